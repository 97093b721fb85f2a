"""Estimator meets measurement: DDP and FSDP2 on 2 and 4 CPU ranks (gloo).

For a config-built GPT-2, each configuration is run for real with ``jv.launch`` (every rank
recorded) and predicted by the estimator's data-parallel what-if arithmetic
(``_estimator/whatif.py: sharded_peak``) from one single-device estimate of the same per-rank
step. The table compares the prediction with the highest measured per-rank peak. It also
times the training steps in each rank with and without recording (overhead per rank).

    python bench/distributed_estimate.py            # 2 and 4 ranks, DDP and FSDP2
    python bench/distributed_estimate.py --ranks 2  # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

CONFIG: dict[str, Any] = {
    "n_layer": 4,
    "n_embd": 128,
    "n_head": 4,
    "vocab_size": 4096,
    "n_positions": 128,
}
BATCH, SEQ, STEPS = 4, 128, 3


def build() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**CONFIG))


def batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))
    return {"input_ids": ids, "labels": ids}


def train(mode: str, out: str) -> None:
    """What each rank runs: wrap, then STEPS AdamW steps; step times go to ``out``."""
    gpt = build()
    model: nn.Module = gpt
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(gpt)
    elif mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in gpt.transformer.h:
            fully_shard(block)
        fully_shard(gpt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = batch()
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        model(**data).loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    rank = dist.get_rank() if dist.is_initialized() else 0
    Path(out, f"rank{rank}.json").write_text(json.dumps(times))


def _plain_rank(rank: int, world: int, port: int, mode: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        train(mode, out)
    finally:
        dist.destroy_process_group()


def step_times(out: str, world: int) -> list[float]:
    """Median step time of steps after the first, per rank."""
    return [
        statistics.median(json.loads(Path(out, f"rank{r}.json").read_text())[1:])
        for r in range(world)
    ]


def measure(mode: str, world: int) -> tuple[list[int], list[int], list[float], list[float]]:
    """Per-rank peaks (recorded), frees the recorder inferred (made on another thread: gloo's),
    and per-rank step times recorded / not recorded."""
    import jupyter_vram as jv
    from jupyter_vram._distributed.launcher import free_port

    with tempfile.TemporaryDirectory() as recorded, tempfile.TemporaryDirectory() as plain:
        profiles = jv.launch(train, nproc=world, args=(mode, recorded), stacks=False, timeout=900)
        mp.spawn(_plain_rank, args=(world, free_port(), mode, plain), nprocs=world, join=True)
        peaks = [p.peak_bytes for p in profiles]
        inferred = [int(p.meta.get("inferred_frees", 0)) for p in profiles]
        return peaks, inferred, step_times(recorded, world), step_times(plain, world)


def predict(mode: str, world: int) -> int:
    import jupyter_vram as jv
    from jupyter_vram._estimator.whatif import SHARDINGS, sharded_peak

    est = jv.estimate(build(), batch(), optimizer="adamw", device="cpu")
    unit = int(est.profile.meta.get("estimate", {}).get("unit_parameter_bytes", 0))
    name = "DDP" if mode == "ddp" else "ZeRO-3 / FSDP full shard"
    sharding = next(s for s in SHARDINGS if s.name == name)
    return sharded_peak(est.profile, sharding, world, unit)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--modes", nargs="+", default=["ddp", "fsdp"])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each configuration")
    options = parser.parse_args()
    mib = 1 << 20
    print(f"GPT-2 {CONFIG}, batch {BATCH}x{SEQ} per rank, AdamW, {STEPS} steps, gloo on CPU")
    print(
        "| scheme | ranks | measured peak (max rank) | ranks' spread | what-if | error "
        "| inferred frees per rank |"
    )
    print("|---|---|---|---|---|---|---|")
    overheads = []
    for mode in options.modes:
        for world in options.ranks:
            predicted = predict(mode, world)
            for _ in range(options.repeat):
                peaks, inferred, recorded, plain = measure(mode, world)
                top = max(peaks)
                error = (predicted - top) / top
                print(
                    f"| {mode.upper()} | {world} | {top / mib:.2f} MiB | "
                    f"{(top - min(peaks)) / mib:.2f} MiB | {predicted / mib:.2f} MiB | "
                    f"{100 * error:+.1f} % | {', '.join(map(str, inferred))} |",
                    flush=True,
                )
                overheads.append((mode, world, recorded, plain))
    print("\nstep time per rank (median of steps 2..), recorded vs not:")
    for mode, world, recorded, plain in overheads:
        ratio = [r / p for r, p in zip(recorded, plain, strict=True)]
        print(
            f"{mode} x{world}: recorded {statistics.mean(recorded) * 1e3:.0f} ms, plain "
            f"{statistics.mean(plain) * 1e3:.0f} ms, overhead x{statistics.mean(ratio):.2f} "
            f"(ranks {min(ratio):.2f}-{max(ratio):.2f})"
        )


if __name__ == "__main__":
    main()
