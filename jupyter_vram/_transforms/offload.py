"""Activation offload: tensors saved for backward wait in host memory instead of the device.

``torch.autograd.graph.save_on_cpu`` copies each tensor autograd saves to host memory when it
is saved and back when backward needs it, pinned on CUDA so both copies run asynchronously.
On a CPU run host memory *is* the device: there is nothing to move, and the reruns refuse the
option (see :func:`offload_unavailable`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def offload_unavailable(device: str) -> str | None:
    """Why offloading cannot lower memory on ``device`` (None where it can)."""
    if torch.device(device).type == "cpu":
        return (
            "offload moves activations to host memory, and this cell already runs in host "
            "memory (CPU): nothing to move"
        )
    return None


@contextlib.contextmanager
def offloaded(device: str) -> Iterator[None]:
    """Save activations to (pinned, on CUDA) host memory for the block."""
    pin = torch.device(device).type == "cuda"
    with torch.autograd.graph.save_on_cpu(pin_memory=pin):
        yield
