"""Estimator processes kept warm between estimates: reused, replaced after a crash, ended with
the kernel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._estimator.runner import WARM, close_warm_workers


@pytest.fixture(autouse=True)
def fresh_workers() -> Iterator[None]:
    close_warm_workers()
    yield
    close_warm_workers()


def mlp(width: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width))


def test_the_next_estimate_of_a_model_reuses_its_process() -> None:
    model = mlp()
    first = jv.estimate(model, "8x64", device="cpu")
    loaded = WARM.pids()
    assert len(loaded) == 2  # the process that ran it, and a spare for the next model
    again = jv.estimate(model, "8x64", device="cpu", optimizer="sgd")
    assert set(WARM.pids()) == set(loaded)  # nothing new started
    # by hand: AdamW keeps two fp32 moments and a 4-byte step per parameter tensor; the
    # estimator's SGD keeps one momentum buffer
    numel = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    assert first.peak_breakdown()["optimizer_state"] == 8 * numel + 4 * tensors
    assert again.peak_breakdown()["optimizer_state"] == 4 * numel


def test_another_model_takes_the_spare() -> None:
    jv.estimate(mlp(), "8x64", device="cpu")
    spare = set(WARM.pids())
    jv.estimate(mlp(32), "8x32", device="cpu")
    # one of the two kept processes is the former spare, which now holds the new model
    assert len(set(WARM.pids()) & spare) == 1


def test_a_crashed_warm_process_is_replaced() -> None:
    model = mlp()
    before = jv.estimate(model, "8x64", device="cpu").peak_bytes
    for pid in WARM.pids():
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in WARM.pids()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert jv.estimate(model, "8x64", device="cpu").peak_bytes == before


KERNEL = r"""
import sys
import torch
from torch import nn
import jupyter_vram as jv
from jupyter_vram._estimator.runner import WARM
jv.estimate(nn.Linear(8, 8), "2x8", device="cpu")
print(" ".join(map(str, WARM.pids())), flush=True)
sys.stdin.readline()
"""


def job_folders(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith("jupyter_vram_estimate_")]


def test_warm_processes_end_with_their_kernel(tmp_path: Path) -> None:
    folders = tmp_path / "tmp"
    folders.mkdir()
    env = {**os.environ, "TMPDIR": str(folders)}
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert kernel.stdout is not None
        pids = [int(p) for p in kernel.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        assert len(job_folders(folders)) == 2
        kernel.send_signal(signal.SIGKILL)
        kernel.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            alive = [
                p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
            ]
            if not alive and not job_folders(folders):
                break
            time.sleep(0.1)
        assert not alive, "a warm estimator process outlived its kernel"
        assert job_folders(folders) == []
    finally:
        if kernel.poll() is None:
            kernel.kill()


def test_a_spare_whose_kernel_went_away_as_it_answered_removes_its_folder(tmp_path: Path) -> None:
    """The kernel can die just as a spare says it is ready (its hello then breaks the pipe):
    the spare must still delete its job folder (CI once found one left behind)."""
    folder = tmp_path / "jupyter_vram_estimate_spare"
    folder.mkdir()
    (folder / "stderr.txt").write_text("")
    spare = subprocess.Popen(
        [sys.executable, "-m", "jupyter_vram._estimator.worker", "--spare", str(os.getpid()),
         str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert spare.stdout is not None
    spare.stdout.close()  # nobody reads its hello
    try:
        spare.wait(timeout=120)
    finally:
        if spare.poll() is None:
            spare.kill()
    assert not folder.exists()


class CachesOnFirstCall(nn.Module):
    """Builds a table on its first forward and keeps it (a lazy cache, like rotary tables)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.unused = nn.Linear(64, 1024)  # never called: no gradient, no optimizer state
        self.table: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            self.table = torch.ones(256, 1024)  # 1 MiB kept from the first step on
        return self.fc(x) * self.table[0, 0]


def tiny_gpt2() -> nn.Module:
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=64)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("make", [tiny_gpt2, CachesOnFirstCall], ids=["gpt2", "lazy-cache"])
def test_a_warm_process_predicts_what_a_fresh_one_does(make: type[nn.Module]) -> None:
    """Later runs in a warm process skip simulating the warm-up's forward and backward where
    the first run showed that they leave nothing behind; the answer must not change."""
    model = make()
    shape = "4x32" if make is tiny_gpt2 else "8x64"
    jv.estimate(model, shape, device="cpu")  # the first run: a whole warm-up step
    warm = {o: jv.estimate(model, shape, device="cpu", optimizer=o) for o in ("sgd", "adafactor")}
    for optimizer, estimate in warm.items():
        close_warm_workers()
        fresh = jv.estimate(model, shape, device="cpu", optimizer=optimizer)
        assert estimate.peak_breakdown() == fresh.peak_breakdown(), optimizer
        assert estimate.peak_bytes == fresh.peak_bytes


def live_curve(estimate: jv.Estimate) -> list[int]:
    """Bytes alive after each event of the simulated step, from the rows by hand: + size at
    each allocation, - size at each free (rows alive before the step count from the start)."""
    a = estimate.profile.allocations
    start = int(a.size[a.alloc_seq < 0].sum())
    deltas: dict[int, int] = {}
    columns = (a.size.tolist(), a.alloc_seq.tolist(), a.free_seq.tolist())
    for size, alloc, free in zip(*columns, strict=True):
        if alloc >= 0:
            deltas[alloc] = deltas.get(alloc, 0) + size
        if free >= 0:
            deltas[free] = deltas.get(free, 0) - size
    curve, live = [], start
    for seq in sorted(deltas):
        live += deltas[seq]
        curve.append(live)
    return curve


def rows_by_name(estimate: jv.Estimate) -> list[tuple[int, int, str, str, int, int]]:
    """Each allocation by size, when, op and module name, phase and category (free order
    among equal rows varies between runs: autocast frees its cached copies in hash order)."""
    p = estimate.profile
    a = p.allocations
    ops, modules = list(p.ops), list(p.modules)
    return sorted(
        (size, alloc, ops[op] if op >= 0 else "", modules[m] if m >= 0 else "", phase, cat)
        for size, alloc, op, m, phase, cat in zip(
            a.size.tolist(), a.alloc_seq.tolist(), a.op.tolist(), a.module.tolist(),
            a.phase.tolist(), a.category.tolist(), strict=True,
        )
    )  # fmt: skip


def test_a_warm_process_reusing_its_fake_model_predicts_what_a_fresh_one_does() -> None:
    """Later runs start from the previous run's fake parameters (same dtype) and, with the same
    optimizer, from its optimizer state, instead of a warm-up step; each must predict exactly
    what a fresh process predicts: the same rows, memory curve, peak and reserved memory."""
    model = tiny_gpt2()
    runs: list[dict[str, Any]] = [
        {},  # first run: a whole warm-up step
        {"amp": "bf16"},  # same optimizer: parameters and optimizer state reused
        {"optimizer": "sgd"},  # another optimizer: parameters reused, a new warm-up
        {"optimizer": "sgd", "checkpoint": True},
    ]
    warm = [jv.estimate(model, "4x32", **settings) for settings in runs]
    for settings, estimate in zip(runs, warm, strict=True):
        close_warm_workers()
        fresh = jv.estimate(model, "4x32", **settings)
        assert estimate.peak_bytes == fresh.peak_bytes, settings
        assert estimate.reserved_bytes == fresh.reserved_bytes, settings
        assert estimate.peak_breakdown() == fresh.peak_breakdown(), settings
        assert live_curve(estimate) == live_curve(fresh), settings
        assert rows_by_name(estimate) == rows_by_name(fresh), settings
