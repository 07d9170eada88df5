#!/usr/bin/env bash
# One call on the GPU machine that runs several of the GPU checks in order, within BUDGET_S seconds in all
# (default 520): each part starts only with enough time left, gets timeouts that fit what is left, and writes
# under one work folder, packed into $OUT/results.tgz after every part (the device tool returns at most 8 files;
# a call cut short still returns what finished). Parts (PARTS, in order; default "ops smoke qwen-image"):
#
#   ops          the CUDA op tests (bench/gpu/bin/kiln-compute-it: each op on CUDA against the CPU backend)
#   smoke        every benchmarked workflow end to end on CUDA on tiny synthetic files (64², 2 steps): the
#                engine's CUDA path per family, before the real-size runs (SMOKE_WORKFLOWS: which; SMOKE_ARGS:
#                more bench arguments, `--cpu` to check the part here)
#   qwen-image   bench/qwen-image-gpu.sh (issue #23: 1328², 8-step Lightning at 100 % and 25 %, beside diffusers)
#   wan22-5b     bench/wan-gpu.sh (issue #24: TI2V 5B, 1280×704, 33 frames, at 100 % and 25 %, beside diffusers)
#   wan22-a14b   bench/wan-gpu.sh WORKFLOW=wan22-a14b (the two experts at 832×480, 17 frames, 25 %)
#   executor     bench/gpu.sh (the executor's transfer and streaming benchmark beside torch's baseline)
#   templates    every template the suite ran (tests/templates, packed from target/templates/replay.json by
#                bench/device-pack.sh) again through the CUDA kiln server on tiny files: bench/templates-replay.py,
#                breadth first over node types, until the time left runs out (TEMPLATES_S: at most this many)
#   attention-bench  long attention alone at the real runs' shapes on both paths (`kiln-gpu-bench --attention`)
#   profile      the family parts after it run as a profile: KILN_CUDA_PROFILE=1 (each run's report lists every
#                kernel's and GEMM's time; the warm run's is the steady state, the first's includes loading the
#                kernels: the driver's compile of their PTX, NVRTC's too where no earlier process of the call left
#                it in the kernel cache), 2 steps, Kiln alone (no diffusers) at 100 %, and they start with at least 60 s left
#                instead of 200; the other parts are not profiled
#   profile-after  each family part after it is followed, on the same files, by such a profiled run (in
#                FAMILY/profile/), when 60 s are left
#   attention=P  the parts after it run long attention as KILN_CUDA_ATTENTION=P says (gemm, mma, mma2 or cudnn);
#                with attention=auto, among gemm and the paths whose op test passed (one test a path): when
#                attention-bench ran before, the one of least time over its shapes (cudnn only where its kernels
#                ran there), else mma (or mma2) if it passed, else gemm
#
# After ops, a conv2d or conv2d_sum op test that did not pass sets KILN_CUDA_CUDNN=0 (convolutions as im2col)
# for the rest.
#
# A family part runs only if its smoke (when one ran) ran on CUDA without an error.
#
# Prepare here: `bench/device-pack.sh --build --hide-fixtures` (bench/gpu/build.sh and bench/zimage-gpu/build.sh,
# the binaries xz-compressed into .device/, the fixtures out of the index for the call: the device tool's
# 64 MiB). Then, with the device tool: run `PARTS="…" bash bench/device.sh`, carry [".device"], timeout_s at
# least BUDGET_S + 30; afterwards `bench/device-pack.sh --restore`.
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET=${BUDGET_S:-520}
PARTS=${PARTS:-ops smoke qwen-image}
DEST=${OUT:-bench/device-out}
mkdir -p "$DEST"
WORK=${WORK:-/tmp/kiln-device}
rm -rf "$WORK"
mkdir -p "$WORK"
BIN=bench/zimage-gpu/bin

# The carried pack (bench/device-pack.sh): the binaries xz-compressed, to fit the tool's 64 MiB with the tree.
if [ -d .device ]; then
  mkdir -p bench/gpu/bin "$BIN" bench/zimage-gpu/wheels
  python3 - <<'PY'
import lzma, os, pathlib, shutil
for f in pathlib.Path(".device").iterdir():
    if f.suffix == ".xz" and not f.name.endswith(".tar.xz"):  # the binaries; the templates' pack is a tar
        dest = pathlib.Path("bench/gpu/bin" if f.stem in ("kiln-gpu-bench", "kiln-compute-it") else "bench/zimage-gpu/bin") / f.stem
        dest.write_bytes(lzma.decompress(f.read_bytes()))
        os.chmod(dest, 0o755)
    elif f.suffix == ".whl":
        shutil.copy(f, "bench/zimage-gpu/wheels/")
