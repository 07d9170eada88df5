#!/usr/bin/env bash
# Issue #11's GPU benchmark in one call on the GPU machine (at most 8 minutes): writes the real-configuration bf16
# Z-Image-Turbo files there with the carried `kiln` (`kiln model synth`, random weights, ~19.5 GB), runs the
# default workflow in-process through Kiln (engine/benches/zimage.rs) at 1024², 8 steps, with the VRAM budget at
# 100 %, 50 % and 25 % of the DiT's weights, runs the same files through diffusers (bench/zimage-gpu/
# torch_zimage.py) in the same run, and summarises the goal ratios (bench/zimage-gpu/compare.py).
#
# Build first, here: bench/zimage-gpu/build.sh (bin/ and wheels/ under bench/zimage-gpu/, ignored by git).
# Then, with the device tool: run `bash bench/zimage-gpu.sh`, carry ["bench/zimage-gpu/bin", "bench/zimage-gpu/wheels"],
# timeout_s 540. Results go to $OUT (the device tool's output folder), or bench/zimage-gpu/out/ by hand.
#
# `--dry-run` runs the same path on the CPU with tiny files at 64², 2 steps (Kiln with --cpu, torch on the CPU in
# f32): PYTHON=/path/to/python with torch, diffusers and transformers (no wheels installed then).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/zimage-gpu/out}
mkdir -p "$OUT"
BIN=${BIN:-bench/zimage-gpu/bin}
MODELS=${MODELS_DIR:-/tmp/kiln-zimage-models}
if [ "${1:-}" = "--dry-run" ]; then
  SIZE=tiny PX=64 STEPS=2 KILN_DEVICE=--cpu TORCH_DEVICE=cpu PY=${PYTHON:-python3}
  T_SYNTH=60 T_KILN=60 T_TORCH=120
else
  SIZE=real PX=1024 STEPS=8 KILN_DEVICE= TORCH_DEVICE=cuda PY=python3
  T_SYNTH=150 T_KILN=70 T_TORCH=110
fi
. bench/zimage-gpu/common.sh

say "kiln model synth --size $SIZE --dtype bf16"
rm -rf "$MODELS"
t0=$(date +%s)
timeout "$T_SYNTH" "$BIN/kiln" model synth --size "$SIZE" --dtype bf16 --models-dir "$MODELS" >> "$LOG" 2>&1
echo "rc=$? synth_s=$(( $(date +%s) - t0 ))" | tee -a "$LOG"
du -sb "$MODELS"/*/* 2>&1 | tee -a "$LOG"

# The baseline first (every later figure is compared with it), then Kiln: 100 % (the compute the partial budgets
# are measured against), 25 % (the goal), 50 %.
say "diffusers"
PYTHONUNBUFFERED=1 timeout "$T_TORCH" "$PY" bench/zimage-gpu/torch_zimage.py --models "$MODELS" --size "$PX" \
  --steps "$STEPS" --device "$TORCH_DEVICE" --out "$OUT/torch.json" >> "$LOG" 2>&1
echo "rc=$?" | tee -a "$LOG"

kiln_at_budgets "100 25 50" zimage

summarise
rm -rf "$MODELS"
