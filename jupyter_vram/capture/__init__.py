"""Recorders: the only place that touches private torch APIs."""

from __future__ import annotations

import threading
from types import FrameType
from typing import Protocol

from ..model import Profile


class Recorder(Protocol):
    """Start recording, and stop into a Profile (stop must always switch recording off)."""

    source: str
    device: str

    def start(self, entry_frame: FrameType | None = None) -> None: ...

    def stop(self, error: str | None = None) -> Profile: ...


class RecordingError(RuntimeError):
    """Recording could not start (already recording, unavailable device, ...)."""


#: One recorder at a time per process: dispatch modes and the CUDA allocator history are
#: process-wide, so nested recording would corrupt both.
RECORDING_LOCK = threading.Lock()


def make_recorder(device: str | None, *, stacks: bool = True) -> Recorder:
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        from .cuda_snapshot import CudaSnapshotRecorder

        return CudaSnapshotRecorder(dev, stacks=stacks)
    from .dispatch import DispatchRecorder

    return DispatchRecorder(str(dev), stacks=stacks)
