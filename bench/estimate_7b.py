"""Estimate a 7B-parameter Llama training step: wall time, memory of the estimator, arithmetic.

The model (Llama-2-7B shapes: hidden 4096, intermediate 11008, 32 layers, 32 heads, vocabulary
32000) is built on the meta device and estimated with ``estimate(model, "1x2048")`` (CUDA target,
AdamW, fp32). Targets: the whole ``estimate()`` call <= 30 s, the estimator's peak RSS <= 2 GB.
The estimate is checked against arithmetic: parameters 4 B x numel, AdamW state exactly 2 x that
(its step counters live on the host on CUDA), gradients = parameters when the optimizer runs.

Usage: python bench/estimate_7b.py [--no-stacks] [--layers N] [--readme]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any

import numpy as np
import torch

from jupyter_vram._model import PHASES

GIB = 2**30
SECTION = "## 7B estimate"


def llama_7b(layers: int = 32) -> torch.nn.Module:
    """Llama-2-7B's shapes on the meta device (no memory, no weights)."""
    import transformers

    t: Any = transformers
    t.logging.set_verbosity_error()
    config = t.LlamaConfig(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
    )
    with torch.device("meta"):
        model: torch.nn.Module = t.LlamaForCausalLM(config)
    return model


def _rss_gb(kib: int) -> float:
    return kib * 1024 / 1e9  # ru_maxrss is in KiB on Linux


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def before_optimizer(profile: object) -> dict[str, int]:
    """Category -> bytes live just before the optimizer's first allocation."""
    prof = profile  # a jupyter_vram.Profile
    t = prof.timeline  # type: ignore[attr-defined]
    phases = prof.allocations.phase[t.alloc_index]  # type: ignore[attr-defined]
    first = int(np.flatnonzero(phases == PHASES.index("optimizer"))[0])
    return dict(t.breakdown_at(first - 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-stacks", action="store_true", help="estimate with stacks=False")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--inputs", default="1x2048")
    parser.add_argument("--readme", action="store_true", help="write the figures to README.md")
    args = parser.parse_args(argv)

    from jupyter_vram._estimator import estimate

    model = llama_7b(args.layers)
    numel = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    started = time.perf_counter()
    est = estimate(model, args.inputs, stacks=not args.no_stacks)
    wall = time.perf_counter() - started
    worker_rss = _rss_gb(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    self_rss = _rss_gb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    simulated = float(est.profile.meta.get("estimate", {}).get("seconds", float("nan")))

    peak = est.peak_breakdown()
    opt = before_optimizer(est.profile)
    param_bytes = 4 * numel
    # AdamW's step counters are CPU tensors on a CUDA run (not fused, not capturable): no device
    # memory, so the state is exactly two parameter-sized buffers.
    steps = 0
    expected = {
        "parameter, at the peak": (peak["parameter"], param_bytes, 0),
        "optimizer_state, at the peak": (peak["optimizer_state"], 2 * param_bytes, steps),
        "gradient, before the optimizer": (opt["gradient"], param_bytes, 0),
        "optimizer_state, before the optimizer": (opt["optimizer_state"], 2 * param_bytes, steps),
        "temporary, at the peak (foreach AdamW's sqrt(v))": (peak["temporary"], param_bytes, 0),
    }
    checks = [
        f"| {name} | {got:,} | {want:,} | {got - want:+,} "
        f"| {'ok' if got - want == extra else 'MISMATCH'} |"
        for name, (got, want, extra) in expected.items()
    ]
    lines = [
        f"Llama, {args.layers} layers ({numel / 1e9:.2f}B parameters, {tensors} tensors), "
        f"input {est.input}, AdamW, fp32, CUDA target, stacks={not args.no_stacks}:",
        "",
        "| figure | value | target |",
        "|---|--:|--:|",
        f"| `estimate()` wall time | {wall:.1f} s | <= 30 s |",
        f"| of which the simulated steps (worker's own timer) | {simulated:.1f} s | |",
        f"| estimator process peak RSS | {worker_rss:.2f} GB | <= 2 GB |",
        f"| calling process peak RSS | {self_rss:.2f} GB | |",
        f"| peak allocated | {_gib(est.peak_bytes)} | |",
        f"| predicted max reserved | {_gib(est.reserved_bytes)} | |",
        f"| device used (reserved + runtime) | {_gib(est.predicted_device_bytes)} | |",
        f"| events recorded | {est.profile.event_count:,} | |",
        "",
        "Peak breakdown: " + ", ".join(f"{k} {_gib(v)}" for k, v in peak.items() if v) + ".",
        "",
        f"Arithmetic: parameters 4 B x {numel:,}; AdamW state 2 x parameters (the {tensors} "
        "step counters stay on the host on CUDA).",
        "",
        "| check (bytes) | estimate | arithmetic | difference | |",
        "|---|--:|--:|--:|---|",
        *checks,
    ]
    text = "\n".join(lines)
    print(text)
    if args.readme:
        write_readme(text)
    return 0 if all(got - want == extra for got, want, extra in expected.values()) else 1


def write_readme(text: str) -> None:
    from readme_section import write_section  # bench/ is on sys.path when run as a script

    write_section(SECTION, text)


if __name__ == "__main__":
    sys.exit(main())
