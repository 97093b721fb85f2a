"""Group allocations (live at a moment, or all allocated) by category, module, op or stack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from .._model import CATEGORIES, PHASES

if TYPE_CHECKING:
    from .._model import Profile

BEFORE_THE_RUN = "(alive before the run)"
GroupKey = Literal["category", "module", "op", "phase", "stack", "site"]


@dataclass(frozen=True)
class Group:
    """One group: its label, bytes, allocation count and bytes per category."""

    label: str
    bytes: int
    count: int
    by_category: tuple[int, ...]


def _labels(profile: Profile, key: GroupKey) -> tuple[npt.NDArray[np.int32], list[str]]:
    a = profile.allocations
    if key == "category":
        return a.category.astype(np.int32), list(CATEGORIES)
    if key == "phase":
        return a.phase.astype(np.int32), list(PHASES)
    if key == "module":
        return a.module, [m or "(no module)" for m in profile.modules]
    if key == "op":
        return a.op, list(profile.ops)
    # stacks: allocations from before the run, and those without a stack, get labels of their own
    labels = [stack_label(profile, i, full=key == "stack") for i in range(len(profile.stacks))]
    n = len(labels)
    ids = np.where(a.alloc_seq < 0, n + 1, np.where(a.stack < 0, n, a.stack)).astype(np.int32)
    return ids, [*labels, "(no Python stack)", BEFORE_THE_RUN]


def stack_label(profile: Profile, stack_id: int, *, full: bool = False) -> str:
    """The innermost user frame of a stack (its allocation site), or the whole stack."""
    frames = profile.stack_of(stack_id)
    if not frames:
        return "(no Python stack)"
    if full:
        return " > ".join(str(f) for f in frames)
    return str(frames[-1])


def group(
    profile: Profile, mask: npt.NDArray[np.bool_], key: GroupKey, *, limit: int | None = None
) -> list[Group]:
    """Groups of the masked allocations, largest first."""
    ids, labels = _labels(profile, key)
    a = profile.allocations
    sel_ids = ids[mask]
    sizes = a.size[mask]
    cats = a.category[mask].astype(np.int64)
    n = len(labels)
    totals = np.bincount(sel_ids, weights=sizes, minlength=n)
    counts = np.bincount(sel_ids, minlength=n)
    n_cat = len(CATEGORIES)
    per_cat = np.bincount(
        sel_ids.astype(np.int64) * n_cat + cats, weights=sizes, minlength=n * n_cat
    )
    per_cat = per_cat.reshape(n, n_cat)
    order = [i for i in np.argsort(-totals, kind="stable") if counts[i] > 0]
    if limit is not None:
        order = order[:limit]
    return [
        Group(
            label=labels[i],
            bytes=int(round(totals[i])),
            count=int(counts[i]),
            by_category=tuple(int(round(v)) for v in per_cat[i]),
        )
        for i in order
    ]


def live_at_peak(profile: Profile, key: GroupKey, *, limit: int | None = None) -> list[Group]:
    timeline = profile.timeline
    return group(profile, timeline.live_mask(timeline.peak_index), key, limit=limit)


def allocated_during_run(profile: Profile) -> npt.NDArray[np.bool_]:
    """Allocations made while recording on the profile's device (baseline excluded)."""
    return (profile.allocations.alloc_seq >= 0) & profile.timeline.device_mask
