"""Device-wide memory from NVML (nvidia-ml-py), which also counts what the allocator cannot see.

The CUDA context, cuBLAS/cuDNN workspaces and other processes use device memory outside the
caching allocator; NVML is the only cheap way to see it. Everything here is lazy and best-effort:
without the package, a driver or a GPU every function returns None and never raises.
"""

from __future__ import annotations

import os
from typing import Any

_initialized: bool | None = None  # None: not tried yet; False: NVML is unavailable here


def _nvml() -> Any | None:
    """The initialized pynvml module, or None (tried once per process)."""
    global _initialized
    if _initialized is False:
        return None
    try:
        import pynvml
    except ImportError:
        _initialized = False
        return None
    if _initialized is None:
        try:
            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            _initialized = False
            return None
        _initialized = True
    return pynvml


def _pci_bus_id(index: int) -> str | None:
    """The PCI bus id of torch's device ``index`` (NVML numbers devices ignoring
    CUDA_VISIBLE_DEVICES, so the index alone can name the wrong GPU)."""
    try:
        import torch

        props = torch.cuda.get_device_properties(index)
        domain = int(getattr(props, "pci_domain_id"))  # noqa: B009 - absent from the stubs
        bus = int(getattr(props, "pci_bus_id"))  # noqa: B009
        dev = int(getattr(props, "pci_device_id"))  # noqa: B009
    except Exception:  # noqa: BLE001 - older torch has no pci fields; no CUDA at all
        return None
    return f"{domain:08X}:{bus:02X}:{dev:02X}.0"


def _handle(nvml: Any, index: int) -> Any:
    bus_id = _pci_bus_id(index)
    if bus_id is not None:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        except Exception:  # noqa: BLE001 - fall back to NVML's own numbering
            pass
    return nvml.nvmlDeviceGetHandleByIndex(index)


def device_memory(index: int) -> dict[str, int] | None:
    """``{"total", "used", "free"}`` bytes of CUDA device ``index`` (torch numbering), plus
    ``"process_used"`` (this process, context included) where the driver reports it; None
    without NVML or a GPU."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        handle = _handle(nvml, index)
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        out = {"total": int(info.total), "used": int(info.used), "free": int(info.free)}
    except Exception:  # noqa: BLE001
        return None
    try:
        pid = os.getpid()
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = getattr(proc, "usedGpuMemory", None)
            if proc.pid == pid and isinstance(used, int):
                out["process_used"] = used
    except Exception:  # noqa: BLE001 - not supported in some containers and on some drivers
        pass
    return out
