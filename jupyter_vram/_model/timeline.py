"""Replay a profile's alloc/free events into live bytes over time, and find the peak.

Numpy over the allocation columns alone (not the Profile), so it sits at the bottom with the
columns: the Profile caches its replay (``Profile.timeline``) and every layer reads it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from .columns import CATEGORIES, PHASES, Allocations, Int64Array

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Timeline:
    """Live bytes on one device after each event, in sequence order.

    Index ``-1`` stands for the state before the first event (the baseline alone); every
    function that takes an event index accepts it.
    """

    allocations: Allocations = field(repr=False)  # the profile's
    device_mask: BoolArray = field(repr=False)  # allocations on the profile's device
    seq: Int64Array  # event sequence numbers, ascending
    time_ns: Int64Array  # event times, relative to the start of recording
    alloc_index: Int64Array  # allocation row of each event
    delta: Int64Array  # +size for an alloc, -size for a free
    total: Int64Array  # live bytes after each event
    baseline_bytes: int
    peak_index: int
    peak_bytes: int

    def __len__(self) -> int:
        return len(self.seq)

    def seq_at(self, index: int) -> int:
        return -1 if index < 0 else int(self.seq[index])

    def live_mask(self, index: int) -> BoolArray:
        """Allocations (rows of the profile) live right after event ``index``."""
        a = self.allocations
        s = self.seq_at(index)
        alive = (a.alloc_seq <= s) & ((a.free_seq < 0) | (a.free_seq > s))
        return alive & self.device_mask

    def breakdown_at(self, index: int) -> dict[str, int]:
        """Category -> live bytes after event ``index``; sums to the total at that point."""
        a = self.allocations
        mask = self.live_mask(index)
        sums = np.bincount(a.category[mask], weights=a.size[mask], minlength=len(CATEGORIES))
        return {name: int(round(v)) for name, v in zip(CATEGORIES, sums, strict=True)}

    def total_at(self, index: int) -> int:
        return self.baseline_bytes if index < 0 else int(self.total[index])

    @property
    def peak_phase(self) -> str:
        """The phase of the event that reached the peak ('baseline' if nothing rose above it)."""
        if self.peak_index < 0:
            return "baseline"
        row = int(self.alloc_index[self.peak_index])
        return PHASES[int(self.allocations.phase[row])]

    def index_at_seq(self, seq: int) -> int:
        """The last event at or before sequence number ``seq`` (-1 if none)."""
        return int(np.searchsorted(self.seq, seq, side="right")) - 1

    def index_at_time(self, time_ns: int) -> int:
        """The last event at or before ``time_ns`` (-1 if none)."""
        return int(np.searchsorted(self.time_ns, time_ns, side="right")) - 1

    def by_category(self, indices: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.int64]:
        """Live bytes per category after each event (or after the events at ``indices``):
        shape (events, categories)."""
        n_cat = len(CATEGORIES)
        cats = self.allocations.category[self.alloc_index]
        if indices is not None:
            return self._by_category_at(np.asarray(indices, np.int64), cats)
        out = np.zeros((len(self.seq), n_cat), np.int64)
        for c in range(n_cat):
            out[:, c] = np.cumsum(np.where(cats == c, self.delta, 0))
        return out + self.baseline_by_category()[None, :]

    def _by_category_at(
        self, at: npt.NDArray[np.int64], cats: npt.NDArray[np.int8]
    ) -> npt.NDArray[np.int64]:
        """:meth:`by_category` after the events ``at`` only (index -1: before the first
        event, the baseline): the deltas are summed per category between consecutive asked
        events, and those sums accumulated, so a chart's few hundred points cost a pass over
        the events, not one per category."""
        n_cat = len(CATEGORIES)
        out = np.zeros((len(at), n_cat), np.int64)
        ends = np.unique(at[at >= 0])  # the events asked for, in order
        if len(ends):
            stop = int(ends[-1]) + 1
            segment = np.repeat(np.arange(len(ends)), np.diff(np.r_[-1, ends]))
            # summed as floats, exact while a segment moves under 2**53 bytes (8 PiB)
            sums = np.bincount(segment * n_cat + cats[:stop], self.delta[:stop], len(ends) * n_cat)
            running = np.cumsum(np.rint(sums).astype(np.int64).reshape(-1, n_cat), axis=0)
            asked = at >= 0
            out[asked] = running[np.searchsorted(ends, at[asked])]
        return out + self.baseline_by_category()[None, :]

    def sample(self, max_points: int = 2000) -> npt.NDArray[np.int64]:
        """At most ``max_points`` event indices that keep the shape of the curve: the highest
        point of each of ``max_points`` equal slices of the run, the global peak included."""
        n = len(self.seq)
        if n <= max_points:
            return np.arange(n, dtype=np.int64)
        edges = np.linspace(0, n, max_points + 1).astype(np.int64)
        picks = np.maximum.reduceat(self.total, edges[:-1])
        # first index in each slice where the slice maximum is reached
        out = np.empty(max_points, np.int64)
        for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
            out[i] = lo + int(np.argmax(self.total[lo:hi] == picks[i]))
        if self.peak_index >= 0:
            out = np.union1d(out, [self.peak_index])
        return out

    def x_values(self, axis: Literal["time", "event"] = "time") -> npt.NDArray[np.float64]:
        """Each event's x on a chart: ms since the start (never decreasing), or 1..n."""
        if axis == "time":
            return np.maximum.accumulate(self.time_ns.astype(np.float64) / 1e6)
        return np.arange(1, len(self.seq) + 1, dtype=np.float64)

    def peak_x(self, axis: Literal["time", "event"] = "time") -> float | None:
        """The peak's x on a chart (as :meth:`x_values` places it); None: the peak is the
        baseline, before the first event."""
        if self.peak_index < 0:
            return None
        if axis == "time":
            return float(self.time_ns[: self.peak_index + 1].max() / 1e6)
        return float(self.peak_index + 1)

    def bucket_peaks(
        self,
        buckets: int = 600,
        *,
        axis: Literal["time", "event"] = "time",
        start: float | None = None,
        end: float | None = None,
    ) -> tuple[npt.NDArray[np.float64], Int64Array]:
        """What a chart ``buckets`` pixels wide should draw so that no maximum is lost.

        The x axis (ms since the start, or event number 1..n) from ``start`` (default 0) to
        ``end`` (default: the last event) is cut into ``buckets`` equal slices. Each slice that
        holds events is drawn at the level of its highest event, from the slice's start; a
        slice followed by empty ones hands over, at the next slice's start, to its last event's
        level (what holds until the next event). Returns (x, event index) of those steps,
        starting at ``start`` (with the level from before it, index -1 being the baseline, when
        the first slice is empty) and ending at ``end``; the highest event in the range is
        always one of them.
        """
        n = len(self.seq)
        if n == 0:
            return np.zeros(1), np.full(1, -1, np.int64)
        xs = self.x_values(axis)
        lo = 0.0 if start is None else max(0.0, float(start))
        hi = float(xs[-1]) if end is None else min(float(end), float(xs[-1]))
        if hi <= lo:
            hi = lo + (1.0 if xs[-1] <= 0 else float(xs[-1]) * 1e-9)
        first = int(np.searchsorted(xs, lo, side="left"))
        stop = int(np.searchsorted(xs, hi, side="right"))
        width = (hi - lo) / buckets
        if stop <= first:  # no event in the range: the level held across it
            return np.asarray([lo, hi]), np.asarray([first - 1, first - 1], np.int64)
        # x never decreases, so each slice's events are one run of ``slot``
        slot = np.minimum(((xs[first:stop] - lo) / width).astype(np.int64), buckets - 1)
        total = self.total[first:stop]
        starts = np.flatnonzero(np.r_[True, slot[1:] != slot[:-1]])  # each run's first event
        level = np.maximum.reduceat(total, starts)  # each run's highest level
        at_level = np.flatnonzero(total == np.repeat(level, np.diff(np.r_[starts, len(slot)])))
        highest = at_level[np.searchsorted(at_level, starts)] + first  # earliest on ties
        used = slot[starts]
        last = np.r_[starts[1:] - 1, len(slot) - 1] + first
        x: list[float] = []
        index: list[int] = []
        if used[0] > 0:
            x.append(lo)
            index.append(first - 1)
        for k, b in enumerate(used.tolist()):
            x.append(lo + b * width)
            index.append(int(highest[k]))
            following = int(used[k + 1]) if k + 1 < len(used) else buckets
            if following > b + 1 or (k + 1 == len(used) and int(last[k]) != int(highest[k])):
                x.append(min(lo + (b + 1) * width, hi))
                index.append(int(last[k]))
        if x[-1] < hi:  # the last level's right edge
            x.append(hi)
            index.append(index[-1])
        return np.asarray(x), np.asarray(index, np.int64)

    def baseline_by_category(self) -> Int64Array:
        a = self.allocations
        mask = (a.alloc_seq < 0) & self.device_mask
        sums = np.bincount(a.category[mask], weights=a.size[mask], minlength=len(CATEGORIES))
        return np.rint(sums).astype(np.int64)


