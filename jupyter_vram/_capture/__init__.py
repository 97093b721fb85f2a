"""Recorders: the only place that touches private torch APIs."""

from __future__ import annotations

from ._common import (
    RECORDING_LOCK,
    STACK_MODES,
    Recorder,
    RecordingError,
    interrupts_deferred,
    stack_mode,
)

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


def make_recorder(
    device: str | None, *, stacks: bool | str = "sampled", ops: str = "auto", trace: bool = True
) -> Recorder:
    """The recorder for a device: the allocator's history on CUDA, its reports to the torch
    profiler on the CPU (the dispatch tracker when the user's own profiler is running), the
    dispatch tracker for fake and meta tensors, which allocate nothing. ``trace=False``: the
    code may run torch.compile, which must not run under the profiler's Python tracer."""
    import torch

    name = parse_device(device)
    dev = torch.device(name)
    mode = stack_mode(stacks)
    if dev.type == "cuda":
        from .cuda_snapshot import CudaSnapshotRecorder

        return CudaSnapshotRecorder(dev, stacks=mode != "none")
    if dev.type == "cpu":
        from .cpu_recorder import ProfilerRecorder
        from .profiler_session import profiler_busy

        if not profiler_busy():
            return ProfilerRecorder(name, stacks=mode, ops=ops, trace=trace)
    from .dispatch import DispatchRecorder

    return DispatchRecorder(name, stacks=mode != "none")
