#!/usr/bin/env bash
# Create .venv (if missing) and install jupyter_vram with the given extras, torch pinned to the
# CPU wheel through constraints.txt. Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
target="."
[ -n "$extras" ] && target=".[$extras]"
python -m pip install --quiet --constraint constraints.txt --editable "$target"
