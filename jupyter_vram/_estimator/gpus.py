"""Common GPUs and their memory, so an estimate can say which cards it fits on.

Sizes are the total ``nvidia-smi`` (NVML) reports, in whole MiB, with a recent driver. That
is the figure people see and quote; the CUDA runtime (``cudaMemGetInfo``, and so
``torch.cuda.get_device_properties().total_memory``) reports a few hundred MiB less on most
cards (e.g. about 79.2 GiB on an A100 80GB), and the CUDA context takes a few hundred MiB
more before any tensor exists. A fit check keeps that headroom: it compares against
:attr:`Gpu.usable_bytes` (the NVML total less :data:`RUNTIME_HIDDEN_BYTES`), or use
:func:`gpu_from_bytes` with the real device's figure (already the runtime's).

Each card also has its compute capability: flash attention needs 8.0 (Ampere) or newer, so
on a T4 or V100 CUDA runs attention through the memory-efficient kernel.

Marketing names differ from what the driver calls a card ("NVIDIA A100-SXM4-80GB",
"Tesla T4", "NVIDIA GeForce RTX 4090"), so :func:`find_gpu` ignores case, punctuation, vendor
words and form factors (SXM, PCIe, HBM): a form factor does not change the memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GPUS", "RUNTIME_HIDDEN_BYTES", "Gpu", "find_gpu", "gpu_from_bytes"]

MIB = 1 << 20

#: What the CUDA runtime reports less than NVML's total (memory the driver keeps; not usable
#: by any process): 80 GiB vs 79.2 GiB on an A100 80GB. Taken from that one card, so a guess
#: for the others ("a few hundred MiB" on most).
RUNTIME_HIDDEN_BYTES = 819 * MIB


@dataclass(frozen=True)
class Gpu:
    """A GPU model and the memory its driver reports.

    ``approximate`` marks sizes taken from the marketing figure (GB read as GiB) rather than
    a driver's report.
    """

    name: str
    memory_bytes: int
    approximate: bool = False
    aliases: tuple[str, ...] = ()
    compute_capability: float | None = None  # None: unknown (assumed 8.0 or newer)
    # NVML total minus what the runtime offers: RUNTIME_HIDDEN_BYTES for the cards below
    # (NVML figures); 0 for a size that is already the runtime's (gpu_from_bytes)
    hidden_bytes: int = 0

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / (1 << 30)

    @property
    def usable_bytes(self) -> int:
        """What the CUDA runtime offers processes: the NVML total less what the driver keeps.
        A step fits when its device used (reserved + context) is at most this."""
        return self.memory_bytes - self.hidden_bytes

    def fits(self, predicted_device_bytes: int) -> bool:
        """The fit rule, the one copy of it: a step fits this card when its device used
        (reserved + runtime allowance, with this card's kernels and workspaces) is at most
        :attr:`usable_bytes`. The largest-batch search looks for the same limit."""
        return predicted_device_bytes <= self.usable_bytes

    @property
    def capability(self) -> tuple[int, int] | None:
        """The compute capability as (major, minor), as PyTorch compares it; None: unknown."""
        cc = self.compute_capability
        if cc is None:
            return None
        major = int(cc)
        return major, round((cc - major) * 10)

    @property
    def cublas_workspace_bytes(self) -> int:
        """PyTorch's cuBLAS workspace on this card under this process's torch, one per thread
        that runs matmuls (its default ``CUBLAS_WORKSPACE_CONFIG``): 32 MiB or
        ``:4096:2:16:8`` = 8,519,680 bytes, by compute capability and torch version
        (:func:`jupyter_vram._blas_workspaces.blas_workspaces`). Unknown cards: the 32 MiB."""
        import torch

        from .._blas_workspaces import blas_workspaces

        return blas_workspaces(torch.__version__, self.capability).cublas_bytes

    @property
    def flash_attention(self) -> bool:
        """Whether PyTorch's flash attention kernel runs on this card (compute capability
        8.0 or newer; unknown cards are assumed recent)."""
        return self.compute_capability is None or self.compute_capability >= 8.0


def _gpu(name: str, mib: int, cc: float, *aliases: str, approximate: bool = False) -> Gpu:
    return Gpu(name, mib * MIB, approximate, aliases, cc, RUNTIME_HIDDEN_BYTES)


#: Ascending by memory, with compute capability. A bare family name ("a100", "v100") means
#: its largest variant here.
GPUS: tuple[Gpu, ...] = (
    _gpu("GTX 1060 6GB", 6144, 6.1, "gtx 1060", "1060", approximate=True),
    _gpu("RTX 3060 12GB", 12288, 8.6, "rtx 3060", "3060"),
    _gpu("T4", 15360, 7.5, "t4 16gb"),
    _gpu("V100 16GB", 16384, 7.0),
    _gpu("A10", 23028, 8.6, "a10 24gb"),
    _gpu("L4", 23034, 8.9, "l4 24gb"),
    _gpu("RTX 4090", 24564, 8.9, "4090", "rtx 4090 24gb"),
    _gpu("RTX 3090", 24576, 8.6, "3090", "rtx 3090 24gb"),
    _gpu("V100 32GB", 32768, 7.0, "v100", approximate=True),
    _gpu("A100 40GB", 40960, 8.0),
    _gpu("L40S", 46068, 8.9, "l40s 48gb"),
    _gpu("H100 80GB", 81559, 9.0, "h100"),
    _gpu("A100 80GB", 81920, 8.0, "a100"),
    _gpu("H200", 143771, 9.0, "h200 141gb"),
)

_VENDOR_WORDS = frozenset({"nvidia", "geforce", "tesla"})
_FORM_FACTOR = re.compile(r"sxm\d*|pcie|hbm\d*e?")


def _key(name: str) -> str:
    """``name`` reduced to what tells cards apart: "NVIDIA A100-SXM4-80GB" -> "a10080gb"."""
    tokens = re.findall(r"[a-z0-9]+", name.lower())
    kept = (
        t + "b" if re.fullmatch(r"\d+g", t) else t  # "80g" -> "80gb"
        for t in tokens
        if t not in _VENDOR_WORDS and not _FORM_FACTOR.fullmatch(t)
    )
    return "".join(kept)


def _index() -> dict[str, Gpu]:
    index: dict[str, Gpu] = {}
    for gpu in GPUS:
        for alias in (gpu.name, *gpu.aliases):
            key = _key(alias)
            if index.setdefault(key, gpu) is not gpu:
                raise ValueError(f"GPU name {alias!r} is ambiguous")
    return index


_BY_KEY = _index()


def find_gpu(name: str) -> Gpu:
    """The GPU called ``name``: "a100 80gb", "A100-80GB", "h100", "4090", "Tesla T4" ...

    A family name without a size is its largest variant ("a100" is the 80 GB card, "v100"
    the 32 GB one); give the size to be sure. Raises ValueError for an unknown name.
    """
    gpu = _BY_KEY.get(_key(name))
    if gpu is None:
        known = ", ".join(g.name for g in GPUS)
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {known}")
    return gpu


def gpu_from_bytes(name: str, total: int, compute_capability: float | None = None) -> Gpu:
    """A Gpu for a device seen at run time (``torch.cuda.get_device_properties``: its
    ``total_memory`` is already what the runtime offers, so nothing more is held back)."""
    if total <= 0:
        raise ValueError(f"GPU memory must be positive, got {total}")
    return Gpu(name, int(total), False, (), compute_capability)