def replay(a: Allocations, device_id: int) -> Timeline:
    """Sort the events of the allocations on device ``device_id`` (an index into the
    profile's devices table) by sequence and accumulate live bytes."""
    on_device = a.device == device_id
    rows = np.arange(len(a), dtype=np.int64)

    alloc_rows = rows[on_device & (a.alloc_seq >= 0)]
    free_rows = rows[on_device & (a.free_seq >= 0)]
    seq = np.concatenate([a.alloc_seq[alloc_rows], a.free_seq[free_rows]])
    times = np.concatenate([a.alloc_ns[alloc_rows], a.free_ns[free_rows]])
    alloc_index = np.concatenate([alloc_rows, free_rows])
    delta = np.concatenate([a.size[alloc_rows], -a.size[free_rows]])
    order = np.argsort(seq, kind="stable")
    seq, times, alloc_index, delta = seq[order], times[order], alloc_index[order], delta[order]

    baseline = int(a.size[on_device & (a.alloc_seq < 0)].sum())
    total = baseline + np.cumsum(delta, dtype=np.int64)
    if len(total) and int(total.max()) > baseline:
        peak_index = int(np.argmax(total))
        peak = int(total[peak_index])
    else:
        peak_index, peak = -1, baseline
    return Timeline(
        allocations=a,
        device_mask=on_device,
        seq=seq,
        time_ns=times,
        alloc_index=alloc_index,
        delta=delta,
        total=total,
        baseline_bytes=baseline,
        peak_index=peak_index,
        peak_bytes=peak,
    )
