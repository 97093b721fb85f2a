"""CUDA recording from the caching allocator's own history (``_record_memory_history``).

The allocator logs every block it hands out and takes back, with Python stacks, at ~2 us per
event and without touching user code, so this is the exact record of device memory. Three
things are added on top of it, all cheap:

* a lean dispatch mode sets the allocator's per-thread *user metadata* to
  ``"phase|module|op"`` before each aten op, so every allocation names its phase, module and op;
* the :class:`~.tagging.Tagger` reports roles (parameter, gradient, activation, ...) of live
  tensors; a role is a storage address, placed in the event order by a *marker*: a 1-byte
  allocation labelled ``"jv-marker|k"`` (filtered out of the profile);
* the trace logs the *requested* size of each allocation, while ``max_memory_allocated`` counts
  whole blocks (rounded up, or a whole cached block when splitting it would leave too little);
  :class:`_AllocatorModel` replays the block layout to recover each block's real size.

Every private torch API used for CUDA recording lives in this file (:class:`_CudaApi`).
:func:`profile_from_snapshot` is a pure function of a snapshot dict, so saved snapshots (from
here or from ``torch.cuda.memory._dump_snapshot``) convert anywhere, without a GPU.
"""

from __future__ import annotations

import bisect
import inspect
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np
import torch

from ..model import CATEGORY_INDEX, PHASES, Frame, Profile, SegmentEvents
from . import RecordingError
from .builder import OTHER, TEMPORARY, UNKNOWN, Interner, ProfileBuilder
from .dispatch import BASELINE_OP
from .modes import ObservingMode
from .stacks import _hidden_prefixes
from .tagging import PHASE_OTHER, Tagger, live_objects

__all__ = [
    "MARKER_PREFIX",
    "CudaSnapshotRecorder",
    "Role",
    "profile_from_snapshot",
    "round_size",
]

MARKER_PREFIX = "jv-marker|"
#: (storage address, category, owning module id, marker index). Marker 0: observed before the
#: trace started; -1: not placed (no marker support), matched against the end of the trace.
Role = tuple[int, int, int, int]

ACTIVATION = CATEGORY_INDEX["activation"]
INPUT = CATEGORY_INDEX["input"]

# Caching-allocator constants (c10/cuda/CUDACachingAllocator.cpp).
_MIN_BLOCK = 512  # every request rounds up to a multiple of this
_SMALL_SIZE = 1 << 20  # requests up to 1 MiB use the small pool
_SMALL_BUFFER = 2 << 20  # small-pool segments are 2 MiB
_MAX_FRAMES = 48  # user frames kept per stack, as on the CPU path

_ACTIVE = "active_allocated"
_FREE, _ALLOCATED, _PENDING = 0, 1, 2
_METADATA = re.compile(r"(\d+)\|(\d+)\|(.+)", re.DOTALL)
# Frames of torch, Jupyter plumbing and this package, recognised on any machine (a snapshot may
# be converted far from where it was recorded, so local install prefixes are not enough).
_HIDDEN = re.compile(
    r"[\\/](?:site|dist)-packages[\\/](?:torch|IPython|ipykernel|tornado|traitlets|zmq|"
    r"jupyter_client|jupyter_vram)[\\/]"
    r"|[\\/]jupyter_vram[\\/](?:capture[\\/]|session\.py|recording\.py|magics\.py)"
    r"|[\\/]python3(?:\.\d+)?[\\/](?:asyncio[\\/]|runpy\.py|contextlib\.py|threading\.py)"
)


# -- the allocator's arithmetic -------------------------------------------------------------


