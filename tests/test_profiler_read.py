"""Reading the profiler's event tree with Python stacks gives the same rows as without: the
walk skips the calls jupyter_vram's own hooks make (most of the tree with stacks) but for the
way to the module ranges they open, and nothing of the user's is lost with them."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.utils.checkpoint as cp
from torch import nn

import jupyter_vram as jv


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)) * 2)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = cp.checkpoint(block, x, use_reentrant=False) if i % 2 else block(x)
        return x


def rows(stacks: bool) -> tuple[list[tuple[Any, ...]], jv.Profile]:
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters())
    x = torch.randn(16, 32)

    def step() -> None:
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    with jv.record("cpu", stacks=stacks) as rec:
        step()
        step()
    p = rec.profile
    a = p.allocations
    return [
        (
            int(a.size[i]),
            p.ops[a.op[i]],
            p.modules[a.module[i]],
            int(a.phase[i]),
            int(a.category[i]),
            int(a.alloc_seq[i]),
            int(a.free_seq[i]),
        )
        for i in range(len(a))
    ], p


def test_stacks_change_no_row() -> None:
    with_stacks, profile = rows(True)
    without, _ = rows(False)
    assert profile.meta["stacks"] == "full"
    assert with_stacks == without
    # the module ranges our hooks open were found: forward allocations name their block
    assert any(module == "Net.blocks.1.a" for _, _, module, *_ in with_stacks)
    # every allocation made in forward has a stack that ends in this file
    a = profile.allocations
    named = [profile.frames[f] for s in a.stack if s >= 0 for f in profile.stacks[s][-1:]]
    assert named and all(__file__.endswith(frame.filename) for frame in named)


def test_address_search_finds_exactly_the_overlapping_blocks() -> None:
    """The grouped address search returns what a scan of every block returns, in order, on
    blocks of very different lengths (one huge block once widened every search's window)."""
    import random

    from jupyter_vram._capture.cpu_rows import _Intervals

    rng = random.Random(7)
    blocks = []
    for row in range(3000):
        start = rng.randrange(0, 1 << 24) * 64
        length = rng.choice([8, 64, 512, 4096, 1 << 16, 1 << 20, 150 << 20])
        blocks.append((start, start + length * rng.randint(1, 3), row))
    search = _Intervals(*(np.array(column, np.int64) for column in zip(*blocks, strict=True)))
    for _ in range(2000):
        ptr = rng.randrange(0, 1 << 30)
        size = rng.choice([1, 64, 4096, 1 << 20])
        expected = sorted(b for b in blocks if b[0] < ptr + size and b[1] > ptr)
        assert search.over(ptr, size) == expected
    none = np.zeros(0, np.int64)
    assert _Intervals(none, none, none).over(0, 10) == []


def test_many_ranges_at_once_rule_out_only_what_no_block_covers() -> None:
    """Asked for many ranges at once, the search answers False only where a scan of every
    block finds none (it may answer True where one search then finds none); on small blocks
    far apart most ranges are ruled out."""
    import random

    from jupyter_vram._capture.cpu_rows import _Intervals

    rng = random.Random(11)
    blocks = []
    for row in range(2000):
        start = rng.randrange(0, 1 << 24) * 4096
        blocks.append((start, start + rng.choice([8, 64, 512, 4096]), row))
    blocks.append((1 << 40, (1 << 40) + (150 << 20), 2000))  # one huge block, far away
    search = _Intervals(*(np.array(column, np.int64) for column in zip(*blocks, strict=True)))
    ptrs = np.array([rng.randrange(0, 1 << 36) for _ in range(3000)] + [(1 << 40) + 5], np.int64)
    sizes = np.array([rng.choice([1, 64, 4096]) for _ in range(len(ptrs))], np.int64)
    maybe = search.may_be_over(ptrs, ptrs + sizes).tolist()
    covered = [
        any(b[0] < p + n and b[1] > p for b in blocks)
        for p, n in zip(ptrs.tolist(), sizes.tolist(), strict=True)
    ]
    assert all(m for m, c in zip(maybe, covered, strict=True) if c)
    assert maybe[-1] and covered[-1]  # inside the huge block
    assert sum(maybe) < len(maybe) // 10  # by hand: the blocks cover ~0.1 % of the space


def test_ranges_after_points_follow_a_stack_walked_point_by_point() -> None:
    """The ranges open after each point (computed with numpy) are those of two stacks walked
    point by point, on random points with closes of nothing open, recomputes and steps."""
    from jupyter_vram._capture.profiler_read import ReadState, _ranges_after_points

    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(0, 50))
        times = np.sort(rng.integers(0, 1000, n)).tolist()
        kinds = rng.choice(6, n, p=rng.dirichlet(np.ones(6))).tolist()
        points = [
            (t, k, int(rng.integers(1, 8)), t + int(rng.integers(0, 300)))
            for t, k in zip(times, kinds, strict=True)
        ]
        state = ReadState()
        state.sticky = bool(trial % 2)
        state.seq_module = {3: 99}
        got = _ranges_after_points(list(points), state)
        expected, seq_module = _walked(points, bool(trial % 2), {3: 99})
        columns = ("module_depth", "module_top", "step_depth", "step_top", "backward_until")
        columns += ("recompute_until", "sticky", "node_seq")
        for name, column in zip(columns, expected, strict=True):
            assert getattr(got, name).tolist() == column, (trial, name)
        assert got.backward_points == [i for i, p in enumerate(points) if p[1] == 4]
        assert state.seq_module == seq_module


