"""A CUDA allocator snapshot dict -> the Profile of one device.

:func:`profile_from_snapshot` is a pure function of a snapshot dict, so saved snapshots (from
:mod:`.cuda_snapshot` or from ``torch.cuda.memory._dump_snapshot``) convert anywhere, without a
GPU. Beyond the allocator's own trace it reads what the recorder adds:

* the allocator's per-thread *user metadata* ``"phase|module|op"`` on each allocation, which
  names its phase, module and op;
* *roles* (parameter, gradient, activation, ...) of live tensors: a role is a storage address,
  placed in the event order by a *marker*, a 1-byte allocation labelled ``"jv-marker|k"``
  (filtered out of the profile);
* the baseline snapshot taken before recording, from which :mod:`.cuda_allocator` replays the
  block layout to turn requested sizes into the block sizes ``max_memory_allocated`` counts.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .._allocator_rules import UNLIMITED_SPLIT, is_small_segment, round_size
from .._blas_workspaces import ANY_VERSION_SIZES
from .._model import PHASES, Frame, Profile, SegmentEvents
from .builder import BASELINE_OP, OTHER, TEMPORARY, UNKNOWN, ProfileBuilder
from .cuda_allocator import _AllocatorModel, active_blocks, device_segments, roundup_divisions
from .stacks import FrameFilter
from .tagging import PHASE_OTHER
from .workspace_rows import name_workspaces

__all__ = [
    "MARKER_PREFIX",
    "SOURCE",
    "Role",
    "profile_from_snapshot",
]

#: The ``Profile.source`` of profiles converted from CUDA allocator snapshots.
SOURCE = "cuda_snapshot"
MARKER_PREFIX = "jv-marker|"
#: The request size of a marker where torch cannot label allocations (no
#: ``_set_memory_metadata``: torch before 2.10). An odd size nothing else asks for; the
#: marker is known by it, by its free right after it, and by its place among the markers.
MARKER_FALLBACK_BYTES = 263
#: How many trace entries later a fallback marker's free may come (another thread may
#: allocate in between).
_MARKER_FREE_WITHIN = 8
#: (storage address, category, owning module id, marker index). Marker 0: observed before the
#: trace started; -1: not placed (no marker support), matched against the end of the trace.
Role = tuple[int, int, int, int]

_MAX_FRAMES = 48  # user frames kept per stack, as on the CPU path
_METADATA = re.compile(r"(\d+)\|(\d+)\|(.+)", re.DOTALL)
_SEGMENT_ACTIONS = ("segment_alloc", "segment_map", "segment_free", "segment_unmap")


def _segment_event(entry: Mapping[str, Any], model: _AllocatorModel | None) -> int:
    """A segment mapped (+ its size) or unmapped (- its size); the replayed layout follows."""
    size = int(entry["size"])
    if entry.get("action") in ("segment_alloc", "segment_map"):
        if model is not None:
            model.add_segment(int(entry["addr"]), size, is_small_segment(size))
        return size
    if model is not None:
        model.remove_segment(int(entry["addr"]))
    return -size


class SnapshotStacks:
    """Trace frames (innermost first) to interned stacks (outermost first), user frames only.

    A fresh snapshot shares one list between the events of an allocation and one dict between
    equal frames, so the caches are keyed on identity first (cheap, and safe: the snapshot keeps
    every key object alive during a conversion); a snapshot read from JSON falls back to the
    frames' content.
    """

    def __init__(self, builder: ProfileBuilder, boundary: Sequence[Sequence[Any]] = ()) -> None:
        self._builder = builder
        bound = [(str(f[0]), int(f[1]), str(f[2])) for f in boundary]
        self._entry = (bound[0][0], bound[0][2]) if bound else None
        self._outer = tuple(bound[1:])
        self._keep = FrameFilter().keep
        self._by_id: dict[int, tuple[object, int, str | None]] = {}
        self._by_ids: dict[tuple[int, ...], tuple[int, str | None]] = {}
        self._by_content: dict[tuple[tuple[str, int, str], ...], tuple[int, str | None]] = {}

    def _inside(self, key: tuple[tuple[str, int, str], ...]) -> tuple[tuple[str, int, str], ...]:
        """Drop the callers of the frame that started recording: the same for every
        allocation, and in a kernel twenty-odd frames of plumbing (the CPU path does the same).
        """
        n = len(self._outer)
        if self._entry is None or len(key) <= n or (n and key[-n:] != self._outer):
            return key
        inner = key[-n - 1]
        return key[: len(key) - n] if (inner[0], inner[2]) == self._entry else key

    def __call__(self, frames: Any) -> tuple[int, str | None]:
        """(stack id, function name of the innermost user frame); -1 without frames."""
        if not frames:
            return -1, None
        hit = self._by_id.get(id(frames))
        if hit is not None and hit[0] is frames:
            return hit[1], hit[2]
        ids = tuple(map(id, frames))
        found = self._by_ids.get(ids)
        if found is None:
            found = self._by_ids[ids] = self._from_content(frames)
        self._by_id[id(frames)] = (frames, found[0], found[1])
        return found

    def _from_content(self, frames: Any) -> tuple[int, str | None]:
        key = tuple(
            (str(f.get("filename", "")), int(f.get("line", 0)), str(f.get("name", "")))
            for f in frames
        )
        found = self._by_content.get(key)
        if found is None:
            kept = [Frame(*k) for k in self._inside(key) if self._keep(k[0])]
            kept = kept[:_MAX_FRAMES]
            inner = kept[0].name if kept else None
            found = self._by_content[key] = (
                self._builder.intern_stack(tuple(reversed(kept))),
                inner,
            )
        return found


def _trace_of(snapshot: Mapping[str, Any], device: int) -> list[Mapping[str, Any]]:
    traces = snapshot.get("device_traces") or []
    return list(traces[device]) if device < len(traces) else []


def _marker(metadata: object) -> int | None:
    if isinstance(metadata, str) and metadata.startswith(MARKER_PREFIX):
        try:
            return int(metadata[len(MARKER_PREFIX) :])
        except ValueError:
            return None
    return None


def markers_by_size(trace: Sequence[Mapping[str, Any]], size: int, emitted: int) -> dict[int, int]:
    """Trace index -> marker number of the fallback markers (see
    :data:`MARKER_FALLBACK_BYTES`): allocations of exactly ``size`` bytes freed within a few
    entries. ``emitted`` markers were made; the trace holds the last of them (a ring buffer
    drops the oldest), so the last one found is marker ``emitted``."""
    found: list[int] = []
    for seq, entry in enumerate(trace):
        if entry.get("action") != "alloc" or int(entry.get("size", -1)) != size:
            continue
        addr = entry.get("addr")
        after = trace[seq + 1 : seq + 1 + _MARKER_FREE_WITHIN]
        if any(e.get("action") == "free_requested" and e.get("addr") == addr for e in after):
            found.append(seq)
    first = emitted - len(found) + 1
    return {seq: first + j for j, seq in enumerate(found) if first + j > 0}


def _detect_truncation(
    trace: Sequence[Mapping[str, Any]],
    baseline_live: Iterable[int] | None,
    max_entries: int | None,
) -> bool:
    """Did the ring buffer drop the start of the run? A full buffer may have; with a baseline,
    freeing a block that was neither live at the start nor allocated since proves it."""
    if max_entries is not None and len(trace) >= max_entries:
        return True
    if baseline_live is None:
        return False
    live = set(baseline_live)
    for entry in trace:
        action = entry.get("action")
        if action == "alloc":
            live.add(int(entry["addr"]))
        elif action == "free_requested" and _marker(entry.get("user_metadata")) is None:
            addr = int(entry["addr"])
            if addr not in live:
                return True
            live.discard(addr)
    return False


class _Converter:
    """One conversion of one device's trace: see :func:`profile_from_snapshot`."""

    def __init__(
        self,
        snapshot: Mapping[str, Any],
        device_index: int,
        baseline: Mapping[str, Any] | None,
        modules: Sequence[str],
        max_entries: int | None,
        boundary: Sequence[Sequence[Any]] = (),
        marker_size: int | None = None,
        markers_emitted: int = 0,
    ) -> None:
        self.snapshot = snapshot
        self.index = device_index
        self.device = f"cuda:{device_index}"
        self.trace = _trace_of(snapshot, device_index)
        self.modules = modules
        self.b = ProfileBuilder()
        self.device_id = self.b.devices(self.device)
        self.baseline_op = self.b.ops(BASELINE_OP)
        self.stacks = SnapshotStacks(self.b, boundary)
        self.row_addr: list[int] = []  # the block address of each row
        self.labels: dict[str, tuple[int, int, int] | None] = {}
        self.module_ids: dict[int, int] = {}
        settings = snapshot.get("allocator_settings") or {}
        divisions = roundup_divisions(settings)
        self.round: Callable[[int], int] = lambda size: round_size(size, divisions)
        max_split = int(settings.get("max_split_size", -1) or -1)
        self.max_split = max_split if max_split > 0 else UNLIMITED_SPLIT
        self.expandable = bool(settings.get("expandable_segments")) or any(
            e.get("action") in ("segment_map", "segment_unmap") for e in self.trace
        )
        start_live = None if baseline is None else active_blocks(baseline, device_index)
        self.truncated = _detect_truncation(self.trace, start_live, max_entries)
        self.baseline = None if self.truncated else baseline
        self.estimated: set[int] = set()  # rows whose size is a rounding estimate
        self.notes: dict[str, int] = {"size_mismatches": 0, "inconsistencies": 0}
        self.size_markers = (
            markers_by_size(self.trace, marker_size, markers_emitted) if marker_size else {}
        )

    # -- ids ---------------------------------------------------------------------------------

    def module_id(self, index: int) -> int:
        mid = self.module_ids.get(index)
        if mid is None:
            name = self.modules[index] if 0 <= index < len(self.modules) else ""
            mid = self.module_ids[index] = self.b.modules(name)
        return mid

    def label(self, metadata: object) -> tuple[int, int, int] | None:
        """(phase, module id, op id) from a ``"phase|module|op"`` metadata string."""
        if not isinstance(metadata, str) or not metadata:
            return None
        if metadata in self.labels:
            return self.labels[metadata]
        found = None
        m = _METADATA.fullmatch(metadata)
        if m is not None and int(m[1]) < len(PHASES):
            found = (int(m[1]), self.module_id(int(m[2])), self.b.ops(m[3]))
        self.labels[metadata] = found
        return found

    # -- rows --------------------------------------------------------------------------------

    def add_before(self, addr: int, size: int, frames: Any) -> int:
        """A block allocated before the trace starts (alloc_seq -1)."""
        stack, _ = self.stacks(frames)
        self.row_addr.append(addr)
        return self.b.add(
            size, -1, 0, self.device_id, self.baseline_op, 0, stack, PHASE_OTHER, OTHER
        )

    def add_alloc(self, addr: int, seq: int, ns: int, size: int, entry: Mapping[str, Any]) -> int:
        stack, inner = self.stacks(entry.get("frames"))
        label = self.label(entry.get("user_metadata"))
        if label is not None:
            phase, module, op = label
        else:
            phase, module, op = PHASE_OTHER, 0, self.b.ops(inner or UNKNOWN)
        self.row_addr.append(addr)
        return self.b.add(size, seq, ns, self.device_id, op, module, stack, phase, TEMPORARY)

    # -- the walk ----------------------------------------------------------------------------

    def replay_model(self) -> _AllocatorModel | None:
        """The allocator's block layout, replayed from the baseline's segments (None without
        a baseline, or on expandable segments, which always split: sizes are exact)."""
        if self.baseline is None or self.expandable:
            return None
        return _AllocatorModel.from_segments(
            device_segments(self.baseline, self.index), self.round, self.max_split
        )

    def open_baseline(self) -> dict[int, int]:
        """Address -> row of each block the baseline holds, made before the trace."""
        live: dict[int, int] = {}
        if self.baseline is not None:
            for addr, block in active_blocks(self.baseline, self.index).items():
                live[addr] = self.add_before(addr, int(block["size"]), block.get("frames"))
        return live

    def end_requested(self, requested: Mapping[int, tuple[int, int]], live: dict[int, int]) -> None:
        """Freed, but still waiting on another stream when the trace ends: end at the
        request."""
        for row, (seq, ns) in requested.items():
            self.b.free(row, seq, ns)
            del live[self.row_addr[row]]

    def run(self) -> tuple[dict[int, int], list[int], list[int], dict[str, Any]]:
        """Replay the trace into rows; return marker positions, segment events and notes."""
        b = self.b
        model = self.replay_model()
        live = self.open_baseline()  # address -> open row
        requested: dict[int, tuple[int, int]] = {}  # row -> (seq, ns) of its free_requested
        markers: dict[int, int] = {}  # marker index -> seq of its allocation
        marker_blocks: set[int] = set()
        seg_seq: list[int] = []
        seg_delta: list[int] = []
        ooms: list[dict[str, int]] = []
        t0 = next((int(e["time_us"]) for e in self.trace if "time_us" in e), 0)

        for seq, entry in enumerate(self.trace):
            action = entry.get("action")
            ns = (int(entry.get("time_us", t0)) - t0) * 1000
            if action == "alloc":
                addr, req = int(entry["addr"]), int(entry["size"])
                size = model.alloc(addr, req) if model is not None else None
                k = _marker(entry.get("user_metadata"))
                if k is None:
                    k = self.size_markers.get(seq)
                if k is not None:
                    markers.setdefault(k, seq)
                    marker_blocks.add(addr)
                    continue
                old = live.pop(addr, None)
                if old is not None:  # a free we never saw: end the old row here
                    self.notes["inconsistencies"] += 1
                    b.free(old, seq, ns)
                    requested.pop(old, None)
                if size is None:
                    size = self.round(req)
                    if not self.expandable:  # expandable segments always split: exact
                        self.estimated.add(len(b))
                live[addr] = self.add_alloc(addr, seq, ns, size, entry)
            elif action == "free_requested":
                addr = int(entry["addr"])
                if addr in marker_blocks or _marker(entry.get("user_metadata")) is not None:
                    continue
                row = live.get(addr)
                if row is None:  # allocated before the (truncated) trace started
                    size = self.round(int(entry["size"]))
                    row = live[addr] = self.add_before(addr, size, entry.get("frames"))
                    self.estimated.add(row)
                requested.setdefault(row, (seq, ns))
            elif action == "free_completed":
                addr = int(entry["addr"])
                if model is not None:
                    model.free_completed(addr)
                if addr in marker_blocks:
                    marker_blocks.discard(addr)
                    continue
                row = live.pop(addr, None)
                if row is not None:
                    b.free(row, seq, ns)
                    requested.pop(row, None)
                # else: its free was requested before the trace started (not allocated then)
            elif action in _SEGMENT_ACTIONS:
                seg_seq.append(seq)
                seg_delta.append(_segment_event(entry, model))
            elif action == "oom":
                ooms.append({"seq": seq, "size": int(entry.get("size", 0)),
                             "device_free": int(entry.get("device_free", 0))})  # fmt: skip

        self.end_requested(requested, live)
        self.reconcile(live)
        notes: dict[str, Any] = {"oom": ooms} if ooms else {}
        notes["sizes_replayed"] = model is not None and not model.broken
        return markers, seg_seq, seg_delta, notes

    def reconcile(self, live: Mapping[int, int]) -> None:
        """Blocks live at the end are known exactly: fix their sizes, add blocks never seen."""
        end = active_blocks(self.snapshot, self.index)
        for addr, row in live.items():
            block = end.get(addr)
            if block is None:
                self.notes["inconsistencies"] += 1
                continue
            size = int(block["size"])
            if self.b.size[row] != size:
                if row not in self.estimated:
                    self.notes["size_mismatches"] += 1
                self.b.size[row] = size
            self.estimated.discard(row)
        for addr, block in end.items():
            if addr not in live:  # alive throughout, allocated before the trace started
                self.add_before(addr, int(block["size"]), block.get("frames"))

    # -- roles -------------------------------------------------------------------------------

    def assign_roles(self, roles: Iterable[Sequence[int]], markers: Mapping[int, int]) -> None:
        """Give each role to the allocation at its address that was live when it was seen.

        A role seen after marker ``k`` was allocated (at the observation, or earlier with no op
        in between) is placed at that marker's event and goes to the row at its address live
        there; failing that, the latest row allocated before it; failing that, the first row
        allocated after it. Marker 0 means before the trace (rows live at its start), as does a
        marker the ring buffer dropped; an unplaced role (-1) is matched at the end.
        """
        b = self.b
        rows_at: dict[int, tuple[list[int], list[int]]] = {}  # address -> (alloc seqs, rows)
        for row in sorted(range(len(b)), key=lambda r: (b.alloc_seq[r], r)):
            seqs, rows = rows_at.setdefault(self.row_addr[row], ([], []))
            seqs.append(b.alloc_seq[row])
            rows.append(row)
        last_marker = max(markers, default=0)
        for role in roles:
            addr, category, module, k = (int(v) for v in role[:4])
            found = rows_at.get(addr)
            if found is None:
                continue
            if k == 0:
                at = -1
            elif k in markers:
                at = markers[k]
            elif 0 < k < last_marker:
                at = -1  # its marker fell out of the ring buffer: seen before the window
            else:
                at = len(self.trace)
            # Blocks at one address never overlap in time, so the row live at `at`, if any, is
            # the last one allocated at or before it.
            seqs, rows = found
            i = bisect.bisect_right(seqs, at)
            row = rows[i - 1] if i else rows[0]
            b.promote(row, category)
            if module and not b.module[row]:
                b.module[row] = self.module_id(module)

    def reserved_baseline(self, seg_delta: Sequence[int]) -> int:
        """Bytes reserved when the trace starts: from the baseline, else from the end state."""
        if self.baseline is not None:
            return sum(int(s["total_size"]) for s in device_segments(self.baseline, self.index))
        if "segments" in self.snapshot:
            end = sum(int(s["total_size"]) for s in device_segments(self.snapshot, self.index))
            return max(end - sum(seg_delta), 0)
        running = lowest = 0
        for d in seg_delta:
            running += d
            lowest = min(lowest, running)
        return -lowest


