"""Synthetic profiles of any size, for analysis and rendering benchmarks."""

from __future__ import annotations

import numpy as np

from jupyter_vram._model import CATEGORIES, PHASES, Allocations, Frame, Profile


def synthetic_profile(events: int, *, seed: int = 0) -> Profile:
    """A run of exactly ``events`` alloc + free events, training-loop-like: mostly short-lived
    allocations, a few that outlive the run, over 200 modules, 60 ops and 2,000 stacks
    (6,000 distinct allocation sites)."""
    rng = np.random.default_rng(seed)
    n = (events + 1) // 2
    n_kept = 2 * n - events  # allocations never freed, so the event count comes out exact
    sizes = (rng.lognormal(mean=11, sigma=2.5, size=n).astype(np.int64) // 512 + 1) * 512
    start = np.sort(rng.uniform(0, 1e9, size=n))
    end = start + rng.exponential(scale=2e6, size=n)
    kept = rng.choice(n, size=n_kept, replace=False)
    end[kept] = np.inf
    times = np.concatenate([start, end[np.isfinite(end)]])
    order = np.argsort(times, kind="stable")
    seq_of = np.empty(len(times), np.int64)
    seq_of[order] = np.arange(len(times))
    alloc_seq = seq_of[:n]
    free_seq = np.full(n, -1, np.int64)
    free_seq[np.isfinite(end)] = seq_of[n:]
    n_modules, n_ops, n_stacks = 200, 60, 2000
    modules = ["", *(f"Model.blocks.{i // 10}.layer{i % 10}" for i in range(n_modules - 1))]
    frames = [Frame(f"/project/model_{i % 40}.py", i, f"fn{i % 97}") for i in range(400)]
    stacks = [tuple(int(x) for x in rng.choice(400, size=6)) for _ in range(n_stacks)]
    # one Python line allocates through one to three ops, inside one module: as in real runs
    stack = rng.integers(-1, n_stacks, n).astype(np.int32)
    op = ((stack.astype(np.int64) * 7 + rng.integers(0, 3, n)) % n_ops).astype(np.int32)
    module = (np.maximum(stack, 0) % n_modules).astype(np.int32)
    allocations = Allocations(
        size=sizes,
        alloc_seq=alloc_seq,
        free_seq=free_seq,
        alloc_ns=start.astype(np.int64),
        free_ns=np.where(np.isfinite(end), end, -1).astype(np.int64),
        device=np.zeros(n, np.int32),
        op=op,
        module=module,
        stack=stack,
        phase=rng.integers(0, len(PHASES), n).astype(np.int8),
        category=rng.integers(0, len(CATEGORIES), n).astype(np.int8),
    )
    return Profile(
        allocations,
        device="cuda:0",
        source="synthetic",
        devices=["cuda:0"],
        ops=[f"op{i}" for i in range(n_ops)],
        modules=modules,
        frames=frames,
        stacks=stacks,
        wall_ns=int(1e9),
    )
