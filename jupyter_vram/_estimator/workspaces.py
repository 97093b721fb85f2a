"""What a CUDA estimate adds that a fake run cannot show: the library workspaces PyTorch keeps,
and where the program's first step made what the measured (second) step finds.

- **BLAS workspaces** (:mod:`jupyter_vram._blas_workspaces`): one cuBLAS workspace per thread
  that runs a cuBLAS call, and up to torch 2.11 a separate cuBLASLt one per thread that runs
  an ``addmm`` with a bias vector (the cuBLASLt path). The forward runs in the calling thread
  and backward in autograd's device thread, each with its own handle. They are allocated
  through the caching allocator on the thread's first call and kept, so a second step finds
  them made: rows alive before the step, category other, named by op.
- **The first step** (:func:`first_step_positions`): where in the step the rows alive before
  it were made by the first step (optimizer state, the workspaces), for the allocator model's
  replay of the first step (:func:`~.cuda_model.simulate`, ``warm_up``).
"""

from __future__ import annotations

import os

import numpy as np

from .._blas_workspaces import (
    CUBLAS_LABEL,
    CUBLAS_OPS,
    CUBLASLT_LABEL,
    CUBLASLT_OPS,
    BlasWorkspaces,
    blas_workspaces,
)
from .._model import CATEGORY_INDEX, PHASE_INDEX, Allocations, Profile

__all__ = [
    "CUBLASLT_OPS",
    "CUBLAS_OPS",
    "estimate_workspaces",
    "first_step_positions",
    "with_blas_workspaces",
]

_THREADS = ("forward", "backward")


def estimate_workspaces(
    version: str | None = None, capability: tuple[int, int] | None = None
) -> BlasWorkspaces:
    """The workspaces torch ``version`` (None: this process's) gives a thread on a GPU of
    ``capability`` (None: unknown, taken as one with 32 MiB cuBLAS workspaces), with
    PyTorch's environment variables as this process sees them."""
    if version is None:
        import torch

        version = torch.__version__
    return blas_workspaces(version, capability, os.environ)


def _threads_using(profile: Profile, ops: frozenset[str]) -> list[str]:
    """The threads ("forward": the caller's, "backward": autograd's) whose step allocations
    include one of ``ops``, in the order they first ran."""
    a = profile.allocations
    uses = np.array([op in ops for op in profile.ops], dtype=bool)
    if not len(a) or not uses.any():
        return []
    calls = uses[a.op] & (a.alloc_seq >= 0)
    backward = a.phase == PHASE_INDEX["backward"]
    return [t for t, rows in zip(_THREADS, (calls & ~backward, calls & backward), strict=True)
            if rows.any()]  # fmt: skip


def with_blas_workspaces(profile: Profile, ws: BlasWorkspaces) -> Profile:
    """``profile`` with the BLAS workspaces its threads keep (see the module docstring), and
    ``meta["estimate"]`` saying which: ``blas_workspaces`` (op, bytes, thread, in row order)
    and the cuBLAS / cuBLASLt counts and sizes the fit checks adjust per GPU."""
    made: list[tuple[str, int, str]] = []
    lt_threads = _threads_using(profile, CUBLASLT_OPS) if ws.cublaslt_separate else []
    for thread in _threads_using(profile, CUBLAS_OPS):
        made.append((CUBLAS_LABEL, ws.cublas_bytes, thread))
        if thread in lt_threads:
            made.append((CUBLASLT_LABEL, ws.cublaslt_bytes, thread))
    lt_count = sum(1 for m in made if m[0] == CUBLASLT_LABEL)
    info = {
        **profile.meta.get("estimate", {}),
        "cublas_workspaces": len(made) - lt_count,
        "cublas_workspace_bytes": ws.cublas_bytes,
        "cublaslt_workspaces": lt_count,
        "cublaslt_workspace_bytes": ws.cublaslt_bytes if ws.cublaslt_separate else 0,
        "blas_workspaces": [list(m) for m in made],
    }
    meta = {**profile.meta, "estimate": info}
    if not made:
        return profile.replace(meta=meta)
    ops = list(profile.ops)
    modules = list(profile.modules)

    def index(names: list[str], name: str) -> int:
        if name not in names:
            names.append(name)
        return names.index(name)

    count = len(made)
    a = profile.allocations
    extra = {
        "size": [m[1] for m in made], "alloc_seq": [-1] * count, "free_seq": [-1] * count,
        "alloc_ns": [0] * count, "free_ns": [-1] * count, "device": [0] * count,
        "op": [index(ops, m[0]) for m in made], "module": [index(modules, "")] * count,
        "stack": [-1] * count, "phase": [PHASE_INDEX["other"]] * count,
        "category": [CATEGORY_INDEX["other"]] * count,
    }  # fmt: skip
    columns = {k: np.concatenate([getattr(a, k), np.asarray(v)]) for k, v in extra.items()}
    return profile.replace(
        allocations=Allocations.from_columns(columns), ops=ops, modules=modules, meta=meta
    )


def _first_alloc(profile: Profile, phase: str, ops: frozenset[str] | None = None) -> int | None:
    """The seq of the step's first allocation in ``phase`` (by one of ``ops``, if given)."""
    a = profile.allocations
    rows = (a.alloc_seq >= 0) & (a.phase == PHASE_INDEX[phase])
    if ops is not None:
        uses = np.array([op in ops for op in profile.ops], dtype=bool)
        rows &= uses[a.op] if len(uses) else False
    return int(a.alloc_seq[rows].min()) if rows.any() else None


def first_step_positions(profile: Profile) -> dict[int, float]:
    """Rows alive before the step that the program's first step made, each mapped to its
    position in the step (made once the events with a smaller seq have run):

    * optimizer state: made by the optimizer's first step before anything else it allocates
      (Adam's ``_init_group``, SGD's momentum buffers);
    * each BLAS workspace: by its thread's first call of that library, just after the call
      allocated its output (on an H200: the output, then the 32 MiB cuBLAS workspace, then
      the 1 MiB cuBLASLt one, all within the first ``addmm``).
    """
    a = profile.allocations
    positions: dict[int, float] = {}
    end = float(a.alloc_seq.max(initial=-1)) + 0.5
    optimizer = _first_alloc(profile, "optimizer")
    state = np.flatnonzero((a.alloc_seq < 0) & (a.category == CATEGORY_INDEX["optimizer_state"]))
    for row in state.tolist():
        positions[row] = optimizer - 0.5 if optimizer is not None else end
    made = profile.meta.get("estimate", {}).get("blas_workspaces") or []
    labels = {CUBLAS_LABEL: CUBLAS_OPS, CUBLASLT_LABEL: CUBLASLT_OPS}
    rows = [
        r for r in np.flatnonzero(a.alloc_seq < 0).tolist()
        if profile.ops[int(a.op[r])] in labels
    ]  # fmt: skip
    for row, item in zip(rows, made, strict=False):
        label, thread = str(item[0]), str(item[2])
        first = _first_alloc(profile, thread, labels.get(label)) if thread in _THREADS else None
        positions[row] = first + 0.5 if first is not None else end
    return positions