def _walked(
    points: list[tuple[int, int, int, int]], sticky: bool, seq_module: dict[int, int]
) -> tuple[list[list[int]], dict[int, int]]:
    """Kinds: 0 open module, 1 close it, 2 open step, 3 close it, 4 backward, 5 forward op."""
    modules: list[int] = []
    steps: list[int] = []
    until = recompute = 0
    node = -1
    rows = [[0, 0, 0, 0, 0, 0, int(sticky), -1]]
    for t, kind, value, end in points:
        if kind == 0:
            if not modules and t < until:
                recompute = end
            elif not modules:
                sticky = True
            modules.append(value)
        elif kind == 1:
            modules = modules[:-1]
            recompute = 0 if not modules else recompute
        elif kind == 2:
            steps.append(value)
            sticky = False
        elif kind == 3:
            steps = steps[:-1]
        elif kind == 4:
            until, sticky, node = max(until, end), False, value
        elif value not in seq_module:
            seq_module[value] = modules[-1] if modules else 0
        top = modules[-1] if modules else 0
        step = steps[-1] if steps else 0
        rows.append([len(modules), top, len(steps), step, until, recompute, int(sticky), node])
    return [list(column) for column in zip(*rows, strict=True)], seq_module


def test_a_light_chunk_of_interleaved_threads_is_read_in_time_order() -> None:
    """Two threads' reports, taken out of time order (as the library may append them), are
    read in time order, each keeping its own pointer, size, op name and outermost op's span;
    a report with no span (or one outside the chunk's) gets none. The expected rows are
    written out by hand."""
    from jupyter_vram._capture.builder import Interner
    from jupyter_vram._capture.native import NativeChunk
    from jupyter_vram._capture.profiler_read import ReadState, read_native

    names = ["", "aten::empty", "aten::mm", "aten::add"]
    # time, ptr, size, op name id, backward seq, span slot (base 10: slots 10 and 11 here)
    reports = np.array(
        [
            [300, 0x3000, 48, 2, -2, 11],
            [100, 0x1000, 16, 1, -2, 10],
            [400, 0x3000, -48, 0, -2, -1],
            [200, 0x2000, 32, 3, -2, 12],  # slot 12: not in this chunk
        ],
        np.int64,
    )
    spans = np.array([[90, 150], [290, 350]], np.int64)
    chunk = NativeChunk(reports, np.zeros((0, 4), np.int64), spans, 10, names)
    state = ReadState()
    read = read_native(chunk, Interner(), state)
    e = read.events
    ops = read.ops
    assert list(e.time_ns) == [100, 200, 300, 400]
    assert list(e.ptr) == [0x1000, 0x2000, 0x3000, 0x3000]
    assert list(e.size) == [16, 32, 48, -48]
    assert [ops[i] if i else "" for i in e.op] == ["aten::empty", "aten::add", "aten::mm", ""]
    assert list(e.span_start) == [90, 0, 290, 0]
    assert list(e.span_end) == [150, 0, 350, 0]
    assert list(e.stack) == [-1, -1, -1, -1]
    assert list(e.recompute_end) == [0, 0, 0, 0]
