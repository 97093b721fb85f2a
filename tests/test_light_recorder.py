"""The light recorder (a C++ memory reporter + RecordFunction callback, built on first use)
against torch.profiler's own event tree: two independent readings of the same allocator
reports must give the same allocations, ops, modules, phases and categories."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import jupyter_vram as jv
from jupyter_vram._capture import native

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def reader() -> Iterator[Callable[[str], None]]:
    """Choose the reading for the next recordings: "light" or "profiler"."""
    saved = os.environ.get("JUPYTER_VRAM_NATIVE")

    def choose(which: str) -> None:
        os.environ["JUPYTER_VRAM_NATIVE"] = "1" if which == "light" else "0"

    yield choose
    if saved is None:
        os.environ.pop("JUPYTER_VRAM_NATIVE", None)
    else:
        os.environ["JUPYTER_VRAM_NATIVE"] = saved


def test_the_library_builds_here() -> None:
    assert native.library() is not None, native.why_not()
    assert native.why_not() == ""


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        self.embed = nn.Conv1d(8, 32, 3, padding=1)
        self.blocks = nn.ModuleList(Block(32) for _ in range(3))
        self.head = nn.Linear(32, 5)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).transpose(1, 2)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=False) if self.checkpointed else block(h)
        return self.head(h).mean(1)


def _steps(checkpointed: bool) -> Callable[[], None]:
    torch.manual_seed(0)
    model = Stack(checkpointed)
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(4, 8, 16), torch.randint(0, 5, (4,))

    def steps() -> None:
        for _ in range(3):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    steps()
    return steps


COLUMNS = ["op", "module", "phase", "category", "bytes", "alloc_seq", "free_seq"]


def _rows(profile: jv.Profile) -> pd.DataFrame:
    df = profile.to_dataframe()
    return df[df["alloc_seq"] >= 0][COLUMNS].astype(str).reset_index(drop=True)


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_light_and_profiler_readings_agree(
    reader: Callable[[str], None], checkpointed: bool
) -> None:
    steps = _steps(checkpointed)
    profiles = {}
    for which in ("profiler", "light", "profiler"):
        reader(which)
        with jv.record("cpu") as rec:
            steps()
        profiles[which] = rec.profile
    light, traced = profiles["light"], profiles["profiler"]
    assert light.meta["reports_from"] == "light recorder"
    assert traced.meta["reports_from"] == "torch.profiler"
    assert light.meta["reports"] == traced.meta["reports"] > 100
    assert light.peak_bytes == traced.peak_bytes
    a, b = _rows(light), _rows(traced)
    assert len(a) > 50
    pd.testing.assert_frame_equal(a, b)
    # the readings name real things: backward's ops have their forward op's module
    backward = set(a[a["phase"] == "backward"]["module"])
    assert {"Stack.head", "Stack.blocks.2.up", "Stack.embed"} <= backward, backward


def test_a_users_profiler_inside_takes_the_reports_and_gives_them_back(
    reader: Callable[[str], None],
) -> None:
    reader("light")
    with jv.record("cpu") as rec:
        before = torch.ones(1000)
        with torch.profiler.profile(profile_memory=True) as users_own:
            inside = torch.ones(2000)
        after = torch.ones(3000)
    assert any(e.cpu_memory_usage == 8000 for e in users_own.events())  # theirs worked
    sizes = set(rec.profile.to_dataframe()["bytes"])
    assert {4000, 12000} <= sizes and 8000 not in sizes  # it had the reports meanwhile
    assert any("incomplete" in w for w in rec.profile.meta["warnings"])
    assert torch.autograd.profiler._run_on_profiler_start.__module__ == "torch.autograd.profiler"
    del before, inside, after


def test_without_a_compiler_the_profiler_reads_and_the_profile_says_why(tmp_path: Path) -> None:
    code = (
        "import torch, jupyter_vram as jv\n"
        "with jv.record('cpu') as rec:\n"
        "    x = torch.ones(256)\n"
        "print(rec.profile.meta['reports_from'])\n"
        "print(rec.profile.peak_bytes)\n"
        "print(rec.profile.meta['warnings'][0])\n"
    )
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path),  # nothing built there
        "CXX": str(tmp_path / "no-such-compiler"),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("JUPYTER_VRAM_NATIVE", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "torch.profiler"
    assert lines[1] == str(256 * 4)
    assert "could not be built" in lines[2] and "no-such-compiler" in lines[2]


def test_a_process_forked_while_recording_records_nothing() -> None:
    """A DataLoader worker forked mid-cell inherits the callback: it must neither record nor
    grow (its ops would otherwise add to arrays nobody reads)."""
    with jv.record("cpu") as rec:
        kept = torch.ones(100)
        pid = os.fork()
        if pid == 0:  # the child: run ops, then say whether it thinks it records
            for _ in range(1000):
                torch.ones(10).add_(1)
            os._exit(3 if native.recording() else 0)
        _, status = os.waitpid(pid, 0)
        more = torch.ones(200)
    assert os.waitstatus_to_exitcode(status) == 0
    assert rec.profile.peak_bytes == 4 * 100 + 4 * 200
    del kept, more


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x * 2

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad * 2


def test_custom_autograd_functions_run_under_the_light_recorder() -> None:
    """torch reads what sits in the thread's profiler-state slot as a profiler's state when a
    custom autograd Function applies (bitsandbytes' 4-bit matmul is one): a bare memory
    reporter there made that apply fail (std::bad_alloc) or crash the process."""
    x = torch.randn(64, requires_grad=True)
    with jv.record("cpu") as rec:
        for _ in range(500):
            _Twice.apply(x).sum().backward()
    assert rec.profile.meta["reports_from"] == "light recorder"
    assert x.grad is not None and torch.equal(x.grad, torch.full((64,), 2.0 * 500))


def test_a_profile_names_only_the_ops_its_own_reports_made() -> None:
    """The library's name table lives as long as the process: a later recording's profile must
    not list the ops an earlier one ran (the plan reads "BatchNorm in the run" from them)."""
    with jv.record("cpu"):
        nn.BatchNorm1d(4)(torch.randn(8, 4))
    with jv.record("cpu") as rec:
        kept = torch.ones(1000) * 2
    ops = set(rec.profile.ops)
    assert "mul" in ops
    assert not any("batch_norm" in op for op in ops), ops
    del kept


def test_a_broken_cached_library_is_built_again(tmp_path: Path) -> None:
    """A cached library that does not load (a truncated file) is rebuilt, not a fallback for
    ever after."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("JUPYTER_VRAM_NATIVE", None)
    spoil = "from jupyter_vram._capture import native\nnative._built().write_bytes(b'broken')\n"
    record = (
        "import torch, jupyter_vram as jv\n"
        "with jv.record('cpu') as rec:\n"
        "    x = torch.ones(64)\n"
        "print(rec.profile.meta['reports_from'], rec.profile.peak_bytes)\n"
    )
    for code in (spoil, record):
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["light", "recorder", "256"]


def test_library_pairs_reports_as_the_python_rule_does() -> None:
    """The library's pairing (``jv_links``) and the Python one give the same links on reports
    with every case in them: frees of live blocks, frees of nothing recorded, blocks reused
    at one address, and allocations over live blocks' bytes (frees no report gave)."""
    from jupyter_vram._capture.cpu_rows import links_in_python

    assert native.library() is not None
    rng = np.random.default_rng(7)
    for trial in range(20):
        n = 2000
        ptr = rng.integers(0, 64, n) * 16  # a small arena: addresses collide often
        size = rng.integers(1, 80, n) * np.where(rng.random(n) < 0.5, 1, -1)
        size[rng.random(n) < 0.02] = 0
        expected = _links_by_hand(ptr.tolist(), size.tolist())
        assert links_in_python(ptr, size).tolist() == expected, trial
        found = native.links(ptr, size)
        assert found is not None and found.tolist() == expected, trial


def _links_by_hand(ptr: list[int], size: list[int]) -> list[int]:
    """The rule, the slow obvious way: a list of live blocks searched whole."""
    link = [-1] * len(ptr)
    live: list[tuple[int, int, int]] = []  # (start, end, allocation)
    for i, (start, n) in enumerate(zip(ptr, size, strict=True)):
        if n > 0:
            for block in [b for b in live if b[0] < start + n and start < b[1]]:
                live.remove(block)
                link[block[2]] = i
            live.append((start, start + n, i))
        elif n < 0:
            for block in live:
                if block[0] == start:
                    live.remove(block)
                    link[block[2]], link[i] = i, block[2]
                    break
    return link
