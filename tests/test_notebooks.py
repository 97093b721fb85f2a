"""Every committed notebook runs top to bottom on CPU and is committed without outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
sys.path.insert(0, str(ROOT / "scripts"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_without_outputs(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    assert not any(c.get("outputs") or c.get("execution_count") for c in cells)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_runs_top_to_bottom(path: Path, tmp_path: Path) -> None:
    from run_notebook import run

    copy = tmp_path / path.name
    copy.write_text(path.read_text())
    nb = run(copy)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
