"""Allocation rows from the allocator's reports, the role notes and what other threads did.

See :func:`build_rows`; the reports come from ``profiler_read``, the evidence about other
threads from ``cpu_threads``.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from . import native
from .builder import BASELINE_OP, OTHER, TEMPORARY, ProfileBuilder
from .cpu_threads import MemoryMap
from .profiler_read import EventRead, Reports
from .tagging import (
    ACTIVATION,
    BUFFER,
    FROZEN_PARAMETER,
    GRADIENT,
    OPTIMIZER_STATE,
    PARAMETER,
    PHASE_BACKWARD,
    PHASE_FORWARD,
    QUANT_STATE,
)

ELSEWHERE_OP = "(another thread)"
#: A role noted within this many ns of an allocation's start still belongs to it: notes are
#: stamped with time.time_ns(), reports with the profiler's clock converted to the same
#: system time, and the two differ by a conversion error of about a microsecond.
_TOLERANCE_NS = 20_000


def build_rows(
    builder: ProfileBuilder,
    read: EventRead,
    notes: Sequence[tuple[int, int, int, int, int, int]] | np.ndarray,
    freed: dict[int, int],
    *,
    t0: int,
    threads_ran_from: int | None = None,
    maps: Sequence[MemoryMap] = (),
) -> Rows:
    """Turn allocator reports, role notes and release times into allocation rows; return how
    many frees were inferred (made where the allocator does not report: another thread) and
    the rows' addresses.

    Each report pairs with the live allocation at its address. Each note (time, address, size,
    category, module, storage key) goes to the allocation holding that address at that time,
    or, when none does, to a row for memory no report covers. That memory was held before
    recording (a baseline row) unless there is evidence that another thread made it during
    the recording (an ``(another thread)`` row):

    * the address: a report made during the recording, before the note, covered some of the
      same bytes (an allocation, or a free of memory an earlier recording allocated), or a
      memory map snapshot (``maps``) taken during the recording did not have them mapped, so
      this memory came later; the row starts when those bytes were last seen not to be it;
    * a thread: another thread is known to have run user code from ``threads_ran_from`` on
      (see :class:`_ThreadWatch`), the note comes after that, and it is data (an input, an
      activation, a tensor the cell keeps), not a model's parameters, buffers, gradients or
      optimizer state, which come from before the cell unless their address says otherwise.
      This is weaker evidence (data held before the cell that the namespace scan did not
      reach looks the same), so the row starts with the recording, as memory held before
      would: a wrong guess moves bytes out of "before the cell", never out of a peak.

    Without either (no other thread, or only idle ones) the memory was there before the cell,
    as it would be in a run alone. Baseline and other-thread rows end when their storage died
    (``freed``), the allocator reported their free, or a later report reused their bytes.

    The allocator reports a free only on the thread that makes it: memory allocated here and
    freed on another thread (gloo's work threads free DDP buffers) would stay live to the end.
    Such frees are inferred, each at the latest time the evidence allows: a later allocation
    overlapping the block (the allocator reuses addresses) ends it just before; the death of
    its noted storage (a weakref) ends it then; a noted storage of another thread over its
    bytes ends it just before the note; a snapshot of the process's memory map (``maps``,
    taken at the start, at module calls at most every 50 ms, and at the end) in which its
    first byte is not mapped at all ends it then (memory still allocated is always mapped).

    The addresses returned (one per row, -1 for none) are those of the rows made while
    recording whose free no report gave: what ties a storage alive at the end to its row.
    """
    for name in read.ops[1:]:
        builder.ops(name)
    cpu = builder.devices("cpu")
    table = np.asarray(notes, np.int64).reshape(-1, 6)
    r = _replay_reports(builder, read.events, cpu, t0, set(table[:, 1].tolist()))
    space = _Space(r.blocks, r.orphans, r.alloc_time, r.free_time)
    unreported = _place_notes(builder, r, space, table, freed, cpu, t0, threads_ran_from, maps)
    _kept_for_backward(builder, r)
    if maps:
        _unmapped_ends(r, unreported, maps)
    addresses = np.full(len(builder), -1, np.int64)
    live_ptrs, live_rows = r.live
    addresses[live_rows] = live_ptrs
    for row, (_, ptr, _) in unreported.items():
        addresses[row] = ptr
    _sequence(builder, r.alloc_time, r.free_time, t0)
    inferred = sum(1 for row in r.inferred if not r.was_reported(row))
    return Rows(inferred, addresses)


class Rows(NamedTuple):
    """What :func:`build_rows` found beside the rows."""

    inferred_frees: int
    addresses: np.ndarray  # one per row, -1 where none is kept


#: "no time": a row without one in a :class:`_Times` column
_UNSET = np.iinfo(np.int64).max


class _Times:
    """Row -> time (ns): a column for the rows of the reports (``_UNSET`` where a row has
    none) and a dict for the rows added after them. A dict of every row, built and then
    read back into arrays, cost more than the rest of reading a cell of many tensors."""

    def __init__(self, first: int, column: np.ndarray) -> None:
        self.first = first
        self.column = column
        self._later: dict[int, int] = {}

    def get(self, row: int, default: int) -> int:
        i = row - self.first
        if 0 <= i < len(self.column):
            t = int(self.column[i])
            return default if t == _UNSET else t
        return self._later.get(row, default)

    def __getitem__(self, row: int) -> int:
        t = self.get(row, _UNSET)
        if t == _UNSET:
            raise KeyError(row)
        return t

    def __setitem__(self, row: int, t: int) -> None:
        i = row - self.first
        if 0 <= i < len(self.column):
            self.column[i] = t
        else:
            self._later[row] = t

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, times) of every row that has a time."""
        held = np.flatnonzero(self.column != _UNSET)
        later = len(self._later)
        rows = np.fromiter(self._later.keys(), np.int64, later)
        times = np.fromiter(self._later.values(), np.int64, later)
        return np.concatenate([held + self.first, rows]), np.concatenate([self.column[held], times])