def profile_from_snapshot(
    snapshot: Mapping[str, Any],
    *,
    device_index: int = 0,
    baseline: Mapping[str, Any] | None = None,
    roles: Iterable[Sequence[int]] = (),
    modules: Sequence[str] = ("",),
    max_entries: int | None = None,
    boundary: Sequence[Sequence[Any]] = (),
    wall_ns: int = 0,
    device_info: Mapping[str, Any] | None = None,
    error: str | None = None,
    meta: Mapping[str, Any] | None = None,
    row_addresses: list[int] | None = None,
    workspaces: Mapping[int, str] | None = None,
    marker_size: int | None = None,
    markers_emitted: int = 0,
) -> Profile:
    """Convert a ``torch.cuda.memory._snapshot()`` dict into the Profile of one device.

    * Each ``alloc`` opens a row; the ``free_completed`` at its address closes it (a
      ``free_requested`` never completed in the trace closes it at the request). Sizes are
      block sizes, what ``max_memory_allocated`` counts: replayed from the block layout when
      ``baseline`` (the snapshot taken just before recording) is given, exact from the final
      segments for blocks still live, else rounded requests (``meta["estimated_sizes"]``).
    * Blocks live before the trace are rows with ``alloc_seq == -1``: from ``baseline``, else
      inferred from the end state and from frees of blocks the trace never allocated, which is
      also how a wrapped ring buffer (``max_entries``) is handled (``meta["truncated"]``).
    * ``segment_alloc/map`` and ``segment_free/unmap`` become reserved-memory events; the
      reserved baseline comes from ``baseline``, else from the end state.
    * ``user_metadata`` ``"phase|module|op"`` (``module`` indexes ``modules``) names each
      allocation; without it the op is the innermost user frame's function and the phase
      "other". Marker allocations (``"jv-marker|k"``) are dropped; they only place ``roles``
      ``(address, category, module, marker)`` in time (:meth:`_Converter.assign_roles`).

    ``boundary``: the frame that started recording and its callers, innermost first, as
    ``(filename, line, name)``; stacks drop those callers (the entry frame's line is ignored).

    Sequence numbers are trace indices; times are ``time_us`` relative to the first event.
    ``row_addresses``, when given, gets each row's block address (for leak finding).
    ``workspaces``: the BLAS workspace sizes of the recording's torch and GPU (size -> label,
    :func:`~jupyter_vram._blas_workspaces.blas_workspaces`); the rows that are workspaces get
    that label as op, category other (:mod:`.workspace_rows`). None: every default size.
    ``marker_size``, ``markers_emitted``: a recording by a torch that cannot label
    allocations placed its markers by size (:func:`markers_by_size`).
    """
    conv = _Converter(snapshot, device_index, baseline, modules, max_entries, boundary,
                      marker_size, markers_emitted)  # fmt: skip
    markers, seg_seq, seg_delta, notes = conv.run()
    if row_addresses is not None:
        row_addresses.extend(conv.row_addr)
    conv.assign_roles(roles, markers)
    reserved0 = conv.reserved_baseline(seg_delta)
    info: dict[str, Any] = {
        "trace_events": len(conv.trace),
        "truncated": conv.truncated,
        "markers": len(markers),
        "estimated_sizes": len(conv.estimated),
        "expandable_segments": conv.expandable,
        **conv.notes,
        **notes,
    }
    if "segments" in snapshot:
        end = sum(int(s["total_size"]) for s in device_segments(snapshot, device_index))
        info["reserved_end"] = end
        if reserved0 + sum(seg_delta) != end:
            info["reserved_mismatch"] = reserved0 + sum(seg_delta) - end
    info.update(meta or {})
    profile = conv.b.build(
        device=conv.device,
        source=SOURCE,
        wall_ns=wall_ns,
        segments=SegmentEvents(
            np.asarray(seg_seq, np.int64), np.asarray(seg_delta, np.int64), reserved0
        ),
        device_info=device_info,
        error=error,
        meta=info,
    )
    return name_workspaces(profile, ANY_VERSION_SIZES if workspaces is None else workspaces)
