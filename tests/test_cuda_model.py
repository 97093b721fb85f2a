"""The caching-allocator model: hand arithmetic, and agreement with the fixture's allocator.

tests/fixtures/make_cuda_snapshot.py has its own, deliberately naive, re-implementation of
the allocator (linear scans, one list of blocks per segment); the model must match its
counters exactly on random request sequences.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from jupyter_vram._analysis.allocator import (
    allocator_state,
    has_segments,
    reserved_at,
    reserved_peak,
)
from jupyter_vram._estimator.cuda_model import AllocatorSimulation, simulate, to_cuda_profile
from jupyter_vram._model import Allocations, Profile

from .conftest import cuda_snapshot_generator

KIB = 1024
MIB = 1024 * KIB
FIXTURES = Path(__file__).parent / "fixtures"

Row = tuple[int, int, int] | tuple[int, int, int, int]  # size, alloc_seq, free_seq[, device]


def make_profile(rows: Sequence[Row], *, device: str = "cpu") -> Profile:
    """A profile of bare allocations (device 0 = ``device``, device 1 = "meta")."""
    n = len(rows)
    cols: dict[str, Any] = {
        "size": [r[0] for r in rows],
        "alloc_seq": [r[1] for r in rows],
        "free_seq": [r[2] for r in rows],
        "alloc_ns": [max(r[1], 0) for r in rows],
        "free_ns": [max(r[2], 0) for r in rows],
        "device": [r[3] if len(r) > 3 else 0 for r in rows],
        "op": [0] * n,
        "module": [0] * n,
        "stack": [-1] * n,
        "phase": [0] * n,
        "category": [0] * n,
    }
    return Profile(
        Allocations.from_columns(cols),
        device=device,
        source="test",
        devices=[device, "meta"],
        ops=["op"],
        modules=[""],
        frames=[],
        stacks=[],
        meta={"note": "kept"},
    )


def blocks(sim: AllocatorSimulation) -> list[int]:
    return [int(b) for b in sim.block_size]


# -- hand arithmetic -------------------------------------------------------------------------


def test_tiny_request_takes_512_bytes_of_a_2_mib_segment() -> None:
    sim = simulate(make_profile([(100, 0, -1)]))
    assert blocks(sim) == [512]
    assert (sim.peak_allocated, sim.peak_reserved, sim.segment_count) == (512, 2 * MIB, 1)
    assert sim.segments.seq.tolist() == [0] and sim.segments.delta.tolist() == [2 * MIB]
    assert sim.segments.baseline == 0


def test_mid_size_request_gets_a_20_mib_segment() -> None:
    size = 3 * MIB // 2 + 1  # rounds up to the next 512 B
    sim = simulate(make_profile([(size, 0, -1)]))
    assert blocks(sim) == [3 * MIB // 2 + 512]
    assert (sim.peak_reserved, sim.segment_count) == (20 * MIB, 1)


def test_large_requests_get_a_segment_of_their_own_size() -> None:
    sim = simulate(make_profile([(12 * MIB, 0, -1)]))
    assert blocks(sim) == [12 * MIB]
    assert sim.peak_reserved == 12 * MIB
    # one byte more: a 14 MiB segment, and the 2 MiB - 512 B left is worth splitting off
    sim = simulate(make_profile([(12 * MIB + 1, 0, -1)]))
    assert blocks(sim) == [12 * MIB + 512]
    assert (sim.peak_allocated, sim.peak_reserved) == (12 * MIB + 512, 14 * MIB)


def test_reuse_splits_only_when_more_than_1_mib_is_left() -> None:
    sim = simulate(
        make_profile([
            (8 * MIB, 0, 1),  # a 20 MiB segment; the 12 MiB rest is split off
            (37 * MIB // 2, 2, 3),  # reuses it; 1.5 MiB left > 1 MiB: split
            (39 * MIB // 2, 4, 5),  # 0.5 MiB would be left: takes the whole block
            (19 * MIB, 6, -1),  # exactly 1 MiB left is not enough either
        ])
    )  # fmt: skip
    assert blocks(sim) == [8 * MIB, 37 * MIB // 2, 20 * MIB, 20 * MIB]
    assert (sim.peak_allocated, sim.peak_reserved, sim.segment_count) == (20 * MIB, 20 * MIB, 1)


def test_small_blocks_split_down_to_512_bytes() -> None:
    sim = simulate(
        make_profile([
            (MIB, 0, 2),  # a 2 MiB segment, split in two halves
            (MIB, 1, -1),  # the second half, exactly
            (MIB - 1000, 3, -1),  # rounds to 1 MiB - 512 B: the 512 B left is split off
            (400, 4, -1),  # fits that 512 B block exactly
        ])
    )  # fmt: skip
    assert blocks(sim) == [MIB, MIB, MIB - 512, 512]
    assert (sim.peak_allocated, sim.peak_reserved, sim.segment_count) == (2 * MIB, 2 * MIB, 1)


def test_freed_neighbours_merge_so_a_bigger_request_fits() -> None:
    sim = simulate(
        make_profile([
            (6 * MIB, 0, 3),  # [0, 6) of a 20 MiB segment
            (6 * MIB, 1, 4),  # [6, 12)
            (6 * MIB, 2, 6),  # [12, 18), leaving [18, 20) free
            (11 * MIB, 5, 7),  # A and B merged to [0, 12): fits, 1 MiB left -> whole block
            (20 * MIB, 8, -1),  # everything merged back into one 20 MiB block
        ])
    )  # fmt: skip
    assert blocks(sim) == [6 * MIB, 6 * MIB, 6 * MIB, 12 * MIB, 20 * MIB]
    assert (sim.peak_allocated, sim.peak_reserved, sim.segment_count) == (20 * MIB, 20 * MIB, 1)


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    sim = simulate(
        make_profile([
            (6 * MIB, 0, -1),  # segment 1 (20 MiB): [0, 6) + a free 14 MiB block
            (16 * MIB, 1, 2),  # too big for it: segment 2, 16 MiB exactly, then freed
            (27 * MIB // 2, 3, -1),  # 14 MiB and 16 MiB blocks fit: the 14 MiB one, whole
            (15 * MIB, 4, -1),  # the 16 MiB one, whole (exactly 1 MiB left)
        ])
    )  # fmt: skip
    assert blocks(sim) == [6 * MIB, 16 * MIB, 14 * MIB, 16 * MIB]
    assert (sim.peak_allocated, sim.peak_reserved, sim.segment_count) == (36 * MIB, 36 * MIB, 2)


def test_pools_are_separate() -> None:
    sim = simulate(make_profile([(MIB, 0, 1), (MIB + 1, 2, -1)]))
    # the free 2 MiB small segment cannot serve a large request
    assert blocks(sim) == [MIB, MIB + 512]
    assert (sim.peak_reserved, sim.segment_count) == (22 * MIB, 2)


def test_baseline_rows_reserve_before_recording_and_other_devices_are_ignored() -> None:
    sim = simulate(
        make_profile([
            (30 * MIB + 3, 0, 1),  # recording: reuses nothing, a 32 MiB segment
            (5 * MIB, -1, -1),  # baseline: a 20 MiB segment
            (10**9, 0, -1, 1),  # another device: keeps its size, counts nowhere
            (100, -1, 2),  # baseline, freed while recording: a 2 MiB segment
            (4 * MIB, 3, -1),  # fits the 15 MiB left of the baseline segment
        ])
    )  # fmt: skip
    assert blocks(sim) == [30 * MIB + 512, 5 * MIB, 10**9, 512, 4 * MIB]
    assert sim.segments.baseline == 22 * MIB
    assert sim.segments.seq.tolist() == [0] and sim.segments.delta.tolist() == [32 * MIB]
    assert sim.peak_allocated == 35 * MIB + 1024
    assert (sim.peak_reserved, sim.segment_count) == (54 * MIB, 3)


def test_zero_byte_requests_take_no_block() -> None:
    sim = simulate(make_profile([(0, 0, 1), (0, -1, -1)]))
    assert blocks(sim) == [0, 0]
    assert (sim.peak_allocated, sim.peak_reserved, sim.segment_count) == (0, 0, 0)


def test_roundup_divisions() -> None:
    # 4 divisions between 4 and 8 MiB: 5 MiB + 1 rounds up to 6 MiB
    sim = simulate(make_profile([(5 * MIB + 1, 0, -1)]), divisions=[4] * 16)
    assert blocks(sim) == [6 * MIB]


def test_max_split_size() -> None:
    rows: list[Row] = [(40 * MIB, 0, 1), (MIB + 1, 2, -1), (35 * MIB, 3, -1)]
    unlimited = simulate(make_profile(rows))
    assert blocks(unlimited) == [40 * MIB, MIB + 512, 35 * MIB]
    assert unlimited.segment_count == 1
    # from 32 MiB on blocks are oversize: a smaller request may not take one (a new
    # segment), a request above the limit takes one whole if it is less than 20 MiB too big
    limited = simulate(make_profile(rows), max_split_size=32 * MIB)
    assert blocks(limited) == [40 * MIB, MIB + 512, 40 * MIB]
    assert (limited.segment_count, limited.peak_reserved) == (2, 60 * MIB)
    # a cached block exactly 20 MiB too big is refused, a smaller one taken whole
    exact = simulate(make_profile([(60 * MIB, 0, 1), (40 * MIB, 2, -1)]), max_split_size=32 * MIB)
    assert blocks(exact) == [60 * MIB, 40 * MIB] and exact.segment_count == 2
    near = simulate(make_profile([(60 * MIB, 0, 1), (41 * MIB, 2, -1)]), max_split_size=32 * MIB)
    assert blocks(near) == [60 * MIB, 60 * MIB] and near.segment_count == 1


# -- the CUDA profile --------------------------------------------------------------------------


def test_warm_up_replays_the_first_step_before_the_measured_one() -> None:
    """Optimizer state B (4 MiB) that the first step makes after its 12 MiB request, then a
    step of X (8 MiB, freed at 2) and Y (12 MiB, freed at 3).

    Cold (B made before the step): B takes a 20 MiB segment (4 MiB < 10 MiB), X splits its
    16 MiB rest, Y (>= 10 MiB) gets a 12 MiB segment: 32 MiB reserved.
    Warm: in the first step X takes a 20 MiB segment, Y its 12 MiB rest, B a second 20 MiB
    segment (4 + 16 free); both steps then run out of those 40 MiB: X takes the 16 MiB block
    (best fit), Y the merged 20 MiB. Peak allocated 4 + 8 + 12 = 24 MiB either way.
    """
    rows: list[Row] = [(4 * MIB, -1, -1), (8 * MIB, 0, 2), (12 * MIB, 1, 3)]
    cold = simulate(make_profile(rows))
    assert (cold.peak_allocated, cold.peak_reserved) == (24 * MIB, 32 * MIB)
    warm = simulate(make_profile(rows), warm_up={0: 1.5})
    assert (warm.peak_allocated, warm.peak_reserved) == (24 * MIB, 40 * MIB)
    assert warm.segments.baseline == 40 * MIB and warm.segment_count == 2
    assert blocks(warm) == [4 * MIB, 8 * MIB, 12 * MIB]


def test_to_cuda_profile_reads_like_a_gpu_recording(tmp_path: Path) -> None:
    base = make_profile([
        (5 * MIB, -1, -1),
        (100, 0, 2),
        (3 * MIB, 1, -1),
        (7, 1, -1, 1),
        (25 * MIB, 3, 4),
    ])  # fmt: skip
    sim = simulate(base)
    cuda = to_cuda_profile(base, sim)
    assert cuda.device == "cuda" and cuda.devices == ("cuda", "meta")
    assert cuda.allocations.size.tolist() == [5 * MIB, 512, 3 * MIB, 7, 26 * MIB]
    assert cuda.allocations.alloc_seq.tolist() == base.allocations.alloc_seq.tolist()
    assert cuda.source == base.source and cuda.event_count == base.event_count
    assert cuda.meta == {
        "note": "kept",
        "allocator_model": {
            "peak_allocated": sim.peak_allocated,
            "peak_reserved": sim.peak_reserved,
            "segments": 3,
        },
    }
    assert cuda.peak_bytes == sim.peak_allocated == 5 * MIB + 3 * MIB + 26 * MIB
    assert has_segments(cuda)
    assert reserved_peak(cuda) == sim.peak_reserved == 20 * MIB + 2 * MIB + 26 * MIB
    assert reserved_at(cuda, [-1, 0, 2, 3]).tolist() == [20 * MIB, 22 * MIB, 22 * MIB, 48 * MIB]
    state = allocator_state(cuda)
    assert state.has_caching_allocator and state.peak_reserved == 48 * MIB
    assert state.allocated_at_reserved_peak == 5 * MIB + 3 * MIB + 26 * MIB
    assert state.end_reserved == 48 * MIB and state.end_allocated == 8 * MIB
    loaded = Profile.load(cuda.save(tmp_path / "cuda.json"))
    assert loaded.segments.seq.tolist() == cuda.segments.seq.tolist()
    assert loaded.segments.baseline == 20 * MIB


def test_to_cuda_profile_checks_its_inputs() -> None:
    base = make_profile([(100, 0, -1), (100, 0, -1, 1)])
    assert to_cuda_profile(base, device="cuda:1").device == "cuda:1"
    with pytest.raises(ValueError, match="already has allocations on 'meta'"):
        to_cuda_profile(base, device="meta")
    other = simulate(make_profile([(100, 0, -1)]))
    with pytest.raises(ValueError, match="1 rows"):
        to_cuda_profile(base, other)
    empty = Profile(
        Allocations.empty(), device="meta", source="test", devices=(), ops=(), modules=(),
        frames=(), stacks=(),
    )  # fmt: skip
    sim = simulate(empty)
    assert (sim.peak_allocated, sim.peak_reserved, len(sim.block_size)) == (0, 0, 0)
    assert to_cuda_profile(empty, sim).peak_bytes == 0


# -- against the fixture's allocator -------------------------------------------------------------


@pytest.fixture(scope="module")
def reference() -> Iterator[ModuleType]:
    with cuda_snapshot_generator() as module:
        yield module


EDGES = [1, 511, 512, 513, MIB - 512, MIB, MIB + 1, 2 * MIB, 10 * MIB - 512, 10 * MIB,
         10 * MIB + 1, 19 * MIB, 19 * MIB + 1, 20 * MIB, 21 * MIB]  # fmt: skip


def random_size(rng: np.random.Generator) -> int:
    kind = rng.integers(6)
    if kind == 0:
        return int(rng.integers(1, 4 * KIB))
    if kind == 1:
        return int(rng.integers(1, MIB + 1))
    if kind == 2:
        return int(rng.choice(EDGES))
    if kind == 3:
        return int(rng.integers(MIB + 1, 10 * MIB))
    if kind == 4:
        return int(rng.integers(10 * MIB, 64 * MIB))
    return int(rng.integers(1, 8)) * MIB  # whole MiB: exact fits and exact leftovers


def play(reference: ModuleType, rng: np.random.Generator) -> None:
    """One random run through the fixture's allocator, then the model on the same requests."""
    alloc = reference.Allocator()
    rows: list[list[int]] = []  # [size, alloc_seq, free_seq]
    expected_block: list[int] = []
    live: list[tuple[int, Any]] = []  # (row, block)
    peak = 0
    segments: list[tuple[int, int]] = []

    def malloc(size: int, seq: int) -> None:
        nonlocal peak
        before = alloc.reserved
        block = alloc.malloc(size, [])
        if alloc.reserved != before and seq >= 0:
            segments.append((seq, alloc.reserved - before))
        peak = max(peak, alloc.allocated)
        live.append((len(rows), block))
        rows.append([size, seq, -1])
        expected_block.append(block.size)

    for _ in range(int(rng.integers(0, 6))):  # the baseline: allocations only
        malloc(random_size(rng), -1)
    baseline_reserved = alloc.reserved
    p_free = rng.uniform(0.3, 0.6)
    for seq in range(int(rng.integers(5, 120))):
        if live and rng.random() < p_free:
            row, block = live.pop(int(rng.integers(len(live))))
            alloc.free(block)
            rows[row][2] = seq
        else:
            malloc(random_size(rng), seq)

    # rows in any order, but the baseline's in the order it was allocated
    n_base = sum(1 for r in rows if r[1] < 0)
    places = rng.permutation(len(rows))
    order = np.empty(len(rows), np.int64)
    order[np.sort(places[:n_base])] = np.arange(n_base)
    order[places[n_base:]] = np.arange(n_base, len(rows))
    shuffled: list[Row] = [(rows[i][0], rows[i][1], rows[i][2]) for i in order]
    shuffled.append((12345, 0, -1, 1))  # another device

    sim = simulate(make_profile(shuffled))
    assert blocks(sim)[:-1] == [expected_block[i] for i in order]
    assert blocks(sim)[-1] == 12345
    assert sim.peak_allocated == peak
    assert sim.peak_reserved == alloc.reserved
    assert sim.segment_count == len(alloc.segments)
    assert sim.segments.baseline == baseline_reserved
    assert (
        list(zip(sim.segments.seq.tolist(), sim.segments.delta.tolist(), strict=True)) == segments
    )


def test_matches_the_fixture_allocator(reference: ModuleType) -> None:
    rng = np.random.default_rng(20240611)
    for _ in range(2000):
        play(reference, rng)
