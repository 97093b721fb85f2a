"""A snapshot's trace as columns, converted to a Profile with array operations.

Snapshots dumped outside jupyter_vram reach millions of trace entries; a dict per entry costs
hundreds of bytes and a Python loop per entry seconds per million. Here a device's trace is a
handful of integer columns (:class:`TraceColumns`, filled by :mod:`.stream` straight
from the pickle, or from a dict by :func:`columns_from_trace`) plus tables of the distinct
stacks and metadata strings, and :func:`profile_from_columns` converts it with numpy.

The rules are those of :func:`jupyter_vram._capture.cuda_convert.profile_from_snapshot`
without a baseline (which a foreign snapshot never has): an ``alloc`` opens a row, the first
``free_completed`` at its address closes it (else another ``alloc`` there, else an uncompleted
``free_requested``); a ``free_requested`` at an address with no open row is a block from before
the trace; sizes are rounded requests, exact for blocks live at the end (from ``segments``),
where blocks the trace never touched are added as alive throughout.
tests/test_snapshot_io.py checks both agree.

Labels (see :mod:`.file`): the phase of each allocation comes from its stack (one
decision per distinct stack), carried forward over allocations without Python frames, and the
optimizer's annotations; the module from its ``user_metadata``; the op from its innermost
user frame.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .._allocator_rules import round_size
from .._capture.builder import BASELINE_OP, OTHER, TEMPORARY, UNKNOWN, ProfileBuilder
from .._capture.cuda_allocator import active_blocks, device_segments, roundup_divisions
from .._capture.cuda_convert import MARKER_PREFIX, SOURCE, SnapshotStacks
from .._model import (
    MAX_BYTES,
    MAX_SEQ,
    PHASE_INDEX,
    Allocations,
    Profile,
    ProfileFileError,
    SegmentEvents,
)

ACTIONS: tuple[str, ...] = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "other",
)
ACTION_CODE: dict[str, int] = {name: i for i, name in enumerate(ACTIONS)}
ALLOC, FREE_REQUESTED, FREE_COMPLETED = 0, 1, 2
_SEGMENT_ADD = (3, 5)
_SEGMENT_REMOVE = (4, 6)
OOM = 7

FORWARD, BACKWARD, OPTIMIZER, OTHER_PHASE = (PHASE_INDEX[p] for p in ("forward", "backward",
                                             "optimizer", "other"))  # fmt: skip
_OPTIM = re.compile(r"[\\/]torch[\\/]optim[\\/]")
_BACKWARD = re.compile(r"[\\/]torch[\\/](?:autograd[\\/]|_tensor\.py$)")
_MODULE_CALL = re.compile(r"[\\/]torch[\\/]nn[\\/]modules[\\/]module\.py$")

IntArray = npt.NDArray[np.integer[Any]]


class UnsupportedPickle(Exception):
    """A pickle opcode the stream reader does not interpret (old text protocols): load it
    whole. (Here, below both readers: the stream reader and its bulk loop raise it.)"""


@dataclass
class TraceColumns:
    """One device's trace: one value per entry in each column.

    ``stack`` indexes ``stacks`` (raw frame lists, innermost first; -1: no frames) and
    ``meta`` indexes ``metas`` (``user_metadata`` strings; 0 is the empty string).
    """

    action: array[int] = field(default_factory=lambda: array("b"))
    addr: array[int] = field(default_factory=lambda: array("q"))
    size: array[int] = field(default_factory=lambda: array("q"))
    time_us: array[int] = field(default_factory=lambda: array("q"))
    stack: array[int] = field(default_factory=lambda: array("i"))
    meta: array[int] = field(default_factory=lambda: array("i"))
    stacks: list[Sequence[Mapping[str, Any]]] = field(default_factory=list)
    metas: list[str] = field(default_factory=lambda: [""])

    def __len__(self) -> int:
        return len(self.action)


class _Interner:
    """Stack / metadata ids for :func:`columns_from_trace`, keyed on identity then content."""

    def __init__(self, cols: TraceColumns) -> None:
        self.cols = cols
        self.by_id: dict[int, tuple[object, int]] = {}
        self.by_content: dict[tuple[tuple[str, int, str], ...], int] = {}
        self.meta_ids: dict[str, int] = {"": 0}

    def stack(self, frames: Any) -> int:
        if not frames:
            return -1
        hit = self.by_id.get(id(frames))
        if hit is not None and hit[0] is frames:
            return hit[1]
        key = tuple(
            (str(f.get("filename", "")), int(f.get("line", 0)), str(f.get("name", "")))
            for f in frames
        )
        sid = self.by_content.get(key)
        if sid is None:
            sid = self.by_content[key] = len(self.cols.stacks)
            self.cols.stacks.append(frames)
        self.by_id[id(frames)] = (frames, sid)
        return sid

    def meta(self, value: object) -> int:
        text = value if isinstance(value, str) else ""
        mid = self.meta_ids.get(text)
        if mid is None:
            mid = self.meta_ids[text] = len(self.cols.metas)
            self.cols.metas.append(text)
        return mid


def columns_from_trace(trace: Sequence[Mapping[str, Any]]) -> TraceColumns:
    """The columns of a trace held as a list of dicts (a ``_snapshot()`` dict's)."""
    cols = TraceColumns()
    intern = _Interner(cols)
    other = ACTION_CODE["other"]
    for e in trace:
        cols.action.append(ACTION_CODE.get(str(e.get("action")), other))
        cols.addr.append(int(e.get("addr", 0)))
        cols.size.append(int(e.get("size", 0)))
        cols.time_us.append(int(e.get("time_us", 0)))
        cols.stack.append(intern.stack(e.get("frames")))
        cols.meta.append(intern.meta(e.get("user_metadata")))
    return cols


def _frame_phase(frames: Sequence[Mapping[str, Any]]) -> int:
    """The phase a Python stack shows (innermost first); -1 if it shows none."""
    forward = False
    for f in frames:
        filename = str(f.get("filename", ""))
        if _OPTIM.search(filename):
            return OPTIMIZER
        if _BACKWARD.search(filename):
            return BACKWARD
        if _MODULE_CALL.search(filename):
            forward = True
    return FORWARD if forward else -1


def _optimizer_spans(snapshot: Mapping[str, Any], index: int) -> list[tuple[int, int]]:
    """(start, end) times in us of the optimizer's annotated ``step`` / ``zero_grad`` calls."""
    spans: list[tuple[int, int]] = []
    open_at: dict[str, int] = {}
    for a in snapshot.get("external_annotations") or ():
        if not isinstance(a, Mapping) or int(a.get("device", index)) != index:
            continue
        name = str(a.get("name", ""))
        if not name.startswith("Optimizer."):
            continue
        if a.get("stage") == "START":
            open_at[name] = int(a.get("time_us", 0))
        elif a.get("stage") == "END" and name in open_at:
            spans.append((open_at.pop(name), int(a.get("time_us", 0))))
    return spans


def _forward_fill(values: IntArray) -> IntArray:
    """Each -1 replaced by the last value before it that is not -1 (OTHER_PHASE if none)."""
    known = values >= 0
    last = np.maximum.accumulate(np.where(known, np.arange(len(values)), -1))
    return np.where(last >= 0, values[np.maximum(last, 0)], OTHER_PHASE)


def _address_order(addr: IntArray, positions: IntArray, n: int) -> tuple[IntArray, IntArray]:
    """``positions`` (increasing, below ``n``) ordered by ``addr`` at them, then by position,
    and a key per ordered position that is equal exactly where the address is.

    One sort of 64-bit words (the address's offset, then the position, in one word: sorted
    with SIMD, many times faster than a stable argsort) when both fit, as they do for any
    GPU's address range; else a stable argsort."""
    if len(positions) == 0:
        return positions.astype(np.int64), positions.astype(np.int64)
    at = addr[positions]
    low, high = int(at.min()), int(at.max())
    if high - low < 1 << 63:
        at -= np.int64(low)  # offsets from the lowest address
        spread = int(np.bitwise_or.reduce(at))
        shift = (spread & -spread).bit_length() - 1 if spread else 0  # common trailing zeros
        pos_bits = max(n - 1, 1).bit_length()
        if ((high - low) >> shift).bit_length() + pos_bits <= 64:
            at >>= np.int64(shift)
            words = at.view(np.uint64)
            words <<= np.uint64(pos_bits)
            words |= np.asarray(positions, np.int64).view(np.uint64)
            words.sort()
            order = np.bitwise_and(words, np.uint64((1 << pos_bits) - 1)).view(np.int64)
            words >>= np.uint64(pos_bits)
            return order, words
        at = addr[positions]
    order = positions[np.argsort(at, kind="stable")].astype(np.int64)
    return order, addr[order]


def _first_in_span(span: IntArray, where: npt.NDArray[np.bool_], spans: int) -> IntArray:
    """Per span (``span``: each position's span, non-decreasing): the first position where
    ``where`` holds; -1 if none."""
    at = np.flatnonzero(where)
    s = span[at]
    first = np.ones(len(s), bool)
    np.not_equal(s[1:], s[:-1], out=first[1:])
    out = np.full(spans, -1, np.int64)
    out[s[first]] = at[first]
    return out


def _rows(
    action: IntArray, addr: IntArray, mem: IntArray, n: int
) -> tuple[IntArray, IntArray, int]:
    """(the trace index of each row's opening event, in trace order; that of its free, -1:
    never; the allocs seen over a live block) for the memory events at ``mem``.

    By address, then time: an alloc opens a row, and so does a free_requested with nothing
    open at its address (first there, or right after a completed free). Each row spans to the
    next opener at its address; it is freed by the first free_completed in that span, else by
    that next opener (an alloc over a live block), else by a free_requested in its span (the
    opener itself for a block from before the trace)."""
    order, key = _address_order(addr, mem, n)
    m = len(order)
    if m == 0:
        return order, order, 0
    a_act = action[order]
    new_address = np.ones(m, bool)
    np.not_equal(key[1:], key[:-1], out=new_address[1:])
    del key
    prev_done = np.zeros(m, bool)
    np.equal(a_act[:-1], FREE_COMPLETED, out=prev_done[1:])
    opener = (a_act == FREE_REQUESTED) & (new_address | prev_done)
    opener |= a_act == ALLOC
    del prev_done
    # spans: from each opener, and from each address's first event (which opens no row when
    # it is a completed free), to the next of either
    span_start = opener | new_address
    starts = np.flatnonzero(span_start)
    span = np.cumsum(span_start, dtype=np.int32)
    span -= 1
    del span_start
    done = _first_in_span(span, a_act == FREE_COMPLETED, len(starts))
    requested = _first_in_span(span, a_act == FREE_REQUESTED, len(starts))  # an opener's own
    del span
    next_open = np.full(len(starts), -1, np.int64)
    same_address = ~new_address[starts[1:]]
    next_open[:-1][same_address] = starts[1:][same_address]
    rows = opener[starts]
    del new_address, opener, same_address
    openers, done, requested, next_open = starts[rows], done[rows], requested[rows], next_open[rows]
    free_pos = np.where(done >= 0, done, next_open)
    free_pos = np.where(free_pos < 0, requested, free_pos)
    overrun = (done < 0) & (next_open >= 0)
    inconsistencies = int((a_act[next_open[overrun]] == ALLOC).sum())
    src = order[openers]
    free_at = np.where(free_pos >= 0, order[free_pos.clip(0)], -1)
    del order, a_act, openers, free_pos, done, requested, next_open
    # to trace order: rows by the trace index of their opening event
    by_trace = np.full(n, -2, np.int64)
    by_trace[src] = free_at
    src = np.flatnonzero(by_trace != -2)
    return src, by_trace[src], inconsistencies


def _round_sizes(requests: IntArray, divisions: Sequence[int]) -> IntArray:
    """:func:`jupyter_vram._allocator_rules.round_size` of each request: the default 512-byte
    rounding with array operations; the requests ``roundup_power2_divisions`` may change, one
    at a time."""
    size = np.maximum((requests + 511) // 512 * 512, 512).astype(np.int64)
    if any(int(d) > 1 for d in divisions):
        special = np.flatnonzero(requests > 512)
        uniq, inv = np.unique(requests[special], return_inverse=True)
        size[special] = np.asarray([round_size(int(r), divisions) for r in uniq], np.int64)[inv]
    return size


#: The largest time a trace entry may carry, in microseconds: its nanoseconds fit an int64.
MAX_TIME_US = MAX_SEQ // 1000


def check_numbers(addr: IntArray, size: IntArray, time_us: IntArray) -> None:
    """A ProfileFileError naming the first trace entry with a size that is negative or past
    a petabyte, a negative address or a time out of range: a size of -512 must not load as a
    512-byte block."""
    checks = (
        ("size", size, (size < 0) | (size > MAX_BYTES), f"0 to {MAX_BYTES:,} bytes"),
        ("address", addr, addr < 0, "never negative"),
        ("time_us", time_us, np.abs(time_us) > MAX_TIME_US, f"within {MAX_TIME_US:,}"),
    )
    found = [(int(np.argmax(bad)), name, values, rule) for name, values, bad, rule in checks
             if bad.any()]  # fmt: skip
    if found:
        i, name, values, rule = min(found, key=lambda f: f[0])
        raise ProfileFileError(
            f"trace entry {i}: {name} {int(values[i]):,} is out of range ({rule})"
        )


def trace_numbers(trace: Sequence[Mapping[str, Any]]) -> tuple[IntArray, IntArray, IntArray]:
    """(addresses, sizes, times in us) of a trace held as a list of dicts; OverflowError
    past int64."""
    n = len(trace)
    addr = np.fromiter((int(e.get("addr", 0)) for e in trace), np.int64, n)
    size = np.fromiter((int(e.get("size", 0)) for e in trace), np.int64, n)
    time_us = np.fromiter((int(e.get("time_us", 0)) for e in trace), np.int64, n)
    return addr, size, time_us


@dataclass
class _Entries:
    """A trace's columns as numpy views (no copies), with the sequence and time helpers."""

    action: npt.NDArray[np.int8]
    addr: IntArray
    req: IntArray
    time_us: IntArray
    stack_of: IntArray
    meta_of: IntArray

    @classmethod
    def of(cls, cols: TraceColumns) -> _Entries:
        entries = cls(
            np.frombuffer(cols.action, np.int8),
            np.frombuffer(cols.addr, np.int64),
            np.frombuffer(cols.size, np.int64),
            np.frombuffer(cols.time_us, np.int64),
            np.frombuffer(cols.stack, np.int32),
            np.frombuffer(cols.meta, np.int32),
        )
        check_numbers(entries.addr, entries.req, entries.time_us)
        return entries

    @property
    def n(self) -> int:
        """How many entries; sequence numbers are trace indices."""
        return len(self.action)

    def ns(self, index: IntArray) -> IntArray:
        """Nanoseconds since the first entry, of the entries at ``index``."""
        t0 = int(self.time_us[0]) if self.n else 0
        return (self.time_us[index] - t0) * 1000


@dataclass
class _StackFacts:
    """Per distinct stack (a last slot for no frames): interned stack id, the op of its
    innermost user function, the phase its frames show (-1: none)."""

    ids: IntArray
    inner_ops: IntArray
    phase: IntArray

    @classmethod
    def of(cls, cols: TraceColumns, b: ProfileBuilder, stacks: SnapshotStacks) -> _StackFacts:
        facts = cls(
            np.full(len(cols.stacks) + 1, -1, np.int64),
            np.zeros(len(cols.stacks) + 1, np.int64),
            np.full(len(cols.stacks) + 1, -1, np.int64),
        )
        unknown_op = b.ops(UNKNOWN)
        facts.inner_ops[-1] = unknown_op
        for i, frames in enumerate(cols.stacks):
            sid, inner = stacks(frames)
            facts.ids[i] = sid
            facts.inner_ops[i] = b.ops(inner) if inner else unknown_op
            facts.phase[i] = _frame_phase(frames)
        return facts

    def slots(self, stack_of: IntArray) -> IntArray:
        """The slot of each stack index (-1, no frames: the last one)."""
        return np.where(stack_of >= 0, stack_of, len(self.ids) - 1)


def _phase_of_allocs(
    e: _Entries, facts: _StackFacts, snapshot: Mapping[str, Any], device_index: int
) -> npt.NDArray[np.int8]:
    """Per trace entry, the phase of the allocation there (other elsewhere): from its stack,
    carried over frameless allocations, the optimizer's annotated spans over both."""
    allocs = np.flatnonzero(e.action == ALLOC)
    phase_seen = facts.phase[facts.slots(e.stack_of[allocs])]
    phase_by_alloc = _forward_fill(phase_seen) if len(allocs) else phase_seen
    for t_start, t_end in _optimizer_spans(snapshot, device_index):
        inside = (e.time_us[allocs] >= t_start) & (e.time_us[allocs] <= t_end)
        phase_by_alloc[inside] = OPTIMIZER
    phase_at = np.full(e.n, OTHER_PHASE, np.int8)
    phase_at[allocs] = phase_by_alloc
    return phase_at


def _row_columns(
    e: _Entries, cols: TraceColumns, b: ProfileBuilder, facts: _StackFacts,
    snapshot: Mapping[str, Any], device_index: int, expandable: bool,
) -> tuple[dict[str, Any], npt.NDArray[np.bool_], int]:  # fmt: skip
    """The rows the trace opens (allocs, and free_requests at addresses with no open row), in
    trace order of their opening event: their columns, whose sizes are still rounded requests,
    which sizes are estimates, and the count of inconsistencies met."""
    marker = np.asarray([t.startswith(MARKER_PREFIX) for t in cols.metas], bool)
    mem = np.flatnonzero((e.action <= FREE_COMPLETED) & ~marker[e.meta_of])
    src, free_at, inconsistencies = _rows(e.action, e.addr, mem, e.n)
    del mem
    is_alloc = e.action[src] == ALLOC
    divisions = roundup_divisions(snapshot.get("allocator_settings") or {})
    stack_slot = facts.slots(e.stack_of[src])
    columns: dict[str, Any] = {
        "size": _round_sizes(e.req[src], divisions),
        "alloc_seq": np.where(is_alloc, src, -1),
        "free_seq": free_at,
        "alloc_ns": np.where(is_alloc, e.ns(src), 0),  # as the converter: 0 before the trace
        "free_ns": np.where(free_at >= 0, e.ns(free_at.clip(0)), -1),
        "op": np.where(is_alloc, facts.inner_ops[stack_slot], b.ops(BASELINE_OP)),
        "stack": facts.ids[stack_slot],
        "addr": e.addr[src],
    }
    columns["phase"] = np.where(
        is_alloc, _phase_of_allocs(e, facts, snapshot, device_index)[src], OTHER_PHASE
    )
    module_of_meta = np.asarray([0] + [b.modules(name) for name in cols.metas[1:]], np.int64)
    columns["module"] = np.where(is_alloc, module_of_meta[e.meta_of[src]], 0)
    columns["category"] = np.where(is_alloc, TEMPORARY, OTHER)
    estimated = (is_alloc & (not expandable)) | ~is_alloc
    return columns, estimated, inconsistencies


def _segment_entries(action: npt.NDArray[np.int8]) -> npt.NDArray[np.intp]:
    """The trace indices of segment events (map, unmap, alloc, free)."""
    seg_seq = np.flatnonzero(action > FREE_COMPLETED)
    return seg_seq[np.isin(action[seg_seq], (*_SEGMENT_ADD, *_SEGMENT_REMOVE))]


def _expandable(e: _Entries, seg_seq: IntArray, snapshot: Mapping[str, Any]) -> bool:
    """Expandable segments: said by the settings, or shown by segment map / unmap events."""
    settings = snapshot.get("allocator_settings") or {}
    return bool(settings.get("expandable_segments")) or bool(
        np.isin(e.action[seg_seq], (5, 6)).any()
    )


def _fit_end_state(
    columns: dict[str, Any], estimated: npt.NDArray[np.bool_], end: Mapping[int, Any],
    notes: dict[str, int],
) -> list[tuple[int, Mapping[str, Any]]]:  # fmt: skip
    """Give the rows live at the end their exact block sizes from the end state (counting
    mismatches and rows with no block in ``notes``); the blocks no row reached."""
    if not end:
        return []
    size, row_addr = columns["size"], columns["addr"]
    seen: set[int] = set()
    for r in np.flatnonzero(columns["free_seq"] < 0).tolist():
        block = end.get(int(row_addr[r]))
        seen.add(int(row_addr[r]))
        if block is None:
            notes["inconsistencies"] += 1
            continue
        exact = int(block["size"])
        if size[r] != exact and not estimated[r]:
            notes["size_mismatches"] += 1
        size[r] = exact
        estimated[r] = False
    return [(a, blk) for a, blk in end.items() if a not in seen]


def _allocations(
    columns: dict[str, Any], extra: list[tuple[int, Mapping[str, Any]]], b: ProfileBuilder,
    stacks: SnapshotStacks, device_id: int,
) -> Allocations:  # fmt: skip
    """The rows in the order the converter makes them (by the trace index of their first
    event), then the blocks the trace never touched; each column written once, in its final
    type."""
    k = len(columns["size"])
    columns = {key: v for key, v in columns.items() if key != "addr"}
    columns["device"] = np.full(k, device_id, np.int32)
    more: dict[str, list[int]] = {}
    if extra:
        baseline_op = b.ops(BASELINE_OP)
        more = {
            "size": [int(blk["size"]) for _, blk in extra],
            "alloc_seq": [-1] * len(extra),
            "free_seq": [-1] * len(extra),
            "alloc_ns": [0] * len(extra),
            "free_ns": [-1] * len(extra),
            "device": [device_id] * len(extra),
            "op": [baseline_op] * len(extra),
            "module": [0] * len(extra),
            "stack": [stacks(blk.get("frames"))[0] for _, blk in extra],
            "phase": [OTHER_PHASE] * len(extra),
            "category": [OTHER] * len(extra),
        }
    kinds = Allocations.empty()
    for key, v in columns.items():
        out = np.empty(k + len(extra), getattr(kinds, key).dtype)
        out[:k] = v
        out[k:] = more.get(key, ())
        columns[key] = out
    return Allocations.from_columns(columns)


def _reserved(
    e: _Entries, seg_seq: npt.NDArray[np.intp], snapshot: Mapping[str, Any], device_index: int
) -> tuple[SegmentEvents, int | None]:
    """The segment events, and the reserved bytes at the end when the snapshot has its
    segments (the start is then worked back from the end; else it is what keeps the running
    total from going below zero)."""
    req = e.req[seg_seq]
    seg_delta = np.where(np.isin(e.action[seg_seq], _SEGMENT_ADD), req, -req)
    end_reserved = None
    if "segments" in snapshot:
        end_reserved = sum(int(s["total_size"]) for s in device_segments(snapshot, device_index))
        reserved0 = max(end_reserved - int(seg_delta.sum()), 0)
    else:
        running = np.cumsum(seg_delta)
        reserved0 = -int(min(running.min(initial=0), 0))
    return SegmentEvents(seg_seq, seg_delta, reserved0), end_reserved


def profile_from_columns(
    cols: TraceColumns, snapshot: Mapping[str, Any], device_index: int
) -> Profile:
    """Convert one device's trace columns (see the module docstring)."""
    b = ProfileBuilder()
    device = f"cuda:{device_index}"
    device_id = b.devices(device)
    e = _Entries.of(cols)
    stacks = SnapshotStacks(b)
    facts = _StackFacts.of(cols, b, stacks)
    seg_seq = _segment_entries(e.action)
    expandable = _expandable(e, seg_seq, snapshot)
    columns, estimated, inconsistencies = _row_columns(
        e, cols, b, facts, snapshot, device_index, expandable
    )
    notes = {"size_mismatches": 0, "inconsistencies": inconsistencies}
    extra = _fit_end_state(columns, estimated, active_blocks(snapshot, device_index), notes)
    allocations = _allocations(columns, extra, b, stacks, device_id)
    segments, end_reserved = _reserved(e, seg_seq, snapshot, device_index)
    meta: dict[str, Any] = {
        "trace_events": e.n,
        "truncated": False,
        "markers": 0,
        "estimated_sizes": int(estimated.sum()),
        "expandable_segments": expandable,
        **notes,
        "sizes_replayed": False,
    }
    ooms = [{"seq": int(i), "size": int(e.req[i]), "device_free": 0}
            for i in np.flatnonzero(e.action == OOM)]  # fmt: skip
    if ooms:
        meta["oom"] = ooms
    if end_reserved is not None:
        meta["reserved_end"] = end_reserved
    return Profile(
        allocations,
        device=device,
        source=SOURCE,
        devices=b.devices.names,
        ops=b.ops.names,
        modules=b.modules.names,
        frames=b.frames,
        stacks=b.stacks,
        segments=segments,
        meta=meta,
    )