_NONE = np.zeros(0, np.int64)


@dataclass
class _Replay:
    """What replaying the allocator's reports left: the blocks still live (by address), and
    each row's allocation and free times (reported, or inferred where the reports are silent).
    Per-row facts are columns over the reports' rows (from ``first`` on)."""

    first: int = 0  # the row of the first report's allocation
    #: (address, time, row) of the allocations made at a noted address, by address then time
    noted: tuple[np.ndarray, np.ndarray, np.ndarray] = (_NONE, _NONE, _NONE)
    live: tuple[np.ndarray, np.ndarray] = (_NONE, _NONE)  # (address, row) of blocks not freed
    alloc_time: _Times = field(default_factory=lambda: _Times(0, _NONE.copy()))
    reported: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # a free reported
    inferred: dict[int, int] = field(default_factory=dict)  # row -> time of an unreported free
    evicted: dict[int, int] = field(default_factory=dict)  # row -> address (a later block over it)
    #: the allocations' address, end and row, as columns
    blocks: tuple[np.ndarray, np.ndarray, np.ndarray] = (_NONE, _NONE, _NONE)
    orphans: list[tuple[int, int, int]] = field(default_factory=list)  # frees of no row here
    recompute_end: dict[int, int] = field(default_factory=dict)
    free_phase: tuple[np.ndarray, np.ndarray] = (_NONE, _NONE)  # (row, phase) of reported frees
    #: inferred, then reported, frees
    free_time: _Times = field(default_factory=lambda: _Times(0, _NONE.copy()))

    def was_reported(self, row: int) -> bool:
        """Whether the allocator reported this row's free."""
        i = row - self.first
        return 0 <= i < len(self.reported) and bool(self.reported[i])

    def made_at(self, ptr: int) -> list[tuple[int, int]]:
        """(time, row) of the allocations made at a noted address, in time order."""
        starts, times, rows = self.noted
        lo = int(np.searchsorted(starts, ptr, "left"))
        hi = int(np.searchsorted(starts, ptr, "right"))
        return list(zip(times[lo:hi].tolist(), rows[lo:hi].tolist(), strict=True))


def _replay_reports(
    builder: ProfileBuilder, events: Reports, cpu: int, t0: int, noted: set[int]
) -> _Replay:
    """1. Allocations made while recording, each report paired with the live block at its
    address (:func:`_links`); rows are added in bulk, in report order; ``noted`` only for
    the addresses a role note names (``noted``)."""
    r = _Replay()

    def column(name: str, dtype: type) -> np.ndarray:
        return np.frombuffer(getattr(events, name), dtype)

    t, ptr, size = column("time_ns", np.int64), column("ptr", np.int64), column("size", np.int64)
    link = _links(ptr, size)
    made = np.flatnonzero(size > 0)
    r.first = len(builder)
    rows = np.arange(r.first, r.first + len(made))
    ended_by = link[made]
    freed = ended_by >= 0
    reported = freed & (size[np.maximum(ended_by, 0)] < 0)
    unseen = freed & ~reported  # a later allocation over its bytes: freed where none reported
    starts, ends, times = ptr[made], ptr[made] + size[made], t[made]
    r.alloc_time = _Times(r.first, times.copy())
    by, guessed = ended_by[reported], t[ended_by[unseen]] - 1
    free = np.full(len(made), _UNSET, np.int64)
    free[unseen] = guessed
    free[reported] = t[by]
    r.free_time = _Times(r.first, free)
    r.reported = reported
    r.free_phase = (rows[reported], column("phase", np.int8)[by])
    r.inferred = dict(zip(rows[unseen].tolist(), guessed.tolist(), strict=True))
    r.evicted = dict(zip(rows[unseen].tolist(), starts[unseen].tolist(), strict=True))
    r.live = (starts[~freed], rows[~freed])
    r.blocks = (starts, ends, rows)
    lost = np.flatnonzero((size < 0) & (link < 0))  # frees of no block allocated here
    ends_lost = ptr[lost] - size[lost]
    r.orphans = list(zip(ptr[lost].tolist(), ends_lost.tolist(), t[lost].tolist(), strict=True))
    if noted:
        named = np.flatnonzero(np.isin(starts, np.fromiter(noted, np.int64, len(noted))))
        named = named[np.argsort(starts[named], kind="stable")]  # by address, then in order
        r.noted = (starts[named], times[named], rows[named])
    recompute = column("recompute_end", np.int64)[made]
    kept = np.flatnonzero(recompute)
    r.recompute_end = dict(zip(rows[kept].tolist(), recompute[kept].tolist(), strict=True))
    _add_rows(builder, events, cpu, t0)
    return r


