"""Bad input gets one clear line: devices this machine lacks, runaway rank counts and
timeouts, sizes of any length, numbers past 64 bits in snapshots, the wrong object given to
``jv.rerun``, a file that is neither a profile nor a snapshot. Nothing runs, no process starts,
no traceback shows, and the kernel records the next cell as before.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import jupyter_vram as jv
from jupyter_vram import ProfileFileError
from jupyter_vram import _cli as cli
from jupyter_vram._capture import RECORDING_LOCK, RecordingError
from jupyter_vram._capture.capacity import parse_capacity
from jupyter_vram._devices import memory_now
from jupyter_vram._rerun import RerunError
from jupyter_vram._snapshots.file import profile_from_snapshot_source

from .conftest import CLEAN, ipython_shell, recording_state

DID_NOT_RUN = "; the cell did not run"


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    ip = ipython_shell()
    ip.run_line_magic("load_ext", "jupyter_vram")
    ip.run_cell("import torch")
    yield ip


def one_line(
    shell: InteractiveShell, cell: str, capsys: pytest.CaptureFixture[str], *, prefix: str
) -> str:
    """Run ``cell``: it raises nothing, binds no ``ran_here``, and prints one line on stderr
    (no traceback, no ``.;``). Returns the line."""
    shell.user_ns.pop("ran_here", None)
    result = shell.run_cell(cell)
    assert result.error_before_exec is None and result.error_in_exec is None, result
    assert "ran_here" not in shell.user_ns, "the cell ran"
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith(prefix), lines[0]
    assert "Traceback" not in out.err + out.out and ".;" not in lines[0], lines[0]
    assert recording_state() == CLEAN
    return lines[0]


# -- 12: devices that hold nothing, or that this machine does not have ----------------------


def _missing(device: str) -> bool:
    if device == "mps":
        return not torch.backends.mps.is_available()
    if device == "xla":
        return importlib.util.find_spec("torch_xla") is None
    return True


@pytest.mark.parametrize("device", ["meta", "mps", "xla"])
def test_devices_without_memory_here_are_refused(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], device: str
) -> None:
    if not _missing(device):
        pytest.skip(f"this machine has {device}")
    line = one_line(
        shell, f"%%vram --device {device}\nran_here = torch.ones(10)", capsys, prefix="%%vram: "
    )
    assert line.endswith(DID_NOT_RUN)
    if device == "meta":
        assert "meta tensors hold no memory" in line
    else:
        assert f"device '{device}' is not available here" in line
    with pytest.raises(RecordingError), jv.record(device):
        pass  # pragma: no cover - never entered
    assert not RECORDING_LOCK.locked()


@pytest.mark.skipif(torch.cuda.device_count() > 7, reason="this machine has a cuda:7")
def test_line_magic_on_a_cuda_device_this_machine_lacks(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line(shell, "%vram --device cuda:7", capsys, prefix="%vram: ")
    if torch.cuda.is_available():
        assert "cuda:7 does not exist" in line
    else:
        assert "torch.cuda.is_available() is False" in line
    assert memory_now("cuda:7") == line  # called directly: the same line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_refused_without_a_stray_period(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line(shell, "%%vram --device cuda\nran_here = 1", capsys, prefix="%%vram: ")
    assert line.endswith("jv.record(device='cpu')" + DID_NOT_RUN)


def test_cli_run_on_a_device_without_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "s.py"
    script.write_text("ran_here = 1\n")
    assert cli.main(["run", "--device", "meta", "-o", str(tmp_path / "r.html"), str(script)]) == 2
    assert capsys.readouterr().err.startswith("jupyter-vram run: 'meta': meta tensors hold")
    assert not (tmp_path / "r.html").exists()


# -- 10 and 13: --nproc and --timeout ---------------------------------------------------------


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A machine of two CPUs and no GPU, where starting a process is recorded, not done."""
    started: list[object] = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    monkeypatch.setattr(subprocess, "call", lambda *a, **k: started.append(a))
    return started


MAIN = "\ndef main():\n    pass\nran_here = 1"


@pytest.mark.parametrize("nproc", ["3", "99999999999999999999", "0", "-2"])
def test_nproc_is_bounded_by_the_machine(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], two_cpus: list[object], nproc: str
) -> None:
    line = one_line(shell, f"%%vram --nproc {nproc}{MAIN}", capsys, prefix="%%vram: --nproc")
    assert line.endswith(DID_NOT_RUN)
    if int(nproc) > 2:
        assert f"--nproc {nproc} is more ranks than this machine can run at once: at most 2" in line
    else:
        assert "at least 1" in line
    assert two_cpus == []  # no process started
    with pytest.raises(ValueError, match="at most 2"):
        jv.launch(print, nproc=10**400)
    assert cli.main(["run", "--nproc-per-node", nproc, __file__]) == 2
    assert "--nproc-per-node" in capsys.readouterr().err
    assert two_cpus == []


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "1e300"])
def test_timeout_must_be_a_real_number_of_seconds(
    shell: InteractiveShell,
    capsys: pytest.CaptureFixture[str],
    two_cpus: list[object],
    timeout: str,
) -> None:
    cell = f"%%vram --nproc 2 --timeout {timeout}{MAIN}"
    line = one_line(shell, cell, capsys, prefix="%%vram: --timeout must be more than 0 seconds")
    assert line.endswith(DID_NOT_RUN) and two_cpus == []


