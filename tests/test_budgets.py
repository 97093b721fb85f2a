"""Memory budgets that hold: `%%vram --max` (the cell runs, then fails past its limit),
`jv.assert_fits` (an estimated step against a GPU, no GPU needed) and the pytest marker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import ipython_shell

CELL = "kept = torch.zeros(1 << 16)  # 256 KiB\nprint('ran to the end')\n"


@pytest.fixture(scope="module")
def shell() -> Iterator[Any]:
    ip = ipython_shell()
    ip.run_line_magic("load_ext", "jupyter_vram")
    ip.run_cell("import torch")
    yield ip
    ip.user_ns.pop("kept", None)
    ip.user_ns.pop("_vram", None)


def test_max_fails_a_cell_over_its_limit_after_the_cell_ran(
    shell: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from jupyter_vram._magics import VramLimitExceeded

    result = shell.run_cell("%%vram --text --max 100KiB\n" + CELL)
    out = capsys.readouterr().out
    assert isinstance(result.error_in_exec, VramLimitExceeded)
    assert shell.user_ns["kept"].numel() == 1 << 16  # the cell ran to its end
    message = str(result.error_in_exec)
    # 65536 float32 = 262144 bytes live at the peak, the limit 102400
    assert "256.0 KiB exceeded the limit 100.0 KiB" in message
    assert "1. " in message and "zeros" in message  # the site that made the peak
    ran, summary, error = (out.index(s) for s in ("ran to the end", "peak", "VramLimitExceeded"))
    assert ran < summary < error  # the cell's output, the profile, then the error


def test_max_passes_a_cell_under_its_limit(shell: Any) -> None:
    result = shell.run_cell("%%vram --quiet --max 1MiB\n" + CELL)
    assert result.success
    assert shell.user_ns["_vram"].peak_bytes >= 1 << 18


def test_a_bad_max_stops_the_cell_before_it_runs(
    shell: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.user_ns.pop("kept", None)
    result = shell.run_cell("%%vram --quiet --max lots\n" + CELL)
    assert result.success and "kept" not in shell.user_ns
    assert "the cell did not run" in capsys.readouterr().err


def test_assert_fits_passes_a_small_model_on_a_t4() -> None:
    import jupyter_vram as jv

    from .conftest import MLP

    # 263k parameters: a few MiB of weights, gradients and state beside a 16 GB card
    estimate = jv.assert_fits(MLP(), "8x256", gpu="T4", optimizer="adamw")
    assert estimate.peak_bytes < 2**30


@pytest.mark.slow
def test_assert_fits_fails_a_7b_adamw_step_on_a_t4_naming_the_gpu() -> None:
    import re

    import torch

    import jupyter_vram as jv

    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    assert 6.5e9 < n_params < 7e9
    with pytest.raises(AssertionError) as failure:
        jv.assert_fits(model, "1x64", gpu="T4", optimizer="adamw")
    message = str(failure.value)
    assert "does not fit a T4" in message
    assert "parameter" in message and "optimizer_state" in message
    # fp32 AdamW holds 16 bytes a parameter (weights, gradients, two moments) at the least
    found = re.search(r"predicted device memory ([0-9.]+) GiB", message)
    assert found is not None and float(found.group(1)) >= 16 * n_params / 2**30 * 0.99


MARKED_TESTS = """
import pytest
import torch


@pytest.mark.vram(max="1MiB")
def test_under():
    kept = torch.zeros(1 << 16)  # 256 KiB
    assert kept.sum() == 0


@pytest.mark.vram(max="1MiB")
def test_over():
    kept = torch.zeros(1 << 19)  # 2 MiB
    assert kept.sum() == 0


def test_unmarked():
    assert torch.zeros(1 << 20).sum() == 0  # 4 MiB, no limit
"""


def run_pytest(folder: Any, *args: str) -> Any:
    """pytest in a fresh process on a temporary test file, loading the plugin as the entry
    point does (``-p``: this checkout may not be the installed one)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (folder / "test_marked.py").write_text(MARKED_TESTS)
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    command = [sys.executable, "-m", "pytest", "-p", "jupyter_vram.pytest_plugin", "-q"]
    return subprocess.run(
        [*command, "-p", "no:cacheprovider", *args, str(folder / "test_marked.py")],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_the_marker_fails_an_over_limit_test_and_passes_an_under_limit_one(tmp_path: Any) -> None:
    done = run_pytest(tmp_path, "--vram-report")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "1 failed, 2 passed" in out
    assert "FAILED test_marked.py::test_over" in out
    # the failure says by how much, and where: 2 MiB of zeros against 1 MiB
    assert "peak 2.0 MiB exceeded the limit 1.0 MiB" in out and "zeros" in out
    report = out[out.index("vram peaks") :]
    assert "ok" in report and "256.0 KiB" in report and "test_marked.py::test_under" in report
    assert "over" in report and "test_marked.py::test_over" in report
    assert "test_unmarked" not in report


def test_the_plugin_is_registered_by_entry_point() -> None:
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    entry = '[project.entry-points.pytest11]\njupyter_vram = "jupyter_vram.pytest_plugin"\n'
    assert entry in pyproject