def _links(ptr: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Each report paired (time order; size > 0 an allocation, < 0 a free): for an
    allocation, the report that ended it (-1: live at the end); for a free, the allocation it
    ended (-1: none recorded). A free ends the live block at its address; an allocation over
    bytes of live blocks ends them (they were freed where no report was made: another
    thread). The light recorder's library does this in C++ (``jv_links``); this is the same
    rule where it is not loaded."""
    found = native.links(ptr, size)
    return found if found is not None else links_in_python(ptr, size)


def links_in_python(ptr: np.ndarray, size: np.ndarray) -> np.ndarray:
    """:func:`_links` without the library."""
    link = np.full(len(ptr), -1, np.int64)
    live: dict[int, tuple[int, int]] = {}  # start -> (allocation, end)
    starts = SortedInts()
    for i, (start, n) in enumerate(zip(ptr.tolist(), size.tolist(), strict=True)):
        if n > 0:
            end = start + n
            other = starts.before(end)
            while other is not None:  # live blocks never overlap: the ones further left end before
                held, other_end = live[other]
                if other_end <= start:
                    break
                starts.remove(other)
                del live[other]
                link[held] = i
                other = starts.before(end)
            live[start] = (i, end)
            starts.add(start)
        elif n < 0:
            block = live.pop(start, None)
            if block is not None:
                starts.remove(start)
                link[block[0]] = i
                link[i] = block[0]
    return link


def _add_rows(builder: ProfileBuilder, events: Reports, cpu: int, t0: int) -> None:
    """The rows of the allocation reports, in order, as temporaries until a role says more."""

    def column(name: str, dtype: type) -> np.ndarray:
        return np.frombuffer(getattr(events, name), dtype)

    made = column("size", np.int64) > 0
    builder.add_many(
        size=column("size", np.int64)[made],
        alloc_ns=column("time_ns", np.int64)[made] - t0,
        device=cpu,
        op=column("op", np.int32)[made],
        module=column("module", np.int32)[made],
        stack=column("stack", np.int32)[made],
        phase=column("phase", np.int8)[made],
        category=TEMPORARY,
    )


def _place_notes(
    builder: ProfileBuilder,
    r: _Replay,
    space: _Space,
    notes: np.ndarray,
    freed: dict[int, int],
    cpu: int,
    t0: int,
    threads_ran_from: int | None,
    maps: Sequence[MemoryMap],
) -> dict[int, tuple[int, int, int]]:
    """2. Each role note goes to the row holding its address then, or to a row of memory no
    report covers (before the recording, or another thread's). Returns those rows -> (storage
    key, address, last note), their ends set from the evidence."""
    free_time, inferred = r.free_time, r.inferred
    baseline: dict[int, int] = {}  # storage key -> its row (before recording / elsewhere)
    unreported: dict[int, tuple[int, int, int]] = {}
    made_times = r.alloc_time.column
    first_made = int(made_times.min()) if len(made_times) else sys.maxsize
    taken = _early_notes(builder, notes, first_made, t0, cpu, baseline, unreported)
    later = notes[taken:]
    at_once = _notes_at_once(builder, r, space, later, baseline, unreported)
    skip = (at_once.rows >= 0).tolist()
    named: list[tuple[int, int, int]] = []  # (note, row, module) of the others
    for i, (t, ptr, size, category, module, key) in enumerate(later.tolist()):
        if skip[i]:
            continue
        row_or_none = _holder(r.made_at(ptr), t, free_time)
        if row_or_none is None:
            row_or_none = space.inside(ptr, size, t)  # a storage over part of a block's bytes
        if row_or_none is not None:
            row = row_or_none
            died = freed.get(key)
            if (
                not r.was_reported(row)
                and died is not None
                and died >= t - _TOLERANCE_NS
                and died < free_time.get(row, sys.maxsize)
                and builder.size[row] == size
            ):
                free_time[row] = inferred[row] = died  # its last reference went elsewhere
        elif key in baseline:
            row = baseline[key]
            if i > at_once.last.get(row, -1):
                unreported[row] = (key, ptr, t)
        else:
            row = _uncovered_row(builder, r, space, (t, ptr, size, category), t0, cpu,
                                 threads_ran_from, maps)  # fmt: skip
            baseline[key] = row
            unreported[row] = (key, ptr, t)
        builder.promote(row, category)
        if module:
            named.append((i, row, module))
    _first_modules(builder, at_once.rows, at_once.modules, named)
    _end_uncovered(builder, space, unreported, freed, free_time)
    return unreported


def _uncovered_row(
    builder: ProfileBuilder,
    r: _Replay,
    space: _Space,
    note: tuple[int, int, int, int],
    t0: int,
    cpu: int,
    threads_ran_from: int | None,
    maps: Sequence[MemoryMap],
) -> int:
    """A row for a storage no report covers, first noted at ``note`` (time, address, size,
    role): held before the recording, or made by another thread from when the evidence
    (see :func:`build_rows`) says; a block of ours still live over its bytes ended before."""
    t, ptr, size, category = note
    made = None
    if t > t0:
        for other in space.live_at(ptr, size, t):
            if not r.was_reported(other):  # its bytes are this storage's now
                r.free_time[other] = r.inferred[other] = t - 1
        made = _made_after(space.gone_before(ptr, size, t, t0), maps, ptr, t, t0)
        if (
            made is None
            and threads_ran_from is not None
            and t >= threads_ran_from
            and category not in _MODEL_STATE
        ):
            made = t0
    if made is not None:
        row = builder.add(size, 0, made - t0, cpu, builder.ops(ELSEWHERE_OP), 0, -1, 0, 0)
        r.alloc_time[row] = made
    else:
        row = builder.add(size, -1, 0, cpu, builder.ops(BASELINE_OP), 0, -1, 0, 0)
    builder.category[row] = OTHER
    return row


def _end_uncovered(
    builder: ProfileBuilder,
    space: _Space,
    unreported: dict[int, tuple[int, int, int]],
    freed: dict[int, int],
    free_time: _Times,
) -> None:
    """End each row of memory no report covers where the evidence says (see
    :func:`_release`), asking only about those something could have ended."""
    rows = np.fromiter(unreported, np.int64, len(unreported))
    ptrs = np.fromiter((ptr for _, ptr, _ in unreported.values()), np.int64, len(unreported))
    sizes = np.frombuffer(builder.size, np.int64)[rows]
    near = space.blocks_may_be_over(ptrs, ptrs + sizes).tolist()
    orphaned = space.orphan_starts
    for (row, (key, ptr, noted)), size, reused in zip(
        unreported.items(), sizes.tolist(), near, strict=True
    ):
        if not reused and key not in freed and ptr not in orphaned:
            continue  # nothing could have ended it (see _release)
        released = _release(key, ptr, size, noted, freed, space, reused=reused)
        if released is not None:
            free_time[row] = released


def _notes_at_once(
    builder: ProfileBuilder,
    r: _Replay,
    space: _Space,
    notes: np.ndarray,
    baseline: dict[int, int],
    unreported: dict[int, tuple[int, int, int]],
) -> _AtOnce:
    """The notes whose row is settled before any note is placed, placed together (a training
    loop notes thousands: its gradients, the activations saved for backward):

    * on a reported block: the latest allocation at the note's address made by then (what
      :func:`_holder` looks at first) holds it when it was still live then, and whether it
      was cannot change when the allocator reported its free (only unreported ends are
      inferred, and only made earlier);
    * on memory from before the cell: no allocation at its address, no reported block over
      its bytes, and its storage given a row by :func:`_early_notes` (the parameters and
      inputs autograd saves, noted again at every step).

    Each raises its row's role as :meth:`ProfileBuilder.promote` does; a before-the-cell
    row keeps its last note, as the loop would. Modules are given later, in note order
    (:func:`_first_modules`)."""
    decided = np.full(len(notes), -1, np.int64)
    if not len(notes):
        return _AtOnce(decided, np.zeros(0, np.int64), {})
    t, ptr, size, category, modules, key = notes.T
    starts, times, rows = r.noted
    made_there = np.zeros(len(notes), bool)
    if len(starts):
        held, made_there = _latest_made(starts, times, rows, ptr, t)
        i = np.clip(held - r.first, 0, max(len(r.reported) - 1, 0))
        settled = (held >= 0) & r.reported[i] & (r.free_time.column[i] >= t - _TOLERANCE_NS)
        decided[settled] = held[settled]
    last: dict[int, int] = {}
    if baseline:
        old = ~made_there & ~space.blocks_may_be_over(ptr, ptr + size)
        old &= np.isin(key, np.fromiter(baseline, np.int64, len(baseline)))
        for n in np.flatnonzero(old).tolist():  # in note order: the last one stays
            row = decided[n] = baseline[int(key[n])]
            unreported[row] = (int(key[n]), int(ptr[n]), int(t[n]))
            last[row] = n
    placed = decided >= 0
    builder.promote_many(decided[placed], category[placed])
    return _AtOnce(decided, modules, last)


class _AtOnce(NamedTuple):
    """What :func:`_notes_at_once` placed."""

    rows: np.ndarray  # each note's row (-1: left to the loop)
    modules: np.ndarray  # each note's module
    last: dict[int, int]  # a before-the-cell row -> the last note placed on it


def _latest_made(
    starts: np.ndarray, times: np.ndarray, rows: np.ndarray, ptr: np.ndarray, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each (address, time): the row of the latest allocation made at that address by
    then (-1: none), and whether any was made there. ``starts``/``times``/``rows``: the
    allocations, by address then time. One sorted key over (address, time), each address a
    band of the recording's times, where that fits in 62 bits (else none found: the loop
    places those notes)."""
    low = int(times.min())
    width = int(times.max()) - low + 2
    addresses, band = np.unique(starts, return_inverse=True)
    at = np.searchsorted(addresses, ptr)
    made_there = addresses[np.minimum(at, len(addresses) - 1)] == ptr
    held = np.full(len(ptr), -1, np.int64)
    if (len(addresses) + 1) * width >= 1 << 62:
        return held, made_there  # a cell of hours over many addresses
    keys = band * width + (times - low + 1)
    asked = at * width + np.clip(t + _TOLERANCE_NS - low + 1, 0, width - 1)
    latest = np.searchsorted(keys, asked, "right") - 1
    found = made_there & (latest >= 0)
    found[found] &= band[latest[found]] == at[found]
    held[found] = rows[latest[found]]
    return held, made_there


