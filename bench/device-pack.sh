#!/usr/bin/env bash
# Packs what bench/device.sh needs on the GPU machine into .device/ (ignored by git through .git/info/exclude):
# the release binaries of bench/gpu/build.sh and bench/zimage-gpu/build.sh xz-compressed (~24 MB instead of
# ~72 MB), the diffusers wheel and, where ./scripts/templates has run, the template suite's runs
# (.device/templates.tar.xz, for device.sh's `templates` part), and reports what would travel. `--build` first runs both build scripts
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
# The template suite's runs (target/templates/replay.json, written by ./scripts/templates or ./scripts/test) and
# the images and videos they load, for device.sh's `templates` part.
if [ -f target/templates/replay.json ]; then
  python3 - <<'PY'
import json, tarfile
replay = json.load(open("target/templates/replay.json"))
inputs = sorted({s["copy"] for t in replay["templates"] for s in t["steps"] if "copy" in s})
with tarfile.open(".device/templates.tar.xz", "w:xz") as tar:
    tar.add("target/templates/replay.json", arcname="replay.json")
    for path in inputs:
        tar.add(path, arcname=f"inputs/{path}")
print(f"templates: {len(replay['templates'])} runs, {len(inputs)} input files")
PY
else
  rm -f .device/templates.tar.xz
  echo "no target/templates/replay.json: device.sh's templates part needs ./scripts/templates run first"
fi
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
pack=$(du -cb .device | tail -1 | cut -f1)
echo "tracked $((tree / 1048576)) MiB + untracked $((${untracked:-0} / 1048576)) MiB + .device $((pack / 1048576)) MiB (limit 64 MiB)"
