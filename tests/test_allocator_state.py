"""Allocator measures on hand-built allocator states: the cached-free share is taken at the
allocated peak, and expandable_segments is advised only when fragmentation cost segments."""

from __future__ import annotations

import numpy as np
import pytest

from jupyter_vram._analysis.allocator import allocator_state, stranded_requests
from jupyter_vram._capture.builder import ProfileBuilder
from jupyter_vram._model import CATEGORY_INDEX, PHASE_INDEX, Profile, SegmentEvents

MIB = 2**20
T = CATEGORY_INDEX["temporary"]
FWD = PHASE_INDEX["forward"]


def state_of(steps: list[tuple[str, int, int]], meta: dict[str, object] | None = None) -> Profile:
    """A CUDA-like profile from steps in order: ("seg", bytes, 0) reserves a segment for the
    next request, ("alloc", bytes, key) and ("free", 0, key)."""
    b = ProfileBuilder()
    dev, op, mod = b.devices("cuda:0"), b.ops("mm"), b.modules("net")
    rows: dict[int, int] = {}
    seg_seq: list[int] = []
    seg_delta: list[int] = []
    for seq, (kind, size, key) in enumerate(steps):
        if kind == "seg":
            seg_seq.append(seq)
            seg_delta.append(size)
        elif kind == "alloc":
            rows[key] = b.add(size, seq, seq * 1000, dev, op, mod, -1, FWD, T)
        else:
            b.free(rows[key], seq, seq * 1000)
    segments = SegmentEvents(np.asarray(seg_seq, np.int64), np.asarray(seg_delta, np.int64), 0)
    return b.build(
        device="cuda:0", source="cuda", wall_ns=10**6, segments=segments, meta=meta or {}
    )


def advised(profile: Profile) -> bool:
    return any("expandable_segments" in a for a in allocator_state(profile).advice)


def issue_case() -> Profile:
    """The issue's estimate: 1.6 GiB reserved and 1.6 GiB allocated at the peak. Early on, a
    600 MiB request got a segment of its own while the 1000 MiB segment was cached free, so
    when reserved memory peaked nothing was allocated; later both are filled and allocated
    reaches all that is reserved."""
    return state_of([
        ("seg", 1000 * MIB, 0), ("alloc", 1000 * MIB, 1), ("free", 0, 1),
        ("seg", 600 * MIB, 0), ("alloc", 600 * MIB, 2),  # with 1000 MiB cached free
        ("free", 0, 2),
        ("alloc", 1000 * MIB, 3), ("alloc", 600 * MIB, 4),  # fills both: the peak, 1600 MiB
        ("free", 0, 3), ("free", 0, 4),
    ])  # fmt: skip


def test_cached_free_share_is_taken_at_the_allocated_peak() -> None:
    state = allocator_state(issue_case())
    assert state.peak_allocated == 1600 * MIB
    assert state.peak_reserved == 1600 * MIB
    # at the allocated peak everything reserved is in use: 0 % cached free
    assert state.reserved_at_allocated_peak == 1600 * MIB
    assert state.cached_free_share == 0.0
    assert state.excess_reserved == 0
    # the old measure, taken when reserved peaked (the new segment, before its request):
    # nothing allocated, "100 % fragmented"
    assert state.allocated_at_reserved_peak == 0
    # the 600 MiB request found 1000 MiB cached free and still got a segment: that is
    # fragmentation (on a real allocator: the free block was the wrong pool or stream), but it
    # cost nothing at the peak, so no advice
    assert [r.size for r in state.stranded] == [600 * MIB]
    assert not advised(issue_case())


def test_no_fragmentation_when_the_cache_was_too_small() -> None:
    profile = state_of([
        ("seg", 400 * MIB, 0), ("alloc", 400 * MIB, 1), ("free", 0, 1),
        ("seg", 600 * MIB, 0), ("alloc", 600 * MIB, 2),  # only 400 MiB free: a real need
    ])  # fmt: skip
    assert stranded_requests(profile) == []
    state = allocator_state(profile)
    assert state.reserved_at_allocated_peak == 1000 * MIB
    assert state.cached_free_share == pytest.approx(400 / 1000)
    assert not advised(profile)


def fragmented() -> list[tuple[str, int, int]]:
    """Ten 100 MiB blocks in one 1000 MiB segment, every other one freed: 500 MiB free in
    100 MiB holes. Then three 300 MiB requests each need a segment of their own although
    500 MiB are free. Peak allocated 1400 MiB, reserved 1900 MiB."""
    steps: list[tuple[str, int, int]] = [("seg", 1000 * MIB, 0)]
    steps += [("alloc", 100 * MIB, k) for k in range(10)]
    steps += [("free", 0, k) for k in range(0, 10, 2)]
    steps += [("seg", 300 * MIB, 0), ("alloc", 300 * MIB, 20)]
    steps += [("seg", 300 * MIB, 0), ("alloc", 300 * MIB, 21)]
    steps += [("seg", 300 * MIB, 0), ("alloc", 300 * MIB, 22)]
    return steps


def test_fragmentation_that_costs_reserved_memory_is_advised() -> None:
    profile = state_of(fragmented())
    state = allocator_state(profile)
    assert state.peak_allocated == (500 + 900) * MIB
    assert state.peak_reserved == 1900 * MIB
    assert state.reserved_at_allocated_peak == 1900 * MIB
    assert state.cached_free_share == pytest.approx(500 / 1900)
    assert state.excess_reserved == 500 * MIB
    # free before each 300 MiB request: 500, 500, 500 MiB (the holes stay): all stranded
    assert [(r.size, r.cached_free) for r in state.stranded] == [(300 * MIB, 500 * MIB)] * 3
    assert advised(profile)
    text = next(a for a in state.advice if "expandable_segments" in a)
    assert "500.0 MiB" in text and "3 request(s)" in text


def test_no_advice_when_expandable_segments_is_on_or_memory_is_small() -> None:
    assert not advised(state_of(fragmented(), meta={"expandable_segments": True}))
    small = [(kind, size // 16, key) for kind, size, key in fragmented()]
    assert allocator_state(state_of(small)).stranded  # same shape, 120 MiB reserved
    assert not advised(state_of(small))
