#!/usr/bin/env bash
# Packs what bench/device.sh needs on the GPU machine into .device/ (ignored by git through .git/info/exclude):
# the release binaries of bench/gpu/build.sh and bench/zimage-gpu/build.sh xz-compressed (~24 MB instead of
# ~72 MB) and the diffusers wheel, and reports what would travel. `--build` first runs both build scripts
# (`bench/device-pack.sh --build --hide-fixtures` is the whole preparation of a device call). The device tool
# sends the tracked files too, and the test fixtures alone (~68 MB) are over its 64 MiB: with `--hide-fixtures`
# they (but the quantized formats' the CUDA op tests read) leave the index (kept on disk, excluded) for the call;
# `--restore` puts them back. Never commit while they are hidden.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every fixture folder but the quantized formats' (the CUDA op tests read those).
mapfile -t FIXTURES < <(ls -d engine/models/tests/fixtures/*/ engine/tests/fixtures | sed 's#/$##' | grep -v '/quant$')
exclude() { grep -qxF "$1" .git/info/exclude 2>/dev/null || echo "$1" >> .git/info/exclude; }
if [ "${1:-}" = "--build" ]; then
  shift
  bench/gpu/build.sh
  bench/zimage-gpu/build.sh
fi
case "${1:-}" in
  --restore)
    git reset -q HEAD -- "${FIXTURES[@]}"
    for f in "${FIXTURES[@]}"; do sed -i "\\#^/$f/\$#d" .git/info/exclude; done
    git status --short | head
    exit 0 ;;
  --hide-fixtures)
    for f in "${FIXTURES[@]}"; do exclude "/$f/"; done
    git rm -r -q --cached "${FIXTURES[@]}" ;;
esac
exclude "/.device/"
mkdir -p .device
for b in bench/gpu/bin/kiln-gpu-bench bench/gpu/bin/kiln-compute-it bench/zimage-gpu/bin/kiln \
  bench/zimage-gpu/bin/kiln-zimage-bench; do
  packed=".device/$(basename "$b").xz"
  if [ ! -f "$packed" ] || [ "$b" -nt "$packed" ]; then
    xz -T0 -6 -c "$b" > "$packed"
  fi
done
cp bench/zimage-gpu/wheels/*.whl .device/
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
pack=$(du -cb .device | tail -1 | cut -f1)
echo "tracked $((tree / 1048576)) MiB + untracked $((${untracked:-0} / 1048576)) MiB + .device $((pack / 1048576)) MiB (limit 64 MiB)"
