"""What every recorder shares: the Recorder protocol, the one-at-a-time lock, the error,
and deferring Ctrl-C while process-wide state is switched.

Apart from the package's ``__init__`` so that the recorders (``cuda_snapshot``,
``cpu_recorder``) import it without importing the package that picks between them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any, Protocol

from .._model import Profile


class Recorder(Protocol):
    """Start recording, and stop into a Profile (stop must always switch recording off)."""

    source: str
    device: str

    def start(
        self, entry_frame: FrameType | None = None, namespace: Mapping[str, Any] | None = None
    ) -> None: ...

    def stop(self, error: str | None = None) -> Profile: ...


#: Python stacks of allocations: sampled by a helper thread (cheap), traced by the profiler
#: (exact; every Python call is recorded), or none
STACK_MODES = ("sampled", "full", "none")


def stack_mode(stacks: bool | str | None) -> str:
    """``True`` -> ``"full"``, ``False`` / ``None`` -> ``"none"``, else one of STACK_MODES."""
    if stacks is True:
        return "full"
    if stacks is False or stacks is None:
        return "none"
    if stacks not in STACK_MODES:
        raise ValueError(f"stacks must be one of {', '.join(STACK_MODES)}, not {stacks!r}")
    return stacks


class RecordingError(RuntimeError):
    """Recording could not start (already recording, unavailable device, ...)."""


#: One recorder at a time per process: dispatch modes and the CUDA allocator history are
#: process-wide, so nested recording would corrupt both.
RECORDING_LOCK = threading.Lock()


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
