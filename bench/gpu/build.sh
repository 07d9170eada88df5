#!/usr/bin/env bash
# Builds, on a machine without CUDA, the release binaries bench/gpu.sh runs on the GPU machine, into
# bench/gpu/bin/ (ignored by git; carry it to the GPU machine). cudarc loads libcuda, cuBLASLt and NVRTC at
# run time, so nothing here needs a toolkit.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p bench/gpu/bin
cargo build --release --locked -p kiln-compute --features cuda --bench gpu --message-format=json \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])' > bench/gpu/bin/.gpu-path
cargo test --release --locked -p kiln-compute --features cuda --test it --no-run --message-format=json \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "it":
        print(m["executable"])' > bench/gpu/bin/.it-path
cp "$(cat bench/gpu/bin/.gpu-path)" bench/gpu/bin/kiln-gpu-bench
cp "$(cat bench/gpu/bin/.it-path)" bench/gpu/bin/kiln-compute-it
rm bench/gpu/bin/.gpu-path bench/gpu/bin/.it-path
strip bench/gpu/bin/kiln-gpu-bench bench/gpu/bin/kiln-compute-it 2>/dev/null || true
ls -la bench/gpu/bin
