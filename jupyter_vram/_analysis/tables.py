"""pandas views of a profile: one row per allocation, and top allocation sites."""

from __future__ import annotations

import weakref
from dataclasses import astuple, dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from .._model import CATEGORIES, PHASES
from .groups import stack_label

if TYPE_CHECKING:
    from .._model import Profile


def allocations_frame(profile: Profile) -> pd.DataFrame:
    """One row per allocation, with names resolved and a live-at-peak flag."""
    a = profile.allocations
    timeline = profile.timeline
    site_names = _unique([stack_label(profile, s) for s in range(len(profile.stacks))])
    site_codes = np.where(a.stack >= 0, a.stack, -1)
    return pd.DataFrame(
        {
            "op": _categorical(a.op, _unique(profile.ops)),
            "module": _categorical(a.module, _unique(profile.modules)),
            "phase": _categorical(a.phase, list(PHASES)),
            "category": _categorical(a.category, list(CATEGORIES)),
            "bytes": a.size,
            "device": _categorical(a.device, _unique(profile.devices)),
            "alloc_seq": a.alloc_seq,
            "free_seq": a.free_seq,
            "alloc_ms": np.where(a.alloc_seq >= 0, a.alloc_ns / 1e6, np.nan),
            "free_ms": np.where(a.free_seq >= 0, a.free_ns / 1e6, np.nan),
            "live_at_peak": timeline.live_mask(timeline.peak_index),
            "site": _categorical(site_codes, site_names),
            "stack_id": a.stack,
        }
    )


def _categorical(codes: npt.NDArray[np.integer[Any]], names: list[str]) -> pd.Categorical[str]:
    return pd.Categorical.from_codes(codes, categories=pd.Index(names))


def _unique(names: list[str] | tuple[str, ...]) -> list[str]:
    """pandas categories must be unique: number repeats (two stacks, one innermost frame)."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        n = seen.get(name, 0)
        seen[name] = n + 1
        out.append(name if n == 0 else f"{name} #{n + 1}")
    return out


@dataclass(frozen=True)
class SiteRow:
    """One allocation site of :func:`site_rows` (the columns of :func:`top_sites`)."""

    site: str  # innermost user frame
    op: str
    live_at_peak_bytes: int
    allocated_bytes: int
    allocations: int
    largest_bytes: int
    category: str  # holding most of the site's bytes live at the peak, else of those allocated
    stack: str  # full


SITE_COLUMNS = [f.name for f in fields(SiteRow)]


def site_rows(profile: Profile, limit: int = 20, *, by: str = "peak") -> list[SiteRow]:
    """Allocation sites (Python stack + op), ranked by bytes live at the peak (``by="peak"``)
    or allocated, as plain rows: what a display shows, without building a DataFrame.

    Only allocations made during the run count: the baseline has no site. Sites with the same
    bytes come in the order of their op's name, then of their stack.
    """
    sums = _site_sums(profile)
    if sums is None:
        return []
    n_ops = len(profile.ops)
    uniq = sums.keys
    primary, secondary = (
        (sums.peak_bytes, sums.allocated) if by == "peak" else (sums.allocated, sums.peak_bytes)
    )
    # ties by op name, then by stack: not by the order stacks were first seen, which changes
    # with whether a sampled line landed (a report's rows would swap from run to run)
    op_rank = np.argsort(np.argsort(np.array(profile.ops, dtype=object), kind="stable"))
    top = np.lexsort((uniq // n_ops, op_rank[uniq % n_ops], -secondary, -primary))[:limit]
    return [
        SiteRow(
            site=stack_label(profile, int(key // n_ops - 1)),
            op=profile.ops[int(key % n_ops)],
            live_at_peak_bytes=int(sums.peak_bytes[i]),
            allocated_bytes=int(sums.allocated[i]),
            allocations=int(sums.counts[i]),
            largest_bytes=int(sums.largest[i]),
            category=CATEGORIES[int(sums.main_category[i])],
            stack=stack_label(profile, int(key // n_ops - 1), full=True),
        )
        for i, key in zip(top.tolist(), uniq[top].tolist(), strict=True)
    ]


def top_sites(profile: Profile, limit: int = 20, *, by: str = "peak") -> pd.DataFrame:
    """:func:`site_rows` as a DataFrame (columns ``SITE_COLUMNS``), for users' own analysis."""
    rows = site_rows(profile, limit, by=by)
    if not rows:
        return pd.DataFrame(columns=SITE_COLUMNS)
    return pd.DataFrame([astuple(row) for row in rows], columns=SITE_COLUMNS)


@dataclass(frozen=True)
class _SiteSums:
    """Per site (key: (stack + 1) * ops + op): what :func:`top_sites` ranks and shows."""

    keys: npt.NDArray[np.int64]
    peak_bytes: npt.NDArray[np.float64]
    allocated: npt.NDArray[np.float64]
    counts: npt.NDArray[np.int64]
    largest: npt.NDArray[np.float64]
    main_category: npt.NDArray[np.int64]


#: each profile's site sums, kept while it lives: a display asks for the top sites three
#: times (the text, the saved profile, the app's table), each a pass over every allocation
_SITE_SUMS: weakref.WeakKeyDictionary[Profile, _SiteSums | None] = weakref.WeakKeyDictionary()


def _site_sums(profile: Profile) -> _SiteSums | None:
    """The sums of each site of the run's allocations (None: the run allocated nothing)."""
    if profile in _SITE_SUMS:
        return _SITE_SUMS[profile]
    a = profile.allocations
    t = profile.timeline
    rows = np.flatnonzero((a.alloc_seq >= 0) & t.device_mask)
    sums = None
    if len(rows):
        keys = (a.stack[rows].astype(np.int64) + 1) * len(profile.ops) + a.op[rows]
        uniq, inverse = np.unique(keys, return_inverse=True)
        sizes = a.size[rows].astype(np.float64)
        live = t.live_mask(t.peak_index)[rows]
        n = len(uniq)
        largest = np.zeros(n)
        np.maximum.at(largest, inverse, sizes)
        sums = _SiteSums(
            uniq,
            np.asarray(np.bincount(inverse, np.where(live, sizes, 0), n), np.float64),
            np.asarray(np.bincount(inverse, sizes, n), np.float64),
            np.bincount(inverse, minlength=n),
            largest,
            _main_category(inverse * len(CATEGORIES) + a.category[rows], sizes, live, n),
        )
    _SITE_SUMS[profile] = sums
    return sums


def _main_category(
    site_cat: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.float64],
    live: npt.NDArray[np.bool_],
    n: int,
) -> npt.NDArray[np.int64]:
    """Per site, the category of most of its bytes live at the peak (what the row's peak
    figure is made of: a site that mostly makes temporaries may hold a gradient then), else
    of most of its allocated bytes."""
    n_cat = len(CATEGORIES)
    allocated = np.bincount(site_cat, weights=sizes, minlength=n * n_cat).reshape(n, n_cat)
    at_peak = np.bincount(site_cat, weights=np.where(live, sizes, 0), minlength=n * n_cat)
    at_peak = at_peak.reshape(n, n_cat)
    held = at_peak.sum(axis=1) > 0
    main: npt.NDArray[np.int64] = np.where(held, at_peak.argmax(axis=1), allocated.argmax(axis=1))
    return main.astype(np.int64)
