"""Shared fixtures: small real models, and a check that every test leaves recording off."""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from jupyter_vram._capture import RECORDING_LOCK, native
from jupyter_vram._capture.ticker import CHUNK_SIGNAL


def recording_state() -> dict[str, object]:
    """Everything a recorder may switch on; all must be back to normal after a recording."""
    return {
        "dispatch_modes": len(_get_current_dispatch_mode_stack()),
        "forward_pre_hooks": len(module_hooks._global_forward_pre_hooks),
        "forward_hooks": len(module_hooks._global_forward_hooks),
        "step_pre_hooks": len(optimizer_hooks._global_optimizer_pre_hooks),
        "step_post_hooks": len(optimizer_hooks._global_optimizer_post_hooks),
        "saved_tensor_hooks": torch._C._autograd._top_saved_tensors_default_hooks(False),
        "profiler": torch.autograd.profiler._is_profiler_enabled,
        "light_recorder": native.recording(),
        "profiler_start_hook": torch.autograd.profiler._run_on_profiler_start.__qualname__,
        "thread_profile": threading.getprofile(),
        "sigint": signal.getsignal(signal.SIGINT),
        "chunk_signal": signal.getsignal(CHUNK_SIGNAL) if CHUNK_SIGNAL else None,
        "helper_threads": sorted(
            t.name
            for t in threading.enumerate()
            if t.name.startswith("jupyter_vram-") and t.name not in NOT_RECORDING
        ),
        "lock": RECORDING_LOCK.locked(),
    }


#: our threads that are not part of a recording: an estimator process closed, or the spare
#: one `%load_ext` starts, in the background (each ends by itself within seconds; on a loaded
#: machine it may outlive a test)
NOT_RECORDING = frozenset(
    {"jupyter_vram-estimator-close", "jupyter_vram-estimator-start", "jupyter_vram-build"}
)
native.library()  # built (or loaded) before any test records, so every test records alike

STARTED_SIGINT = signal.getsignal(signal.SIGINT)
"""SIGINT's handler as the test session started: Python's default, or SIG_IGN where the session
was started with interrupts ignored (a background job, nohup, some CI runners)."""

CLEAN = {
    "dispatch_modes": 0,
    "forward_pre_hooks": 0,
    "forward_hooks": 0,
    "step_pre_hooks": 0,
    "step_post_hooks": 0,
    "saved_tensor_hooks": None,
    "profiler": False,
    "light_recorder": False,
    "profiler_start_hook": "_run_on_profiler_start",
    "thread_profile": None,
    "sigint": STARTED_SIGINT,
    "chunk_signal": signal.SIG_DFL if CHUNK_SIGNAL else None,
    "helper_threads": [],
    "lock": False,
}


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the block, as in a kernel running a request
    (ipykernel sets Python's handler then), whatever the session started with."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def recording_left_off() -> Iterator[None]:
    assert recording_state() == CLEAN
    yield
    assert recording_state() == CLEAN, "a test left recording (or one of its hooks) switched on"


class MLP(nn.Module):
    def __init__(self, d_in: int = 256, d_hidden: int = 512, d_out: int = 256) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def ipython_shell() -> Any:
    """IPython's test shell: one per process, started by whichever test module asks first."""
    from IPython.terminal.interactiveshell import TerminalInteractiveShell
    from IPython.testing.globalipapp import start_ipython

    start_ipython()
    return TerminalInteractiveShell.instance()


@pytest.fixture
def mlp() -> MLP:
    torch.manual_seed(0)
    return MLP()


def owned_breakdown(profile: object, index: int, prefix: str) -> dict[str, int]:
    """Category -> bytes live after event ``index`` in allocations charged to modules under
    ``prefix`` (tests share a process, so other tests' models may be alive too)."""
    import numpy as np

    from jupyter_vram._model import CATEGORIES

    prof = profile  # a jupyter_vram.Profile
    a = prof.allocations  # type: ignore[attr-defined]
    mask = prof.timeline.live_mask(index)  # type: ignore[attr-defined]
    names = np.array([m.startswith(prefix) for m in prof.modules], dtype=bool)  # type: ignore[attr-defined]
    mask &= names[a.module]
    sums = np.bincount(a.category[mask], weights=a.size[mask], minlength=len(CATEGORIES))
    return {c: int(v) for c, v in zip(CATEGORIES, sums, strict=True)}


@contextlib.contextmanager
def cuda_snapshot_generator() -> Iterator[ModuleType]:
    """tests/fixtures/make_cuda_snapshot.py, imported by path (it plays the CUDA allocator)."""
    path = Path(__file__).parent / "fixtures" / "make_cuda_snapshot.py"
    spec = importlib.util.spec_from_file_location("make_cuda_snapshot", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_cuda_snapshot"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["make_cuda_snapshot"]
