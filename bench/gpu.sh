#!/usr/bin/env bash
# Every GPU check and benchmark of the compute layer in one call on the GPU machine (at most 7.5 minutes):
# the CUDA op tests (each op on CUDA against the CPU backend), Kiln's GPU benchmark, and the PyTorch baseline
# in the same run, then a summary of the ratios the targets are stated in (performance-anchors.md §4).
#
# Build first, here: bench/gpu/build.sh (release binaries into bench/gpu/bin/, carried to the GPU machine).
# Results go to $OUT (the device tool's output folder), or bench/gpu/out/ when run by hand.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/gpu/out}
mkdir -p "$OUT"
BIN=bench/gpu/bin
export KILN_BENCH_DIR=${KILN_BENCH_DIR:-/tmp}
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv
  ldconfig -p | grep -E 'libcuda\.so|cublasLt|nvrtc' || true
  nproc; grep MemTotal /proc/meminfo
} > "$OUT/machine.txt" 2>&1

echo "== CUDA op tests"
timeout 120 "$BIN/kiln-compute-it" cuda --test-threads=1 --nocapture > "$OUT/cuda-tests.txt" 2>&1
echo "rc=$?" >> "$OUT/cuda-tests.txt"
tail -5 "$OUT/cuda-tests.txt"

echo "== Kiln GPU benchmark"
timeout 210 "$BIN/kiln-gpu-bench" "$OUT/kiln-gpu.json" > "$OUT/kiln-gpu.log" 2>&1
echo "rc=$?" >> "$OUT/kiln-gpu.log"
tail -3 "$OUT/kiln-gpu.log"

echo "== PyTorch baseline"
OUT="$OUT" timeout 120 python3 bench/gpu/torch_streaming_baseline.py > "$OUT/torch.log" 2>&1
echo "rc=$?" >> "$OUT/torch.log"

python3 bench/gpu/compare.py "$OUT/kiln-gpu.json" "$OUT/anchor.json" "$OUT/machine.txt" > "$OUT/summary.json"
cat "$OUT/summary.json"
