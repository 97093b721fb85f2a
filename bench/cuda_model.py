"""Time the caching-allocator model (target: 200k events in well under 2 s).

Two workloads per size: the synthetic training-loop profile (short-lived allocations), and a
fragmenting one where allocations live for a random stretch of the run, so thousands of
blocks are live and the free lists stay long.

Usage: python bench/cuda_model.py [events ...]   (default: 200000)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from synthetic import synthetic_profile

from jupyter_vram._estimator.cuda_model import simulate
from jupyter_vram._model import Allocations, Profile


def fragmenting_profile(events: int, *, seed: int = 1) -> Profile:
    """``events`` events of allocations from 512 B to 64 MiB, each freed after a random
    number of later events (up to a tenth of the run)."""
    rng = np.random.default_rng(seed)
    n = events // 2
    sizes = np.exp(rng.uniform(np.log(512), np.log(64 << 20), n)).astype(np.int64)
    start = np.arange(n, dtype=np.float64)
    end = start + rng.uniform(0.5, n / 10, n)
    times = np.concatenate([start, end])
    order = np.argsort(times, kind="stable")
    seq = np.empty(2 * n, np.int64)
    seq[order] = np.arange(2 * n)
    zeros = np.zeros(n, np.int64)
    allocations = Allocations(
        size=sizes,
        alloc_seq=seq[:n],
        free_seq=seq[n:],
        alloc_ns=zeros,
        free_ns=zeros,
        device=zeros.astype(np.int32),
        op=zeros.astype(np.int32),
        module=zeros.astype(np.int32),
        stack=np.full(n, -1, np.int32),
        phase=zeros.astype(np.int8),
        category=zeros.astype(np.int8),
    )
    return Profile(
        allocations,
        device="cpu",
        source="bench",
        devices=["cpu"],
        ops=["op"],
        modules=[""],
        frames=[],
        stacks=[],
    )


def run(events: int) -> None:
    for label, prof in (
        ("training loop", synthetic_profile(events)),
        ("fragmenting", fragmenting_profile(events)),
    ):
        start = time.perf_counter()
        sim = simulate(prof)
        elapsed = time.perf_counter() - start
        print(
            f"{label:<14} {prof.event_count:>9,} events  {elapsed:6.3f} s  "
            f"allocated peak {sim.peak_allocated / 2**30:7.2f} GiB, reserved "
            f"{sim.peak_reserved / 2**30:7.2f} GiB in {sim.segment_count:,} segments"
        )


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [200_000]:
        run(n)
