"""What a rerun costs on GPT-2 small (124M parameters, built from its config): host memory and
time for the state copy, the rerun itself and the restore, against the first `%%vram` run.

Usage: python bench/rerun_cost.py [--seq 128] [--batch 2] [--readme]

The notebook holds the model and AdamW after one training step (so gradients and optimizer
state exist: the copy is as big as it gets). The first run is a `%%vram` of one more step
(``session.run_code``, as the magic calls it); each rerun is ``jv.rerun`` of that profile,
plain, with checkpointing ("auto") and with bf16 autocast. Host memory is the process's
resident set, sampled every 5 ms while the rerun runs: its rise over the value before the
call is what the rerun needs on top of the notebook (state copy + the run's own memory; on a
CPU run the device *is* host memory, so the run's activations show there too). The state
copy alone is timed and sized by ``transforms.state.take``; ``StartState`` is what every
plain `%%vram` now pays to make reruns start where it started.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_section import write_section

import jupyter_vram as jv
from jupyter_vram._session import run_code
from jupyter_vram._transforms import state
from jupyter_vram._units import format_bytes

STEP = (
    "loss = model(input_ids=ids, labels=ids).loss\nloss.backward()\nopt.step()\nopt.zero_grad()\n"
)
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * PAGE


class PeakRss:
    """The highest resident set seen while the block runs (sampled every 5 ms)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakRss:
        self.start = rss()
        self.peak = self.start
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def notebook(seq: int, batch: int) -> dict[str, Any]:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(attn_implementation="eager")  # 12 layers, 768 wide
    model = transformers.GPT2LMHeadModel(config)
    ns: dict[str, Any] = {
        "model": model,
        "opt": torch.optim.AdamW(model.parameters(), lr=1e-4),
        "ids": torch.randint(0, config.vocab_size, (batch, seq)),
    }
    exec(STEP.replace("opt.zero_grad()", "pass"), ns)  # state and .grad exist
    return ns


def measure(seq: int, batch: int) -> list[str]:
    ns = notebook(seq, batch)
    params = sum(p.numel() for p in ns["model"].parameters())
    lines = [
        f"GPT-2 small ({params / 1e6:.0f}M parameters, fp32), AdamW, batch {batch}x{seq}, "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs; after one step (.grad and "
        "optimizer state exist).",
        "",
    ]
    t = time.perf_counter()
    start = state.StartState.take(ns)
    start_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    copy = state.take(ns, ["ids"])
    copy_s = time.perf_counter() - t
    copy_bytes = copy.host_bytes
    t = time.perf_counter()
    copy.restore()
    restore_s = time.perf_counter() - t
    del copy, start
    t = time.perf_counter()
    baseline = run_code(STEP, ns).profile
    first_s = time.perf_counter() - t
    assert baseline is not None
    lines += [
        "| what | host memory | time |",
        "|---|---|---|",
        f"| StartState before every %%vram (no tensor copies) | - | {start_ms:.1f} ms |",
        f"| state copy (params, grads, AdamW state, input) | "
        f"{format_bytes(copy_bytes)} | {copy_s:.2f} s |",
        f"| restore (copy_ back in place) | - | {restore_s:.2f} s |",
        f"| first run (%%vram of the step) | peak {format_bytes(baseline.peak_bytes)} "
        f"(measured) | {first_s:.2f} s |",
    ]
    for name, options in (
        ("plain rerun", {}),
        ("rerun, checkpoint auto", {"checkpoint": "auto"}),
        ("rerun, bf16 autocast", {"amp": "bf16"}),
    ):
        with PeakRss() as mem:
            t = time.perf_counter()
            variant = jv.rerun(baseline, **options)
            took = time.perf_counter() - t
        cost = variant.meta["rerun_cost"]
        lines.append(
            f"| {name}: whole call | +{format_bytes(mem.peak - mem.start)} RSS at most "
            f"(copy {format_bytes(cost['state_bytes'])}; run peak "
            f"{format_bytes(variant.peak_bytes)}) | {took:.2f} s (copy "
            f"{cost['copy_seconds']:.2f} s, restore {cost['restore_seconds']:.2f} s) |"
        )
        print(lines[-1], flush=True)
        print("   ", jv.verdict(baseline, variant), flush=True)
        lines.append(f"|  verdict | {jv.verdict(baseline, variant)} | |")
        del variant
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--readme", action="store_true", help="write bench/README.md's section")
    args = parser.parse_args()
    lines = measure(args.seq, args.batch)
    text = "\n".join(lines)
    print(text)
    if args.readme:
        load = os.getloadavg()[0]
        write_section(
            "## Rerun cost",
            "`python bench/rerun_cost.py --readme` (what one `jv.rerun` of a training step "
            "costs; see the script's docstring for how each figure is taken).\n\n"
            + text
            + f"\n\nLoad average when it finished: {load:.1f} on {os.cpu_count()} CPUs.",
        )


if __name__ == "__main__":
    main()
