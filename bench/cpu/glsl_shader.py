"""ComfyUI's own GLSLShader renderer (comfy_extras/nodes_glsl.py's `_render_shader_batch`: OpenGL ES through
ANGLE, on a machine without a GPU Mesa's llvmpipe, which compiles each shader to native SIMD code) timed on the
image and uniforms of engine/examples/glsl_timing.rs, for bench/cpu/glsl-shader.sh. Prints one JSON line per
shader. Needs what scripts/reference/glsl_shader.py needs (Mesa's Vulkan drivers, comfy-angle, PyOpenGL).

    COMFYUI_DIR=... python bench/cpu/glsl_shader.py SIDE SHADER.frag...
"""

import json
import os
import sys
import time

ARGS = sys.argv[1:]
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "reference"))
from comfyui import import_comfyui  # noqa: E402

import_comfyui(node_modules=True)

import numpy as np  # noqa: E402
from comfy_extras import nodes_glsl  # noqa: E402

side = int(ARGS[0])
image = ((np.arange(side * side * 3, dtype=np.int64) * 7919) % 1000).astype(np.float32).reshape(side, side, 3) / 1000
floats = [30.0 + i for i in range(10)]
for path in ARGS[1:]:
    source = open(path).read()
    # The context, the program's compilation by ANGLE and llvmpipe's JIT warmed first on 8 x 8 pixels.
    nodes_glsl._render_shader_batch(source, 8, 8, [[image[:8, :8]]], floats, [], [], [])
    started = time.perf_counter()
    nodes_glsl._render_shader_batch(source, side, side, [[image]], floats, [], [], [])
    seconds = time.perf_counter() - started
    print(json.dumps({"shader": os.path.basename(path), "side": side, "seconds": round(seconds, 4)}))
