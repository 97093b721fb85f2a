"""The ``jupyter-vram`` command end to end, in subprocesses: outputs and exit codes."""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import jupyter_vram as jv
from jupyter_vram import _cli as cli
from jupyter_vram._units import format_bytes

ROOT = Path(__file__).parent.parent
H200 = Path(__file__).parent / "fixtures" / "h200"


def jupyter_vram(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_vram._cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_console_script_points_at_the_cli() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["jupyter-vram"].partition(":")
    assert module == "jupyter_vram._cli" and getattr(cli, name) is cli.main


@pytest.mark.slow
def test_run_profiles_a_script_and_fails_with_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "kept = torch.ones(1000 * int(sys.argv[1]))\n"  # float32: 4 bytes each
        "if sys.argv[2:] == ['--crash']:\n"
        "    raise RuntimeError('boom in the script')\n"
    )
    ok = jupyter_vram(
        "run", "--device", "cpu", "-o", "r.html", "--save", "p.json.gz", script, "3", cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    assert "<html" in (tmp_path / "r.html").read_text()[:2000].lower()
    assert jv.Profile.load(tmp_path / "p.json.gz").peak_bytes == 3 * 1000 * 4
    assert ok.stderr == ""  # no progress when stderr is not a terminal

    bad = jupyter_vram(
        "--progress", "run", "--device", "cpu", "-o", "bad.html", "--save", "bad.json.gz",
        script, "5", "--crash", cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 1
    assert "boom in the script" in bad.stderr and "running train.py" in bad.stderr
    partial = jv.Profile.load(tmp_path / "bad.json.gz")  # the run up to the error
    assert partial.peak_bytes == 5 * 1000 * 4
    assert (tmp_path / "bad.html").exists()


@pytest.mark.slow
def test_report_and_compare_snapshots_and_bad_input(tmp_path: Path) -> None:
    for name in ("mlp_step1", "mlp_step2"):
        raw = json.loads(gzip.decompress((H200 / f"{name}.snapshot.json.gz").read_bytes()))
        (tmp_path / f"{name}.pickle").write_bytes(pickle.dumps(raw["snapshot"]))
    rep = jupyter_vram("report", "mlp_step1.pickle", "-o", "one.html", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    peak = jv.Profile.from_snapshot(tmp_path / "mlp_step1.pickle").peak_bytes
    assert f"peak {format_bytes(peak)}" in rep.stdout
    assert (tmp_path / "one.html").stat().st_size > 10_000

    diff = jupyter_vram("compare", "mlp_step1.pickle", "mlp_step2.pickle", "-o", "d.html",
                        cwd=tmp_path)  # fmt: skip
    assert diff.returncode == 0, diff.stderr
    page = (tmp_path / "d.html").read_text()
    assert "peak" in page and "optimizer_state" in page

    (tmp_path / "junk.pickle").write_bytes(b"not a pickle at all")
    for args in (("report", "missing.pickle"), ("report", "junk.pickle"), ("nonsense",)):
        bad = jupyter_vram(*args, cwd=tmp_path)
        assert bad.returncode == 2, (args, bad.stderr)
        assert bad.stderr.strip()


@pytest.mark.slow
def test_estimate_a_model_factory(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(
        "import torch.nn as nn\n"
        "def build():\n"
        "    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))\n"
    )
    est = jupyter_vram("estimate", "model.py:build", "--input", "32x256", "--device", "cpu",
                       "--optimizer", "adam", "-o", "e.html", cwd=tmp_path)  # fmt: skip
    assert est.returncode == 0, est.stderr
    # 256 x 512 + 512 + 512 x 10 + 10 = 136,714 parameters x 4 bytes = 534.0 KiB
    assert "136.7K parameters" in est.stdout
    assert "parameter          534.0 KiB" in est.stdout
    assert "optimizer_state      1.0 MiB" in est.stdout  # Adam: two moments
    assert (tmp_path / "e.html").exists()
    missing = jupyter_vram("estimate", "model.py:nope", cwd=tmp_path)
    assert missing.returncode == 2 and "nope is not a function" in missing.stderr


def test_python_m_jupyter_vram_hands_the_cli_commands_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from jupyter_vram.__main__ import main

    assert main(["report", str(tmp_path / "missing.pickle")]) == 2
    assert "no such file" in capsys.readouterr().err