PY
fi

left() { echo $((BUDGET - ($(date +%s) - START))); }
# `family PART DIR`: the family script of PART (qwen-image, wan22-5b, wan22-a14b) with its results in DIR; its files
# in /tmp/kiln-PART-models.
family() {
  if [ "$1" = qwen-image ]; then
    OUT="$2" MODELS_DIR=/tmp/kiln-qwen-image-models bash bench/qwen-image-gpu.sh > "$2/stdout.txt" 2>&1
  else
    OUT="$2" WORKFLOW=$1 MODELS_DIR="/tmp/kiln-$1-models" bash bench/wan-gpu.sh > "$2/stdout.txt" 2>&1
  fi
}
# The smaller of $1 and the fraction $2 (percent) of the time left.
fit() { local l; l=$(($(left) * $2 / 100)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
pack() { tar czf "$DEST/results.tgz" -C "$WORK" . 2>/dev/null; }
log() { echo "== [$(( $(date +%s) - START )) s] $*" | tee -a "$WORK/device.log"; }

nvidia-smi > "$WORK/nvidia-smi.txt" 2>&1
# cudarc opens libcuda, cuBLASLt and NVRTC by name: the driver's folder, the toolkit's, and the CUDA 13 wheels
# of the image's PyTorch (what scripts/test compiles the kernels with) on the search path.
NV=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)/nvidia
LD_LIBRARY_PATH="$(ls -d "$NV"/cu13/lib "$NV"/*/lib /usr/local/cuda/lib64 /usr/local/nvidia/lib64 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH
# Every process of the call (op tests, smokes, family runs, the templates' server) compiles each kernel file once
# between them: the first writes its PTX here, the others read it.
export KILN_CUDA_KERNEL_CACHE=/tmp/kiln-kernel-cache
{ echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldconfig -p | grep -E 'libcuda\.so|cublasLt|nvrtc'
  ls "$NV"/cu13/lib 2>&1 | head -30; } > "$WORK/libraries.txt" 2>&1

# Tiny files of each workflow (the names engine/benches/zimage.rs reads), written in parallel.
smoke_synth() {
  local dir=$WORK/smoke-models
  s() { local m=$1; shift; "$BIN/kiln" model synth --size tiny --models-dir "$dir/$m" "$@" >> "$WORK/smoke-synth.log" 2>&1 \
    || echo "synth $m $* failed" | tee -a "$WORK/device.log"; }
  s zimage --dtype bf16 &
  s qwen-image-lightning --dtype fp8_e4m3fn --family qwen-image --name diffusion_models/qwen_image_fp8_e4m3fn.safetensors &
  s qwen-image-lightning --dtype fp8_scaled --family qwen25vl --name text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors &
  s qwen-image-lightning --dtype bf16 --family wan21-vae --name vae/qwen_image_vae.safetensors &
  s wan22-5b --dtype f16 --family wan22-ti2v-5b --name diffusion_models/wan2.2_ti2v_5B_fp16.safetensors &
  s wan22-5b --dtype fp8_scaled --family umt5-xxl --name text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors &
  s wan22-5b --dtype bf16 --family wan22-vae --name vae/wan2.2_vae.safetensors &
  wait
  for e in high low; do
    s wan22-a14b --dtype fp8_scaled --family wan22-t2v-a14b --name "diffusion_models/wan2.2_t2v_${e}_noise_14B_fp8_scaled.safetensors" &
  done
  s wan22-a14b --dtype bf16 --family wan21-vae --name vae/wan_2.1_vae.safetensors &
  s flux-dev --dtype fp8_scaled --family flux1 --name diffusion_models/flux1-dev-kontext_fp8_scaled.safetensors &
  s flux-dev --dtype fp8_scaled --family t5xxl --name text_encoders/t5xxl_fp8_e4m3fn_scaled.safetensors &
  s flux-dev --dtype f16 --family clip-l --name text_encoders/clip_l.safetensors &
  s flux-dev --dtype f32 --family flux-vae --name vae/ae.safetensors &
  s animate2 --dtype int8_convrot --family wan21-animate2-14b --name diffusion_models/wan_animate_2_distill_int8_convrot.safetensors &
  s animate2 --dtype f16 --family clip-vision-h --name clip_vision/clip_vision_h.safetensors &
  s animate2 --dtype bf16 --family wan21-vae --name vae/wan_2.1_vae.safetensors &
  wait
  s flux2-klein --dtype bf16 --family flux2 --name diffusion_models/flux-2-klein-4b.safetensors &
  s flux2-klein --dtype bf16 --family qwen3 --name text_encoders/qwen_3_4b.safetensors &
  s flux2-klein --dtype f32 --family flux2-vae --name vae/flux2-vae.safetensors &
  s humo --dtype fp8_e4m3fn --family humo-17b --name diffusion_models/humo_17B_fp8_e4m3fn.safetensors &
  s humo --dtype f16 --family whisper-large-v3 --name audio_encoders/whisper_large_v3_fp16.safetensors &
  s humo --dtype bf16 --family wan21-vae --name vae/wan_2.1_vae.safetensors &
  s s2v --dtype fp8_scaled --family wan22-s2v-14b --name diffusion_models/wan2.2_s2v_14B_fp8_scaled.safetensors &
  s s2v --dtype f16 --family wav2vec2-large-english --name audio_encoders/wav2vec2_large_english_fp16.safetensors &
  s s2v --dtype bf16 --family wan21-vae --name vae/wan_2.1_vae.safetensors &
  s lotus --dtype f16 --family lotus-depth --name diffusion_models/lotus-depth-d-v1-1.safetensors &
  s lotus --dtype f32 --family sd-vae --name vae/vae-ft-mse-840000-ema-pruned.safetensors &
  wait
  mkdir -p "$dir/wan22-a14b/text_encoders" "$dir/animate2/text_encoders" "$dir/humo/text_encoders" \
    "$dir/s2v/text_encoders"
  for m in wan22-a14b animate2 humo s2v; do
    cp "$dir/wan22-5b/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors" "$dir/$m/text_encoders/"
  done
}

for part in $PARTS; do
  l=$(left)
  case "$part" in
    ops)
      [ "$l" -ge 30 ] || { log "ops skipped: $l s left"; continue; }
      log "ops"
      # cuDNN's own log of its errors (why a fused-attention graph or a convolution was declined) into ops.txt;
      # the cuDNN attention test in a process of its own, so a fault there leaves the other results standing.
      export CUDNN_LOGLEVEL_DBG=1 CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr
      timeout "$(fit 90 60)" bench/gpu/bin/kiln-compute-it cuda --skip attention_on_cudnn --test-threads=1 \
        > "$WORK/ops.txt" 2>&1
      echo "rc=$?" >> "$WORK/ops.txt"
      timeout "$(fit 40 30)" bench/gpu/bin/kiln-compute-it attention_on_cudnn --test-threads=1 >> "$WORK/ops.txt" 2>&1
      echo "rc=$?" >> "$WORK/ops.txt"
      unset CUDNN_LOGLEVEL_DBG CUDNN_LOGERR_DBG CUDNN_LOGDEST_DBG
      grep -E "^test |test result|panicked|rc=|cuDNN ran" "$WORK/ops.txt" | tee -a "$WORK/device.log"
      # A convolution test that did not pass (conv2d, or conv2d_sum's accumulation with cuDNN's beta = 1): the
      # later parts keep to the im2col path (cuDNN may be the cause).
      if ! grep -q "conv2d_matches_the_cpu ... ok" "$WORK/ops.txt" \
        || ! grep -q "conv2d_sum_matches_the_cpu ... ok" "$WORK/ops.txt"; then
        export KILN_CUDA_CUDNN=0
        log "KILN_CUDA_CUDNN=0: a conv2d op test did not pass"
      fi ;;
    smoke)
      [ "$l" -ge 60 ] || { log "smoke skipped: $l s left"; continue; }
      log "smoke: tiny files"
      smoke_synth
      for wf in ${SMOKE_WORKFLOWS:-zimage qwen-image-lightning wan22-5b wan22-a14b flux-dev animate2 flux2-klein humo s2v lotus}; do
        [ "$(left)" -ge 20 ] || { log "smoke $wf skipped"; continue; }
        log "smoke $wf on CUDA"
        timeout "$(fit 40 30)" "$BIN/kiln-zimage-bench" --workflow "$wf" --models "$WORK/smoke-models/$wf" --size 64 \
          --steps 2 --label "smoke-$wf" --out "$WORK/smoke-$wf.json" ${SMOKE_ARGS:-} > /dev/null 2> "$WORK/smoke-$wf.log"
        echo "smoke $wf rc=$?" | tee -a "$WORK/device.log"
        python3 - "$WORK/smoke-$wf.json" "$WORK/smoke-ok" "$wf" <<'PY' 2>&1 | tee -a "$WORK/device.log"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    last = (r.get("runs") or [{}])[-1]
    kind, error = r.get("device", {}).get("kind"), r.get("error") or last.get("error")
    print("  device", kind, "steps", last.get("step_seconds"), "seconds", last.get("seconds"), "error", error)
    if kind == "cuda" and not error:
        with open(sys.argv[2], "a") as f:
            print(sys.argv[3], file=f)
