"""Name the cuBLAS / cuBLASLt workspaces in a CUDA recording.

PyTorch allocates a thread's BLAS workspaces through the caching allocator inside its first
matmul (``getCurrentCUDABlasHandle`` / ``getCUDABlasLtWorkspace``) and keeps them for the life of
the process. In the first CUDA cell of a process they are made during the run, after the
matmul's output, by the op that runs the matmul: without a name they read as that op's
"temporary" memory (65 of the 97 MiB temporary at the peak of the H200 MLP recording). They are
runtime state, not the user's: this gives them their own op ("cuBLAS workspace" /
"cuBLASLt workspace"), category other, and lists them in ``meta["blas_workspaces"]``.

A row is taken for one when all of these hold: a BLAS op made it
(:data:`~jupyter_vram._blas_workspaces.CUBLAS_OPS`), it has a workspace size of this torch and
GPU, it is still alive when the recording ends, no role names it (it is no tensor), and it is
not the first allocation of its op call (the call's output comes first). Workspaces made
before the recording are among the blocks alive at its start, which no op names.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._blas_workspaces import CUBLAS_OPS
from .._model import CATEGORY_INDEX, Allocations, Profile

__all__ = ["name_workspaces"]


def _second_of_call(a: Allocations, rows: np.ndarray) -> np.ndarray:
    """For ``rows`` (made in the run), whether the allocation made just before each one came
    from the same op, module and phase (the same op call, as far as the trace can tell)."""
    made = np.flatnonzero(a.alloc_seq >= 0)
    order = made[np.argsort(a.alloc_seq[made], kind="stable")]
    previous = np.full(len(a), -1, np.int64)
    previous[order[1:]] = order[:-1]
    before = previous[rows]
    has = before >= 0
    same = np.zeros(len(rows), dtype=bool)
    b = before[has]
    r = rows[has]
    same[has] = (a.op[b] == a.op[r]) & (a.module[b] == a.module[r]) & (a.phase[b] == a.phase[r])
    return same


def name_workspaces(profile: Profile, sizes: Mapping[int, str]) -> Profile:
    """``profile`` with the BLAS workspaces it made named (see the module docstring);
    ``sizes``: workspace size -> label, for the torch and GPU of the recording."""
    a = profile.allocations
    if not len(a) or not sizes:
        return profile
    blas = np.array([op in CUBLAS_OPS for op in profile.ops], dtype=bool)
    if not blas.any():
        return profile
    wanted = np.fromiter(sizes, np.int64)
    candidate = (
        (a.alloc_seq >= 0)
        & blas[a.op]
        & (a.free_seq < 0)
        & np.isin(a.size, wanted)
        & (a.category == CATEGORY_INDEX["temporary"])
    )
    rows = np.flatnonzero(candidate)
    rows = rows[_second_of_call(a, rows)]
    if not len(rows):
        return profile
    ops = list(profile.ops)
    op = a.op.copy()
    category = a.category.copy()
    found = []
    for row in rows.tolist():
        label = sizes[int(a.size[row])]
        if label not in ops:
            ops.append(label)
        op[row] = ops.index(label)
        category[row] = CATEGORY_INDEX["other"]
        found.append({"op": label, "bytes": int(a.size[row]), "alloc_seq": int(a.alloc_seq[row])})
    columns = {name: getattr(a, name) for name in Allocations.__dataclass_fields__}
    columns.update(op=op, category=category)
    meta = {**profile.meta, "blas_workspaces": found}
    return profile.replace(allocations=Allocations.from_columns(columns), ops=ops, meta=meta)
