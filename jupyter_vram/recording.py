"""`jv.record()`: record the allocations of a block of code into a Profile."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from .capture import RECORDING_LOCK, Recorder, RecordingError, interrupts_deferred, make_recorder
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
