#!/usr/bin/env bash
# Issue #23's GPU benchmark in one call on the GPU machine (at most 8 minutes): writes the released
# configuration's Qwen-Image files there with the carried `kiln` (`kiln model synth`, random weights: the 20B MMDiT
# in fp8 e4m3fn, ~20 GB, the 7B text encoder in scaled fp8, the VAE in bf16), runs the Lightning workflow
# in-process through Kiln (engine/benches/zimage.rs `--workflow qwen-image-lightning`: 1328², 8 euler steps at
# CFG 1) with the VRAM budget at 100 % and 25 % of the MMDiT's weights, runs the same MMDiT and VAE through
# diffusers (bench/qwen-image-gpu/torch_qwen_image.py: the fp8 weights widened to bf16, all resident) in the same
# run, and summarises the goal ratios (bench/zimage-gpu/compare.py: step ≤ 1.0 × diffusers' at full residency,
# ≤ 1.05 × max(compute, streamed bytes ÷ link) at 25 %).
#
# Build first, here: bench/zimage-gpu/build.sh (the same `kiln` and bench binary, and the diffusers wheel).
# Then, with the device tool: run `bash bench/qwen-image-gpu.sh`, carry ["bench/zimage-gpu/bin",
# "bench/zimage-gpu/wheels"], timeout_s 540. Results go to $OUT (the device tool's output folder), or
# bench/qwen-image-gpu/out/ by hand.
#
# STEPS, TORCH=0 (no diffusers), PCTS (the budgets, default "100 25"), SYNTH=0 (the files of an earlier call
# kept with KEEP=1) can be set, as bench/wan-gpu.sh's.
#
# `--dry-run` runs the same path on the CPU with tiny files at 64², 2 steps (Kiln with --cpu, torch on the CPU in
# f32): PYTHON=/path/to/python with torch and diffusers (no wheels installed then).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/qwen-image-gpu/out}
mkdir -p "$OUT"
BIN=${BIN:-bench/zimage-gpu/bin}
MODELS=${MODELS_DIR:-/tmp/kiln-qwen-image-models}
if [ "${1:-}" = "--dry-run" ]; then
  SIZE=tiny PX=64 STEPS=2 KILN_DEVICE=--cpu TORCH_DEVICE=cpu PY=${PYTHON:-python3}
  T_SYNTH=60 T_KILN=120 T_TORCH=120
else
  SIZE=real PX=1328 STEPS=${STEPS:-8} KILN_DEVICE= TORCH_DEVICE=cuda PY=python3
  T_SYNTH=${T_SYNTH:-180} T_KILN=${T_KILN:-80} T_TORCH=${T_TORCH:-130}
fi
. bench/zimage-gpu/common.sh

if [ "${SYNTH:-1}" = 1 ]; then
  say "kiln model synth --size $SIZE (the three files, in parallel)"
  rm -rf "$MODELS"
  t0=$(date +%s)
  synth --dtype fp8_e4m3fn --family qwen-image --name diffusion_models/qwen_image_fp8_e4m3fn.safetensors &
  synth --dtype fp8_scaled --family qwen25vl --name text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors &
  synth --dtype bf16 --family wan21-vae --name vae/qwen_image_vae.safetensors &
  wait
  echo "synth_s=$(( $(date +%s) - t0 ))" | tee -a "$LOG"
fi
du -sb "$MODELS"/*/* 2>&1 | tee -a "$LOG"

# The baseline first (every later figure is compared with it), then Kiln: 100 % (the compute the partial budget
# is measured against), then 25 % (the goal).
if [ "${TORCH:-1}" = 1 ]; then
  say "diffusers"
  PYTHONUNBUFFERED=1 timeout "$T_TORCH" "$PY" bench/qwen-image-gpu/torch_qwen_image.py --models "$MODELS" \
    --size "$PX" --steps "$STEPS" --device "$TORCH_DEVICE" --out "$OUT/torch.json" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
fi

kiln_at_budgets "${PCTS:-100 25}" qwen-image-lightning

summarise
[ "${KEEP:-0}" = 1 ] || rm -rf "$MODELS"