def _first_modules(
    builder: ProfileBuilder,
    decided: np.ndarray,
    modules: np.ndarray,
    named: list[tuple[int, int, int]],
) -> None:
    """A row without a module takes the first note's, in note order, that names one
    (``decided``: the holder of each note placed at once, with its ``modules``; ``named``:
    (note, row, module) of the others)."""
    at_once = np.flatnonzero((decided >= 0) & (modules != 0))
    others = np.array(named, np.int64).reshape(-1, 3)
    notes = np.concatenate([at_once, others[:, 0]])
    if not len(notes):
        return
    order = np.argsort(notes, kind="stable")
    rows = np.concatenate([decided[at_once], others[:, 1]])[order]
    names = np.concatenate([modules[at_once], others[:, 2]])[order]
    held, first = np.unique(rows, return_index=True)
    column = np.frombuffer(builder.module, np.int32)
    unnamed = column[held] == 0
    column[held[unnamed]] = names[first[unnamed]]
    del column  # the builder's column may grow again


def _early_notes(
    builder: ProfileBuilder,
    notes: np.ndarray,
    first_made: int,
    t0: int,
    cpu: int,
    baseline: dict[int, int],
    unreported: dict[int, tuple[int, int, int]],
) -> int:
    """The first notes, taken before any reported allocation could hold their bytes (the
    namespace's tensors, noted as recording starts: up to 50,000), all at once: a row of
    memory from before the cell per storage, with what :func:`_place_notes` would give it
    one note at a time (its first note's size, its strongest role, its first module, its
    last note). Returns how many notes that took."""
    if not len(notes):
        return 0
    table = notes[:_EARLY_MAX]
    early = (table[:, 0] + _TOLERANCE_NS < first_made) & (table[:, 0] <= t0)
    taken = len(early) if early.all() else int(np.argmin(early))
    if not taken:
        return 0
    t, ptr, size, category, module, key = table[:taken].T
    keys, first, which = np.unique(key, return_index=True, return_inverse=True)
    last = taken - 1 - np.unique(key[::-1], return_index=True)[1]
    modules = np.zeros(len(keys), np.int64)
    named = np.flatnonzero(module)
    if len(named):
        owners, at = np.unique(which[named], return_index=True)
        modules[owners] = module[named[at]]
    order = np.argsort(first, kind="stable")  # rows in the order their storages were noted
    row0 = len(builder)
    builder.add_many(
        size=size[first[order]],
        alloc_ns=np.zeros(len(keys), np.int64),
        device=cpu,
        op=np.full(len(keys), builder.ops(BASELINE_OP)),
        module=modules[order],
        stack=np.full(len(keys), -1),
        phase=np.zeros(len(keys), np.int8),
        category=OTHER,  # a row starts as other; a note only raises it
        alloc_seq=-1,
    )
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    builder.promote_many(row0 + rank[which], category)
    rows = range(row0, row0 + len(keys))
    ordered = keys[order].tolist()
    baseline.update(zip(ordered, rows, strict=True))
    ends = last[order]
    unreported.update(
        zip(rows, zip(ordered, ptr[ends].tolist(), t[ends].tolist(), strict=True), strict=True)
    )
    return taken


