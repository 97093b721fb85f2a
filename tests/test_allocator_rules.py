"""The caching allocator's rules, with values worked out by hand from the rules PyTorch
documents for CUDACachingAllocator (512-byte blocks; a small pool of 2 MiB segments for
requests up to 1 MiB; 20 MiB segments for requests under 10 MiB, else the request rounded up
to 2 MiB; splitting leaves at least 512 B in the small pool and more than 1 MiB in the large
one; blocks at or above max_split_size are never split)."""

from __future__ import annotations

from jupyter_vram._allocator_rules import (
    UNLIMITED_SPLIT,
    is_small,
    is_small_segment,
    segment_size,
    should_split,
    takes_cached_block,
)

MIB = 1 << 20


def test_pools() -> None:
    assert is_small(512) and is_small(MIB)
    assert not is_small(MIB + 512)
    assert is_small_segment(2 * MIB) and not is_small_segment(20 * MIB)


def test_segment_sizes() -> None:
    assert segment_size(512) == 2 * MIB
    assert segment_size(MIB) == 2 * MIB
    assert segment_size(MIB + 512) == 20 * MIB
    assert segment_size(10 * MIB - 512) == 20 * MIB
    assert segment_size(10 * MIB) == 10 * MIB
    assert segment_size(11 * MIB + 512) == 12 * MIB


def test_split_rules() -> None:
    # small pool: a remainder of one 512-byte block is kept
    assert should_split(True, 512, 512, UNLIMITED_SPLIT)
    assert not should_split(True, 2 * MIB - 256, 256, UNLIMITED_SPLIT)
    # large pool: the remainder must exceed 1 MiB
    assert not should_split(False, 19 * MIB, MIB, UNLIMITED_SPLIT)
    assert should_split(False, 19 * MIB - 512, MIB + 512, UNLIMITED_SPLIT)
    # a request at or above max_split_size takes its whole block
    assert not should_split(False, 8 * MIB, 12 * MIB, 8 * MIB)
    assert should_split(False, 4 * MIB, 16 * MIB, 8 * MIB)


def test_which_cached_block_a_request_may_take() -> None:
    assert takes_cached_block(2 * MIB, 500 * MIB, UNLIMITED_SPLIT)
    # below max_split_size: never an oversize block
    assert not takes_cached_block(2 * MIB, 64 * MIB, 64 * MIB)
    assert takes_cached_block(2 * MIB, 63 * MIB, 64 * MIB)
    # at or above it: no block 20 MiB or more bigger than the request
    assert takes_cached_block(64 * MIB, 83 * MIB, 64 * MIB)
    assert not takes_cached_block(64 * MIB, 84 * MIB, 64 * MIB)
