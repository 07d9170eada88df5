#!/usr/bin/env bash
# Builds, on a machine without CUDA, what bench/zimage-gpu.sh carries to the GPU machine, into
# bench/zimage-gpu/bin/ and bench/zimage-gpu/wheels/ (ignored by git; carry both):
#   bin/kiln                 the server binary (only `kiln model synth` is used there: it writes the
#                            real-configuration bf16 files on the GPU machine, ~19.5 GB, instead of carrying them)
#   bin/kiln-zimage-bench    engine/benches/zimage.rs with the `cuda` feature (cudarc loads libcuda, cuBLASLt and
#                            NVRTC at run time, so nothing here needs a toolkit)
#   wheels/diffusers-*.whl   diffusers (the GPU image has torch, transformers, safetensors, tokenizers, but not
#                            diffusers; its own dependencies are all in the image)
# and checks that they fit the device tool's 64 MiB carry limit (with the working tree).
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=bench/zimage-gpu
mkdir -p "$DIR/bin" "$DIR/wheels"
artifact() { # the executable of target $1 in cargo's JSON messages on stdin
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}
cargo build --release --locked -p kiln-server --bin kiln --message-format=json | artifact kiln > "$DIR/bin/.kiln"
cargo bench --locked -p kiln-engine --features cuda --bench zimage --no-run --message-format=json \
  | artifact zimage > "$DIR/bin/.bench"
cp "$(cat "$DIR/bin/.kiln")" "$DIR/bin/kiln"
cp "$(cat "$DIR/bin/.bench")" "$DIR/bin/kiln-zimage-bench"
rm "$DIR/bin/.kiln" "$DIR/bin/.bench"
strip "$DIR/bin/kiln" "$DIR/bin/kiln-zimage-bench" 2>/dev/null || true
# The wheel for the GPU machine's Python (3.12); a pure-Python wheel, so any platform tag does.
if ! ls "$DIR"/wheels/diffusers-0.42.1-*.whl >/dev/null 2>&1; then
  PY=${PYTHON:-python3}
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d "$DIR/wheels" diffusers==0.42.1
fi
ls -la "$DIR/bin" "$DIR/wheels"
total=$(du -cb "$DIR/bin" "$DIR/wheels" | tail -1 | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "carried: $((total / 1048576)) MiB + working tree $((tree / 1048576)) MiB (limit 64 MiB)"
if [ $((total + tree)) -gt $((64 * 1048576)) ]; then
  echo "over the device tool's 64 MiB limit" >&2
  exit 1
fi
