"""The same estimate twice gives the same numbers: a canonical order where the run has none.

Two orders in a fake run's profile come from the Python process rather than from the model:

- **Baseline rows** (tensors alive before the recorded step: parameters, optimizer state,
  inputs) are registered in the order the garbage collector lists them, which depends on the
  process's history. The CUDA allocator model places them in row order, and where a block
  lands decides how much of a segment later requests can use: the same GPT-2 step came out
  2 MiB apart in peak allocated between two fresh runs. :func:`canonical_baseline` orders
  them as a training program allocates them: the model's tensors in module order, then the
  optimizer state parameter by parameter, then the inputs, then anything else by its size.
- **Frees in one burst** (several storages released with no allocation between them, e.g.
  autocast's cast cache cleared when the forward leaves autocast) come in the order of a hash
  map keyed by memory addresses. No number depends on that order (nothing is allocated in
  between, and the allocator merges the freed blocks the same way whatever the order), but
  each row's free position does; :func:`canonical_bursts` frees each burst in allocation order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from .._capture.dispatch import DispatchRecorder
from .._model import Allocations, Profile

_COLUMNS = tuple(Allocations.__dataclass_fields__)


def canonical_baseline(
    profile: Profile, first: Sequence[int], sums: dict[int, tuple[int, bool]]
) -> tuple[Profile, dict[int, tuple[int, bool]]]:
    """``profile`` with its baseline rows in a fixed order, and ``sums`` (row -> (row,
    whole), see the accumulation watch) renumbered to match.

    ``first``: rows in the order they come first (a row listed twice counts once); the other
    baseline rows follow, by category, size (largest first), module, device and free
    position. Rows equal in all of those are interchangeable for every number.
    """
    a = profile.allocations
    base = np.flatnonzero(a.alloc_seq < 0)
    if len(base) < 2:
        return profile, sums
    rank: dict[int, int] = {}
    for row in first:
        rank.setdefault(int(row), len(rank))
    modules, devices = profile.modules, profile.devices

    def key(row: int) -> tuple[int, int, int, str, str, int]:
        if row in rank:
            return (0, rank[row], 0, "", "", 0)
        return (1, int(a.category[row]), -int(a.size[row]), modules[int(a.module[row])],
                devices[int(a.device[row])], int(a.free_seq[row]))  # fmt: skip

    ordered = sorted(base.tolist(), key=key)
    take = np.arange(len(a))
    take[base] = ordered
    if np.array_equal(take[base], base):
        return profile, sums
    new_row = np.empty_like(take)
    new_row[take] = np.arange(len(a))
    columns = {name: getattr(a, name)[take] for name in _COLUMNS}
    renumbered = {
        int(new_row[row]): (int(new_row[operand]) if operand >= 0 else -1, whole)
        for row, (operand, whole) in sums.items()
    }
    return profile.replace(allocations=Allocations.from_columns(columns)), renumbered


def canonical_bursts(profile: Profile) -> Profile:
    """``profile`` with the frees of each burst (consecutive frees, no allocation between)
    reassigned in allocation order: the same sequence numbers and times, row by row."""
    a = profile.allocations
    freed = np.flatnonzero(a.free_seq >= 0)
    if len(freed) < 2:
        return profile
    freed = freed[np.argsort(a.free_seq[freed], kind="stable")]
    allocs = np.sort(a.alloc_seq[a.alloc_seq >= 0])
    # the allocations before each free: a burst is a run of frees with the same count
    before = np.searchsorted(allocs, a.free_seq[freed])
    starts = np.flatnonzero(np.diff(before, prepend=-1))
    free_seq, free_ns = a.free_seq.copy(), a.free_ns.copy()
    changed = False
    for burst in np.split(freed, starts[1:]):
        if len(burst) < 2:
            continue
        by_alloc = burst[np.lexsort((burst, a.alloc_seq[burst]))]
        if np.array_equal(by_alloc, burst):
            continue
        free_seq[by_alloc] = a.free_seq[burst]
        free_ns[by_alloc] = a.free_ns[burst]
        changed = True
    if not changed:
        return profile
    columns = {name: getattr(a, name) for name in _COLUMNS}
    columns.update(free_seq=free_seq, free_ns=free_ns)
    return profile.replace(allocations=Allocations.from_columns(columns))


def rows_of(recorder: DispatchRecorder, tensors: Iterable[Any]) -> list[int]:
    """The recorder's rows of ``tensors`` (those it knows), in order."""
    rows = []
    for tensor in tensors:
        row = recorder.row_of(tensor) if isinstance(tensor, torch.Tensor) else None
        if row is not None:
            rows.append(row)
    return rows


__all__ = ["canonical_baseline", "canonical_bursts", "rows_of"]