#: notes looked at for :func:`_early_notes` (the namespace's are at most 50,000)
_EARLY_MAX = 60_000


def _kept_for_backward(builder: ProfileBuilder, r: _Replay) -> None:
    """3. What the roles cannot say: kept across a recompute, or saved outside module calls."""
    for row, until in r.recompute_end.items():
        if builder.category[row] == TEMPORARY and r.free_time.get(row, sys.maxsize) > until:
            builder.category[row] = ACTIVATION
    # kept from forward until backward released it: saved for backward where our saved-tensor
    # hooks were not on (the loss, outside any module call)
    rows, phases = r.free_phase
    released = rows[phases == PHASE_BACKWARD]
    if len(released):
        category = np.frombuffer(builder.category, np.int8)
        made_in = np.frombuffer(builder.phase, np.int8)[released]
        kept = released[(category[released] == TEMPORARY) & (made_in == PHASE_FORWARD)]
        category[kept] = ACTIVATION
        del category  # the builder's column may grow again


def _unmapped_ends(
    r: _Replay, unreported: dict[int, tuple[int, int, int]], maps: Sequence[MemoryMap]
) -> None:
    """4. Blocks unmapped while we still thought them held: freed then, on another thread."""
    last = maps[-1]
    ptrs, rows = r.live
    ask = ~last.holds_each(ptrs)  # the others are mapped at the end and not inferred freed
    if r.inferred:
        ask |= np.isin(rows, np.fromiter(r.inferred, np.int64, len(r.inferred)))
    live = (ptrs[ask], rows[ask])
    held = np.fromiter(unreported, np.int64, len(unreported))  # before the cell: up to 50,000
    where = np.fromiter((ptr for _, ptr, _ in unreported.values()), np.int64, len(held))
    asked = ~last.holds_each(where)
    if r.inferred:
        asked |= np.isin(held, np.fromiter(r.inferred, np.int64, len(r.inferred)))
    unmapped = {row: unreported[row] for row in held[asked].tolist()}
    for ptr, row, since in _unreported_blocks(live, r.evicted, unmapped, r.alloc_time):
        if row in r.inferred or not last.holds(ptr):
            gone = _unmapped_by(maps, ptr, since, r.free_time.get(row, sys.maxsize))
            if gone is not None:
                r.free_time[row] = r.inferred[row] = gone


