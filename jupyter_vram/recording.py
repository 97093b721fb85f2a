"""`jv.record()`: record the allocations of a block of code into a Profile."""

from __future__ import annotations

import sys
from types import TracebackType

from .capture import RECORDING_LOCK, Recorder, RecordingError, make_recorder
from .model import Profile


class Recording:
    """Context manager around one recorder; `.profile` is ready once the block exits.

    The profile is kept even when the block raises (it covers the run up to the error), and
    recording is switched off on every exit path.
    """

    def __init__(self, device: str | None = None, *, stacks: bool = True) -> None:
        self._device = device
        self._stacks = stacks
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
            self._recorder = make_recorder(self._device, stacks=self._stacks)
            self._recorder.start(sys._getframe(1))
        except BaseException:
            if self._recorder is not None:
                self._recorder.stop()
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
            self._profile = self._recorder.stop(error=error)
        finally:
            self._recorder = None
            RECORDING_LOCK.release()


def record(device: str | None = None, *, stacks: bool = True) -> Recording:
    """Record every allocation made inside the ``with`` block.

    ``device=None`` records CUDA when it is available (allocator snapshots) and otherwise every
    tensor storage on any device through a dispatch-mode tracker, with the CPU as the device
    whose peak is reported.
    """
    return Recording(device, stacks=stacks)
