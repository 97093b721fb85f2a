"""Recorders: the only place that touches private torch APIs.

Where each module here is tested: tests/INDEX.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import (
    RECORDING_LOCK,
    STACK_MODES,
    Recorder,
    RecordingError,
    interrupts_deferred,
    stack_mode,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "RECORDING_LOCK",
    "STACK_MODES",
    "Recorder",
    "RecordingError",
    "interrupts_deferred",
    "make_recorder",
    "parse_device",
    "stack_mode",
]


def parse_device(device: str | None, *, fake: bool = False) -> str:
    """A device name a recorder accepts, or a RecordingError that says why not: an unknown
    name, a device this machine does not have (``cuda`` without a GPU, ``mps``, ``xla``...),
    or ``meta``, whose tensors hold no memory (``fake``: the estimator's fake-tensor run, which
    records meta on purpose)."""
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
    if dev.type == "meta" and not fake:
        raise RecordingError(
            f"{device!r}: meta tensors hold no memory, so there is nothing to record; "
            "%vram_estimate (jv.estimate) predicts a step's memory without the device"
        )
    why = _unavailable(dev)
    if why is not None:
        raise RecordingError(why)
    return "cpu" if dev.type == "cpu" else str(dev)


def _unavailable(dev: torch.device) -> str | None:
    """Why this machine cannot hold tensors on ``dev`` (None: it can)."""
    import torch

    if dev.type in ("cpu", "meta"):
        return None
    if dev.type == "cuda":
        from .cuda_snapshot import cuda_unavailable

        return cuda_unavailable(dev.index)
    try:  # mps, xla, xpu...: a backend that is not here cannot make an empty tensor
        torch.empty(0, device=dev)
    except Exception:  # noqa: BLE001 - each backend words it differently, at length
        return (
            f"device {str(dev)!r} is not available here (torch {torch.__version__} cannot make "
            "a tensor on it); record 'cpu' or 'cuda'"
        )
    return None


def make_recorder(
    device: str | None,
    *,
    stacks: bool | str = "sampled",
    ops: str = "auto",
    trace: bool = True,
    fake: bool = False,
) -> Recorder:
    """The recorder for a device: the allocator's history on CUDA, its reports to the torch
    profiler on the CPU (the dispatch tracker when the user's own profiler is running), the
    dispatch tracker for fake and meta tensors, which allocate nothing. ``trace=False``: the
    code may run torch.compile, which must not run under the profiler's Python tracer."""
    import torch

    name = parse_device(device, fake=fake)
    dev = torch.device(name)
    mode = stack_mode(stacks)
    if dev.type == "cuda":
        from .cuda_snapshot import CudaSnapshotRecorder

        return CudaSnapshotRecorder(dev, stacks=mode != "none", label_ops=ops)
    if dev.type == "cpu":
        from .cpu_recorder import ProfilerRecorder
        from .profiler_session import profiler_busy

        if not profiler_busy():
            return ProfilerRecorder(name, stacks=mode, ops=ops, trace=trace)
    from .dispatch import DispatchRecorder

    return DispatchRecorder(name, stacks=mode != "none")
