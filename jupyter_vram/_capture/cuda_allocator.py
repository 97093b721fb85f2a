"""The CUDA caching allocator's block arithmetic, replayed from a recorded trace.

The allocator's trace logs the *requested* size of each allocation, while
``max_memory_allocated`` counts whole blocks (rounded up, or a whole cached block when splitting
it would leave too little). :class:`_AllocatorModel` replays the trace's segment and block
events on the allocator's blocks (:class:`jupyter_vram._allocator_blocks.CachedBlocks`, the
bookkeeping the estimator's model uses too) to recover each block's real size; the helpers
below read blocks and segments out of a snapshot dict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from .._allocator_blocks import CachedBlocks
from .._allocator_rules import is_small, is_small_segment

_ACTIVE = "active_allocated"


class _AllocatorModel:
    """The allocator's blocks, replayed from segment and block events to learn block sizes.

    An allocation takes the free block starting at its address; the allocator splits off the
    rounded request unless the rest would be too small to keep (< 512 B in the small pool,
    <= 1 MiB in the large pool; the pool is the request's, by its rounded size, as the
    allocator's own ``should_split`` reads it), in which case the allocation owns the whole
    block. Frees merge free neighbours. A block whose free was requested but not completed
    (used on another stream) is not reusable, like an allocated one. Any event that does not
    fit the model marks it ``broken``; from then on sizes are estimates (and the profile says
    how many).
    """

    def __init__(self, rounding: Callable[[int], int], max_split_size: int) -> None:
        self._round = rounding
        self._blocks = CachedBlocks(max_split_size, best_fit=False)  # the trace says where
        self._segments: dict[int, tuple[int, bool]] = {}  # address -> (size, small pool)
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
            blocks = [(addr, int(b["size"]), _is_free(b)) for addr, b in _block_addresses(seg)]
            model.add_segment(int(seg["address"]), int(seg["total_size"]), small, blocks)
        return model

    def add_segment(
        self, addr: int, size: int, small: bool, blocks: Sequence[tuple[int, int, bool]] = ()
    ) -> None:
        """A segment and its blocks, (start, size, free) (default: one free block)."""
        if addr in self._segments:
            self.broken = True
            return
        layout = sorted(blocks) if blocks else [(addr, size, True)]
        end = addr
        for start, bsize, _ in layout:
            if start != end:  # blocks that do not tile the segment: not a layout to replay
                self.broken = True
            end = start + bsize
        if end != addr + size:
            self.broken = True
        self._blocks.add_segment(small, layout)
        self._segments[addr] = (size, small)

    def remove_segment(self, addr: int) -> None:
        segment = self._segments.pop(addr, None)
        if segment is None:
            self.broken = True
            return
        if not self._blocks.remove_segment(addr, *segment):
            self.broken = True

    def alloc(self, addr: int, requested: int) -> int | None:
        """The size of the block an allocation at ``addr`` gets, or None if unknown."""
        if self.broken:
            return None
        size = self._round(requested)
        blocks = self._blocks
        found = blocks.size_of.get(addr)
        if found is None or found < size or addr not in blocks.free:
            self.broken = True
            return None
        # The allocator splits by the pool the request is served from, as its size says.
        return blocks.size_of[blocks.take(size, is_small(size), addr)]

    def free_completed(self, addr: int) -> None:
        if self.broken:
            return
        blocks = self._blocks
        if addr not in blocks.size_of or addr in blocks.free:
            self.broken = True
            return
        blocks.release(addr, False)  # no free lists: the pool does not matter


def _is_free(block: Mapping[str, Any]) -> bool:
    """Whether a snapshot's block is free to reuse: neither allocated nor pending its free."""
    return not str(block.get("state", "")).startswith("active")


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
