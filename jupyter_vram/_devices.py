"""Device memory right now, for the `%vram` line magic."""

from __future__ import annotations

import torch

from ._units import format_bytes


def memory_now(device: str | None = None) -> str:
    """Allocated / reserved / device used on CUDA; otherwise tensors alive per category (a
    device this machine lacks: one line saying so)."""
    from ._capture import RecordingError, parse_device

    try:
        dev = torch.device(parse_device(device))
    except RecordingError as error:  # a device this machine does not have: one line
        return f"%vram: {error}"
    if dev.type == "cuda":
        from ._capture.nvml import device_memory

        index = dev.index if dev.index is not None else torch.cuda.current_device()
        lines = [
            f"{torch.cuda.get_device_name(index)} (cuda:{index})",
            f"  allocated   {format_bytes(torch.cuda.memory_allocated(index)):>12}",
            f"  reserved    {format_bytes(torch.cuda.memory_reserved(index)):>12}",
        ]
        nvml = device_memory(index)
        if nvml is not None:
            lines.append(
                f"  device used {format_bytes(nvml['used']):>12} of {format_bytes(nvml['total'])}"
            )
        return "\n".join(lines)
    from ._capture import RECORDING_LOCK
    from ._capture.dispatch import DispatchRecorder

    if not RECORDING_LOCK.acquire(blocking=False):
        return "%vram: recording in progress; try again after the cell"
    try:
        recorder = DispatchRecorder(str(dev), stacks=False)
        recorder.start()
        profile = recorder.stop()
    finally:
        RECORDING_LOCK.release()
    breakdown = profile.timeline.breakdown_at(-1)
    total = profile.timeline.baseline_bytes
    lines = [f"{dev}: {format_bytes(total)} held by live tensors (the tracker's view)"]
    lines += [f"  {k:<16}{format_bytes(v):>12}" for k, v in breakdown.items() if v]
    return "\n".join(lines)