def round_size(size: int, divisions: Sequence[int] = ()) -> int:
    """The block size the allocator rounds a ``size``-byte request up to.

    ``divisions`` is ``roundup_power2_divisions`` per power-of-two interval from 1 MiB up
    (``allocator_settings`` in a snapshot); empty or zeros means the default 512-byte rounding.
    """
    if size < _MIN_BLOCK:
        return _MIN_BLOCK
    if divisions:
        index = min(max(size.bit_length() - 1 - 20, 0), len(divisions) - 1)
        parts = int(divisions[index])
        if parts > 1 and size > _MIN_BLOCK * parts:
            return _next_power2_division(size, parts)
    return _MIN_BLOCK * ((size + _MIN_BLOCK - 1) // _MIN_BLOCK)


def _next_power2_division(size: int, parts: int) -> int:
    """Round up to the next of ``parts`` equal steps between two powers of two."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (parts.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


@dataclass
class _Segment:
    size: int
    small: bool
    starts: list[int] = field(default_factory=list)  # block start addresses, ascending


class _AllocatorModel:
    """The allocator's blocks, replayed from segment and block events to learn block sizes.

    An allocation takes the free block starting at its address; the allocator splits off the
    rounded request unless the rest would be too small to keep (< 512 B in the small pool,
    <= 1 MiB in the large pool), in which case the allocation owns the whole block. Frees merge
    free neighbours. Any event that does not fit the model marks it ``broken``; from then on
    sizes are estimates (and the profile says how many).
    """

    def __init__(self, rounding: Callable[[int], int], max_split_size: int) -> None:
        self._round = rounding
        self._max_split = max_split_size
        self._blocks: dict[int, list[int]] = {}  # start -> [size, state, segment address]
        self._segments: dict[int, _Segment] = {}
        self.broken = False

    @classmethod
    def from_segments(
        cls,
        segments: Iterable[Mapping[str, Any]],
        rounding: Callable[[int], int],
        max_split_size: int,
    ) -> _AllocatorModel:
        model = cls(rounding, max_split_size)
        for seg in segments:
            small = seg.get("segment_type", "") == "small" or (
                "segment_type" not in seg and int(seg["total_size"]) == _SMALL_BUFFER
            )
            blocks = [(addr, int(b["size"]), _state(b)) for addr, b in _block_addresses(seg)]
            model.add_segment(int(seg["address"]), int(seg["total_size"]), small, blocks)
        return model

    def add_segment(
        self, addr: int, size: int, small: bool, blocks: Sequence[tuple[int, int, int]] = ()
    ) -> None:
        if addr in self._segments:
            self.broken = True
            return
        seg = _Segment(size, small)
        for start, bsize, state in blocks or [(addr, size, _FREE)]:
            self._blocks[start] = [bsize, state, addr]
            seg.starts.append(start)
        seg.starts.sort()
        self._segments[addr] = seg

    def remove_segment(self, addr: int) -> None:
        seg = self._segments.pop(addr, None)
        if seg is None:
            self.broken = True
            return
        for start in seg.starts:
            block = self._blocks.pop(start, None)
            if block is None or block[1] != _FREE:
                self.broken = True

    def alloc(self, addr: int, requested: int) -> int | None:
        """The size of the block an allocation at ``addr`` gets, or None if unknown."""
        if self.broken:
            return None
        block = self._blocks.get(addr)
        size = self._round(requested)
        if block is None or block[1] != _FREE or block[0] < size:
            self.broken = True
            return None
        seg = self._segments[block[2]]
        remaining = block[0] - size
        if seg.small:
            split = remaining >= _MIN_BLOCK
        else:
            split = size < self._max_split and remaining > _SMALL_SIZE
        if split:
            block[0] = size
            self._blocks[addr + size] = [remaining, _FREE, block[2]]
            bisect.insort(seg.starts, addr + size)
        block[1] = _ALLOCATED
        return block[0]

    def free_requested(self, addr: int) -> None:
        block = self._blocks.get(addr)
        if block is not None and block[1] == _ALLOCATED:
            block[1] = _PENDING  # not reusable until free_completed (cross-stream use)

    def free_completed(self, addr: int) -> None:
        if self.broken:
            return
        block = self._blocks.get(addr)
        if block is None or block[1] == _FREE:
            self.broken = True
            return
        block[1] = _FREE
        starts = self._segments[block[2]].starts
        i = bisect.bisect_left(starts, addr)
        if i + 1 < len(starts) and self._blocks[starts[i + 1]][1] == _FREE:
            block[0] += self._blocks.pop(starts[i + 1])[0]
            del starts[i + 1]
        if i > 0 and self._blocks[starts[i - 1]][1] == _FREE:
            self._blocks[starts[i - 1]][0] += self._blocks.pop(addr)[0]
            del starts[i]


def _state(block: Mapping[str, Any]) -> int:
    state = str(block.get("state", ""))
    if state == _ACTIVE:
        return _ALLOCATED
    return _PENDING if state.startswith("active") else _FREE


def _block_addresses(seg: Mapping[str, Any]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(address, block) of a segment's blocks; old snapshots have no block addresses."""
    addr = int(seg["address"])
    for block in seg.get("blocks", ()):
        addr = int(block.get("address", addr))
        yield addr, block
        addr += int(block["size"])


def _device_segments(snapshot: Mapping[str, Any], device: int) -> list[Mapping[str, Any]]:
    return [s for s in snapshot.get("segments") or () if int(s.get("device", 0)) == device]


def _active_blocks(snapshot: Mapping[str, Any], device: int) -> dict[int, Mapping[str, Any]]:
    return {
        addr: block
        for seg in _device_segments(snapshot, device)
        for addr, block in _block_addresses(seg)
        if block.get("state") == _ACTIVE
    }


def _divisions(settings: Mapping[str, Any]) -> list[int]:
    raw = settings.get("roundup_power2_divisions") or ()
    if isinstance(raw, Mapping):
        return [int(v) for _, v in sorted(raw.items(), key=lambda kv: int(kv[0]))]
    return [int(v) for v in raw]


# -- conversion ---------------------------------------------------------------------------


class _Stacks:
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
        self._local = _hidden_prefixes()
        self._hidden: dict[str, bool] = {}
        self._by_id: dict[int, tuple[object, int, str | None]] = {}
        self._by_ids: dict[tuple[int, ...], tuple[int, str | None]] = {}
        self._by_content: dict[tuple[tuple[str, int, str], ...], tuple[int, str | None]] = {}

    def is_hidden(self, filename: str) -> bool:
        hidden = self._hidden.get(filename)
        if hidden is None:
            hidden = self._hidden[filename] = (
                filename.startswith(self._local)
                or filename.startswith("<frozen")
                or _HIDDEN.search(filename) is not None
            )
        return hidden

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
            kept = [Frame(*k) for k in self._inside(key) if not self.is_hidden(k[0])]
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
    ) -> None:
        self.snapshot = snapshot
        self.index = device_index
        self.device = f"cuda:{device_index}"
        self.trace = _trace_of(snapshot, device_index)
        self.modules = modules
        self.b = ProfileBuilder()
        self.device_id = self.b.devices(self.device)
        self.baseline_op = self.b.ops(BASELINE_OP)
        self.stacks = _Stacks(self.b, boundary)
        self.row_addr: list[int] = []  # the block address of each row
        self.labels: dict[str, tuple[int, int, int] | None] = {}
        self.module_ids: dict[int, int] = {}
        settings = snapshot.get("allocator_settings") or {}
        divisions = _divisions(settings)
        self.round: Callable[[int], int] = lambda size: round_size(size, divisions)
        max_split = int(settings.get("max_split_size", -1) or -1)
        self.max_split = max_split if max_split > 0 else 1 << 62
        self.expandable = bool(settings.get("expandable_segments")) or any(
            e.get("action") in ("segment_map", "segment_unmap") for e in self.trace
        )
        start_live = None if baseline is None else _active_blocks(baseline, device_index)
        self.truncated = _detect_truncation(self.trace, start_live, max_entries)
        self.baseline = None if self.truncated else baseline
        self.estimated: set[int] = set()  # rows whose size is a rounding estimate
        self.notes: dict[str, int] = {"size_mismatches": 0, "inconsistencies": 0}

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

    def run(self) -> tuple[dict[int, int], list[int], list[int], dict[str, Any]]:
        """Replay the trace into rows; return marker positions, segment events and notes."""
        b = self.b
        model: _AllocatorModel | None = None
        if self.baseline is not None and not self.expandable:
            model = _AllocatorModel.from_segments(
                _device_segments(self.baseline, self.index), self.round, self.max_split
            )
        live: dict[int, int] = {}  # address -> open row
        requested: dict[int, tuple[int, int]] = {}  # row -> (seq, ns) of its free_requested
        if self.baseline is not None:
            for addr, block in _active_blocks(self.baseline, self.index).items():
                live[addr] = self.add_before(addr, int(block["size"]), block.get("frames"))
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
                if model is not None:
                    model.free_requested(addr)
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
            elif action in ("segment_alloc", "segment_map"):
                seg_seq.append(seq)
                seg_delta.append(int(entry["size"]))
                if model is not None:
                    small = int(entry["size"]) == _SMALL_BUFFER
                    model.add_segment(int(entry["addr"]), int(entry["size"]), small)
            elif action in ("segment_free", "segment_unmap"):
                seg_seq.append(seq)
                seg_delta.append(-int(entry["size"]))
                if model is not None:
                    model.remove_segment(int(entry["addr"]))
            elif action == "oom":
                ooms.append({"seq": seq, "size": int(entry.get("size", 0)),
                             "device_free": int(entry.get("device_free", 0))})  # fmt: skip

        # Freed, but still waiting on another stream when the trace ends: end at the request.
        for row, (seq, ns) in requested.items():
            b.free(row, seq, ns)
            del live[self.row_addr[row]]
        self.reconcile(live)
        notes: dict[str, Any] = {"oom": ooms} if ooms else {}
        notes["sizes_replayed"] = model is not None and not model.broken
        return markers, seg_seq, seg_delta, notes

    def reconcile(self, live: Mapping[int, int]) -> None:
        """Blocks live at the end are known exactly: fix their sizes, add blocks never seen."""
        end = _active_blocks(self.snapshot, self.index)
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
            if category == ACTIVATION and b.alloc_seq[row] < 0:
                category = INPUT  # data from before the cell that autograd also saved
            b.promote(row, category)
            if module and not b.module[row]:
                b.module[row] = self.module_id(module)

    def reserved_baseline(self, seg_delta: Sequence[int]) -> int:
        """Bytes reserved when the trace starts: from the baseline, else from the end state."""
        if self.baseline is not None:
            return sum(int(s["total_size"]) for s in _device_segments(self.baseline, self.index))
        if "segments" in self.snapshot:
            end = sum(int(s["total_size"]) for s in _device_segments(self.snapshot, self.index))
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
    """
    conv = _Converter(snapshot, device_index, baseline, modules, max_entries, boundary)
    markers, seg_seq, seg_delta, notes = conv.run()
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
        end = sum(int(s["total_size"]) for s in _device_segments(snapshot, device_index))
        info["reserved_end"] = end
        if reserved0 + sum(seg_delta) != end:
            info["reserved_mismatch"] = reserved0 + sum(seg_delta) - end
    info.update(meta or {})
    return conv.b.build(
        device=conv.device,
        source=CudaSnapshotRecorder.source,
        wall_ns=wall_ns,
        segments=SegmentEvents(
            np.asarray(seg_seq, np.int64), np.asarray(seg_delta, np.int64), reserved0
        ),
        device_info=device_info,
        error=error,
        meta=info,
    )


# -- recording ----------------------------------------------------------------------------


class _CudaApi:
    """Every private torch CUDA memory API this package calls, in one replaceable place."""

    def available(self) -> str | None:
        """None if CUDA memory history can be recorded here, else why not."""
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else "no usable CUDA device"
            return (
                f"CUDA memory recording needs a CUDA device, and torch.cuda.is_available() is "
                f"False (torch {torch.__version__}: {build}). Record on the CPU instead: "
                f"jv.record(device='cpu')."
            )
        memory = torch.cuda.memory
        if not (hasattr(memory, "_record_memory_history") and hasattr(memory, "_snapshot")):
            return f"torch {torch.__version__} has no CUDA allocator history to record"
        return None

    def metadata_supported(self) -> bool:
        memory = torch.cuda.memory
        return hasattr(memory, "_set_memory_metadata") and hasattr(memory, "_get_memory_metadata")

    def current_device(self) -> int:
        return int(torch.cuda.current_device())

    def device_count(self) -> int:
        return int(torch.cuda.device_count())

    def start_history(self, *, context: str | None, max_entries: int) -> None:
        record = torch.cuda.memory._record_memory_history
        wanted: dict[str, Any] = {
            "enabled": "all",
            "context": context,
            "stacks": "python",
            "max_entries": max_entries,
            "clear_history": True,
        }
        params = inspect.signature(record).parameters
        record(**{k: v for k, v in wanted.items() if k in params})

    def stop_history(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)

    def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = torch.cuda.memory._snapshot()
        return snap

    def set_metadata(self, text: str) -> None:
        torch.cuda.memory._set_memory_metadata(text)

    def get_metadata(self) -> str:
        return str(torch.cuda.memory._get_memory_metadata())

    def alloc_marker(self, device: torch.device) -> None:
        """Allocate and free one tiny block: two trace events at this point of the run."""
        marker = torch.empty((1,), dtype=torch.uint8, device=device)
        del marker

    def device_info(self, index: int) -> dict[str, Any]:
        """Device and allocator totals at the end; the keys the renderers read."""
        from .nvml import device_memory

        props = torch.cuda.get_device_properties(index)
        info: dict[str, Any] = {
            "name": props.name,
            "total": int(props.total_memory),
            "allocated": int(torch.cuda.memory_allocated(index)),
            "reserved": int(torch.cuda.memory_reserved(index)),
            "max_allocated": int(torch.cuda.max_memory_allocated(index)),
            "max_reserved": int(torch.cuda.max_memory_reserved(index)),
            "cuda": torch.version.cuda,
        }
        nvml = device_memory(index)
        if nvml is not None:  # device-wide: the CUDA context, workspaces, other processes
            info["device_used"] = nvml["used"]
            if "process_used" in nvml:
                info["process_used"] = nvml["process_used"]
        return info


def _frame_chain(frame: FrameType | None) -> list[tuple[str, int, str]]:
    """``frame`` and its callers, innermost first, as a CUDA traceback lists them."""
    chain = []
    while frame is not None:
        chain.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return chain


class CudaSnapshotRecorder:
    """Records one CUDA device through the caching allocator's history (see the module doc).

    ``stacks``: keep Python stacks of allocations. ``ops``: label allocations with their op,
    module and phase through a dispatch mode (a few us per op). ``max_entries``: size of the
    allocator's ring buffer; longer runs keep the end and say ``meta["truncated"]``.
    ``keep_raw``: keep the raw snapshots and roles in ``.raw`` (for fixtures and debugging).
    """

    source = "cuda_snapshot"

    def __init__(
        self,
        device: torch.device | str = "cuda",
        *,
        stacks: bool = True,
        ops: bool = True,
        max_entries: int = 250_000,
        keep_raw: bool = False,
    ) -> None:
        dev = torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"CudaSnapshotRecorder records CUDA devices, not {dev}")
        self._index = dev.index
        self.device = f"cuda:{dev.index}" if dev.index is not None else "cuda"
        self._stacks = stacks
        self._ops = ops
        self._max_entries = max_entries
        self._keep_raw = keep_raw
        self.raw: dict[str, Any] | None = None
        self._api = _CudaApi()
        self._modules = Interner("")
        self.tagger = Tagger(self._on_role, self._modules)
        self._mode = ObservingMode(before=self._label)
        self._labels: dict[tuple[int, int, Any], str] = {}
        self._roles: list[Role] = []
        self._markers = 0
        self._dirty = True
        self._in_marker = False
        self._metadata_ok = False
        self._prev_metadata = ""
        self._baseline: dict[str, Any] | None = None
        self._started = False
        self._active = False
        self._history_on = False
        self._mode_entered = False
        self._t0 = 0
        self._meta: dict[str, Any] = {}
        self._boundary: list[tuple[str, int, str]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, entry_frame: FrameType | None = None) -> None:
        """Take the baseline snapshot and switch history, hooks and labels on.

        ``entry_frame`` is the frame that asked for recording; stacks stop there.
        """
        self._boundary = _frame_chain(entry_frame)
        why = self._api.available()
        if why is not None:
            raise RecordingError(why)
        index = self._index if self._index is not None else self._api.current_device()
        if not 0 <= index < self._api.device_count():
            raise RecordingError(
                f"cuda:{index} does not exist ({self._api.device_count()} devices)"
            )
        self._index = index
        self.device = f"cuda:{index}"
        self._torch_device = torch.device("cuda", index)
        self._started = True
        self._metadata_ok = self._api.metadata_supported()
        if self._metadata_ok:
            # One tiny block before the baseline, so a marker never needs a fresh segment.
            self._api.alloc_marker(self._torch_device)
            self._prev_metadata = self._api.get_metadata()
        _, modules, optimizers = live_objects()
        self._active = True
        self.tagger.adopt(modules, optimizers)  # roles seen now carry marker 0 (the baseline)
        del modules, optimizers
        self._baseline = self._api.snapshot()
        if any(self._baseline.get("device_traces") or ()):
            self._meta["history_was_on"] = True  # the user's own history is switched off at stop
        self._t0 = time.perf_counter_ns()
        self._history_on = True  # set first: stop() switches it off even if this call fails
        self._api.start_history(
            context="alloc" if self._stacks else None, max_entries=self._max_entries
        )
        self.tagger.start()
        if self._ops:
            self._mode.__enter__()  # type: ignore[no-untyped-call]
            self._mode_entered = True

    def stop(self, error: str | None = None) -> Profile:
        """Switch everything off (always, in this order), then convert the final snapshot."""
        snapshot: dict[str, Any] | None = None
        wall_ns = 0
        try:
            if self._mode_entered:
                self._mode_entered = False
                self._mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        finally:
            wall_ns = time.perf_counter_ns() - self._t0 if self._t0 else 0
            try:
                if self._active:
                    self.tagger.final_scan()  # markers still go into the trace
            finally:
                self.tagger.stop()
                self._active = False
                if self._history_on:
                    self._history_on = False
                    try:
                        snapshot = self._api.snapshot()  # switching history off clears it
                    finally:
                        self._api.stop_history()
                        if self._metadata_ok:
                            self._api.set_metadata(self._prev_metadata)
        return self._convert(snapshot, wall_ns, error)

    def _convert(self, snapshot: dict[str, Any] | None, wall_ns: int, error: str | None) -> Profile:
        meta = {"torch": torch.__version__, "stacks": self._stacks, "ops": self._ops, **self._meta}
        if snapshot is None or self._index is None:
            return ProfileBuilder().build(
                device=self.device, source=self.source, wall_ns=wall_ns, error=error, meta=meta
            )
        try:
            device_info: dict[str, Any] = self._api.device_info(self._index)
        except Exception:  # noqa: BLE001 - device facts are a nicety; never lose the profile
            device_info = {}
        roles, self._roles = self._roles, []
        if self._keep_raw:
            self.raw = {
                "snapshot": snapshot,
                "baseline": self._baseline,
                "roles": [list(r) for r in roles],
                "modules": list(self._modules.names),
                "max_entries": self._max_entries,
                "device_index": self._index,
                "boundary": [list(f) for f in self._boundary],
            }
        baseline, self._baseline = self._baseline, None
        return profile_from_snapshot(
            snapshot,
            device_index=self._index,
            baseline=baseline,
            roles=roles,
            modules=self._modules.names,
            max_entries=self._max_entries,
            boundary=self._boundary,
            wall_ns=wall_ns,
            device_info=device_info,
            error=error,
            meta=meta,
        )

    def _label(self, func: Any) -> None:
        """Name the allocations of the op about to run: ``"phase|module|op"``."""
        if self._in_marker:
            return
        try:
            self._dirty = True
            phase, module = self.tagger.phase_and_module()
            key = (phase, module, func)
            label = self._labels.get(key)
            if label is None:
                label = self._labels[key] = f"{phase}|{module}|{func._overloadpacket.__name__}"
            self._api.set_metadata(label)  # per thread: backward runs on its own thread
        except Exception:  # noqa: BLE001 - never raise from bookkeeping (FACTS.md)
            pass

    # -- roles -------------------------------------------------------------------------------

    def _on_role(self, tensor: torch.Tensor, category: int, module: int) -> None:
        if not self._active:
            return
        try:
            dev = tensor.device
            if dev.type != "cuda" or dev.index != self._index:
                return
            addr = tensor.untyped_storage().data_ptr()
            if not addr:
                return
            if not self._history_on:
                marker = 0
            elif self._metadata_ok:
                if self._dirty or not self._ops:  # without the mode, ops go unseen
                    self._emit_marker()
                marker = self._markers
            else:
                marker = -1
            self._roles.append((addr, category, module, marker))
        except Exception:  # noqa: BLE001 - never raise from a hook
            pass

    def _emit_marker(self) -> None:
        """Put marker ``k + 1`` into the trace: roles seen until the next op are placed there."""
        self._in_marker = True
        try:
            self._markers += 1
            previous = self._api.get_metadata()
            self._api.set_metadata(f"{MARKER_PREFIX}{self._markers}")
            try:
                self._api.alloc_marker(self._torch_device)  # its free carries the label too
            finally:
                self._api.set_metadata(previous)
            self._dirty = False
        finally:
            self._in_marker = False
