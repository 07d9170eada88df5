#!/usr/bin/env bash
# Kiln's CPU ops against torch's on the same cases with the same thread count (engine/compute/benches/cpu_ops.rs
# and bench/cpu/torch_cpu_ops.py); writes bench/results/2026-11-30-cpu-ops.json and .md.
#
# Each tool runs ROUNDS times (default 2), alternating, and each case keeps its best median over the rounds, so
# a burst of load from other processes on a shared machine spoils one round rather than the comparison.
# torch is installed into target/bench-venv from bench/cpu/requirements.txt (see there for why --no-deps).
#
# Usage: bench/cpu/run.sh [FILTER]   (env: THREADS, default nproc; ROUNDS, default 2)
set -euo pipefail
cd "$(dirname "$0")/../.."

threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-2}
filter=${1:-}
venv=target/bench-venv
tmp=target/cpu-ops
out=bench/results/2026-11-30-cpu-ops

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-deps -r bench/cpu/requirements.txt
fi
cargo bench -p kiln-compute --bench cpu_ops --no-run

export RAYON_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
mkdir -p "$tmp"
rm -f "$tmp"/kiln-*.json "$tmp"/torch-*.json
for r in $(seq "$rounds"); do
  echo "round $r of $rounds: kiln" >&2
  cargo bench -q -p kiln-compute --bench cpu_ops -- $filter > "$tmp/kiln-$r.json"
  echo "round $r of $rounds: torch" >&2
  "$venv/bin/python" -W ignore bench/cpu/torch_cpu_ops.py --threads "$threads" $filter > "$tmp/torch-$r.json"
done
"$venv/bin/python" bench/cpu/report.py --out "$out" "$tmp"/kiln-*.json "$tmp"/torch-*.json
echo "wrote $out.json and $out.md" >&2
