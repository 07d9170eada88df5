#!/usr/bin/env bash
# GLSLShader on the CPU, Kiln beside ComfyUI in the same run: Kiln's interpreter (engine/examples/glsl_timing.rs)
# and ComfyUI's renderer (bench/cpu/glsl_shader.py: ANGLE on llvmpipe) draw the same shaders over the same image
# with the same number of threads; prints each pair and Kiln's time over ComfyUI's.
#
# Usage: bench/cpu/glsl-shader.sh [SIDE [THREADS]] (defaults 512 and 2)
# env: COMFYUI_DIR (ComfyUI at 0f1fa67a), COMFYUI_PYTHON (its venv's python)
set -euo pipefail
cd "$(dirname "$0")/../.."
side=${1:-512}
threads=${2:-2}
: "${COMFYUI_DIR:?set COMFYUI_DIR to ComfyUI at 0f1fa67a}"
shaders=(engine/tests/fixtures/glsl/{brightness_and_contrast,hue_and_saturation,color_balance,glow,film_grain}.frag)
cargo build -q --release -p kiln-engine --example glsl_timing
kiln=$(target/release/examples/glsl_timing "$side" "$threads" "${shaders[@]}")
comfy=$(LP_NUM_THREADS=$threads "${COMFYUI_PYTHON:-python3}" -W ignore bench/cpu/glsl_shader.py "$side" "${shaders[@]}")
paste <(echo "$kiln") <(echo "$comfy") | python3 -c '
import json, sys
print("%-28s %9s %10s %7s" % ("shader", "kiln s", "comfyui s", "ratio"))
for line in sys.stdin:
    kiln, comfy = (json.loads(part) for part in line.rstrip("\n").split("\t"))
    ratio = kiln["seconds"] / comfy["seconds"]
    print("%-28s %9.3f %10.3f %7.1f" % (kiln["shader"], kiln["seconds"], comfy["seconds"], ratio))
'
