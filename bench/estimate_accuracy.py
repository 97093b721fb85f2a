"""Estimate accuracy: ``jv.estimate()`` against a measured CPU step of real transformers models.

For each case the measured step runs in a fresh Python process (the CPU recorder counts every
live tensor of its process, so nothing else may be alive there): the real model built from its
config, one warm-up step, then one recorded step — the same ``training_step`` the estimator
runs on fake tensors. The estimate is made here, from the model built on the meta device, with
``device="cpu"`` (a CUDA target adds allocator rounding, which a CPU run cannot show).

Usage:
    python bench/estimate_accuracy.py                 # every case, markdown table
    python bench/estimate_accuracy.py gpt2 llama-sgd  # some cases
    python bench/estimate_accuracy.py --readme        # ... and write the table to bench/README.md
    python bench/estimate_accuracy.py --measure gpt2  # one measured step, JSON on stdout
    python bench/estimate_accuracy.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

MIB = 2**20
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTION = "## Estimate accuracy"


@dataclass(frozen=True)
class Case:
    """One model, input and step settings (the arguments of ``estimate()`` after the model)."""

    name: str
    build: Callable[[], nn.Module]
    inputs: str
    optimizer: str = "adamw"
    dtype: str | None = None
    amp: str | None = None
    checkpoint: bool = False
    seed: int = 0
    notes: dict[str, Any] = field(default_factory=dict)

    def variant_label(self) -> str:
        parts = [self.optimizer]
        if self.dtype:
            parts.append(f"dtype={self.dtype}")
        if self.amp:
            parts.append(f"amp={self.amp}")
        if self.checkpoint:
            parts.append("checkpoint")
        return ", ".join(parts)


def _transformers() -> Any:
    import transformers

    module: Any = transformers
    module.logging.set_verbosity_error()
    return module


def gpt2() -> nn.Module:
    t = _transformers()
    config = t.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=16384, n_positions=128)
    model: nn.Module = t.GPT2LMHeadModel(config)
    return model


def bert() -> nn.Module:
    t = _transformers()
    config = t.BertConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        vocab_size=16384,
        max_position_embeddings=128,
    )
    model: nn.Module = t.BertForMaskedLM(config)
    return model


def vit() -> nn.Module:
    t = _transformers()
    config = t.ViTConfig(
        image_size=96,
        patch_size=8,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        num_labels=100,
    )
    model: nn.Module = t.ViTForImageClassification(config)
    return model


def t5() -> nn.Module:
    t = _transformers()
    config = t.T5Config(
        d_model=256,
        d_kv=64,
        d_ff=1024,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        vocab_size=16384,
        decoder_start_token_id=0,  # set in every released T5 config; required with labels
        pad_token_id=0,
    )
    model: nn.Module = t.T5ForConditionalGeneration(config)
    return model


def llama() -> nn.Module:
    t = _transformers()
    config = t.LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=16384,
        max_position_embeddings=128,
    )
    model: nn.Module = t.LlamaForCausalLM(config)
    return model


def resnet() -> nn.Module:
    t = _transformers()
    config = t.ResNetConfig(
        embedding_size=32,
        hidden_sizes=[32, 64, 128, 256],
        depths=[1, 1, 2, 1],
        layer_type="basic",
        num_labels=100,
    )
    model: nn.Module = t.ResNetForImageClassification(config)
    return model


def _variants(name: str, build: Callable[[], nn.Module], inputs: str) -> list[Case]:
    return [
        Case(name, build, inputs),
        Case(f"{name}-checkpoint", build, inputs, checkpoint=True),
        Case(f"{name}-sgd", build, inputs, optimizer="sgd"),
        Case(f"{name}-amp-bf16", build, inputs, amp="bf16"),
        Case(f"{name}-bf16", build, inputs, dtype="bf16"),
    ]


CASES: dict[str, Case] = {
    case.name: case
    for case in [
        *_variants("gpt2", gpt2, "8x128"),
        Case("bert", bert, "8x128"),
        Case("vit", vit, "8x3x96x96"),
        Case("vit-checkpoint", vit, "8x3x96x96", checkpoint=True),
        Case("t5", t5, "8x128"),
        *_variants("llama", llama, "8x128"),
        Case("resnet", resnet, "8x3x128x128"),
        Case("resnet-checkpoint", resnet, "8x3x128x128", checkpoint=True),
    ]
}


def settings_of(case: Case, device: str = "cpu") -> Any:
    from jupyter_vram.estimator.step import StepSettings

    return StepSettings(device=device, dtype=case.dtype, amp=case.amp,
                        checkpoint=case.checkpoint, optimizer=case.optimizer)  # fmt: skip


def build(case: Case, device: str = "cpu") -> nn.Module:
    """The case's model on ``device`` ("cpu": real weights, "meta": shapes only)."""
    torch.manual_seed(case.seed)
    with torch.device(device):
        return case.build()


