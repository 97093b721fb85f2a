"""The allocator's block bookkeeping on hand-laid segments: splits by pool, whole blocks when
too little would be left, merges only within a segment, best fit by (size, address), and a
segment given back only when all its blocks are free.

Expected layouts are written out by hand from the allocator's rules (small pool: split when
>= 512 B would be left; large pool: when > 1 MiB would be left and the request is below
max_split_size)."""

from __future__ import annotations

import pytest

from jupyter_vram._allocator_blocks import CachedBlocks

KIB, MIB = 1024, 1024 * 1024
UNLIMITED = 1 << 62


def layout(blocks: CachedBlocks) -> list[tuple[int, int, bool]]:
    """(start, size, free) of every block, by address."""
    return sorted((a, s, a in blocks.free) for a, s in blocks.size_of.items())


def free_list(blocks: CachedBlocks, small: bool) -> list[tuple[int, int]]:
    """(size, address) of a pool's free list, in its order."""
    pool = blocks.small_free if small else blocks.large_free
    return [(key >> 48, key & ((1 << 48) - 1)) for key in pool]


def test_small_block_splits_until_less_than_512_bytes_would_be_left() -> None:
    blocks = CachedBlocks(UNLIMITED, best_fit=False)
    blocks.add_segment(True, [(0x1000, 4096, True)])
    assert blocks.take(1024, True, 0x1000) == 0x1000
    assert layout(blocks) == [(0x1000, 1024, False), (0x1400, 3072, True)]
    blocks.take(2560, True, 0x1400)  # 512 B left: still split
    assert layout(blocks)[1:] == [(0x1400, 2560, False), (0x1E00, 512, True)]
    blocks.add_segment(True, [(0x9000, 1024, True)])
    blocks.take(512, True, 0x9000)  # 512 left of 1024: split
    blocks.add_segment(True, [(0xA000, 1024 + 511, True)])  # not a real size; tests the rule
    blocks.take(1024, True, 0xA000)  # 511 B would be left: the whole block
    assert blocks.size_of[0xA000] == 1535
    assert 0xA000 + 1024 not in blocks.size_of


def test_large_block_is_taken_whole_unless_more_than_1_mib_is_left() -> None:
    blocks = CachedBlocks(UNLIMITED, best_fit=False)
    blocks.add_segment(False, [(0, 20 * MIB, True)])
    blocks.take(19 * MIB, False, 0)  # exactly 1 MiB would be left: not split
    assert layout(blocks) == [(0, 20 * MIB, False)]
    blocks.add_segment(False, [(64 * MIB, 20 * MIB, True)])
    blocks.take(19 * MIB - 512, False, 64 * MIB)  # 1 MiB + 512 left: split
    assert layout(blocks)[1:] == [
        (64 * MIB, 19 * MIB - 512, False),
        (83 * MIB - 512, MIB + 512, True),
    ]


def test_requests_at_or_above_max_split_size_take_whole_blocks() -> None:
    blocks = CachedBlocks(8 * MIB, best_fit=False)
    blocks.add_segment(False, [(0, 40 * MIB, True)])
    blocks.take(8 * MIB, False, 0)
    assert layout(blocks) == [(0, 40 * MIB, False)]


def test_free_merges_both_free_neighbours_but_not_a_touching_segment() -> None:
    blocks = CachedBlocks(UNLIMITED, best_fit=True)
    # two 2 MiB small segments back to back: the second starts where the first ends
    blocks.add_segment(True, [(0, 2 * MIB, True)])
    blocks.add_segment(True, [(2 * MIB, 2 * MIB, True)])
    a = blocks.take(4096, True, 0)
    b = blocks.take(4096, True, 4096)
    c = blocks.take(4096, True, 8192)
    assert (a, b, c) == (0, 4096, 8192)
    assert blocks.release(a, True) == 4096
    assert blocks.release(c, True) == 4096  # merges with the free rest of the segment
    assert layout(blocks) == [
        (0, 4096, True),
        (4096, 4096, False),
        (8192, 2 * MIB - 8192, True),
        (2 * MIB, 2 * MIB, True),
    ]
    blocks.release(b, True)  # merges with both neighbours: the whole first segment
    assert layout(blocks) == [(0, 2 * MIB, True), (2 * MIB, 2 * MIB, True)]
    assert free_list(blocks, True) == [(2 * MIB, 0), (2 * MIB, 2 * MIB)]
    assert blocks.prev_of == {}


def test_best_fit_takes_the_smallest_fitting_block_then_the_lowest_address() -> None:
    blocks = CachedBlocks(UNLIMITED, best_fit=True)
    # one small segment laid out as: free 8 KiB | used 512 | free 4 KiB | used 512 | free 4 KiB
    used = 2 * MIB - 8 * KIB - 4 * KIB - 4 * KIB - 1024
    blocks.add_segment(
        True,
        [
            (0, 8 * KIB, True),
            (8 * KIB, 512, False),
            (8 * KIB + 512, 4 * KIB, True),
            (12 * KIB + 512, 512, False),
            (12 * KIB + 1024, 4 * KIB, True),
            (16 * KIB + 1024, used, False),
        ],
    )
    assert blocks.take(3 * KIB, True) == 8 * KIB + 512  # a 4 KiB block, the lower one
    assert blocks.size_of[8 * KIB + 512] == 3 * KIB
    assert blocks.take(4 * KIB, True) == 12 * KIB + 1024  # the other 4 KiB block, whole
    assert free_list(blocks, True) == [(1024, 11 * KIB + 512), (8 * KIB, 0)]
    assert blocks.take(5 * KIB, True) == 0


def test_with_no_fitting_block_a_new_segment_is_asked_for() -> None:
    class Made(CachedBlocks):
        def new_segment(self, rounded: int, small: bool) -> int:
            self.add_segment(small, [(0x4000_0000, 20 * MIB, False)])
            return 0x4000_0000

    blocks = Made(UNLIMITED, best_fit=True)
    blocks.add_segment(False, [(0, 4 * MIB, True)])
    assert blocks.take(5 * MIB, False) == 0x4000_0000
    assert layout(blocks) == [
        (0, 4 * MIB, True),
        (0x4000_0000, 5 * MIB, False),
        (0x4000_0000 + 5 * MIB, 15 * MIB, True),
    ]
    with pytest.raises(LookupError):
        CachedBlocks(UNLIMITED, best_fit=True).take(512, True)


def test_max_split_size_keeps_small_requests_off_oversize_blocks() -> None:
    class Made(CachedBlocks):
        def new_segment(self, rounded: int, small: bool) -> int:
            self.add_segment(small, [(1 << 40, 20 * MIB, False)])
            return 1 << 40

    blocks = Made(8 * MIB, best_fit=True)
    blocks.add_segment(False, [(0, 40 * MIB, True)])  # an oversize block: 40 MiB >= 8 MiB
    assert blocks.take(2 * MIB, False) == 1 << 40


def test_a_segment_goes_only_when_every_block_is_free() -> None:
    blocks = CachedBlocks(UNLIMITED, best_fit=True)
    blocks.add_segment(False, [(0, 20 * MIB, True)])
    blocks.take(4 * MIB, False)
    assert not blocks.remove_segment(0, 20 * MIB, False)  # a block is in use
    blocks = CachedBlocks(UNLIMITED, best_fit=True)
    blocks.add_segment(False, [(0, 20 * MIB, True)])
    blocks.release(blocks.take(4 * MIB, False), False)
    assert blocks.remove_segment(0, 20 * MIB, False)
    assert (blocks.size_of, blocks.free, blocks.large_free) == ({}, set(), [])
