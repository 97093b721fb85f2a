#!/usr/bin/env bash
# Set up and run the main job: record a training step of the built-in small GPT and print where the
# memory went (CUDA when available, else CPU), estimate the same model's step on a GPU without
# one (fake tensors), then execute notebooks/quickstart.ipynb headlessly.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh notebook
# shellcheck disable=SC1091
. .venv/bin/activate
python -m jupyter_vram demo --save build/quickstart_profile.json.gz
python -m jupyter_vram estimate --gpu T4
python scripts/run_notebook.py notebooks/quickstart.ipynb build/quickstart.ipynb
