"""The adapter over torch's private CUDA memory calls (``_CudaApi``), run on the CPU with
torch.cuda's answers faked: what it passes to torch, and how it refuses what it cannot record.

PyTorch's own behaviour encoded here: ``_record_memory_history`` raises a RuntimeError on the
``cudaMallocAsync`` backend (it keeps no history), and ``get_allocator_backend()`` names the
backend ("native" or "cudaMallocAsync"); older torch has no ``clear_history`` argument.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from jupyter_vram._capture import RecordingError
from jupyter_vram._capture.cuda_snapshot import CudaSnapshotRecorder, _CudaApi


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A CUDA build with one device; the history calls are recorded, not made."""
    calls: list[Any] = []
    memory = torch.cuda.memory
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(memory, "get_allocator_backend", lambda: "native")

    def record(enabled: Any = "all", context: Any = "all", stacks: str = "all",
               max_entries: int = 0) -> None:  # fmt: skip
        calls.append(("history", enabled, context, stacks, max_entries))

    monkeypatch.setattr(memory, "_record_memory_history", record)
    monkeypatch.setattr(memory, "_snapshot", lambda: {"segments": [], "device_traces": [[]]})
    return calls


def test_cuda_malloc_async_is_refused_before_anything_starts(
    fake_cuda: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: "cudaMallocAsync")
    rec = CudaSnapshotRecorder("cuda:0")
    with pytest.raises(RecordingError, match="cudaMallocAsync") as info:
        rec.start()
    assert "restart the kernel without that setting" in str(info.value)
    assert "jv.estimate()" in str(info.value)
    assert fake_cuda == []  # no history switched on


def test_a_history_refusal_is_a_recording_error(
    fake_cuda: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(**_: Any) -> None:
        raise RuntimeError("Not supported by this allocator backend")

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", refuse)
    with pytest.raises(RecordingError, match="would not record its history"):
        _CudaApi().start_history(context="alloc", max_entries=10)


def test_history_options_are_the_ones_this_torch_takes(fake_cuda: list[Any]) -> None:
    """Python stacks only (C++ stacks are slow to dump); ``clear_history`` is left out where
    ``_record_memory_history`` has no such argument."""
    api = _CudaApi()
    assert api.available() is None
    api.start_history(context="alloc", max_entries=1234)
    api.stop_history()
    assert fake_cuda == [("history", "all", "alloc", "python", 1234),
                         ("history", None, "all", "all", 0)]  # fmt: skip


def test_device_info_reads_the_allocators_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_vram._capture import nvml

    props = SimpleNamespace(name="Fake H200", total_memory=140 << 30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    for name, value in [("memory_allocated", 1), ("memory_reserved", 2),
                        ("max_memory_allocated", 3), ("max_memory_reserved", 4)]:  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, lambda i, v=value: v)
    monkeypatch.setattr(
        nvml, "device_memory", lambda i: {"total": 9, "used": 7, "free": 2, "process_used": 5}
    )
    info = _CudaApi().device_info(0)
    assert info["name"] == "Fake H200" and info["total"] == 140 << 30
    assert (info["allocated"], info["reserved"]) == (1, 2)
    assert (info["max_allocated"], info["max_reserved"]) == (3, 4)
    assert (info["device_used"], info["process_used"]) == (7, 5)


def test_the_user_gets_the_recording_error_from_jv_record(
    fake_cuda: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import jupyter_vram as jv
    from jupyter_vram._capture import RECORDING_LOCK

    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: "cudaMallocAsync")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(RecordingError, match="cudaMallocAsync"), jv.record(device="cuda"):
        pass  # pragma: no cover - never entered
    assert not RECORDING_LOCK.locked() and fake_cuda == []


@pytest.mark.parametrize(("major", "minor", "sizes"), [
    (9, 0, {32 << 20: "cuBLAS workspace"}),  # torch 2.13: cuBLASLt shares it
    (8, 0, {8_519_680: "cuBLAS workspace"}),
])  # fmt: skip
def test_workspace_sizes_come_from_this_torch_and_the_devices_capability(
    monkeypatch: pytest.MonkeyPatch, major: int, minor: int, sizes: dict[int, str]
) -> None:
    assert torch.__version__.startswith("2.13")
    props = SimpleNamespace(major=major, minor=minor)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", raising=False)
    assert _CudaApi().workspace_sizes(0) == sizes
