"""The CUDA caching allocator's rules, in one place (c10/cuda/CUDACachingAllocator.cpp).

Both the CUDA snapshot converter (which replays a recorded trace to learn block sizes) and the
estimator's allocator model (which replays a fake-tensor run to predict them) follow these
rules: how a request is rounded, which pool serves it, how big a new segment is, when a
cached block is split and which cached block a request may take. A change to the allocator's
behaviour is made here once. Pure arithmetic: no torch, no imports from the package.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "LARGE_BUFFER",
    "MIN_BLOCK",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "SMALL_BUFFER",
    "SMALL_SIZE",
    "UNLIMITED_SPLIT",
    "is_small",
    "is_small_segment",
    "round_size",
    "segment_size",
    "should_split",
    "takes_cached_block",
]

MIN_BLOCK = 512  # every request rounds up to a multiple of this; the least a small split leaves
SMALL_SIZE = 1 << 20  # rounded requests up to 1 MiB use the small pool
SMALL_BUFFER = 2 << 20  # small-pool segments are 2 MiB
MIN_LARGE_ALLOC = 10 << 20  # large requests below this get a LARGE_BUFFER segment
LARGE_BUFFER = 20 << 20
ROUND_LARGE = 2 << 20  # bigger requests get a segment of their size rounded up to this
UNLIMITED_SPLIT = 1 << 62  # ``max_split_size`` when PYTORCH_CUDA_ALLOC_CONF does not set it


def round_size(size: int, divisions: Sequence[int] = ()) -> int:
    """The block size the allocator rounds a ``size``-byte request up to.

    ``divisions`` is ``roundup_power2_divisions`` per power-of-two interval from 1 MiB up
    (``allocator_settings`` in a snapshot); empty or zeros means the default 512-byte rounding.
    """
    if size < MIN_BLOCK:
        return MIN_BLOCK
    if divisions:
        index = min(max(size.bit_length() - 1 - 20, 0), len(divisions) - 1)
        parts = int(divisions[index])
        if parts > 1 and size > MIN_BLOCK * parts:
            return _next_power2_division(size, parts)
    return MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


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


def is_small(rounded: int) -> bool:
    """Whether a rounded request is served from the small pool (2 MiB segments)."""
    return rounded <= SMALL_SIZE


def is_small_segment(segment_size: int) -> bool:
    """Whether a segment of this size belongs to the small pool (when its type is not said)."""
    return segment_size == SMALL_BUFFER


def segment_size(rounded: int) -> int:
    """The size of the segment the allocator ``cudaMalloc``s for a request no cached block
    can serve."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


def should_split(small: bool, rounded: int, remaining: int, max_split_size: int) -> bool:
    """Whether the allocator splits a cached block, keeping ``remaining`` bytes cached, or hands
    the whole block to the request (too little would be left, or the request is above
    ``max_split_size``, whose blocks are never split)."""
    if small:
        return remaining >= MIN_BLOCK
    return remaining > SMALL_SIZE and rounded < max_split_size


def takes_cached_block(rounded: int, found: int, max_split_size: int) -> bool:
    """Whether a request may take ``found``, the smallest cached free block that fits it.

    With ``max_split_size`` set, a request below it never takes an oversize block (one at or
    above it), and a bigger request no block ``LARGE_BUFFER`` or more bigger than itself.
    """
    if rounded < max_split_size:
        return found < max_split_size
    return found < rounded + LARGE_BUFFER
