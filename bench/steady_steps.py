"""What a loop of small training steps costs to record: every step in detail, and with its
repeated steps kept as the allocator's reports alone (the default).

Usage: python bench/steady_steps.py [--repeats N] [--steps N] [--readme]

In this process, with one torch thread (a kernel's display and magic are not in these
figures: ``bench/real_cells.py`` has them). Variants, interleaved so drift hits all alike,
each the minimum over the repeats of one whole recording (start to finished profile):

* plain: the loop alone;
* reports alone: the light recorder's library around the loop, as in a repeated step (no
  hooks, no op callback: ``jv_start``, ``jv_steady``, ``jv_stop``): the floor for anything
  that keeps every report;
* reports and ops: the library with its op callback, no hooks: what every step in detail
  costs before any Python;
* detail: ``jv.record(ops="all")``: every step's ops, modules and roles;
* default: ``jv.record()``: steps after the ones that set the pattern are reports alone.

The same loop with its loss an ``nn.CrossEntropyLoss`` module (two steps an iteration, a
pattern of two) is timed plain, in detail and by default too.

Both recordings' rows are checked equal (all columns but times and stacks) before timing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_section import write_section

import jupyter_vram as jv
from jupyter_vram._capture import native

COLUMNS = ["op", "module", "phase", "category", "bytes", "alloc_seq", "free_seq"]


def small_loop(steps: int, loss_module: bool = False) -> Callable[[], None]:
    """The 200-step cell of bench/real_cells.py (``loss_module``: its loss a module)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    criterion = nn.CrossEntropyLoss() if loss_module else nn.functional.cross_entropy

    def loop() -> None:
        for _ in range(steps):
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    loop()
    return loop


def check_equal(loop: Callable[[], None]) -> dict[str, object]:
    with jv.record("cpu", ops="all") as detail:
        loop()
    with jv.record("cpu") as default:
        loop()
    a = detail.profile.to_dataframe()[COLUMNS].astype(str).reset_index(drop=True)
    b = default.profile.to_dataframe()[COLUMNS].astype(str).reset_index(drop=True)
    if not a.equals(b):
        raise SystemExit("the default recording's rows differ from the detail recording's")
    return dict(default.profile.meta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--readme", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lib = native.library()
    if lib is None:
        raise SystemExit(f"the light recorder is not built here: {native.why_not()}")
    loop = small_loop(args.steps)
    meta = check_equal(loop)
    with_module = small_loop(args.steps, loss_module=True)
    module_meta = check_equal(with_module)

    def library(op_callback: bool) -> Callable[[], None]:
        def run() -> None:
            lib.jv_start()
            if not op_callback:
                lib.jv_steady(1, 0, 1)  # no step to repeat: reports alone, nothing raised
            loop()
            lib.jv_stop()
            native._take(lib, [])

        return run

    def recorded(ops: str, cell: Callable[[], None] = loop) -> Callable[[], None]:
        def run() -> None:
            with jv.record("cpu", ops=ops):
                cell()

        return run

    variants = {
        "plain": loop,
        "reports alone (floor)": library(op_callback=False),
        "reports and ops, no hooks": library(op_callback=True),
        "detail (ops='all')": recorded("all"),
        "default (repeated steps as reports)": recorded("auto"),
        "loss module: plain": with_module,
        "loss module: detail (ops='all')": recorded("all", with_module),
        "loss module: default": recorded("auto", with_module),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, run in variants.items():
            began = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - began)
    best = {name: min(t) for name, t in times.items()}

    def ratio(name: str) -> float:
        plain = best["loss module: plain" if name.startswith("loss module") else "plain"]
        return best[name] / plain

    lines = [
        f"`python bench/steady_steps.py --repeats {args.repeats} --steps {args.steps}`: "
        f"torch {torch.__version__}, one torch thread, min of {args.repeats} interleaved runs "
        f"of a whole recording. The default recording repeated {meta['steady_steps']} of "
        f"{args.steps} steps; with the loss a module, {module_meta['steady_steps']} of "
        f"{2 * args.steps} steps, in groups of {module_meta['steady_period']}. Both "
        "recordings' rows equal the detail recording's (every column but times and stacks).",
        "",
        "| variant | ms | ratio to plain |",
        "|---|--:|--:|",
        *(f"| {name} | {t * 1e3:.1f} | {ratio(name):.2f}x |" for name, t in best.items()),
    ]
    text = "\n".join(lines)
    print(text)
    if args.readme:
        write_section("## Steady steps: a loop's repeated steps", text)


if __name__ == "__main__":
    main()
