"""What recording costs, against the alternatives: per step, per aten op, and per recording.

Usage: python bench/recorder_overhead.py [--quick] [--readme]

Variants, each timed on the same warmed-up step and interleaved so drift hits all alike:

* bare: the step alone;
* jupyter_vram: ``jv.record("cpu")`` (the allocator's own reports, module ranges, role hooks),
  with and without Python stacks;
* dispatch tracker: the recorder CPU recording used before (a ``TorchDispatchMode`` plus a
  storage weakref per allocation), kept for fake-tensor estimates;
* torch.profiler: ``profile(activities=[CPU], profile_memory=True)`` alone, the floor for
  anything that reads the allocator's reports, and with ``with_stack=True`` (its Python
  tracer), the floor with Python stacks;
* MemTracker: ``torch.distributed._tools.mem_tracker.MemTracker``, PyTorch's dispatch-mode
  memory tracker.

Each variant is timed from the start of a recording of a few steps to its finished profile,
per step. Per-op cost = (variant - bare) / aten ops in the step (counted by a dispatch mode,
i.e. after decomposition, the unit a dispatch-mode recorder pays for). Start + stop = an empty
recording in this process, which has transformers imported (a kernel's worth of objects).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import gpt2_small_step, tiny_ops_step
from readme_section import write_section

import jupyter_vram as jv
from jupyter_vram._capture.dispatch import DispatchRecorder

Step = Callable[[], None]


class _Count(TorchDispatchMode):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def aten_ops(step: Step) -> int:
    counter = _Count()
    with counter:
        step()
    return counter.ops


@contextmanager
def _dispatch_tracker(stacks: bool) -> Iterator[None]:
    recorder = DispatchRecorder("cpu", stacks=stacks)
    recorder.start(sys._getframe(2))
    try:
        yield
    finally:
        recorder.stop()


@contextmanager
def _profiler(stack: bool = False) -> Iterator[None]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=stack):
        yield


def _memtracker() -> AbstractContextManager[object]:
    from torch.distributed._tools.mem_tracker import MemTracker

    return MemTracker()  # type: ignore[no-any-return]


@contextmanager
def _bare() -> Iterator[None]:
    yield


VARIANTS: dict[str, Callable[[], AbstractContextManager[object]]] = {
    "bare": _bare,
    "jupyter_vram (stacks)": lambda: jv.record("cpu"),
    "jupyter_vram (no stacks)": lambda: jv.record("cpu", stacks=False),
    "dispatch tracker, before (stacks)": lambda: _dispatch_tracker(True),
    "torch.profiler profile_memory": _profiler,
    "torch.profiler profile_memory + with_stack": lambda: _profiler(True),
    "MemTracker": _memtracker,
}


def time_inside(
    make: Callable[[], AbstractContextManager[object]], step: Step, n: int
) -> tuple[float, float]:
    """Seconds per step of one recording of ``n`` steps, from start to a finished profile
    (reading the profiler's events is part of what recording costs), and seconds spent
    leaving the recording (where the profile is made)."""
    start = time.perf_counter()
    with make() as recorder:
        reset = getattr(recorder, "reset_mod_stats", None)  # MemTracker: one step per call
        for _ in range(n):
            if reset is not None:
                reset()
            step()
        ran = time.perf_counter()
    end = time.perf_counter()
    return (end - start) / n, end - ran


def start_stop(make: Callable[[], AbstractContextManager[object]], repeats: int = 9) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with make():
            pass
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, step: Step, repeats: int, steps: int) -> list[str]:
    step()
    step()
    ops = aten_ops(step)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    leaving: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(repeats):
        for variant, make in VARIANTS.items():
            gc.collect()
            per_step, stop = time_inside(make, step, steps)
            times[variant].append(per_step)
            leaving[variant].append(stop)
    bare = statistics.median(times["bare"])
    rows = [
        f"**{name}**: {ops:,} aten ops per step, bare step {bare * 1e3:.1f} ms, "
        f"{steps} steps per recording",
        "",
        "| variant | ms per step, start to profile | x bare | us per aten op, all in | "
        "us per aten op while running | ms to stop (make the profile) |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for variant, ts in times.items():
        med = statistics.median(ts)
        stop = statistics.median(leaving[variant])
        running = med - stop / steps
        if variant == "bare":
            rows.append(f"| {variant} | {med * 1e3:.1f} | 1.00 |  |  |  |")
            continue
        rows.append(
            f"| {variant} | {med * 1e3:.1f} | {med / bare:.2f} | "
            f"{(med - bare) / ops * 1e6:.1f} | {(running - bare) / ops * 1e6:.1f} | "
            f"{stop * 1e3:.1f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--readme", action="store_true", help="write bench/README.md's section")
    parser.add_argument("--section", help="also write the section's text to this file")
    args = parser.parse_args()
    torch.manual_seed(0)
    load = os.getloadavg()[0]  # a shared machine's other work slows every variant alike
    repeats = 3 if args.quick else 5
    out: list[str] = []
    out += measure("GPT-2 small (124M), batch 1x128, AdamW", gpt2_small_step(), repeats, 3)
    out.append("")
    out += measure("tiny ops (200 x Linear(16)+Tanh, batch 4), SGD", tiny_ops_step(), repeats, 5)
    out.append("")
    objects = len(gc.get_objects())
    out += [
        f"**Start + stop of an empty recording** ({objects:,} objects in the process, "
        "transformers imported):",
        "",
        "| variant | ms |",
        "|---|--:|",
        f"| jupyter_vram | {start_stop(lambda: jv.record('cpu')) * 1e3:.1f} |",
        f"| dispatch tracker, before (gc scan of every object) | "
        f"{start_stop(lambda: _dispatch_tracker(True)) * 1e3:.1f} |",
    ]
    text = "\n".join(out)
    print(text)
    if args.readme or args.section:
        header = (
            f"Made by `python bench/recorder_overhead.py{' --quick' if args.quick else ''} "
            f"--readme` with torch {torch.__version__}, Python {sys.version.split()[0]}, on "
            f"{torch.get_num_threads()} CPU threads, load average {load:.1f} at the start and "
            f"{os.getloadavg()[0]:.1f} at the end. "
            f"Median of {repeats} interleaved runs."
        )
        reading = (
            "How to read it: jupyter_vram pays most of its cost when the profile is made, not "
            "per op. While the cell runs, the CPU allocator's reports and the op and module "
            "ranges are collected in C++ by torch's profiler (the profiler alone is the floor), "
            "plus our hooks' Python at module calls and saved tensors: *us per aten op while "
            "running*. Leaving the recording, torch post-processes its events and we read its "
            "event tree (a few microseconds of Python per event: one or two events per op, "
            "one per allocation) into rows: *ms to stop*, once per recording, so a recording "
            "of many steps spreads it thin (*all in* counts it against the steps recorded "
            "here). With Python stacks the profiler also traces every Python and C call, our "
            "hooks' included, and both torch's post-processing and our reading grow with them: "
            "on Python-heavy models (many small modules) stacks cost a multiple of the "
            "profiler with stacks alone, and `--no-stacks` is the cheap mode. The dispatch "
            "tracker was cheaper end to end but changed the program it measured (out-of-place "
            "gradient accumulation) and missed memory made inside ops; it remains for "
            "fake-tensor estimates. MemTracker is PyTorch's dispatch-mode memory tracker."
        )
        section = header + "\n\n" + text + "\n\n" + reading
        if args.section:
            Path(args.section).write_text(section)
        if args.readme:
            write_section("## Recording overhead", section)


if __name__ == "__main__":
    main()
