"""Steady steps: a loop's later steps recorded as the allocator's reports alone.

A training loop of small steps spends most of its recorded time in what labels each report
(a RecordFunction callback on every op, our Python hooks on every module call), not in the
reports themselves (measured on a 200-step loop: reports alone +4 %, the op callback +18 %,
the hooks +45 %). Every top-level module call begins a step (``NativeSession.mark``); once
the last P steps allocated and freed the same sizes in the same order as the P before them,
begun by the same modules, the light recorder keeps only the reports and checks each against
that pattern (native_reports.cpp). A pattern can take several steps: a model and then a loss
module called at the top level make two a loop iteration, and gradient accumulation repeats
only with its optimizer step. Their ops, modules, phases, stacks and roles are then those of
the steps they repeat (the template), copied when the profile is made. Bytes and times stay
the allocator's own.

The first report that does not repeat the step (another shape, code after the loop, another
thread) is noted by the library; at the next safe moment (the ticker's request, between two
bytecodes) detail comes back on: the reports in between have no labels, and the profile says
how many. A pattern that stopped repeating soon is not tried again: the next must be longer
(as long as the steps between the last two such stops, when that is longer still), so a
loop that steps its optimizer every fourth batch is found to repeat every four steps once the
shorter patterns it fits for a while have failed. ``ops="all"`` records every step in detail.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .builder import ProfileBuilder
from .native import NativeSession
from .profiler_read import Reports

#: report columns a repeated step takes from its template (the rest are its own)
LABELS = ("op", "module", "phase", "stack", "recompute_end")
#: the longest pattern looked for, in steps (``kMaxPeriod`` in native_reports.cpp)
MAX_PERIOD = 16
#: a pattern that repeated this many steps before it stopped was right for a while: the
#: next may be as short (else it must be longer)
LIVED_LONG = 64


@dataclass
class Segment:
    """One stretch of steady steps, as report indices from the recording's first report."""

    template: int  # the template's first report (the steps the pattern was first seen in)
    length: int  # reports per pattern (of ``period`` steps)
    labelled_from: int  # the pattern after the template: labelled from it (its own labels
    # are the same, but notes the steps after it would have made are missing)
    steady_from: int  # reports only from here
    end: int = -1  # the first report that did not repeat the pattern (-1: none)
    resumed: int = -1  # where detail came back on (-1: never)
    offsets: tuple[int, ...] = (0,)  # where each of the pattern's steps begins in it
    first_step: int = 0  # the number of steps begun before ``steady_from``

    @property
    def period(self) -> int:
        """Steps in the pattern."""
        return len(self.offsets)

    def steps(self, count: int) -> int:
        """Steps begun between ``steady_from`` and where the segment ended (``count``: the
        number of reports, when it never did)."""
        stop = self.end if self.end >= 0 else count
        cycles, rest = divmod(max(stop - self.steady_from, 0), self.length)
        return cycles * self.period + sum(1 for offset in self.offsets if offset < rest)


class SteadySteps:
    """When to record a loop's steps as reports alone, and their labels afterwards."""

    def __init__(self, session: NativeSession) -> None:
        self.session = session
        self.on = False
        self.segments: list[Segment] = []
        self._starts: list[int] = []  # the last steps' first reports
        self._steps = 0  # steps begun so far
        self._shortest = 1  # the shortest pattern worth trying now
        self._last_stop: int | None = None  # the step where a pattern last stopped repeating

    def step_begins(self, module_id: int, signum: int) -> bool:
        """A top-level module call begins: whether recording goes steady now (the caller
        then takes its hooks off; the first report that does not repeat raises ``signum``)."""
        index, period = self.session.mark(module_id, self._shortest)
        self._steps += 1
        starts = self._starts
        starts.append(index)
        del starts[: -2 * MAX_PERIOD - 1]
        if not period or len(starts) < 2 * period + 1:
            return False
        template, labelled_from, now = starts[-2 * period - 1], starts[-period - 1], starts[-1]
        steady_from = self.session.steady(True, signum, period)
        if steady_from != now:  # reports came between the mark and now: not the step's start
            self.session.steady(False)
            return False
        offsets = tuple(start - labelled_from for start in starts[-period - 1 : -1])
        length = labelled_from - template
        self.segments.append(
            Segment(
                template, length, labelled_from, now, offsets=offsets, first_step=self._steps - 1
            )
        )
        self.on = True
        starts.clear()
        return True

    def diverged(self) -> bool:
        return self.on and self.session.diverged() >= 0

    def resume(self) -> None:
        """Detail back on (the caller puts its hooks back)."""
        if self.on:
            segment = self.segments[-1]
            segment.end = self.session.diverged()
            segment.resumed = self.session.steady(False)
            self.on = False
            self._after_stop(segment)

    def _after_stop(self, segment: Segment) -> None:
        """Count the steps the segment repeated, and choose the shortest pattern to try next."""
        lived = segment.steps(segment.end)
        stop = segment.first_step + lived - 1  # the step that did not repeat
        self._steps = stop + 1
        since = stop - self._last_stop if self._last_stop is not None else 0
        self._last_stop = stop
        if lived >= LIVED_LONG:
            self._shortest = 1
        else:  # stopped soon: a longer pattern, as long as the stops' spacing if it fits
            hint = since if segment.period < since <= MAX_PERIOD else 0
            self._shortest = min(MAX_PERIOD, max(segment.period + 1, hint))

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
        steps = sum(seg.steps(len(size)) for seg in self.segments)
        # the pattern that covered the most steps (shorter ones may have been tried first)
        period = max(self.segments, key=lambda seg: seg.steps(len(size))).period
        meta = {"steady_steps": steps, "steady_reports": labelled, "steady_period": period}
        pattern = ""
        if period > 1:
            pattern = (
                " (a step runs from one top-level module call to the next; here they repeat "
                f"in groups of {period})"
            )
        lines = [
            f"{steps:,} repeated loop steps{pattern} recorded as the allocator's reports alone "
            "(bytes and times exact; ops, modules and roles copied from the step they repeat; "
            "--all-ops or ops='all' records each in detail)"
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
