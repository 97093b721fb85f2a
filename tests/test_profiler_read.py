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
