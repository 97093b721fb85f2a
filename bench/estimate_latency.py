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


NOTES = """What changed ("after"): a run that leaves the model's fake tensors as it made them keeps
them, with its fake mode, for the next run of the same dtype; when the next run also has the
same optimizer, and the recorded step left the optimizer state as it found it, that run keeps
the optimizer too and skips the warm-up step (on the 7B model: AdamW's step over 6.7B
parameters). The answers do not change: tests/test_estimate_warm.py compares every run of a
warm process with a fresh process's (rows, memory curve, peak, reserved).

Where a changed-settings 7B estimate spends its time (py-spy of the estimator process over
later runs, 32 layers): the recorded step's backward about 42 %, forward about 21 %, the
optimizer steps about 15 %; most of that inside torch's FakeTensorMode (its cache key and
output synthesis alone about 36 %) and autograd; our recorder's per-op work (dispatch
observer, module tagging, stack sampling) about 12 %; starting the recording (scan of live
objects) 3 %; filling the fake parameters 3 %; the in-place sums, the CUDA allocator replay
and saving / loading the profile under 2 %; the kernel's side (pickling the job 0.15 s,
reading the profile) a few tenths of a second. A plain FakeTensorMode forward and backward of
the 32 layers with no recorder at all takes 1.7-1.9 CPU s here, so any re-simulation of the
whole model costs at least that.

The "after, idle" rows ran alone on the machine (load 1.0, the same code as "after"): GPT-2
small 1.45 s (AMP) / 1.15 s (SGD), target 1.5 s, met; small 0.24 / 0.13 s, target 1 s, met.
The 7B target (a second estimate <= 4 s): the same request again 0.07 s; another optimizer
3.69 s, met; AMP bf16 4.10 s, 0.1 s over (on the loaded machine 10-20 s of wall time). Going
well under would need not simulating all 32 identical layers (replaying one layer's recorded
events for the others), which is not done.
The largest-batch search of the 7B model is not timed: batch 1 does not fit an A100-80GB."""


if __name__ == "__main__":
    sys.exit(main())
