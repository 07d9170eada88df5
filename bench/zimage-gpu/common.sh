# Sourced by the family GPU scripts (bench/zimage-gpu.sh, qwen-image-gpu.sh, flux-gpu.sh, wan-gpu.sh; run from
# the repository root, with OUT set): the log and its `say`, `synth` (one `kiln model synth` of SIZE into MODELS
# under T_SYNTH, its exit status logged), `kiln_at_budgets` (Kiln's bench at each VRAM budget), `summarise`
# (compare.py's summary into OUT/summary.json, printed without the raw reports), the machine's description
# (OUT/machine.txt), and the carried diffusers wheel installed for the GPU image's Python (not with PYTHON set: a
# dry run brings its own). PY must be set.
LOG="$OUT/run.log"
say() { echo "== $*" | tee -a "$LOG"; }
synth() {
  timeout "$T_SYNTH" "$BIN/kiln" model synth --size "$SIZE" --models-dir "$MODELS" "$@" >> "$LOG" 2>&1
  echo "synth $* rc=$?" | tee -a "$LOG"
}
# `kiln_at_budgets "PCT..." WORKFLOW [BENCH ARGS...]`: the bench on MODELS at PX, STEPS (KILN_DEVICE, under
# T_KILN) with the VRAM budget at each PCT % of the DiT weights, the first the compute the others are measured
# against; each report in OUT/kiln-PCT.json. KILN_ARGS adds bench arguments (e.g. --no-warm).
kiln_at_budgets() {
  local pcts=$1 workflow=$2 pct
  shift 2
  for pct in $pcts; do
    say "kiln at $pct % of the DiT weights"
    timeout "$T_KILN" "$BIN/kiln-zimage-bench" --workflow "$workflow" --models "$MODELS" --size "$PX" \
      --steps "$STEPS" $KILN_DEVICE --vram-fraction "$(awk "BEGIN{print $pct/100}")" --vram-of dit \
      --label "vram-$pct" --out "$OUT/kiln-$pct.json" ${KILN_ARGS:-} "$@" > /dev/null 2>> "$LOG"
    echo "rc=$?" | tee -a "$LOG"
  done
}
summarise() {
  python3 bench/zimage-gpu/compare.py "$OUT" > "$OUT/summary.json"
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); s.pop("raw",None); print(json.dumps(s,indent=1))' \
    "$OUT/summary.json"
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