def _sequence(builder: ProfileBuilder, alloc_time: _Times, free_time: _Times, t0: int) -> None:
    """5. One sequence over every allocation and free, in time order (an allocation before a
    free at the same time, then by row)."""
    rows, made = alloc_time.pairs()
    freed, ended = free_time.pairs()
    times = np.concatenate([made, ended])
    kinds = np.repeat(np.array([0, 1], np.int64), [len(rows), len(freed)])
    order = np.lexsort((np.concatenate([rows, freed]), kinds, times))
    seq = np.empty(len(order), np.int64)
    seq[order] = np.arange(len(order))
    np.frombuffer(builder.alloc_seq, np.int64)[rows] = seq[: len(rows)]
    np.frombuffer(builder.free_seq, np.int64)[freed] = seq[len(rows) :]
    free_ns = np.maximum(0, times[len(rows) :] - t0)
    np.frombuffer(builder.free_ns, np.int64)[freed] = free_ns


class SortedInts:
    """A sorted set of ints in buckets of at most ``2 * load``: adding, removing and finding
    the largest below a value cost a bisection and a short list move, where one sorted list
    moves half of all the live blocks on each insert (300,000 tensors kept: minutes)."""

    def __init__(self, load: int = 512) -> None:
        self._load = load
        self._buckets: list[list[int]] = []
        self._maxes: list[int] = []

    def add(self, value: int) -> None:
        buckets, maxes = self._buckets, self._maxes
        if not buckets:
            buckets.append([value])
            maxes.append(value)
            return
        i = min(bisect.bisect_left(maxes, value), len(buckets) - 1)
        bucket = buckets[i]
        bisect.insort(bucket, value)
        maxes[i] = bucket[-1]
        if len(bucket) > 2 * self._load:
            buckets.insert(i + 1, bucket[self._load :])
            del bucket[self._load :]
            maxes[i] = bucket[-1]
            maxes.insert(i + 1, buckets[i + 1][-1])

    def remove(self, value: int) -> None:
        """Remove a value that is present."""
        i = bisect.bisect_left(self._maxes, value)
        bucket = self._buckets[i]
        del bucket[bisect.bisect_left(bucket, value)]
        if bucket:
            self._maxes[i] = bucket[-1]
        else:
            del self._buckets[i], self._maxes[i]

    def before(self, value: int) -> int | None:
        """The largest value below ``value`` (None: none)."""
        i = bisect.bisect_left(self._maxes, value)
        if i < len(self._buckets):
            bucket = self._buckets[i]
            j = bisect.bisect_left(bucket, value)
            if j:
                return bucket[j - 1]
        return self._maxes[i - 1] if i else None


