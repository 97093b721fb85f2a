"""`%%vram` / `%vram` in a real IPython shell."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

import jupyter_vram as jv

from .conftest import ipython_shell


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    ip = ipython_shell()
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
    # at the end (the peak comes earlier: mm's backward clones its input inside the op)
    end = prof.timeline.breakdown_at(len(prof.timeline) - 1)
    assert end["gradient"] == 4 * (64 * 32 + 32)


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


def test_estimate_magic_text_and_comparison(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """`%vram_estimate` binds the estimate; a later `%%vram` of the model is compared with it."""
    result = shell.run_cell("%vram_estimate model --input x --device cpu --optimizer sgd --text")
    assert result.success
    out = capsys.readouterr().out
    assert "jupyter_vram estimate · Linear" in out and "input 8x64" in out
    est = shell.user_ns["_vram_estimate"]
    assert isinstance(est, jv.Estimate)
    assert est.peak_breakdown()["parameter"] == 4 * (64 * 32 + 32)
    shell.run_cell(
        "opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n"
        "def step():\n"
        "    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"
        "    opt.zero_grad(set_to_none=True)\n"
        "step()"
    )
    capsys.readouterr()
    assert shell.run_cell("%%vram --text\nstep()").success
    from jupyter_vram._session import matching_estimate

    measured = shell.user_ns["_vram"]
    assert matching_estimate(measured) is est
    comparison = est.compare(measured)
    assert comparison.same_device
    # the kernel holds tensors of earlier cells (in a long test session, of earlier tests
    # too: another model's parameters): counted, and set apart as unrelated; the step and
    # what was set apart make up the whole measured peak
    assert comparison.unrelated_bytes >= (
        measured.peak_breakdown()["other"] - est.peak_breakdown()["other"]
    )
    assert comparison.measured_bytes + comparison.unrelated_bytes == measured.peak_bytes
    # the measurement also sees a copy mm's backward makes inside the op (its gradient input
    # is an expanded view), which a fake-tensor run cannot: 1 KiB of this 32 KiB toy
    assert abs(comparison.relative_difference) < 0.05


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("nosuch --input 2x64", "cannot evaluate the model 'nosuch'"),
        ("x --input 2x64", "must be a torch.nn.Module"),
        ("model --input 2x65", "rejected the input"),
        ("model --input 2x64 --gpu quantum9000", "unknown GPU"),
        ("model --input 2x64 --optimizer adamax9000", "unknown optimizer"),
        ("model --input banana", "cannot read the shape"),
    ],
)
def test_estimate_magic_bad_input_is_a_message(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    result = shell.run_cell(f"%vram_estimate {line} --text")
    assert result.success  # a message, not an exception in the user's cell
    out = capsys.readouterr().out
    assert out.count("%vram_estimate:") == 1 and message in out
    assert "Traceback" not in out
