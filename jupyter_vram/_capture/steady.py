"""Steady steps: a loop's later steps recorded as the allocator's reports alone.

A training loop of small steps spends most of its recorded time in what labels each report
(a RecordFunction callback on every op, our Python hooks on every module call), not in the
reports themselves (measured on a 200-step loop: reports alone +4 %, the op callback +18 %,
the hooks +45 %). Every top-level module call begins a step (``NativeSession.mark``); once a
step allocated and freed the same sizes in the same order as the step before it, begun by
the same module, the light recorder keeps only the reports and checks each against that
step (native_reports.cpp). Their ops, modules, phases, stacks and roles are then those of the
step they repeat (the template), copied when the profile is made. Bytes and times stay the
allocator's own.

The first report that does not repeat the step (another shape, code after the loop, another
thread) is noted by the library; at the next safe moment (the ticker's request, between two
bytecodes) detail comes back on: the reports in between have no labels, and the profile says
how many. ``ops="all"`` records every step in detail.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .builder import ProfileBuilder
from .native import NativeSession
from .profiler_read import Reports

#: report columns a repeated step takes from its template (the rest are its own)
LABELS = ("op", "module", "phase", "stack", "recompute_end")


@dataclass
class Segment:
    """One stretch of steady steps, as report indices from the recording's first report."""

    template: int  # the template step's first report
    length: int  # reports per step
    labelled_from: int  # the step after the template: labelled from it (its own labels are
    # the same, but notes the step after it would have made are missing)
    steady_from: int  # reports only from here
    end: int = -1  # the first report that did not repeat the step (-1: none)
    resumed: int = -1  # where detail came back on (-1: never)


class SteadySteps:
    """When to record a loop's steps as reports alone, and their labels afterwards."""

    def __init__(self, session: NativeSession) -> None:
        self.session = session
        self.on = False
        self.segments: list[Segment] = []
        self._starts: list[int] = []  # the last three steps' first reports

    def step_begins(self, module_id: int, signum: int) -> bool:
        """A top-level module call begins: whether recording goes steady now (the caller
        then takes its hooks off; the first report that does not repeat raises ``signum``)."""
        index, repeated = self.session.mark(module_id)
        starts = self._starts
        starts.append(index)
        del starts[:-3]
        if not repeated or len(starts) < 3:
            return False
        template, labelled_from, now = starts
        steady_from = self.session.steady(True, signum)
        if steady_from != now:  # reports came between the mark and now: not the step's start
            self.session.steady(False)
            return False
        self.segments.append(Segment(template, labelled_from - template, labelled_from, now))
        self.on = True
        starts.clear()
        return True

    def diverged(self) -> bool:
        return self.on and self.session.diverged() >= 0

    def resume(self) -> None:
        """Detail back on (the caller puts its hooks back)."""
        if self.on:
            self.segments[-1].end = self.session.diverged()
            self.segments[-1].resumed = self.session.steady(False)
            self.on = False

    def finish(self) -> None:
        """Recording stops (before the library does): where the last segment's steps ended."""
        if self.on:
            self.segments[-1].end = self.session.diverged()
            self.on = False

    def label(self, reports: Reports) -> tuple[np.ndarray, np.ndarray]:
        """Give each repeated report its template's labels (in place); the (repeated,
        template) report indices. A segment whose sizes do not line up (reports of
        another thread reordered by time) is left as recorded."""
        size = reports.view("size")
        pairs = [_pairs(seg, len(size)) for seg in self.segments]
        pairs = [(dst, src) for dst, src in pairs if np.array_equal(size[dst], size[src])]
        if not pairs:
            return _NONE, _NONE
        dst = np.concatenate([p[0] for p in pairs])
        src = np.concatenate([p[1] for p in pairs])
        for name in LABELS:
            column = reports.view(name)
            column[dst] = column[src]
            del column  # the array may grow again
        return dst, src

    def describe(self, size: np.ndarray, labelled: int) -> tuple[dict[str, int], list[str]]:
        """For ``meta`` and a warning line each: how many reports took a step's labels
        (``labelled``; ``size``: every report's) and how many allocations have none."""
        if not self.segments:
            return {}, []
        count = len(size)
        steps = sum(
            -(-((seg.end if seg.end >= 0 else count) - seg.steady_from) // seg.length)
            for seg in self.segments
        )
        meta = {"steady_steps": steps, "steady_reports": labelled}
        lines = [
            f"{steps:,} repeated loop steps recorded as the allocator's reports alone (bytes "
            "and times exact), labelled from the step they repeat (--all-ops or ops='all' "
            "records each in detail)"
        ]
        missing = self.unlabelled(size)
        if missing:
            meta["unlabelled_allocations"] = missing
            lines.append(
                f"{missing:,} allocations made after a step stopped repeating, before detail "
                "came back on, have no op, module or role"
            )
        return meta, lines

    def unlabelled(self, size: np.ndarray) -> int:
        """Allocations with no labels: made after a step stopped repeating, before detail
        came back on (or recording stopped)."""
        total = 0
        for seg in self.segments:
            if seg.end >= 0:
                stop = seg.resumed if seg.resumed >= 0 else len(size)
                total += int(np.count_nonzero(size[seg.end : stop] > 0))
        return total


def _pairs(seg: Segment, count: int) -> tuple[np.ndarray, np.ndarray]:
    end = seg.end if seg.end >= 0 else count
    dst = np.arange(seg.labelled_from, max(end, seg.labelled_from), dtype=np.int64)
    dst = dst[dst < count]
    src = seg.template + (dst - seg.labelled_from) % seg.length
    return dst, src


_NONE = np.zeros(0, np.int64)


def copy_roles(
    builder: ProfileBuilder, size: np.ndarray, first: int, dst: np.ndarray, src: np.ndarray
) -> None:
    """The rows of repeated allocations take their template rows' role and module (set by
    role notes, which the hooks make only in detail). ``size``: every report's (rows are
    made in report order, one per allocation, from row ``first``)."""
    if not len(dst):
        return
    made = size > 0
    row = np.cumsum(made) - 1 + first
    keep = made[dst]
    to, of = row[dst[keep]], row[src[keep]]
    category = np.frombuffer(builder.category, np.int8)
    module = np.frombuffer(builder.module, np.int32)
    category[to], module[to] = category[of], module[of]
    del category, module  # the columns may grow again
