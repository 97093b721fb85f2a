"""The CUDA caching allocator's block arithmetic, replayed outside the allocator.

The allocator's trace logs the *requested* size of each allocation, while
``max_memory_allocated`` counts whole blocks (rounded up, or a whole cached block when splitting
it would leave too little). :class:`_AllocatorModel` redoes the allocator's block layout
(with the rules of :mod:`jupyter_vram._allocator_rules`) to recover each block's real size;
the helpers below read blocks and segments out of a snapshot dict.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._allocator_rules import is_small_segment, should_split

_ACTIVE = "active_allocated"
_FREE, _ALLOCATED, _PENDING = 0, 1, 2


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
                "segment_type" not in seg and is_small_segment(int(seg["total_size"]))
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
        if should_split(seg.small, size, remaining, self._max_split):
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


def device_segments(snapshot: Mapping[str, Any], device: int) -> list[Mapping[str, Any]]:
    """The snapshot's segments on one device."""
    return [s for s in snapshot.get("segments") or () if int(s.get("device", 0)) == device]


def active_blocks(snapshot: Mapping[str, Any], device: int) -> dict[int, Mapping[str, Any]]:
    """Address -> block, for the blocks allocated (and not freed) on one device."""
    return {
        addr: block
        for seg in device_segments(snapshot, device)
        for addr, block in _block_addresses(seg)
        if block.get("state") == _ACTIVE
    }


def roundup_divisions(settings: Mapping[str, Any]) -> list[int]:
    """``roundup_power2_divisions`` of the allocator settings, as a list by power of two."""
    raw = settings.get("roundup_power2_divisions") or ()
    if isinstance(raw, Mapping):
        return [int(v) for _, v in sorted(raw.items(), key=lambda kv: int(kv[0]))]
    return [int(v) for v in raw]
