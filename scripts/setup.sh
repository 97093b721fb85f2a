#!/usr/bin/env bash
# Create .venv (if missing) and install jupyter_vram with the given extras, torch pinned to the
# CPU wheel through constraints.txt. Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh test
# The install also builds the JupyterLab extension (labextension/ -> jupyter_vram/labextension,
# with jlpm and Node.js >= 20.19) unless that build is newer than labextension/src.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -f jupyter_vram/labextension/package.json ] && ! command -v node >/dev/null; then
    echo "setup.sh: Node.js (>= 20.19) is needed to build the lab extension" >&2
    exit 1
fi
python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
target="."
[ -n "$extras" ] && target=".[$extras]"
python -m pip install --quiet --constraint constraints.txt --editable "$target"
