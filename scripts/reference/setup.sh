#!/usr/bin/env bash
# Creates the reference venv at target/reference-venv (dev only; never run by the test command) and prints its
# python. Usage: scripts/reference/setup.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=target/reference-venv
if ! "$venv/bin/python" -c "import torch, diffusers, transformers, tokenizers" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-deps -r scripts/reference/requirements.txt
fi
echo "$venv/bin/python"
