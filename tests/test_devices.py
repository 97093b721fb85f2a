"""`%vram`'s device view: CUDA figures (allocator + NVML) formatted, CPU tracker view exact."""

from __future__ import annotations

import pytest
import torch

from jupyter_vram import _devices as devices
from jupyter_vram._capture import nvml


def test_cuda_view_reports_allocator_and_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 4 * 2**30)
    monkeypatch.setattr(nvml, "device_memory", lambda i: {"used": 5 * 2**30, "total": 141 * 2**30})
    text = devices.memory_now()
    assert text.splitlines() == [
        "NVIDIA H200 (cuda:0)",
        "  allocated        3.0 GiB",
        "  reserved         4.0 GiB",
        "  device used      5.0 GiB of 141.0 GiB",
    ]


def test_cuda_view_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "GPU")
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 0)
    monkeypatch.setattr(nvml, "device_memory", lambda i: None)
    assert "device used" not in devices.memory_now("cuda:1")


def test_cpu_view_counts_live_tensors() -> None:
    keep = torch.nn.Linear(1000, 100)  # 100,100 parameters
    text = devices.memory_now("cpu")
    assert "held by live tensors" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("parameter"))
    assert keep.weight.numel() * 4 <= _parse(line.split()[-2], line.split()[-1])


def _parse(value: str, unit: str) -> float:
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    return float(value) * scale
