"""Recorders: the only place that touches private torch APIs."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any, Protocol

from ..model import Profile


class Recorder(Protocol):
    """Start recording, and stop into a Profile (stop must always switch recording off)."""

    source: str
    device: str

    def start(
        self, entry_frame: FrameType | None = None, namespace: Mapping[str, Any] | None = None
    ) -> None: ...

    def stop(self, error: str | None = None) -> Profile: ...


class RecordingError(RuntimeError):
    """Recording could not start (already recording, unavailable device, ...)."""


#: One recorder at a time per process: dispatch modes and the CUDA allocator history are
#: process-wide, so nested recording would corrupt both.
RECORDING_LOCK = threading.Lock()


def parse_device(device: str | None) -> str:
    """A device name a recorder accepts, or a RecordingError that says which ones are."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise RecordingError(
            f"unknown device {device!r}: record 'cpu', 'cuda' or 'cuda:N'"
        ) from None
    if dev.type == "cpu" and dev.index not in (None, 0):
        raise RecordingError(f"{device!r}: the CPU has one memory, not one per index; record 'cpu'")
    return "cpu" if dev.type == "cpu" else str(dev)


def make_recorder(device: str | None, *, stacks: bool = True) -> Recorder:
    """The recorder for a device: the allocator's history on CUDA, its reports to the torch
    profiler on the CPU (the dispatch tracker when the user's own profiler is running), the
    dispatch tracker for fake and meta tensors, which allocate nothing."""
    import torch

    name = parse_device(device)
    dev = torch.device(name)
    if dev.type == "cuda":
        from .cuda_snapshot import CudaSnapshotRecorder

        return CudaSnapshotRecorder(dev, stacks=stacks)
    if dev.type == "cpu":
        from .profiler_events import ProfilerRecorder, profiler_busy

        if not profiler_busy():
            return ProfilerRecorder(name, stacks=stacks)
    from .dispatch import DispatchRecorder

    return DispatchRecorder(name, stacks=stacks)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (a kernel interrupt) until the block is done, then raise it.

    Starting and stopping a recorder switches process-wide state on and off in several steps;
    an interrupt between two of them would leave some on, or lose the profile. Only the main
    thread receives signals; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[object] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(frame)

    try:
        previous = signal.signal(signal.SIGINT, hold)
    except (ValueError, OSError):  # not allowed here (an embedded interpreter)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt
