"""Wall time of `jv.estimate()` as a notebook user sees it: the first call, then the next ones.

Each case runs in this one process, like cells of one kernel: the model is built once (on the
meta device), then ``estimate()`` is called three times in a row, then ``max_batch_size`` once.
The first call pays for starting an estimator process (imports, about 2.5 s here); the second
repeats it, the third changes the optimizer (a new simulation); later calls are what a user
waits for while trying settings. Targets (issue "see everything, change
nothing"): a second estimate of a small model <= 1 s, GPT-2 small <= 1.5 s, a 7B Llama <= 4 s.

The machine is shared, so wall times swing with its load: each call also reports the CPU
seconds of the estimator process that served it (``/proc``), which is what the call would
take on an idle machine (the simulation is one thread), and the load average.

Usage: python bench/estimate_latency.py [--cases small,gpt2,llama7b] [--label NAME] [--json F]
       python bench/estimate_latency.py --readme F  (README section from F's "before" and
       "after" rows)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

TARGET_S = {"small": 1.0, "gpt2": 1.5, "llama7b": 4.0}


def small() -> tuple[Callable[[], nn.Module], str]:
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))

    return build, "32x512"


def gpt2() -> tuple[Callable[[], nn.Module], str]:
    import transformers

    t: Any = transformers
    t.logging.set_verbosity_error()
    config = t.GPT2Config()  # GPT-2 small: 124M parameters

    def build() -> nn.Module:
        model: nn.Module = t.GPT2LMHeadModel(config)
        return model

    return build, "8x512"


def llama7b() -> tuple[Callable[[], nn.Module], str]:
    import transformers

    t: Any = transformers
    t.logging.set_verbosity_error()
    config = t.LlamaConfig(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
    )

    def build() -> nn.Module:
        model: nn.Module = t.LlamaForCausalLM(config)
        return model

    return build, "1x2048"


CASES = {"small": small, "gpt2": gpt2, "llama7b": llama7b}

#: The calls of a case after the first: (column, estimate() keywords).
CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("first", {"optimizer": "adamw"}),
    ("second", {"optimizer": "adamw"}),  # the same again
    ("amp", {"optimizer": "adamw", "amp": "bf16"}),  # another setting, the same optimizer
    ("third", {"optimizer": "sgd"}),  # another optimizer
)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process so far; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serving_pid() -> int:
    from jupyter_vram._estimator.runner import WARM

    loaded = WARM._loaded  # the process that ran the last estimate
    return loaded.process.pid if loaded is not None else -1


def measure(name: str) -> dict[str, Any]:
    import jupyter_vram as jv

    build, shape = CASES[name]()
    with torch.device("meta"):
        model = build()
    row: dict[str, Any] = {"case": name, "input": shape}
    peaks = []
    loads = []
    for column, settings in CALLS:
        before = {pid: _cpu_s(pid) for pid in _known_pids()}
        start = time.perf_counter()
        estimate = jv.estimate(model, shape, **settings)
        row[f"{column}_s"] = round(time.perf_counter() - start, 3)
        pid = _serving_pid()
        row[f"{column}_cpu_s"] = round(_cpu_s(pid) - before.get(pid, 0.0), 3)
        loads.append(os.getloadavg()[0])
        peaks.append(estimate.peak_bytes)
    before = {pid: _cpu_s(pid) for pid in _known_pids()}
    start = time.perf_counter()
    row["max_batch"] = estimate.max_batch_size("A100-80GB")
    row["max_batch_s"] = round(time.perf_counter() - start, 3)
    pid = _serving_pid()
    row["max_batch_cpu_s"] = round(_cpu_s(pid) - before.get(pid, 0.0), 3)
    if peaks[0] != peaks[1]:
        raise SystemExit(f"{name}: repeated estimates disagree: {peaks}")
    row["load"] = round(sum(loads) / len(loads), 1)
    row["target_s"] = TARGET_S[name]
    row["peaks"] = peaks
    return row


def _known_pids() -> list[int]:
    from jupyter_vram._estimator.runner import WARM

    return WARM.pids()


COLUMNS = (("first", "first call"), ("second", "same again"), ("amp", "AdamW + AMP bf16"),
           ("third", "optimizer sgd"), ("max_batch", "max_batch_size"))  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """Wall seconds, with the serving process's CPU seconds in brackets."""
    head = " | ".join(f"{title} (s)" for _, title in COLUMNS)
    lines = [
        f"| case | | load | {head} | target (second estimate) |",
        "|---|---|--:|" + "--:|" * len(COLUMNS) + "---|",
    ]
    for r in rows:
        cells = " | ".join(f"{r[c + '_s']:.2f} ({r[c + '_cpu_s']:.2f})" for c, _ in COLUMNS)
        lines.append(
            f"| {r['case']} | {r['label']} | {r['load']:.1f} | {cells} | <= {r['target_s']:g} s |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="small,gpt2,llama7b")
    parser.add_argument("--label", default="now")
    parser.add_argument("--json", default=None, help="append the rows to this JSON file")
    parser.add_argument("--readme", default=None, help="write README's section from this JSON")
    args = parser.parse_args()
    if args.readme:
        with open(args.readme) as fh:
            rows = json.load(fh)
        write_readme(rows)
        print(table(rows))
        return 0
    rows = []
    for name in args.cases.split(","):
        row = measure(name) | {"label": args.label}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        try:
            with open(args.json) as fh:
                old = json.load(fh)
        except FileNotFoundError:
            old = []
        with open(args.json, "w") as fh:
            json.dump(old + rows, fh, indent=1)
    print()
    print(table(rows))
    return 0


SECTION = "## Estimator latency"

INTRO = """Made by `python bench/estimate_latency.py` (then `--readme` on its JSON): in one process,
as cells of one kernel, `jv.estimate()` of a model built on the meta device four times — AdamW,
the same again, AdamW with AMP bf16 (a new simulation, the same optimizer), SGD (a new
simulation, another optimizer) — then `max_batch_size("A100-80GB")` of the SGD estimate. Each
cell: wall seconds, and in brackets the CPU seconds of the estimator process that served the
call (one thread: about what the call takes on an idle machine). "before" and "after" ran one
right after the other on the shared 2-core machine (load: the 1-minute average during the run,
other sessions' work included). small: Linear(512, 2048) + GELU + Linear(2048, 512), input
32x512; gpt2: GPT-2 small (124M), 8x512; llama7b: Llama-2-7B shapes (6.74B parameters, 32
layers), 1x2048, on the meta device."""


def write_readme(rows: list[dict[str, Any]]) -> None:
    from readme_section import write_section  # bench/ is on sys.path when run as a script

    order = {"before": 0, "after": 1}
    rows = sorted(rows, key=lambda r: (list(CASES).index(r["case"]), order.get(r["label"], 2)))
    write_section(SECTION, INTRO + "\n\n" + table(rows) + "\n\n" + NOTES)


NOTES = """"before": the estimator as the previous round left it (it already keeps the model's
fake tensors, its fake mode and the optimizer between runs of one model); "after": this round.
What changed: later runs of a model leave out the dispatch mode that gives LSTM layers their
workspace once a whole step of the model ran without the LSTM op (and it has no nn.RNNBase
module): every op of the step passed through that extra Python layer (py-spy of the 7B AMP
run: about 8 %); the estimator process freezes (gc.freeze) what exists before the job loads
(torch, transformers and the rest), so each recording's scan of live objects and each full
garbage collection skip it (scan and collections: about 4 % of a 7B run). The answers do not
change: peak and reserved of every call above are the same in both versions, and these two
changes leave every row of every profile as it was (compared row by row on the three cases).
Also this round, the one change to rows: the same estimate twice gives the same numbers
(tests/test_estimate_determinism.py). Before, the first run of a process could differ from
later ones (GPT-2 small 8x512 with AMP: peak allocated 2 MiB apart): the tensors alive
before the step were registered in the garbage collector's order, and the CUDA allocator
model places them in that order; they now come in the order training makes them
(parameters in module order, the optimizer state parameter by parameter, the inputs).

One sample per cell, on a machine other sessions were using: "before" / "after" one right
after the other at load 1.1-1.9, again ("(2)") at 0.7-2.3, and "after (3)" alone at 0.5. The
CPU seconds swing by 10-30 % from run to run under such load; repeated runs inside one
process (7B, AMP then SGD, 4 times each, two processes per version, alternating, load 2-5)
took AMP bf16 median 3.93 / 3.99 CPU s before and 2.89 / 2.95 after (best 2.95 / 3.94 and
2.52 / 2.79), SGD median 3.33 / 3.62 before and 2.34 / 2.45 after: 15-30 % less.

Wall time well above CPU time in the "AdamW + AMP bf16" column (7B after: 4.7 and 6.0 s of
wall for 2.7 and 3.3 CPU s) is the spare estimator process starting (imports, about 2.5 CPU
s) right after the first call returns, on the same two cores as the estimate and the other
sessions' work; with a core free for it the two do not compete: alone on the machine ("after
(3)", load 0.5) the 7B calls took 2.52 s (AMP) and 2.31 s (SGD) of wall time against the 4 s
target, GPT-2 small 0.80 / 0.57 s (target 1.5 s); the small model stays under 0.2 s (1 s).

Where a changed-settings 7B estimate spends its time now (py-spy of the estimator process, 32
layers): torch's FakeTensorMode about 55 % (its cache key alone about 25 %), the autograd
engine's own work, the model's Python code; our recorder's per-op work (dispatch observer,
module tagging, stack sampling) about 15 %; starting the recording 2 %. A plain FakeTensorMode
forward and backward of the 32 layers with no recorder at all takes about 1.7 CPU s, so any
re-simulation of the whole model costs at least that; going well under would need not
simulating all 32 identical layers, which is not done.
The largest-batch search of the 7B model is not timed: batch 1 does not fit an A100-80GB."""


if __name__ == "__main__":
    sys.exit(main())
