#!/usr/bin/env bash
# Issue #24's GPU benchmark (deliverable 5) on the GPU machine: writes the released configurations' files there
# with the carried `kiln` (`kiln model synth`, random weights in the templates' dtypes), runs the template
# in-process through Kiln (engine/benches/zimage.rs) with the VRAM budget at each of PCTS % of the DiT weights,
# runs the same DiTs and VAE through diffusers (bench/wan-gpu/torch_wan.py: every model resident in bf16) in the
# same run, and summarises the goal ratios (bench/zimage-gpu/compare.py: step ≤ 1.0 × diffusers' at full
# residency, ≤ 1.05 × max(compute, streamed bytes ÷ link) below it).
#
#   WORKFLOW=wan22-5b (default): Wan 2.2 TI2V 5B's text-to-video template, 1280×704, 33 frames (9 latent frames,
#     7 920 tokens), uni_pc, CFG 5: the 5B in fp16 (10 GB), umT5-XXL in scaled fp8, the Wan 2.2 VAE in bf16.
#   WORKFLOW=wan22-a14b: Wan 2.2 A14B's text-to-video template, 832×480, 17 frames (5 latent frames, 7 800
#     tokens), euler, CFG 3.5, the high-noise expert for the first half of the steps and the low-noise one after:
#     the two 14B experts in scaled fp8 (2 × 14.3 GB), umT5-XXL, the Wan 2.1 VAE. PCTS 25: the budget is a
#     quarter of both experts' weights, so each expert streams most of its blocks every step.
#
# Build first, here: bench/zimage-gpu/build.sh (the same `kiln` and bench binary, and the diffusers wheel).
# Then, with the device tool: run `bash bench/wan-gpu.sh` (or `WORKFLOW=wan22-a14b bash bench/wan-gpu.sh`),
# carry ["bench/zimage-gpu/bin", "bench/zimage-gpu/wheels"], timeout_s 540. Results go to $OUT (the device
# tool's output folder), or bench/wan-gpu/out/ by hand. SYNTH=0 / TORCH=0 skip those parts (files kept with
# KEEP=1 by an earlier call on a warm machine); every timeout can be set (T_SYNTH, T_TORCH, T_KILN).
#
# `--dry-run` runs the same path on the CPU with tiny files at 64², 5 frames, 2 steps (Kiln with --cpu, torch on
# the CPU in f32): PYTHON=/path/to/python with torch and diffusers (no wheels installed then).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/wan-gpu/out}
mkdir -p "$OUT"
BIN=${BIN:-bench/zimage-gpu/bin}
WORKFLOW=${WORKFLOW:-wan22-5b}
MODELS=${MODELS_DIR:-/tmp/kiln-$WORKFLOW-models}
SYNTH=${SYNTH:-1} TORCH=${TORCH:-1} KEEP=${KEEP:-0}
case "$WORKFLOW" in
  wan22-5b) PX=1280 HEIGHT=704 FRAMES=33 STEPS=${STEPS:-4} PCTS=${PCTS:-100 25} ;;
  wan22-a14b) PX=832 HEIGHT=480 FRAMES=17 STEPS=${STEPS:-4} PCTS=${PCTS:-25} ;;
  *) echo "WORKFLOW=$WORKFLOW: expected wan22-5b or wan22-a14b" >&2; exit 2 ;;
esac
if [ "${1:-}" = "--dry-run" ]; then
  SIZE=tiny PX=64 HEIGHT=64 FRAMES=5 STEPS=2 KILN_DEVICE=--cpu TORCH_DEVICE=cpu PY=${PYTHON:-python3}
  T_SYNTH=${T_SYNTH:-60} T_KILN=${T_KILN:-180} T_TORCH=${T_TORCH:-120}
else
  SIZE=real KILN_DEVICE= TORCH_DEVICE=cuda PY=python3
  T_SYNTH=${T_SYNTH:-150} T_KILN=${T_KILN:-90} T_TORCH=${T_TORCH:-120}
fi
. bench/zimage-gpu/common.sh

if [ "$SYNTH" = 1 ]; then
  say "kiln model synth --size $SIZE ($WORKFLOW's files, in parallel)"
  rm -rf "$MODELS"
  t0=$(date +%s)
  synth --dtype fp8_scaled --family umt5-xxl --name text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors &
  if [ "$WORKFLOW" = wan22-5b ]; then
    synth --dtype f16 --family wan22-ti2v-5b --name diffusion_models/wan2.2_ti2v_5B_fp16.safetensors &
    synth --dtype bf16 --family wan22-vae --name vae/wan2.2_vae.safetensors &
  else
    for expert in high low; do
      synth --dtype fp8_scaled --family wan22-t2v-a14b \
        --name "diffusion_models/wan2.2_t2v_${expert}_noise_14B_fp8_scaled.safetensors" &
    done
    synth --dtype bf16 --family wan21-vae --name vae/wan_2.1_vae.safetensors &
  fi
  wait
  echo "synth_s=$(( $(date +%s) - t0 ))" | tee -a "$LOG"
fi
du -sb "$MODELS"/*/* 2>&1 | tee -a "$LOG"

# The baseline first (every later figure is compared with it), then Kiln at each budget, the largest first.
if [ "$TORCH" = 1 ]; then
  say "diffusers"
  PYTHONUNBUFFERED=1 timeout "$T_TORCH" "$PY" bench/wan-gpu/torch_wan.py --workflow "$WORKFLOW" --models "$MODELS" \
    --size "$PX" --height "$HEIGHT" --frames "$FRAMES" --steps "$STEPS" --device "$TORCH_DEVICE" \
    --out "$OUT/torch.json" >> "$LOG" 2>&1
  echo "rc=$?" | tee -a "$LOG"
fi

kiln_at_budgets "$PCTS" "$WORKFLOW" --height "$HEIGHT" --frames "$FRAMES"

summarise
[ "$KEEP" = 1 ] || rm -rf "$MODELS"
