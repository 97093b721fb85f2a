"""Analysis time on synthetic profiles (target for 1M events: a few seconds at most).

Usage: python bench/analysis.py [events ...]   (default: 10000 100000 1000000)
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from synthetic import synthetic_profile

from jupyter_vram._analysis.flame import flame_tree
from jupyter_vram._analysis.groups import live_at_peak
from jupyter_vram._analysis.tables import top_sites
from jupyter_vram._model import Profile
from jupyter_vram._render.text import summary


def clock(label: str, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    value = fn()
    print(f"  {label:<34} {time.perf_counter() - start:8.3f} s")
    return value


def run(events: int) -> None:
    prof = synthetic_profile(events)
    print(f"{prof.event_count:,} events, {len(prof.allocations):,} allocations")
    start = time.perf_counter()
    clock("replay + peak", lambda: prof.peak_bytes)
    clock("breakdown at peak", prof.peak_breakdown)
    clock("categories over time", prof.timeline.by_category)
    for key in ("module", "op", "stack"):
        clock(f"live at peak by {key}", lambda key=key: live_at_peak(prof, key))
    for hierarchy in ("module", "stack"):
        for mode in ("peak", "cumulative"):
            clock(
                f"flame tree {hierarchy}/{mode}", lambda h=hierarchy, m=mode: flame_tree(prof, h, m)
            )
    clock("top sites", lambda: top_sites(prof))
    clock("text summary", lambda: summary(prof))
    print(f"  {'total analysis':<34} {time.perf_counter() - start:8.3f} s")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.json.gz"
        clock("save (json.gz)", lambda: prof.save(path))
        print(f"  {'file size':<34} {path.stat().st_size / 1e6:8.1f} MB")
        clock("load", lambda: Profile.load(path).peak_bytes)


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[1:]] or [10_000, 100_000, 1_000_000]
    for n in sizes:
        run(n)
