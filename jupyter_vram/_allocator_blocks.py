"""The CUDA caching allocator's block bookkeeping, replayed outside the allocator.

Two replays keep the allocator's blocks: the CUDA recorder's (the trace tells the address of
every block and segment; it learns each block's real size) and the estimator's (it picks the
best fit and makes segments itself; it predicts block sizes and reserved memory). Both drive
:class:`CachedBlocks`: a request takes a free block whole or splits it (the rules of
:mod:`jupyter_vram._allocator_rules`), a free merges its free neighbours, and with
``best_fit`` per-pool free lists find the smallest free block that fits. Pure Python, no
imports from the package but the rules.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

from ._allocator_rules import should_split, takes_cached_block

__all__ = ["ADDR_BITS", "CachedBlocks"]

# A free block in a free list is one int: size in the high bits, address in the low ones, so
# sorting the ints sorts by (size, address), which is the allocator's best fit. Addresses in
# a best-fit replay must stay below 1 << ADDR_BITS.
ADDR_BITS = 48
_ADDR_MASK = (1 << ADDR_BITS) - 1


class CachedBlocks:
    """The blocks of the allocator's segments, keyed by start address.

    ``prev_of`` links each block to the one before it in its segment (absent for a segment's
    first block); a block's successor, if any, starts at ``addr + size`` and links back to it,
    so segments that touch in the address space never merge. ``free`` holds the free blocks;
    every other block is handed out. With ``best_fit``, ``small_free`` and ``large_free``
    list the free blocks of each pool, sorted by (size, address); without, they stay empty
    (a replay that is told every address needs no search).
    """

    def __init__(self, max_split_size: int, *, best_fit: bool) -> None:
        self.max_split = max_split_size
        self.indexed = best_fit
        self.size_of: dict[int, int] = {}  # every block, free or not
        self.prev_of: dict[int, int] = {}
        self.free: set[int] = set()
        self.small_free: list[int] = []  # (size << ADDR_BITS) | addr, ascending
        self.large_free: list[int] = []

    def add_segment(self, small: bool, blocks: Iterable[tuple[int, int, bool]]) -> None:
        """A segment made of ``blocks``: (start, size, free), in address order, tiling it."""
        prev = -1
        for start, size, is_free in blocks:
            self.size_of[start] = size
            if prev >= 0:
                self.prev_of[start] = prev
            if is_free:
                self.free.add(start)
                if self.indexed:
                    pool = self.small_free if small else self.large_free
                    insort(pool, (size << ADDR_BITS) | start)
            prev = start

    def remove_segment(self, addr: int, size: int, small: bool) -> bool:
        """Forget the segment at ``addr``; False if its blocks were not all free or did not
        tile it (the replay has gone wrong)."""
        end, ok = addr + size, True
        while addr < end:
            block = self.size_of.pop(addr, None)
            if block is None:
                return False
            self.prev_of.pop(addr, None)
            if addr in self.free:
                self.free.discard(addr)
                if self.indexed:
                    _remove(self.small_free if small else self.large_free, block, addr)
            else:
                ok = False
            addr += block
        return ok and addr == end

    def take(self, rounded: int, small: bool, addr: int = -1) -> int:
        """Hand a block to a ``rounded``-byte request; its address (its size: ``size_of``).

        The block is the free one at ``addr`` (a trace says where; the caller made sure it is
        free, big enough and in the ``small`` pool), or, with ``addr`` -1, the smallest cached
        free block of the pool that may serve the request (the lowest address among equals),
        or else a segment from :meth:`new_segment`. The rest of the block is split off as a
        free block, unless too little would be left: then the request gets the whole block.
        """
        size_of = self.size_of
        if addr >= 0:
            self.free.discard(addr)
            found = size_of[addr]
            if self.indexed:
                _remove(self.small_free if small else self.large_free, found, addr)
        else:
            pool = self.small_free if small else self.large_free
            i = bisect_left(pool, rounded << ADDR_BITS)
            found = pool[i] >> ADDR_BITS if i < len(pool) else 0
            # The pool is sorted by size, so the first candidate decides.
            if found and takes_cached_block(rounded, found, self.max_split):
                addr = pool.pop(i) & _ADDR_MASK
                self.free.discard(addr)
            else:
                addr = self.new_segment(rounded, small)
                found = size_of[addr]
        remaining = found - rounded
        if should_split(small, rounded, remaining, self.max_split):
            rest = addr + rounded
            prev_of = self.prev_of
            if prev_of.get(addr + found) == addr:
                prev_of[addr + found] = rest
            size_of[rest] = remaining
            prev_of[rest] = addr
            size_of[addr] = rounded
            self.free.add(rest)
            if self.indexed:
                pool = self.small_free if small else self.large_free
                insort(pool, (remaining << ADDR_BITS) | rest)
        return addr

    def new_segment(self, rounded: int, small: bool) -> int:
        """Make a segment for a request no cached block may serve (one block, handed out: use
        :meth:`add_segment` with it taken); its address. A replay that is told every address
        makes none."""
        raise LookupError(f"no cached block for a {rounded}-byte request")

    def release(self, addr: int, small: bool) -> int:
        """Free the handed-out block at ``addr``, merging it with free neighbours in its
        segment; the size of the block freed. ``small`` only picks the free list."""
        size_of, prev_of, free = self.size_of, self.prev_of, self.free
        freed = size = size_of[addr]
        pool = (self.small_free if small else self.large_free) if self.indexed else None
        nxt = addr + size
        if nxt in free and prev_of.get(nxt) == addr:
            nsize = size_of.pop(nxt)
            if pool is not None:
                _remove(pool, nsize, nxt)
            free.discard(nxt)
            del prev_of[nxt]
            size += nsize
            if prev_of.get(addr + size) == nxt:
                prev_of[addr + size] = addr
        prv = prev_of.get(addr)
        if prv is not None and prv in free:
            psize = size_of[prv]
            if pool is not None:
                _remove(pool, psize, prv)
            del size_of[addr], prev_of[addr]
            if prev_of.get(addr + size) == addr:
                prev_of[addr + size] = prv
            addr, size = prv, psize + size
        else:
            free.add(addr)
        size_of[addr] = size
        if pool is not None:
            insort(pool, (size << ADDR_BITS) | addr)
        return freed


def _remove(pool: list[int], size: int, addr: int) -> None:
    del pool[bisect_left(pool, (size << ADDR_BITS) | addr)]
