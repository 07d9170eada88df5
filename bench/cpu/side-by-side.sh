#!/usr/bin/env bash
# One round of a side-by-side run on the CPU: a fresh server (Kiln or ComfyUI itself), one graph queued twice
# (the first prompt cold, the second warm with another seed) through bench/cpu/side_by_side.py, the server
# stopped. Run the rounds alternately (comfyui, kiln, comfyui, kiln) on a quiet machine and compare the
# figures of the same round order only (bench/results/2026-12-05-comfyui-side-by-side-cpu.md).
#
# Usage: bench/cpu/side-by-side.sh kiln|comfyui GRAPH.json OUT_DIR
# env:
#   MODELS_YAML   an extra_model_paths.yaml naming the models folder, read by both servers (required)
#   KILN          the kiln binary (default target/release/kiln)
#   COMFYUI_DIR   ComfyUI at 0f1fa67a, with its venv in COMFYUI_PYTHON (the reference install of
#                 ComfyUI's docs: a CPU run), e.g. COMFYUI_PYTHON=$COMFYUI_DIR/../venv/bin/python
#   COMFYUI_FLAGS the weight-dtype flag ComfyUI needs on a 24 GiB host (default --fp16-unet: without it,
#                 ComfyUI widens a diffusion model to f32 on the CPU; --fp8_e4m3fn-unet for fp8 files)
#   WORK          scratch folder for the servers' data (default target/side-by-side)
set -euo pipefail
cd "$(dirname "$0")/../.."
which=$1
graph=$(realpath "$2")
out=$(realpath -m "$3")
: "${MODELS_YAML:?set MODELS_YAML to an extra_model_paths.yaml naming the models folder}"
models_yaml=$(realpath "$MODELS_YAML")
work=$(realpath -m "${WORK:-target/side-by-side}")
rm -rf "$work/$which"
mkdir -p "$work/$which"/{input,output,temp,user}
case $which in
  kiln)
    port=8191
    "${KILN:-target/release/kiln}" --listen 127.0.0.1 --port $port --data-dir "$work/$which" \
      --extra-model-paths-config "$models_yaml" --preview-method none > "$work/$which.log" 2>&1 &
    ;;
  comfyui)
    port=8190
    : "${COMFYUI_DIR:?set COMFYUI_DIR to ComfyUI at 0f1fa67a}" "${COMFYUI_PYTHON:?set COMFYUI_PYTHON}"
    (cd "$COMFYUI_DIR" && exec "$COMFYUI_PYTHON" main.py --cpu ${COMFYUI_FLAGS:---fp16-unet} \
      --listen 127.0.0.1 --port $port --input-directory "$work/$which/input" \
      --output-directory "$work/$which/output" --temp-directory "$work/$which/temp" \
      --user-directory "$work/$which/user" --database-url "sqlite:///$work/$which/user/comfyui.db" \
      --extra-model-paths-config "$models_yaml") > "$work/$which.log" 2>&1 &
    ;;
  *)
    echo "usage: $0 kiln|comfyui GRAPH.json OUT_DIR" >&2
    exit 2
    ;;
esac
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -s -o /dev/null "http://127.0.0.1:$port/system_stats" && break
  sleep 1
done
python3 bench/cpu/side_by_side.py run --url "http://127.0.0.1:$port" --pid $pid --graph "$graph" \
  --seeds 1,2 --label "$which" --out "$out"