except Exception as e:
    print("  no report:", e)
PY
        grep -iE "error|panic" "$WORK/smoke-$wf.log" | head -3 | cut -c1-400 | tee -a "$WORK/device.log"
      done
      rm -rf "$WORK/smoke-models" ;;
    qwen-image | wan22-5b | wan22-a14b)
      min=200; [ -n "${PROFILE_FAMILIES:-}" ] && min=60
      [ "$l" -ge "$min" ] || { log "$part skipped: $l s left"; continue; }
      # After a smoke, only a workflow that ran on CUDA goes on to real size.
      smoke=$part; [ "$part" = qwen-image ] && smoke=qwen-image-lightning
      if [ -f "$WORK/smoke-$smoke.json" ] && ! grep -qx "$smoke" "$WORK/smoke-ok" 2>/dev/null; then
        log "$part skipped: its smoke did not run on CUDA"; continue
      fi
      log "$part (left $l s)"
      export T_SYNTH T_TORCH T_KILN
      if [ -n "${PROFILE_FAMILIES:-}" ]; then  # no diffusers run, one Kiln budget: more time to each
        T_SYNTH=$(fit 150 55) T_TORCH=1 T_KILN=$(fit 90 40)
      else
        T_SYNTH=$(fit 150 35) T_TORCH=$(fit 120 25) T_KILN=$(fit 90 18)
      fi
      log "timeouts: synth $T_SYNTH, diffusers $T_TORCH, each Kiln run $T_KILN"
      mkdir -p "$WORK/$part"
      if [ -n "${PROFILE_FAMILIES:-}" ]; then
        KILN_CUDA_PROFILE=1 TORCH=0 STEPS=2 PCTS=100 family "$part" "$WORK/$part"
      else
        KEEP=${PROFILE_AFTER:-0} family "$part" "$WORK/$part"
      fi
      grep -E "^== |rc=|synth_s|met|_step|error" "$WORK/$part/stdout.txt" | head -40 | tee -a "$WORK/device.log"
      if [ -n "${PROFILE_AFTER:-}" ] && [ -z "${PROFILE_FAMILIES:-}" ]; then
        if [ "$(left)" -ge 60 ]; then
          # The same files again, profiled: 2 steps, Kiln alone at 100 %, a first and a warm run.
          log "$part profiled (left $(left) s)"
          mkdir -p "$WORK/$part/profile"
          SYNTH=0 TORCH=0 PCTS=100 STEPS=2 KILN_CUDA_PROFILE=1 T_KILN=$(fit 90 80) \
            family "$part" "$WORK/$part/profile"
          grep -E "rc=" "$WORK/$part/profile/stdout.txt" | tee -a "$WORK/device.log"
        else
          log "$part profile skipped: $(left) s left"
        fi
        rm -rf "/tmp/kiln-$part-models"
      fi ;;
    templates)
      [ "$l" -ge 60 ] || { log "templates skipped: $l s left"; continue; }
      if [ ! -f .device/templates.tar.xz ]; then
        log "templates skipped: no .device/templates.tar.xz (./scripts/templates, then bench/device-pack.sh)"; continue
      fi
      rm -rf "$WORK/templates-pack" && mkdir -p "$WORK/templates-pack"
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
        .device/templates.tar.xz "$WORK/templates-pack"
      budget=$(( l - 25 )); [ "$budget" -gt "${TEMPLATES_S:-$budget}" ] && budget=$TEMPLATES_S
      log "templates: the suite's runs on CUDA (budget $budget s)"
      # SIGINT at the budget's end: the replay stops its server and writes its report on the way out.
      timeout -s INT -k 15 $(( budget + 10 )) python3 bench/templates-replay.py --kiln "$BIN/kiln" \
        --replay "$WORK/templates-pack/replay.json" --inputs "$WORK/templates-pack/inputs" \
        --work /tmp/kiln-templates --out "$WORK/templates.json" --budget "$budget" --timeout 60 \
        > "$WORK/templates.txt" 2>&1
      echo "templates rc=$?" | tee -a "$WORK/device.log"
      { tail -1 "$WORK/templates.txt"; grep -v -E -e ": ran \([0-9.]+ s\)$" -e "^ran [0-9]+ of" "$WORK/templates.txt" | head -20 | cut -c1-300; } \
        | tee -a "$WORK/device.log"
      # The server's log (its device, errors), without the synthesised files.
      tail -c 2000000 /tmp/kiln-templates/kiln.log > "$WORK/templates-kiln.log" 2>/dev/null
      rm -rf /tmp/kiln-templates "$WORK/templates-pack" ;;
    executor)
      [ "$l" -ge 120 ] || { log "executor skipped: $l s left"; continue; }
      log "executor"
      OUT="$WORK/executor" timeout "$(fit 300 95)" bash bench/gpu.sh > "$WORK/executor.txt" 2>&1
      tail -20 "$WORK/executor.txt" | tee -a "$WORK/device.log" ;;
    attention-bench)
      [ "$l" -ge 30 ] || { log "attention-bench skipped: $l s left"; continue; }
      log "attention-bench"
      timeout "$(fit 60 40)" bench/gpu/bin/kiln-gpu-bench --attention "$WORK/attention.json" > "$WORK/attention.txt" 2>&1
      echo "rc=$?" >> "$WORK/attention.txt"
      tail -5 "$WORK/attention.txt" | cut -c1-400 | tee -a "$WORK/device.log" ;;
    profile)
      PROFILE_FAMILIES=1
      log "profiling the family parts: 2 steps, Kiln alone at 100 %" ;;
    profile-after)
      PROFILE_AFTER=1
      log "each family part is followed by a profiled run" ;;
    attention=auto)
      # A kernel form only if its op test passed; where attention-bench ran, the fastest of those over its shapes.
      passed=gemm
      for p in mma mma2; do
        grep -q "attention_on_the_${p}_kernel_matches_the_cpu_with_gqa_and_causal_masks ... ok" "$WORK/ops.txt" \
          2>/dev/null && passed="$passed $p"
      done
      # cuDNN: its test passed, or failed only on how many problems cuDNN took (every output matched the CPU's;
      # attention-bench then says whether it ran at the real shapes).
      t=attention_on_cudnn_matches_the_cpu_with_gqa_and_causal_masks
      if grep -q "$t ... ok" "$WORK/ops.txt" 2>/dev/null \
        || { grep -q "$t ... FAILED" "$WORK/ops.txt" && grep -q "cuDNN ran" "$WORK/ops.txt" \
          && ! grep -q "attention (cudnn)" "$WORK/ops.txt"; }; then
        passed="$passed cudnn"
      fi
      # attention-bench always writes attention.txt: without it the part did not run (a kernel on correctness
      # alone, if one passed); with it but no report (killed, crashed) gemm.
      KILN_CUDA_ATTENTION=$(python3 - "$WORK/attention.json" "$WORK/attention.txt" $passed <<'PY'
import json, os, sys
passed = sys.argv[3:]
try:
    cases = json.load(open(sys.argv[1])).values()
    # A path every case measured (cuDNN only where its kernels ran, else its time is the GEMM path's).
    paths = [p for p in passed if all(p in c and c[p].get("ran", True) for c in cases)]
    print(min(paths, key=lambda p: sum(c[p]["seconds"] for c in cases)))
except FileNotFoundError:
    kernels = [p for p in ("mma", "mma2") if p in passed]
    print("gemm" if os.path.exists(sys.argv[2]) or not kernels else kernels[0])
except Exception:
    print("gemm")
PY
)
      export KILN_CUDA_ATTENTION
      log "KILN_CUDA_ATTENTION=$KILN_CUDA_ATTENTION (op tests passed: $passed)" ;;
    attention=*)
      export KILN_CUDA_ATTENTION=${part#attention=}
      log "KILN_CUDA_ATTENTION=$KILN_CUDA_ATTENTION" ;;
    *) log "unknown part $part" ;;
  esac
  pack
done
log "done"
pack
