"""The ranks side by side: each rank's peak and what held it, the imbalance in words, and the
difference between two ranks. Plain functions of Profiles (no torch, no widgets)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._model import CATEGORIES, Profile
from .._units import format_bytes

#: What the app calls each distributed kind (_capture/distributed_roles.py names them).
KIND_NAMES: dict[str, str] = {
    "fsdp_sharded_parameter": "sharded parameters",
    "fsdp_unsharded_parameter": "unsharded parameters (all-gathered)",
    "fsdp_sharded_gradient": "sharded gradients",
    "ddp_gradient_bucket": "DDP gradient buckets",
    "all_gather_buffer": "all-gather buffers",
    "reduce_scatter_buffer": "reduce-scatter buffers",
    "collective_temporary": "collective temporaries",
}
#: Where a rank's excess sits, as the imbalance sentence says it ("in its all-gather").
_IN_ITS: dict[str, str] = {
    "fsdp_unsharded_parameter": "all-gather",
    "all_gather_buffer": "all-gather",
    "reduce_scatter_buffer": "reduce-scatter",
    "collective_temporary": "collectives",
    "ddp_gradient_bucket": "gradient buckets",
}
#: Below this share of the highest peak the ranks count as balanced.
BALANCED = 0.01


@dataclass(frozen=True)
class RankPeak:
    rank: int
    peak_bytes: int
    roles: dict[str, int]  # role (distributed kind, else category) -> bytes live at the peak


def rank_of(profile: Profile, index: int) -> int:
    rank = profile.meta.get("rank")
    return rank if isinstance(rank, int) else index


def roles_at_peak(profile: Profile) -> dict[str, int]:
    """Bytes live at the peak per role: an allocation's distributed kind where it has one,
    else its category. The values sum to ``peak_bytes``."""
    t = profile.timeline
    a = profile.allocations
    live = t.live_mask(t.peak_index)
    role = np.array([CATEGORIES[c] for c in range(len(CATEGORIES))], dtype=object)[a.category]
    for kind, rows in profile.meta.get("kinds", {}).items():
        rows = np.asarray(rows, dtype=np.int64)
        rows = rows[(rows >= 0) & (rows < len(a))]
        role[rows] = KIND_NAMES.get(kind, kind)
    out: dict[str, int] = {}
    for name, size in zip(role[live].tolist(), a.size[live].tolist(), strict=True):
        out[name] = out.get(name, 0) + int(size)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def rank_peaks(profiles: Sequence[Profile]) -> list[RankPeak]:
    return [RankPeak(rank_of(p, i), p.peak_bytes, roles_at_peak(p)) for i, p in enumerate(profiles)]


def imbalance(peaks: Sequence[RankPeak]) -> str:
    """One sentence: which rank peaks highest, how far above the others, and in what."""
    if len(peaks) < 2:
        return f"one rank, peak {format_bytes(peaks[0].peak_bytes)}" if peaks else "no ranks"
    top = max(peaks, key=lambda p: p.peak_bytes)
    others = [p for p in peaks if p is not top]
    typical = statistics.median(p.peak_bytes for p in others)
    above = top.peak_bytes - typical
    if above <= BALANCED * top.peak_bytes:
        spread = top.peak_bytes - min(p.peak_bytes for p in peaks)
        return f"the {len(peaks)} ranks peak within {format_bytes(spread)} of each other"
    excess: dict[str, float] = {}
    for role, size in top.roles.items():
        excess[role] = size - statistics.mean(p.roles.get(role, 0) for p in others)
    where = max(excess, key=lambda r: excess[r])
    kind = next((k for k, n in KIND_NAMES.items() if n == where), "")
    named = _IN_ITS.get(kind, where)
    return (
        f"rank {top.rank} peaks {format_bytes(above)} above the others, in its {named}"
        f" (+{format_bytes(excess[where])})"
    )


def rank_difference(a: Profile, b: Profile) -> list[tuple[str, int, int]]:
    """(role, bytes at rank a's peak, bytes at rank b's peak), largest difference first."""
    ra, rb = roles_at_peak(a), roles_at_peak(b)
    roles = sorted(set(ra) | set(rb), key=lambda r: -abs(ra.get(r, 0) - rb.get(r, 0)))
    return [(r, ra.get(r, 0), rb.get(r, 0)) for r in roles]


def ranks_text(profiles: Sequence[Profile]) -> str:
    """Plain-text summary: the imbalance sentence, then each rank's peak and top roles."""
    peaks = rank_peaks(profiles)
    lines = [imbalance(peaks)]
    for p, profile in zip(peaks, profiles, strict=True):
        top = ", ".join(f"{r} {format_bytes(b)}" for r, b in list(p.roles.items())[:3] if b)
        error = f"  [error: {profile.error}]" if profile.error else ""
        lines.append(f"rank {p.rank}: peak {format_bytes(p.peak_bytes)} ({top}){error}")
    return "\n".join(lines)