def measure(case: Case) -> dict[str, Any]:
    """One real steady-state step on the CPU, recorded. Call in a fresh process only."""
    import jupyter_vram
    from jupyter_vram.estimator.inputs import make_batch_spec, parse_dtype, with_default_labels
    from jupyter_vram.estimator.step import make_optimizer, training_step
    from jupyter_vram.transforms.checkpointing import enable_checkpointing

    settings = settings_of(case)
    model = build(case)
    if case.dtype:
        model.to(parse_dtype(case.dtype))
    if case.checkpoint:
        enable_checkpointing(model)
    model.train()
    spec = with_default_labels(model, make_batch_spec(model, case.inputs))
    float_dtype = parse_dtype(case.dtype) if case.dtype else torch.float32
    args, kwargs = spec.build("cpu", float_dtype)
    opt = make_optimizer(settings, model)
    started = time.perf_counter()
    training_step(model, opt, args, kwargs, settings, "cpu")
    with jupyter_vram.record("cpu") as rec:
        training_step(model, opt, args, kwargs, settings, "cpu")
    seconds = time.perf_counter() - started
    profile = rec.profile
    return {
        "case": case.name,
        "peak_bytes": profile.peak_bytes,
        "breakdown": profile.peak_breakdown(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "input": spec.describe(),
        "seconds": round(seconds, 3),
    }


def start_measurement(name: str) -> subprocess.Popen[str]:
    """Start :func:`measure` of case ``name`` in a fresh interpreter."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--measure", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def finish_measurement(process: subprocess.Popen[str], timeout_s: float = 600) -> dict[str, Any]:
    """Wait for a measurement started by :func:`start_measurement`; its JSON result."""
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"the measurement failed ({process.returncode}):\n{err[-3000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def measure_in_subprocess(name: str, timeout_s: float = 600) -> dict[str, Any]:
    """:func:`measure` of case ``name`` in a fresh interpreter; returns its JSON."""
    return finish_measurement(start_measurement(name), timeout_s)


def run_estimate(case: Case, device: str = "cpu") -> tuple[Any, float]:
    """The estimate of ``case`` from a meta-device model, and its wall time in seconds."""
    from jupyter_vram.estimator import estimate

    model = build(case, "meta")
    started = time.perf_counter()
    result = estimate(model, case.inputs, optimizer=case.optimizer, device=device,
                      dtype=case.dtype, amp=case.amp, checkpoint=case.checkpoint)  # fmt: skip
    return result, time.perf_counter() - started


@dataclass
class Row:
    case: Case
    parameters: int
    input: str
    measured: int
    estimated: int
    seconds: float
    measured_breakdown: dict[str, int]
    estimated_breakdown: dict[str, int]

    @property
    def error(self) -> float:
        return (self.estimated - self.measured) / self.measured


def compare(case: Case) -> Row:
    measured = measure_in_subprocess(case.name)
    est, seconds = run_estimate(case)
    return Row(case, int(measured["parameters"]), est.input, int(measured["peak_bytes"]),
               est.peak_bytes, seconds, measured["breakdown"], est.peak_breakdown())  # fmt: skip


def _params(n: int) -> str:
    return f"{n / 1e6:.1f}M"


def table(rows: list[Row]) -> str:
    lines = [
        "| case | model | params | input | step | measured peak (MiB) | estimated peak (MiB) "
        "| difference (KiB) | error | estimate time (s) |",
        "|---|---|---|---|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        model = type(build(r.case, "meta")).__name__
        lines.append(
            f"| {r.case.name} | {model} | {_params(r.parameters)} | {r.input} "
            f"| {r.case.variant_label()} | {r.measured / MIB:.1f} | {r.estimated / MIB:.1f} "
            f"| {(r.estimated - r.measured) / 1024:+,.0f} | {100 * r.error:+.2f} % "
            f"| {r.seconds:.1f} |"
        )
    errors = [abs(r.error) * 100 for r in rows]
    if errors:
        lines += [
            "",
            f"Median absolute error {statistics.median(errors):.2f} %, max {max(errors):.2f} % "
            f"over {len(rows)} cases (targets: median <= 3 %, max <= 10 %).",
        ]
    return "\n".join(lines)


def breakdowns(rows: list[Row]) -> str:
    """Where estimate and measurement differ: per-category KiB at the peak, for each case."""
    out = []
    for r in rows:
        cats = dict.fromkeys([*r.measured_breakdown, *r.estimated_breakdown])
        diffs = {c: r.estimated_breakdown.get(c, 0) - r.measured_breakdown.get(c, 0) for c in cats}
        parts = [f"{c} {d / 1024:+,.0f} KiB" for c, d in diffs.items() if d]
        if parts:
            out.append(f"- {r.case.name}: " + ", ".join(parts))
    return "\n".join(out)


def intro() -> str:
    """How the table was made, for the README."""
    import platform

    import transformers

    return (
        '`jv.estimate(..., device="cpu")` against the same training step measured with '
        '`jv.record("cpu")` in a fresh process (one warm-up step, then the recorded one). '
        f"Made by `python bench/estimate_accuracy.py --readme` with torch {torch.__version__}, "
        f"transformers {transformers.__version__}, Python {platform.python_version()}, on "
        f"{os.cpu_count()} CPU cores. Estimate time is the wall time of the whole `estimate()` "
        "call (starting the estimator process included); the model is built on the meta device."
    )


def write_readme(text: str) -> None:
    from readme_section import write_section  # bench/ is on sys.path when run as a script

    write_section(SECTION, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--measure", metavar="CASE", help="measure one case, print JSON")
    parser.add_argument("--list", action="store_true", help="list the cases")
    parser.add_argument("--readme", action="store_true", help="write the table to README.md")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    if args.measure:
        print(json.dumps(measure(CASES[args.measure])))
        return 0
    names = args.cases or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; see --list")
    rows: list[Row] = []
    failures: list[str] = []
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(compare(CASES[name]))
        except Exception as error:  # noqa: BLE001 - report the case and go on
            failures.append(f"- {name}: {type(error).__name__}: {str(error).strip()[:500]}")
    text = table(rows)
    details = breakdowns(rows)
    if details:
        text += "\n\nEstimated minus measured, per category at the peak:\n\n" + details
    if failures:
        text += "\n\nFailed:\n\n" + "\n".join(failures)
    print(text)
    if args.readme:
        write_readme(f"{intro()}\n\n{text}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
