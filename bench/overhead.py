"""Recording overhead: recorded / bare time of a training step.

Usage: python bench/overhead.py [--quick]
Workloads: a GPT-2-small-sized step (124M parameters, batch 1 x 128 tokens, AdamW) and a model
of many tiny ops (a deep stack of 16-wide linear layers). Prints the median of several runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import jupyter_vram as jv


def gpt2_small_step(seq: int = 128, batch: int = 1) -> Callable[[], None]:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(attn_implementation="eager")  # 12 layers, 768 wide, 124M
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, seq))

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def tiny_ops_step(depth: int = 200, width: int = 16) -> Callable[[], None]:
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)]
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, width)

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed(fn: Callable[[], None], record: bool, stacks: bool = True) -> float:
    start = time.perf_counter()
    if record:
        with jv.record("cpu", stacks=stacks):
            fn()
    else:
        fn()
    return time.perf_counter() - start


def per_step_inside(step: Callable[[], None], steps: int, stacks: bool = True) -> float:
    """Seconds per step inside one recording of ``steps`` steps (start/stop costs excluded)."""
    with jv.record("cpu", stacks=stacks):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - start) / steps


def fixed_cost() -> float:
    """Seconds to start and stop an empty recording (baseline scan, hooks, profile build)."""
    start = time.perf_counter()
    with jv.record("cpu"):
        pass
    return time.perf_counter() - start


def measure(name: str, step: Callable[[], None], repeats: int) -> None:
    step()  # warm up: optimizer state, allocator
    step()
    rows: dict[str, list[float]] = {
        "bare step": [],
        "one recorded step": [],
        "per step, in a 5-step recording": [],
        "  same, no stacks": [],
    }
    fixed = []
    for _ in range(repeats):  # interleave so drift hits all variants alike
        rows["bare step"].append(timed(step, False))
        rows["one recorded step"].append(timed(step, True))
        rows["per step, in a 5-step recording"].append(per_step_inside(step, 5))
        rows["  same, no stacks"].append(per_step_inside(step, 5, stacks=False))
        fixed.append(fixed_cost())
    bare = statistics.median(rows["bare step"])
    with jv.record("cpu") as rec:
        step()
    print(f"{name}: {rec.profile.event_count:,} events per step")
    for label, times in rows.items():
        med = statistics.median(times)
        print(f"  {label:<34} {med * 1e3:9.1f} ms  x{med / bare:.2f}")
    print(f"  {'start + stop of a recording':<34} {statistics.median(fixed) * 1e3:9.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    repeats = 3 if args.quick else 7
    measure("GPT-2 small (124M), batch 1x128, AdamW", gpt2_small_step(), repeats)
    measure("tiny ops (200 x Linear(16)+Tanh, batch 4), SGD", tiny_ops_step(), repeats)


if __name__ == "__main__":
    main()
