"""The README's sample report is what `python -m jupyter_vram demo` prints today.

Numbers that change from run to run (wall time, event count, milliseconds) are masked; every
label, category, module, op and site must be the same, so a change to the report or to how
the recorder attributes memory shows up here until `python scripts/readme_sample.py` is run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def masked(report: str) -> list[str]:
    lines = report.strip().splitlines()
    lines[0] = re.sub(r"· [\d.]+ s · [\d,]+ events", "· # s · # events", lines[0])
    lines[1] = re.sub(r"\([\d.]+ ms in", "(# ms in", lines[1])
    return lines


@pytest.mark.slow
def test_readme_sample_is_current(tmp_path: Path) -> None:
    from readme_sample import README, readme_sample

    out = subprocess.run(
        [sys.executable, "-m", "jupyter_vram", "demo", "--device", "cpu", "--save",
         str(tmp_path / "p.json.gz")],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\n\nprofile saved to", 1)[0]  # fmt: skip
    assert masked(readme_sample(README.read_text())) == masked(out)