def _holder(allocs: list[tuple[int, int]] | None, t: int, free_time: _Times) -> int | None:
    """The row that held an address at time ``t`` (None: memory older than the recording)."""
    if not allocs:
        return None
    i = bisect.bisect_right(allocs, (t + _TOLERANCE_NS, sys.maxsize)) - 1
    while i >= 0:
        start, row = allocs[i]
        if free_time.get(row, sys.maxsize) >= t - _TOLERANCE_NS:
            return row
        if start < t - _TOLERANCE_NS:
            return None
        i -= 1
    return None


#: Roles of a model's own memory: a thread having run is no evidence about these.
_MODEL_STATE = frozenset(
    {PARAMETER, FROZEN_PARAMETER, QUANT_STATE, BUFFER, GRADIENT, OPTIMIZER_STATE}
)


class _Intervals:
    """Address ranges ``(start, stop, value)``, searchable by overlap with another range.

    Ranges are grouped by length (each group within a factor of 16), each group sorted by
    start: a range over ``[ptr, ptr + size)`` starts at most its group's longest length before
    ``ptr``, so each group is searched in a window as narrow as its own lengths. One window for
    all (as wide as the longest range: a 150 MB embedding gradient) made every search scan
    most of the recording's blocks.
    """

    def __init__(self, start: np.ndarray, stop: np.ndarray, value: np.ndarray) -> None:
        lengths = np.maximum(stop - start, 1)
        group_of = (np.floor(np.log2(lengths)).astype(np.int64) + 1) // 4  # bit length // 4
        order = np.lexsort((value, stop, start, group_of))
        self._columns = (start, stop, value)
        #: each group's ranges (indices, in start order), their starts, its longest length
        self._parts: list[tuple[np.ndarray, np.ndarray, int]] = []
        bounds = np.flatnonzero(np.diff(group_of[order])) + 1
        for part in np.split(order, bounds) if len(order) else ():
            self._parts.append((part, start[part], int(lengths[part].max())))
        self._groups: list[tuple[list[tuple[int, int, int]], list[int], int]] | None = None

    def _lists(self) -> list[tuple[list[tuple[int, int, int]], list[int], int]]:
        """The groups as lists, made on the first search (most readings never search)."""
        if self._groups is None:
            _, stop, value = self._columns
            self._groups = []
            for part, starts, span in self._parts:
                firsts = starts.tolist()
                items = list(zip(firsts, stop[part].tolist(), value[part].tolist(), strict=True))
                self._groups.append((items, firsts, span))
        return self._groups

    def may_be_over(self, ptrs: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """For each of ``[ptrs, ends)``: False where no range has bytes in it, True where
        one may (:meth:`over` says which): many ranges answered at once."""
        near = np.zeros(len(ptrs), bool)
        for _, starts, span in self._parts:
            lo = np.searchsorted(starts, ptrs - span, "right")
            near |= np.searchsorted(starts, ends, "left") > lo
        return near

    def over(self, ptr: int, size: int) -> list[tuple[int, int, int]]:
        """The ranges with bytes in ``[ptr, ptr + size)``, in (start, stop, value) order."""
        found: list[tuple[int, int, int]] = []
        end = ptr + size
        groups = self._lists()
        for group, starts, span in groups:
            lo = bisect.bisect_right(starts, ptr - span)
            hi = bisect.bisect_left(starts, end, lo)
            if lo < hi:
                found.extend(item for item in group[lo:hi] if item[1] > ptr)
        if len(groups) > 1:
            found.sort()
        return found


class _Space:
    """A recording's reported blocks and orphan frees (frees of memory an earlier recording
    allocated, still in the allocator's table), searchable by address range."""

    def __init__(
        self,
        blocks: tuple[np.ndarray, np.ndarray, np.ndarray],
        orphans: list[tuple[int, int, int]],
        alloc_time: _Times,
        free_time: _Times,
    ) -> None:
        self._blocks = _Intervals(*blocks)
        columns = np.array(orphans, np.int64).reshape(-1, 3)
        self._orphan_ranges = _Intervals(columns[:, 0], columns[:, 1], columns[:, 2])
        self._orphans = sorted(orphans)
        self._orphan_starts = [o[0] for o in self._orphans]
        self.orphan_starts = frozenset(self._orphan_starts)
        self._alloc_time = alloc_time
        self._free_time = free_time

    def _blocks_over(self, ptr: int, size: int) -> list[tuple[int, int, int]]:
        return self._blocks.over(ptr, size)

    def blocks_may_be_over(self, ptrs: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Per range: False where no reported block has bytes in it (see ``_Intervals``)."""
        return self._blocks.may_be_over(ptrs, ends)

    def _alive(self, row: int, t: int) -> bool:
        return (
            self._alloc_time[row] < t - _TOLERANCE_NS and self._free_time.get(row, sys.maxsize) >= t
        )

    def inside(self, ptr: int, size: int, t: int) -> int | None:
        """A block alive at ``t`` whose bytes hold all of these (a storage made over part of
        another's memory, as ``from_blob`` does)."""
        for start, stop, row in self._blocks_over(ptr, size):
            if start <= ptr and ptr + size <= stop and self._alive(row, t):
                return row
        return None

    def live_at(self, ptr: int, size: int, t: int) -> list[int]:
        """Blocks over some of these bytes that were allocated before ``t`` and not freed."""
        return [row for _, _, row in self._blocks_over(ptr, size) if self._alive(row, t)]

    def gone_before(self, ptr: int, size: int, t: int, t0: int) -> int | None:
        """The latest time in the recording before ``t`` that these bytes were seen to be free
        or another block's (None: never), so memory noted over them at ``t`` came after."""
        limit = t - _TOLERANCE_NS
        times = [
            min(self._free_time.get(row, t), t)
            for _, _, row in self._blocks_over(ptr, size)
            if t0 <= self._alloc_time[row] <= limit
        ]
        orphans = self._orphan_ranges.over(ptr, size)
        times.extend(when for _, _, when in orphans if t0 <= when <= limit)
        return max(times) if times else None

    def reused_after(self, ptr: int, size: int, t: int) -> int | None:
        """The first allocation over some of these bytes after ``t`` (they were free by then)."""
        times = [
            self._alloc_time[row]
            for _, _, row in self._blocks_over(ptr, size)
            if self._alloc_time[row] > t + _TOLERANCE_NS
        ]
        return min(times) if times else None

    def orphan_free(self, ptr: int, t: int) -> int | None:
        """The first free of memory at ``ptr`` allocated under an earlier recording."""
        i = bisect.bisect_left(self._orphan_starts, ptr)
        times = []
        while i < len(self._orphans) and self._orphans[i][0] == ptr:
            if self._orphans[i][2] >= t - _TOLERANCE_NS:
                times.append(self._orphans[i][2])
            i += 1
        return min(times) if times else None


def _release(
    key: int,
    ptr: int,
    size: int,
    noted: int,
    freed: dict[int, int],
    space: _Space,
    *,
    reused: bool = True,
) -> int | None:
    """When memory no report allocated went (last noted alive at ``noted``): its storage's
    death, an allocator free at its address (memory allocated under an earlier recording is
    still known to the allocator's table), or just before a report reused its bytes (only
    looked for where a block may be over them: ``reused``)."""
    candidates = []
    orphan = space.orphan_free(ptr, noted)
    if orphan is not None:
        candidates.append(orphan)
    if key in freed:
        candidates.append(freed[key])
    after = space.reused_after(ptr, size, noted) if reused else None
    if after is not None:
        candidates.append(after - 1)
    return min(candidates) if candidates else None


def _unreported_blocks(
    live: tuple[np.ndarray, np.ndarray],
    evicted: dict[int, int],
    unreported: dict[int, tuple[int, int, int]],
    alloc_time: _Times,
) -> Iterator[tuple[int, int, int]]:
    """(address, row, alive at) of the memory whose free no report gave: blocks still open
    (``live``: addresses and rows), blocks a later one reused the bytes of, and rows for
    memory no report allocated."""
    for ptr, row in zip(live[0].tolist(), live[1].tolist(), strict=True):
        yield ptr, row, alloc_time[row]
    for row, ptr in evicted.items():
        yield ptr, row, alloc_time[row]
    for row, (_, ptr, noted) in unreported.items():
        yield ptr, row, noted


def _made_after(
    gone: int | None, maps: Sequence[MemoryMap], ptr: int, t: int, t0: int
) -> int | None:
    """The earliest time memory noted at ``t`` can have been made, from the reports (bytes
    seen free or another block's at ``gone``) and the memory maps (an address unmapped in a
    snapshot during the recording); None: nothing says it came after the start."""
    made = None if gone is None else gone + 1
    for snapshot in maps:
        if snapshot.before > t - _TOLERANCE_NS:
            break
        if snapshot.before >= t0 and not snapshot.holds(ptr):
            made = max(made or 0, snapshot.before)
    return made


def _unmapped_by(maps: Sequence[MemoryMap], ptr: int, since: int, until: int) -> int | None:
    """The first snapshot after ``since`` and before ``until`` with ``ptr`` unmapped."""
    i = bisect.bisect_right([m.before for m in maps], since + _TOLERANCE_NS)
    for snapshot in maps[i:]:
        if snapshot.after >= until:
            return None
        if not snapshot.holds(ptr):
            return snapshot.after
    return None
