# Sourced by the family GPU scripts (bench/zimage-gpu.sh, qwen-image-gpu.sh, flux-gpu.sh, wan-gpu.sh; run from
# the repository root, with OUT set): the log and its `say`, `synth` (one `kiln model synth` of SIZE into MODELS
# under T_SYNTH, its exit status logged), the machine's description (OUT/machine.txt), and the carried diffusers
# wheel installed for the GPU image's Python (not with PYTHON set: a dry run brings its own). PY must be set.
LOG="$OUT/run.log"
say() { echo "== $*" | tee -a "$LOG"; }
synth() {
  timeout "$T_SYNTH" "$BIN/kiln" model synth --size "$SIZE" --models-dir "$MODELS" "$@" >> "$LOG" 2>&1
  echo "synth $* rc=$?" | tee -a "$LOG"
}
: > "$LOG"

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1
  grep -m1 "model name" /proc/cpuinfo; nproc; grep MemTotal /proc/meminfo; df -h /tmp | tail -1
  "$PY" -c 'import torch; print("torch", torch.__version__)' 2>&1
} > "$OUT/machine.txt" 2>&1

if [ -z "${PYTHON:-}" ] && ls bench/zimage-gpu/wheels/*.whl >/dev/null 2>&1; then
  say "installing the carried wheels"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    bench/zimage-gpu/wheels/*.whl >> "$LOG" 2>&1 && export PYTHONPATH=/tmp/site
fi
