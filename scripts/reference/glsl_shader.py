"""Records ComfyUI's `GLSLShader` (comfy_extras/nodes_glsl.py) drawing the shaders of
engine/tests/fixtures/glsl/ over small deterministic images: the reference of Kiln's engine/src/shader (a GLSL ES
interpreter), written to engine/tests/fixtures/glsl/reference.json.

The reference is ComfyUI itself at the commit Kiln matches (0f1fa67a), imported from COMFYUI_DIR (see comfyui.py;
nothing of it is copied here): its `_render_shader_batch`, which compiles the shader with OpenGL ES 3.0 through
ANGLE (the `comfy-angle` wheel ComfyUI's requirements.txt names) and reads the RGBA32F framebuffers back. Without
a display and GPU, ANGLE runs on Vulkan, here Mesa's software rasteriser (lavapipe): on Debian 12
    apt-get install mesa-vulkan-drivers libvulkan1
    target/reference-venv/bin/pip install comfy-angle==0.1.1 PyOpenGL==3.1.10
The renderer ANGLE reports is recorded in the fixture.

Run from the repository root with the reference venv:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/glsl_shader.py

The shaders: the ten of the official template `basic_image_color_adjustment` (comfyui-workflow-templates-json
0.1.123, MIT), one file each, named after their subgraphs, and two written for Kiln's tests (language.frag:
structs, arrays, out parameters, switch, loops, matrices, integer bits, discard, two images and four outputs;
passes.frag: `#pragma passes 3`).

What the fixture holds:
  - `images`: the inputs as ComfyUI's IMAGE [H, W, C] floats, row-major: `image0` 16x12 RGB (a gradient with a
    bright disc and a dark bar, plus seeded noise), `image1` 8x6 RGBA.
  - `cases`: each draw: the shader file, the output size, the images bound (u_image0, u_image1, ...), the
    float, int and bool uniforms in order, the curves (their points and interpolation, and the 256-entry lookup
    table ComfyUI's CurveInput.to_lut() made of each, bound as u_curve0...), and `outputs`: the images ComfyUI
    read back (as many as the shader's highest fragColorN, or one), each [H, W, 4] floats row-major.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

import_comfyui(node_modules=True)

from comfy_api.latest._input.curve_types import CurveInput  # noqa: E402
from comfy_extras import nodes_glsl  # noqa: E402

FIXTURES = os.path.join("engine", "tests", "fixtures", "glsl")


def image0():
    h, w = 12, 16
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = x / (w - 1)
    g = y / (h - 1)
    b = 0.5 + 0.5 * np.sin(x * 0.7 + y * 0.3)
    img = np.stack([r, g, b], axis=-1)
    disc = (x - 10.0) ** 2 + (y - 4.0) ** 2 < 9.0
    img[disc] = [0.95, 0.9, 0.85]
    img[8:10, 2:9] = [0.05, 0.1, 0.2]
    rng = np.random.default_rng(7)
    img = img + rng.uniform(-0.04, 0.04, img.shape)
    return np.clip(img, 0.0, 1.0).astype(np.float32)


def image1():
    h, w = 6, 8
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    return np.stack([1.0 - x / (w - 1), (x + y) / (w + h - 2), y / (h - 1), 0.25 + 0.5 * (x / (w - 1))], -1).astype(
        np.float32
    )


CURVES = [
    {"points": [[0, 0], [0.389, 0.527], [0.736, 0.45], [1, 1]], "interpolation": "monotone_cubic"},
    {"points": [[0, 0.1], [0.5, 0.7], [1, 0.9]], "interpolation": "linear"},
    {"points": [[0, 0], [0.42, 0.68], [0.65, 0.61], [0.78, 0.57], [1, 1]], "interpolation": "monotone_cubic"},
    {"points": [[0, 0], [1, 1]], "interpolation": "monotone_cubic"},
]


def case(shader, floats=(), ints=(), bools=(), curves=(), images=("image0",), size=None):
    return {
        "shader": shader,
        "images": list(images),
        "floats": [float(np.float32(f)) for f in floats],
        "ints": list(ints),
        "bools": list(bools),
        "curves": list(curves),
        "size": size,
    }


CASES = [
    case("color_curves.frag", curves=CURVES),
    case("image_channels.frag"),
    case("brightness_and_contrast.frag", floats=[30.0, -20.0]),
    case("brightness_and_contrast.frag", floats=[-45.0, 60.0]),
    case("glow.frag", floats=[40.0, 25.0, 50.0], ints=[0, 0]),
    case("glow.frag", floats=[80.0, 60.0, 30.0], ints=[3, 0xFFAA33]),
    case("film_grain.frag", floats=[0.6, 1.2, 0.5, 0.3], ints=[0]),
    # Grain size 0.77, not 0.5: at 0.5 every pixel's grain coordinate (v_texCoord · u_resolution / size) lands on
    # an integer (at 0.7 some rows do), where its last bit decides which cell's hash it reads, and that bit is the interpolator's own
    # (llvmpipe's v_texCoord differs from (x + 0.5) / width by an ulp here and there, as GPUs' do).
    case("film_grain.frag", floats=[0.4, 0.77, 1.0, 0.8], ints=[1]),
    case("color_balance.frag", floats=[20, -10, 5, 0, 15, -25, -30, 10, 40], bools=[True]),
    case("color_balance.frag", floats=[-40, 30, 0, 25, 0, 10, 5, -5, 60], bools=[False]),
    case("chromatic_aberration.frag", floats=[40.0], ints=[0]),
    case("chromatic_aberration.frag", floats=[75.0], ints=[2]),
    case("hue_and_saturation.frag", floats=[45.0, 30.0, -10.0, 20.0], ints=[0, 0]),
    case("hue_and_saturation.frag", floats=[-90.0, 50.0, 20.0, 40.0], ints=[1, 1]),
    case("hue_and_saturation.frag", floats=[120.0, 40.0, 10.0, 0.0], ints=[7, 0]),
    case("color_adjustment.frag", floats=[30.0, -20.0, 40.0, -15.0]),
    case("image_levels.frag", floats=[0.1, 0.9, 1.3, 0.05, 0.95], ints=[0]),
    case("image_levels.frag", floats=[0.2, 0.8, 0.7, 0.0, 1.0], ints=[2]),
    case("language.frag", floats=[0.75], ints=[0], bools=[True], images=("image0", "image1")),
    case("language.frag", floats=[0.25], ints=[1], bools=[False], images=("image0", "image1")),
    case("language.frag", floats=[0.5], ints=[3], bools=[True], images=("image0", "image1")),
    case("passes.frag", floats=[1.5]),
    case("image_channels.frag", images=("image1",)),
    case("brightness_and_contrast.frag", floats=[10.0, 10.0], size=[10, 7]),
]


def main():
    images = {"image0": image0(), "image1": image1()}
    cases = []
    for c in CASES:
        source = open(os.path.join(FIXTURES, c["shader"])).read()
        luts = [CurveInput.from_raw(curve).to_lut().astype(np.float32) for curve in c["curves"]]
        bound = [images[name] for name in c["images"]]
        if c["size"]:
            width, height = c["size"]
        else:
            height, width = bound[0].shape[:2]
        outputs = nodes_glsl._render_shader_batch(
            source, width, height, [bound], c["floats"], c["ints"], c["bools"], luts
        )[0]
        used = nodes_glsl._detect_output_count(source)
        record = dict(c)
        record["width"], record["height"] = width, height
        record["luts"] = [[float(v) for v in lut] for lut in luts]
        record["outputs"] = [[float(v) for v in out.reshape(-1)] for out in outputs[:used]]
        del record["size"]
        cases.append(record)
    renderer = nodes_glsl._gl_str(nodes_glsl.gl.GL_RENDERER)
    fixture = {
        "comfyui": "0f1fa67a",
        "renderer": renderer,
        "images": {
            name: {"shape": list(img.shape), "pixels": [float(v) for v in img.reshape(-1)]}
            for name, img in images.items()
        },
        "cases": cases,
    }
    with open(os.path.join(FIXTURES, "reference.json"), "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print(f"{len(cases)} cases on {renderer}")


main()
