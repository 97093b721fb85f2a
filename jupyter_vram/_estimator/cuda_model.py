"""What the CUDA caching allocator would make of a run recorded elsewhere (CPU, fake tensors).

An estimate runs the training step on fake tensors, so it knows every request's exact size
and order but not what a GPU would hold: the caching allocator rounds requests up, hands out
whole cached blocks when splitting them would leave too little, and keeps every segment it
ever ``cudaMalloc``'d. :func:`simulate` replays a profile's allocations through a model of
that allocator (the rules of :mod:`jupyter_vram._allocator_rules`; one device, one stream,
nothing released) to learn each allocation's block size and the reserved memory;
:func:`to_cuda_profile` turns the result into a profile that reads like one recorded on a GPU.

The replay is one pass over the events on the allocator's blocks
(:class:`jupyter_vram._allocator_blocks.CachedBlocks`, the bookkeeping the CUDA recorder's
replay uses too) with per-pool free lists kept sorted by (size, address), so best fit is a
bisect and a free merges its neighbours in O(1) lookups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .._allocator_blocks import ADDR_BITS, CachedBlocks
from .._allocator_rules import MIN_BLOCK, UNLIMITED_SPLIT, is_small, round_size, segment_size
from .._model import Allocations, Int64Array, Profile, SegmentEvents

__all__ = ["AllocatorSimulation", "simulate", "to_cuda_profile"]

# Each pool gets its own address range below the free lists' address bits, and the range
# tells a block's pool without a lookup.
_ADDR_MASK = (1 << ADDR_BITS) - 1
_SMALL_BASE = 1 << (ADDR_BITS - 1)


@dataclass(frozen=True)
class AllocatorSimulation:
    """The allocator's view of a profile's run on one device.

    ``block_size`` has one entry per allocation row: the block the allocator hands that row
    (rows on other devices keep their size). ``segments`` holds a +size event at the seq of
    each allocation that had to ``cudaMalloc`` a new segment; segments made while replaying the
    baseline are in ``segments.baseline``.
    """

    block_size: Int64Array
    segments: SegmentEvents
    peak_allocated: int  # what torch.cuda.max_memory_allocated() would report
    peak_reserved: int  # what torch.cuda.max_memory_reserved() would report
    segment_count: int


def simulate(
    profile: Profile,
    *,
    divisions: Sequence[int] = (),
    max_split_size: int | None = None,
    warm_up: Mapping[int, float] | None = None,
) -> AllocatorSimulation:
    """Replay ``profile``'s allocations on its device through the caching allocator.

    Baseline rows (``alloc_seq == -1``) are allocated first, in row order, as if before
    recording; then every alloc and free in sequence order (an alloc before a free at the same
    seq, as the timeline orders them). ``divisions`` is ``roundup_power2_divisions`` and
    ``max_split_size`` the ``PYTORCH_CUDA_ALLOC_CONF`` setting in bytes (None: unlimited).
    Zero-byte requests take no block, as on a GPU. Segments are never released: neither
    ``empty_cache`` nor an out-of-memory retry is modelled.

    ``warm_up``: the profile is a program's second step, and the first one is replayed before
    it, as the same events. The allocator never gives segments back, so what the first step
    reserved (and where it left the blocks that outlive it) shapes the second. The baseline
    rows the first step made (optimizer state, library workspaces) map to their position in
    the step: made once the events with a smaller seq have run. Every other baseline row is
    made before the first step; rows the step leaves alive are freed between the steps. The
    peaks are the second step's (``torch.cuda.reset_peak_memory_stats()`` between the steps:
    reserved then is what the first step left).
    """
    a = profile.allocations
    n = len(a)
    device_id = profile.devices.index(profile.device) if profile.device in profile.devices else -1
    on_device = a.device == device_id
    rows = np.arange(n, dtype=np.int64)

    rounded = _rounded_sizes(a.size, divisions)
    block_size = a.size.astype(np.int64, copy=True)

    # One event stream: row r allocates as r, frees as ~r (negative).
    base_rows = rows[on_device & (a.alloc_seq < 0)]
    alloc_rows = rows[on_device & (a.alloc_seq >= 0)]
    free_rows = rows[on_device & (a.free_seq >= 0)]
    seq = np.concatenate([a.alloc_seq[alloc_rows], a.free_seq[free_rows]])
    code = np.concatenate([alloc_rows, ~free_rows])
    order = np.argsort(seq, kind="stable")

    replay = _Replay(
        rounded.tolist(), UNLIMITED_SPLIT if max_split_size is None else max_split_size
    )
    codes, seqs = code[order].tolist(), seq[order].tolist()
    made = {r: p for r, p in (warm_up or {}).items() if 0 <= r < n and a.alloc_seq[r] < 0}
    before = [row for row in base_rows.tolist() if row not in made]
    replay.replay(before, [-1] * len(before))
    if warm_up is not None:
        replay.replay(*_first_step(codes, seqs, made, rows[on_device & (a.alloc_seq >= 0)]))
        replay.peak_allocated = replay.allocated  # reset_peak_memory_stats()
    baseline_reserved = replay.reserved
    replay.new_segments.clear()
    replay.replay(codes, seqs)

    sizes = np.asarray(replay.block, np.int64)
    block_size[on_device] = sizes[on_device]

    seg_seq = np.array([s for s, _ in replay.new_segments], np.int64)
    seg_delta = np.array([d for _, d in replay.new_segments], np.int64)
    return AllocatorSimulation(
        block_size=block_size,
        segments=SegmentEvents(seg_seq, seg_delta, baseline_reserved),
        peak_allocated=replay.peak_allocated,
        peak_reserved=replay.reserved,  # nothing is ever released, so the end is the peak
        segment_count=replay.segment_count,
    )


def _first_step(
    codes: list[int],
    seqs: list[int],
    made: Mapping[int, float],
    step_rows: Int64Array,
) -> tuple[list[int], list[int]]:
    """The events (codes, seqs) of the step replayed once as the program's first: the rows in
    ``made`` are allocated at their positions, and what the step leaves alive is freed at its
    end (the second step's own copies replace it)."""
    pending = sorted(made.items(), key=lambda item: (item[1], item[0]))
    out_codes: list[int] = []
    out_seqs: list[int] = []
    k = 0
    for code, seq in zip(codes, seqs, strict=True):
        while k < len(pending) and pending[k][1] < seq:
            out_codes.append(pending[k][0])
            out_seqs.append(seq)
            k += 1
        out_codes.append(code)
        out_seqs.append(seq)
    for row, _ in pending[k:]:
        out_codes.append(row)
        out_seqs.append(-1)
    for row in step_rows.tolist():
        out_codes.append(~row)  # a no-op for rows already freed
        out_seqs.append(-1)
    return out_codes, out_seqs


def to_cuda_profile(
    profile: Profile, sim: AllocatorSimulation | None = None, *, device: str = "cuda"
) -> Profile:
    """``profile`` as a GPU would have recorded it: block sizes, segments, a CUDA device.

    The allocations keep everything but their size; the profile's device is renamed
    ``device``; ``meta["allocator_model"]`` says the numbers come from the model. Device info
    (what the original device had) is dropped, it does not describe the simulated GPU.
    """
    if sim is None:
        sim = simulate(profile)
    a = profile.allocations
    if len(sim.block_size) != len(a):
        raise ValueError(
            f"simulation has {len(sim.block_size)} rows, the profile {len(a)} allocations"
        )
    devices = list(profile.devices)
    if device != profile.device and device in devices:
        raise ValueError(f"the profile already has allocations on {device!r}")
    if profile.device in devices:  # else nothing was allocated on it: nothing to rename
        devices[devices.index(profile.device)] = device
    columns = {name: getattr(a, name) for name in Allocations.__dataclass_fields__}
    columns["size"] = sim.block_size.astype(np.int64, copy=True)
    meta = dict(profile.meta)
    meta["allocator_model"] = {
        "peak_allocated": sim.peak_allocated,
        "peak_reserved": sim.peak_reserved,
        "segments": sim.segment_count,
    }
    return profile.replace(
        allocations=Allocations(**columns),
        device=device,
        devices=devices,
        segments=sim.segments,
        device_info={},
        meta=meta,
    )


def _rounded_sizes(size: Int64Array, divisions: Sequence[int]) -> Int64Array:
    """Every row's request rounded as the allocator rounds it (0 stays 0: no block)."""
    if any(int(d) > 1 for d in divisions):
        out = np.array([round_size(int(s), divisions) for s in size.tolist()], np.int64)
    else:
        out = np.maximum(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK).astype(np.int64)
    out[size <= 0] = 0
    return out


class _Replay(CachedBlocks):
    """The allocator's blocks (best fit over per-pool free lists), the rows holding them,
    and the segments the replay had to make, at addresses of its own."""

    def __init__(self, rounded: list[int], max_split_size: int) -> None:
        super().__init__(max_split_size, best_fit=True)
        self.rounded = rounded
        self.block = [0] * len(rounded)  # row -> the size of the block it was given
        self.block_of: dict[int, int] = {}  # live row -> its block's address
        self.next_small = _SMALL_BASE
        self.next_large = 0
        self.allocated = 0
        self.peak_allocated = 0
        self.reserved = 0
        self.segment_count = 0
        self.new_segments: list[tuple[int, int]] = []  # (seq, size)
        self.seq = -1  # the event being replayed

    def replay(self, codes: list[int], seqs: list[int]) -> None:
        """Replay events: ``code`` row allocates, ``~row`` frees (a no-op for a row with no
        block: a zero-byte request, or a free without its alloc)."""
        rounded, block, block_of = self.rounded, self.block, self.block_of
        take, release, size_of = self.take, self.release, self.size_of
        for code, seq in zip(codes, seqs, strict=True):
            if code >= 0:
                size = rounded[code]
                if size == 0:
                    continue
                self.seq = seq
                addr = take(size, is_small(size))
                size = size_of[addr]
                block_of[code] = addr
                block[code] = size
                self.allocated += size
                if self.allocated > self.peak_allocated:
                    self.peak_allocated = self.allocated
            else:
                at = block_of.pop(~code, None)
                if at is not None:
                    self.allocated -= release(at, at >= _SMALL_BASE)

    def new_segment(self, rounded: int, small: bool) -> int:
        """``cudaMalloc`` a segment, at an address of the replay's own, for the request being
        replayed (event ``seq``)."""
        found = segment_size(rounded)
        if small:
            addr = self.next_small
            self.next_small += found
        else:
            addr = self.next_large
            self.next_large += found
        if self.next_large >= _SMALL_BASE or self.next_small > _ADDR_MASK:
            raise OverflowError("simulated address space exhausted")
        self.add_segment(small, ((addr, found, False),))
        self.reserved += found
        self.segment_count += 1
        self.new_segments.append((self.seq, found))
        return addr
