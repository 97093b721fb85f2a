"""The workspaces PyTorch gives cuBLAS and cuBLASLt, per torch version and GPU, in one place.

PyTorch (``aten/src/ATen/cuda/CublasHandlePool.cpp``) allocates a workspace through the caching
allocator the first time a thread runs a cuBLAS call on a stream, and keeps it for the life of
the process (one per thread and stream: a training step's forward thread and autograd's
backward thread each hold one). They are in ``memory_allocated`` like any tensor, but they are
runtime state, not the user's: the recorder names them and the estimator adds them.

* cuBLAS: ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE_KIB:COUNT`` pairs, summed) or the default:
  ``4096 * 8 * 1024`` bytes (32 MiB) on the GPUs PyTorch picks, else ``4096 * 1024 * 2 +
  16 * 1024 * 8`` (8,519,680 bytes). Which GPUs get 32 MiB changed with torch: compute
  capability 9.0 only (``properties->major == 9 && properties->minor == 0``) up to 2.11, major
  9, 10 or 12 from 2.12 (pytorch/pytorch#175344, merged after the 2.11 branch).
* cuBLASLt (the ``addmm`` with a bias vector, i.e. ``nn.Linear``, runs through it): up to 2.11
  its own persistent workspace, ``CUBLASLT_WORKSPACE_SIZE`` KiB, default 1024 KiB (measured on
  an H200 with torch 2.11: 1 MiB beside the 32 MiB, made by the first ``addmm`` of the
  forward); from 2.12 unified with the cuBLAS one by default (``TORCH_CUBLASLT_UNIFIED_WORKSPACE``,
  pytorch/pytorch#168175 and #175879; torch 2.13's ``torch.backends.cuda.blas_workspace_size``
  documents the unified default): it reuses the cuBLAS allocation, nothing more is allocated.

The version boundaries come from when those changes were merged; only torch 2.11 on compute
capability 9.0 has been measured (``bench/gpu_checks.py`` prints the rows a fresh process
makes, to settle the others). Pure arithmetic: no torch, no imports from the package.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ANY_VERSION_SIZES",
    "CUBLASLT_DEFAULT",
    "CUBLASLT_LABEL",
    "CUBLASLT_OPS",
    "CUBLAS_DEFAULT",
    "CUBLAS_LABEL",
    "CUBLAS_LARGE",
    "CUBLAS_OPS",
    "BlasWorkspaces",
    "blas_workspaces",
    "torch_version",
]

CUBLAS_LARGE = 4096 * 8 * 1024  # 33,554,432: 32 MiB
CUBLAS_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8  # 8,519,680: ":4096:2:16:8"
CUBLASLT_DEFAULT = 1024 * 1024  # 1 MiB ("default size in KiB according to #73328": 1024)
#: How the recorder and the estimator name these blocks (their op).
CUBLAS_LABEL = "cuBLAS workspace"
CUBLASLT_LABEL = "cuBLASLt workspace"
#: aten ops that run through cuBLAS (convolutions use cuDNN, attention its own kernels).
CUBLAS_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "addr",
     "_addmm_activation", "matmul", "linear"}
)  # fmt: skip
#: The ops CUDA runs through cuBLASLt: ``addmm`` (and its fused activation form) when its
#: input is a bias vector, as ``nn.Linear`` calls it (``useLtInterface`` in
#: aten/src/ATen/native/cuda/Blas.cpp).
CUBLASLT_OPS = frozenset({"addmm", "_addmm_activation"})
#: Every default size, for a snapshot whose torch and GPU are not known.
ANY_VERSION_SIZES = {
    CUBLAS_LARGE: CUBLAS_LABEL,
    CUBLAS_DEFAULT: CUBLAS_LABEL,
    CUBLASLT_DEFAULT: CUBLASLT_LABEL,
}

_PAIR = re.compile(r":([0-9]+):([0-9]+)")
_TRUE = frozenset({"1", "true", "on", "yes", "y"})
_FALSE = frozenset({"0", "false", "off", "no", "n"})


@dataclass(frozen=True)
class BlasWorkspaces:
    """The workspaces of one thread and stream.

    ``cublas_bytes``: the cuBLAS workspace, made by the thread's first cuBLAS call.
    ``cublaslt_bytes``: the size cuBLASLt is given. ``cublaslt_separate``: whether that is an
    allocation of its own, made by the thread's first cuBLASLt call (else it reuses the cuBLAS
    workspace and allocates nothing more).
    """

    cublas_bytes: int
    cublaslt_bytes: int
    cublaslt_separate: bool

    @property
    def sizes(self) -> dict[int, str]:
        """Allocation size -> label, for the blocks a recording may show."""
        out = {self.cublas_bytes: CUBLAS_LABEL}
        if self.cublaslt_separate and self.cublaslt_bytes:
            out.setdefault(self.cublaslt_bytes, CUBLASLT_LABEL)
        return out


def torch_version(text: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: ``"2.11.0+cu130"`` -> (2, 11); (0, 0) when
    it cannot be read."""
    match = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def _flag(value: str | None) -> bool | None:
    if value is None:
        return None
    word = value.strip().lower()
    return True if word in _TRUE else False if word in _FALSE else None


def cublas_default(version: tuple[int, int], capability: tuple[int, int] | None) -> int:
    """The cuBLAS workspace without ``CUBLAS_WORKSPACE_CONFIG`` (``parseChosenWorkspaceSize``).
    An unknown GPU (None) is taken as one that gets 32 MiB."""
    if capability is None:
        return CUBLAS_LARGE
    major, minor = capability
    large = major in (9, 10, 12) if version >= (2, 12) else (major, minor) == (9, 0)
    return CUBLAS_LARGE if large else CUBLAS_DEFAULT


def blas_workspaces(
    version: str | tuple[int, int],
    capability: tuple[int, int] | None,
    env: Mapping[str, str] | None = None,
) -> BlasWorkspaces:
    """The workspaces torch ``version`` gives one thread on a GPU of ``capability`` (major,
    minor; None: unknown), with the environment variables PyTorch reads in ``env``."""
    env = env or {}
    ver = torch_version(version) if isinstance(version, str) else version
    cublas = cublas_default(ver, capability)
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    if config is not None:
        pairs = _PAIR.findall(config)
        if pairs:  # unparsable: PyTorch warns and keeps the default
            cublas = sum(int(size) * 1024 * int(count) for size, count in pairs)
    flag = _flag(env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE"))
    unified = (flag is not False) if ver >= (2, 12) else flag is True
    lt_kib = cublas // 1024 if unified and ver >= (2, 12) else CUBLASLT_DEFAULT // 1024
    lt_env = env.get("CUBLASLT_WORKSPACE_SIZE")
    if lt_env is not None and lt_env.strip().isdigit():
        lt_kib = int(lt_env)
    lt = lt_kib * 1024
    if unified:
        return BlasWorkspaces(cublas, min(lt, cublas), cublaslt_separate=False)
    return BlasWorkspaces(cublas, lt, cublaslt_separate=True)
