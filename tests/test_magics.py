"""`%%vram` / `%vram` in a real IPython shell."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

import jupyter_vram as jv


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    ip = start_ipython()
    assert ip is not None
    ip.run_line_magic("load_ext", "jupyter_vram")
    ip.run_cell(
        "import torch\nfrom torch import nn\nmodel = nn.Linear(64, 32)\nx = torch.randn(8, 64)"
    )
    yield ip
    ip.run_cell("del model, x")


def test_cell_magic_runs_in_user_namespace_and_returns_last_value(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    result = shell.run_cell("%%vram\ny = model(x)\ny.sum().backward()\ny.shape")
    assert result.success
    assert tuple(result.result) == (8, 32)
    assert shell.user_ns["y"].shape == (8, 32)
    out = capsys.readouterr().out
    assert "peak" in out and "at the peak:" in out and "parameter" in out
    prof = shell.user_ns["_vram"]
    assert isinstance(prof, jv.Profile) and jv.last_profile() is prof
    assert prof.peak_breakdown()["gradient"] == 4 * (64 * 32 + 32)


def test_error_in_cell_reaches_user_and_profile_is_kept(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    result = shell.run_cell("%%vram\nz = torch.ones(1000)\nraise RuntimeError('cell failed')")
    assert not result.success
    assert isinstance(result.error_in_exec, RuntimeError)
    out = capsys.readouterr().out
    assert "the cell raised RuntimeError: cell failed" in out
    assert shell.user_ns["_vram"].error == "RuntimeError: cell failed"
    assert shell.run_cell("1 + 1").result == 2  # the shell keeps working


def test_empty_cell(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    before = shell.user_ns.get("_vram")
    assert shell.run_cell("%%vram\n\n").success
    assert "empty" in capsys.readouterr().out
    assert shell.user_ns.get("_vram") is before


def test_nested_cell_magic(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    cell = (
        "%%vram\nw = torch.ones(64)\nget_ipython().run_cell_magic('vram', '', 'v = torch.ones(8)')"
    )
    assert shell.run_cell(cell).success
    out = capsys.readouterr().out
    assert "nested cell ran without its own recording" in out
    assert shell.user_ns["v"].shape == (8,)


def test_cell_with_ipython_syntax(shell: InteractiveShell) -> None:
    result = shell.run_cell("%%vram -q\nn = %time 3\nn")
    assert result.success and result.result == 3


def test_line_magic_shows_memory_now(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell("%vram")
    out = capsys.readouterr().out
    assert "held by live tensors" in out and "parameter" in out
