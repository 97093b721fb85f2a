"""What OOM capacities and leak finding cost, on a GPT-2-small training step (124M, CPU).

Usage: python bench/oom_leaks.py [--quick]

* leak baseline: what every recording now does at start (weak references to the storages the
  notebook reaches), for a namespace holding the model, its AdamW (with state) and a batch;
* empty recording, start + stop, with that namespace;
* step time: bare, recorded, recorded with a capacity it fits under (the capacity's dispatch
  mode runs Python around every op);
* the note every recording takes as it ends (weak references to the storages it left alive,
  by identity, each tied to the allocation at its address), and ``profile.leaks()``, after a
  step that leaves its loss alive (named roots only), and after one that also leaves a tensor
  in a reference cycle (a garbage-collector scan as well);
* the same note and ``profile.leaks()`` after a cell that leaves 2,000 tensors of one size
  (half ``ones``, half ``zeros``) in a list: each row names its own op.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import jupyter_vram as jv
from jupyter_vram._capture import row_addresses
from jupyter_vram._leaks import attach, note_start

# The note is taken again and again here, on one profile: leave its addresses in place (the
# recording's own note takes them), so each note ties leaks by address, as a recording's does.
row_addresses.take_addresses = row_addresses._noted.get  # type: ignore[assignment]


def median_s(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def end_state(ns: dict[str, Any]) -> Any:
    """A run's start state as the recording would have taken it: before the step's loss
    existed (the note compares against it), with the namespace as it is now."""
    state = note_start({k: v for k, v in ns.items() if k != "loss"}, "cpu")
    state.namespace = ns
    return state


def end_note_s(profile: Any, ns: dict[str, Any], reps: int) -> float:
    """Median time of the note a recording takes as it ends (``leaks.attach``)."""
    times = []
    for _ in range(reps):
        state = end_state(ns)
        t = time.perf_counter()
        attach(profile, state)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="2 layers instead of 12")
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(attn_implementation="eager", n_layer=2 if args.quick else 12)
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (1, 128))
    ns: dict[str, Any] = {"model": model, "opt": opt, "ids": ids}

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ns["loss"] = loss.detach()

    step()  # optimizer state exists from here on
    reps = 3 if args.quick else 5
    baseline = median_s(lambda: note_start(ns, "cpu"), reps)

    def empty() -> None:
        with jv.record("cpu", namespace=ns):
            pass

    empty_s = median_s(empty, reps)

    def recorded(capacity: int | None) -> Callable[[], None]:
        def run() -> None:
            with jv.record("cpu", namespace=ns, capacity=capacity):
                step()

        return run

    bare = median_s(step, reps)
    rec = median_s(recorded(None), reps)
    cap = median_s(recorded(1 << 40), reps)
    with jv.record("cpu", namespace=ns) as r:
        step()
    prof = r.profile
    note_named = end_note_s(prof, ns, reps)
    attach(prof, end_state(ns))
    prof.leaks()  # first call: imports
    t = time.perf_counter()
    leaks = prof.leaks()
    named_s = time.perf_counter() - t
    gc.disable()
    try:
        with jv.record("cpu", namespace=ns) as r2:
            step()
            box: list[Any] = [torch.ones(1000, 1000)]
            box.append(box)
            del box
        note_scan = end_note_s(r2.profile, ns, reps)
        attach(r2.profile, end_state(ns))
        t = time.perf_counter()
        leaks2 = r2.profile.leaks()
        scan_s = time.perf_counter() - t
    finally:
        gc.enable()
        gc.collect()
    many = 2000
    with jv.record("cpu", namespace=ns) as r3:
        ns["kept"] = [torch.ones(16) if i % 2 else torch.zeros(16) for i in range(many)]
    notes = []
    for _ in range(reps):
        state = note_start({k: v for k, v in ns.items() if k != "kept"}, "cpu")
        state.namespace = ns
        t = time.perf_counter()
        attach(r3.profile, state)
        notes.append(time.perf_counter() - t)
    note_many = statistics.median(notes)
    t = time.perf_counter()
    leaks3 = r3.profile.leaks()
    many_s = time.perf_counter() - t
    del ns["kept"]
    params = sum(p.numel() for p in model.parameters())
    print(f"model: GPT-2 {config.n_layer} layers, {params:,} params")
    print(f"gc objects in this process: {len(gc.get_objects()):,}")
    print(f"leak baseline at start:          {baseline * 1e3:8.1f} ms")
    print(f"empty recording, start + stop:   {empty_s * 1e3:8.1f} ms")
    print(f"step bare:                       {bare * 1e3:8.1f} ms")
    print(f"step recorded:                   {rec * 1e3:8.1f} ms  ({rec / bare:.2f}x)")
    print(f"step recorded with a capacity:   {cap * 1e3:8.1f} ms  ({cap / bare:.2f}x)")
    print(f"note at the end, named roots:    {note_named * 1e3:8.1f} ms")
    print(f"note at the end, with a gc scan: {note_scan * 1e3:8.1f} ms")
    print(f"leaks(), named roots ({len(leaks)} rows):   {named_s * 1e3:8.1f} ms")
    print(f"leaks(), with a gc scan ({len(leaks2)} rows): {scan_s * 1e3:8.1f} ms")
    print(f"note at the end, {many:,} same-size:  {note_many * 1e3:8.1f} ms")
    ops = ", ".join(f"{op}: {n}" for op, n in leaks3["op"].value_counts().sort_index().items())
    print(f"leaks(), {len(leaks3):,} same-size rows:   {many_s * 1e3:8.1f} ms  ({ops})")
    matched = [*leaks["matched_by"], *leaks2["matched_by"], *leaks3["matched_by"]]
    print(f"leak rows matched by address: {matched.count('address')} of {len(matched)}")


if __name__ == "__main__":
    main()
