"""`jv.plan` predicted vs measured: for three models, every option a rerun can measure.

Usage: python bench/plan_fit.py [--readme]

Each model is a config-built (or hand-built) training step with AdamW in a notebook
namespace: one warm-up step (the optimizer state exists), then the step recorded as `%%vram`
records it (``session.run_code``). The plan is asked for 70 % of that peak; every option in
``plan.considered`` that a rerun can measure is verified (``option.verify()``: a `jv.rerun` of
the cell) and its measured peak set beside the predicted one. A micro-batch option's measured
peak is the micro-batch step with its own gradients held from its start (as every micro-batch
after the first holds them). Error = (predicted - measured) / measured.
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_section import write_section

import jupyter_vram as jv
from jupyter_vram._session import run_code

LM_STEP = "opt.zero_grad()\nloss = model(ids, labels=ids).loss\nloss.backward()\nopt.step()\n"
CONV_STEP = "opt.zero_grad()\nloss = F.cross_entropy(model(x), y)\nloss.backward()\nopt.step()\n"


class ConvNet(nn.Module):
    """Four conv + BatchNorm + ReLU blocks (the tests' conv net)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
            for _ in range(4)
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean((2, 3)))


def gpt2() -> tuple[dict[str, Any], str]:
    import transformers

    config = transformers.GPT2Config(
        n_layer=4, n_embd=64, n_head=2, vocab_size=256, n_positions=64, bos_token_id=0,
        eos_token_id=0, attn_implementation="eager",
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 256, (8, 64))
    return {"model": model, "opt": torch.optim.AdamW(model.parameters()), "ids": ids}, LM_STEP


def llama() -> tuple[dict[str, Any], str]:
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=176, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 256, (8, 64))
    return {"model": model, "opt": torch.optim.AdamW(model.parameters()), "ids": ids}, LM_STEP


def conv() -> tuple[dict[str, Any], str]:
    model = ConvNet()
    ns = {"model": model, "opt": torch.optim.AdamW(model.parameters()), "F": nn.functional}
    return {**ns, "x": torch.randn(8, 3, 32, 32), "y": torch.zeros(8, dtype=torch.long)}, CONV_STEP


MODELS = {"gpt2 (decoder LM)": gpt2, "llama (decoder LM, GQA)": llama, "conv net (BatchNorm)": conv}


def measure(name: str, build: Any) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    ns, step = build()
    run_code(step, ns, stacks=False)
    profile = run_code(step, ns, stacks=False).profile
    assert profile is not None
    plan = jv.plan(profile, int(0.7 * profile.peak_bytes))
    rows = []
    best = plan.best.name if plan.best is not None else None
    for option in plan.considered:
        if option.verifiable is not None:
            continue
        start = time.perf_counter()
        option.verify()
        measured = option.measured_peak_bytes
        assert measured is not None
        rows.append({
            "model": name, "option": option.name, "best": option.name == best,
            "baseline": profile.peak_bytes, "predicted": option.predicted_peak_bytes,
            "measured": measured, "error": (option.predicted_peak_bytes - measured) / measured,
            "seconds": time.perf_counter() - start,
        })  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | option | predicted (KiB) | measured (KiB) | error | under budget |",
        "|---|---|--:|--:|--:|:-:|",
    ]
    for r in rows:
        star = " (best)" if r["best"] else ""
        under = "yes" if r["measured"] <= 0.7 * r["baseline"] else "no"
        lines.append(
            f"| {r['model']} | {r['option']}{star} | {r['predicted'] / 1024:,.0f} | "
            f"{r['measured'] / 1024:,.0f} | {r['error']:+.1%} | {under} |"
        )
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    out = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        kind = "with AMP" if "AMP" in r["option"] else "without AMP"
        groups.setdefault(kind, []).append(r)
    for kind, group in [("all", rows), *sorted(groups.items())]:
        errors = [abs(r["error"]) for r in group]
        worst = max(group, key=lambda r: abs(r["error"]))
        out.append(
            f"- {kind}: {len(group)} options, median |error| {statistics.median(errors):.1%}, "
            f"max {max(errors):.1%} ({worst['model']}: {worst['option']})"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", action="store_true", help="write bench/README.md's section")
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    rows = [row for name, build in MODELS.items() for row in measure(name, build)]
    import transformers

    text = (
        f"`python bench/plan_fit.py --readme` with torch {torch.__version__}, transformers "
        f"{transformers.__version__}, Python {platform.python_version()} (CPU runs: the CPU "
        "tracker records each rerun). Budget: 70 % of the measured peak. Every option of "
        "`plan.considered` that a rerun can measure, verified; (best) marks `plan.best`.\n\n"
        + summary(rows)
        + "\n\n"
        + table(rows)
    )
    print(text)
    if args.readme:
        write_section("## Make it fit: plan predicted vs measured", text)


if __name__ == "__main__":
    main()