# -- 13: sizes, snapshots, rerun, files ---------------------------------------------------------


def test_capacity_of_any_length_and_unit() -> None:
    assert parse_capacity("1PB") == 10**15
    assert parse_capacity("1PiB") == 2**50
    assert parse_capacity("1125899906842624") == 2**50  # 1 PiB in bytes: the most taken
    for too_big in ("1" * 400, "99999TiB", "1125899906842625", "2PB", 10**400, 1e300):
        with pytest.raises(ValueError, match=r"more than any device holds \(at most 1 PiB"):
            parse_capacity(too_big)
    for not_positive in ("0", "0.1", 0):
        with pytest.raises(ValueError, match="must be a positive size"):
            parse_capacity(not_positive)


def test_magic_capacity_of_400_digits(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = f"%%vram --capacity {'1' * 400}\nran_here = 1"
    line = one_line(shell, cell, capsys, prefix="%%vram: capacity '1111")
    assert "more than any device holds" in line and line.endswith(DID_NOT_RUN)
    assert len(line) < 200


def snapshot(size: int = 4096, time_us: int = 1_000_000, addr: int = 1 << 20) -> dict[str, Any]:
    """A one-device snapshot: one block allocated and freed."""
    entry = {"addr": addr, "size": size, "stream": 0, "frames": []}
    return {
        "segments": [],
        "device_traces": [
            [
                {**entry, "action": "alloc", "time_us": time_us},
                {**entry, "action": "free_completed", "time_us": time_us + 5},
            ]
        ],
    }


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"size": 2**70}, "too large"),
        ({"time_us": 10**30}, "too large"),
        ({"addr": 2**70}, "too large"),
        ({"size": -512}, "trace entry 0: size -512 is out of range"),
        ({"addr": -5}, "trace entry 0: address -5 is out of range"),
    ],
)
def test_snapshot_numbers_out_of_range(tmp_path: Path, change: dict[str, int], says: str) -> None:
    """Each way in (a dict, a pickle read whole, a pickle streamed) says ProfileFileError."""
    data = snapshot(**change)  # type: ignore[arg-type]
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    for source, stream in ((data, None), (path, False), (path, True)):
        with pytest.raises(ProfileFileError, match=says):
            profile_from_snapshot_source(source, stream=stream)  # type: ignore[arg-type]
    assert jv.Profile.from_snapshot(snapshot()).peak_bytes == 4096  # the same, in range


@pytest.mark.parametrize("what", [5, None, "_vram"])
def test_rerun_of_something_else_is_one_line(what: object) -> None:
    with pytest.raises(RerunError, match=r"^rerun needs a profile made by %%vram") as info:
        jv.rerun(what)  # type: ignore[arg-type]
    assert type(what).__name__ in str(info.value) and "\n" not in str(info.value)
    assert jv.rerun_unavailable(what) == str(info.value)  # type: ignore[arg-type]


def test_report_of_a_file_that_is_neither(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, data in (("random.pickle", bytes(range(7, 256)) * 10), ("text.pickle", b"hello")):
        (tmp_path / name).write_bytes(data)
        assert cli.main(["report", str(tmp_path / name), "-o", str(tmp_path / "r.html")]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"jupyter-vram report: {tmp_path / name}: neither a jupyter_vram profile (JSON, "
            "maybe gzip) nor a PyTorch memory snapshot (a torch.cuda.memory._dump_snapshot "
            "pickle)"
        )


# -- 13: a trailing semicolon ------------------------------------------------------------------


def test_trailing_semicolon_hides_the_value_as_without_vram(shell: InteractiveShell) -> None:
    for cell, shown in (
        ("1 + 1;", None),
        ("1 + 1;  # a comment", None),
        ("1 + 1", 2),
        ("x = 'a;'\nx", "a;"),
    ):
        plain = shell.run_cell(cell, store_history=True).result
        recorded = shell.run_cell(f"%%vram -q\n{cell}", store_history=True).result
        assert plain == recorded == shown, cell
    assert recording_state() == CLEAN


def test_record_refuses_an_unknown_ops_value() -> None:
    """``jv.record(ops=...)`` reaches the recording: an unknown value is refused at once (it
    was once dropped, so ``ops="all"`` did nothing)."""
    with pytest.raises(ValueError, match="ops must be 'auto' or 'all'"):
        jv.record("cpu", ops="every")
