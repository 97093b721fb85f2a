"""What the app's Compare tab costs per rerun: the time to build a variant's column (the
engine's compare by category / module / op, its verdict, both runs' flame trees merged into
the diff tree, the figures) and what it sends to the page (widget and bokeh state, as JSON).

Usage: python bench/compare_tab.py [--layers 4] [--width 256] [--batch 4] [--seq 128]

Two recorded training steps of a GPT-2 built from its config (no download): the baseline
and the same step with its transformer blocks checkpointed (``transforms.checkpointing``,
the switch a rerun flips; the verdict says "a plain run" since no rerun made it). The rerun
itself is not timed here (see bench/rerun_cost.py).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

import jupyter_vram as jv
from jupyter_vram._app.compare_view import CompareView
from jupyter_vram._transforms.checkpointing import enable_checkpointing
from jupyter_vram._units import format_bytes


def widget_bytes(widget: Any) -> int:
    """JSON bytes of a widget's state and of every widget below it (what the page receives)."""
    import ipywidgets as w

    seen: set[str] = set()
    total = 0
    stack = [widget]
    while stack:
        item = stack.pop()
        if item.model_id in seen:
            continue
        seen.add(item.model_id)
        state = item.get_state()
        total += len(json.dumps(state, default=str))
        for value in state.values():
            values = value if isinstance(value, list | tuple) else [value]
            stack.extend(v for v in values if isinstance(v, w.Widget))
        stack.extend(getattr(item, "children", ()))
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=4, n_positions=args.seq)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    step()
    with jv.record() as rec:
        step()
    baseline = rec.profile
    undo = enable_checkpointing(model)
    try:
        with jv.record() as rec:
            step()
    finally:
        undo()
    variant = rec.profile
    view = CompareView()
    start = time.perf_counter()
    result = view.add(baseline, variant)
    took = time.perf_counter() - start
    second = time.perf_counter()
    view.add(baseline, variant)
    took_second = time.perf_counter() - second
    print(
        f"GPT-2 {args.layers} layers x {args.width}, batch {args.batch}x{args.seq}: "
        f"{len(baseline.allocations):,} + {len(variant.allocations):,} allocations"
    )
    print(f"verdict: {result.verdict}")
    print(f"first column: {took:.2f} s; a second column: {took_second:.2f} s")
    # the diff flame graph's blocks go to the page as a document patch when a column is
    # picked, not in the widgets' initial state: counted apart
    flame = len(json.dumps(dict(view.source.data), default=str))
    print(
        f"sent to the page (two columns): widgets' state {format_bytes(widget_bytes(view))}, "
        f"diff flame blocks {format_bytes(flame)} ({len(view.source.data['name'])} blocks)"
    )


if __name__ == "__main__":
    main()
