#!/usr/bin/env bash
# Set up and run the tests: lint (ruff), types (mypy), then pytest. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check jupyter_vram tests bench scripts
ruff format --check jupyter_vram tests bench scripts
mypy
python -m pytest "$@"
