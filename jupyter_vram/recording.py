"""`jv.record()`: record the allocations of a block of code into a Profile."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

from .capture import RECORDING_LOCK, Recorder, RecordingError, make_recorder
from .model import Profile


class Recording:
    """Context manager around one recorder; `.profile` is ready once the block exits.

    The profile is kept even when the block raises (it covers the run up to the error), and
    recording is switched off on every exit path.
    """

    def __init__(
        self,
        device: str | None = None,
        *,
        stacks: bool = True,
        namespace: Mapping[str, Any] | None = None,
    ) -> None:
        self._device = device
        self._stacks = stacks
        self._namespace = namespace
        self._recorder: Recorder | None = None
        self._profile: Profile | None = None

    @property
    def profile(self) -> Profile:
        if self._profile is None:
            raise RuntimeError("the profile is available once the `with jv.record()` block ends")
        return self._profile

    def __enter__(self) -> Recording:
        if not RECORDING_LOCK.acquire(blocking=False):
            raise RecordingError(
                "jupyter_vram is already recording; nested recording is not supported"
            )
        try:
            with interrupts_deferred():  # a half-started recorder is stopped whole, below
                self._recorder = make_recorder(self._device, stacks=self._stacks)
                self._recorder.start(sys._getframe(1), self._namespace)
        except BaseException:
            if self._recorder is not None:
                with interrupts_deferred():
                    self._recorder.stop()
                self._recorder = None
            RECORDING_LOCK.release()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._recorder is not None
        error = None if exc_type is None else f"{exc_type.__name__}: {exc}"
        try:
            with interrupts_deferred():  # an interrupt here must not lose the profile
                self._profile = self._recorder.stop(error=error)
        finally:
            self._recorder = None
            RECORDING_LOCK.release()


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


def record(
    device: str | None = None,
    *,
    stacks: bool = True,
    namespace: Mapping[str, Any] | None = None,
) -> Recording:
    """Record every allocation made inside the ``with`` block.

    ``device=None`` records CUDA when it is available (the caching allocator's history) and
    otherwise the CPU allocator's own reports of every allocation and free. ``namespace``: the
    variables whose tensors count as memory held before the block (default: the calling
    module's globals, e.g. a notebook's namespace).
    """
    return Recording(device, stacks=stacks, namespace=namespace)
