"""Profile -> widget state: time and payload for 10k / 100k / 1M events (target <= 5 MB),
and what a displayed app keeps in the kernel once its profile is gone (target <= 5 MB).

Usage: python bench/app_payload.py [events ...]
"first view" is what %%vram sends when it displays (header + flame graph tab);
"all tabs" adds every other tab, as if the user opened each one; "kept" is the memory the app
still holds after every tab was opened and the profile was dropped (ipywidgets keeps displayed
widgets for the life of the kernel).
"""

from __future__ import annotations

import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from synthetic import synthetic_profile

from jupyter_vram._app import ProfileApp
from jupyter_vram._app.holder import forget_latest


def widgets(widget: Any) -> list[Any]:
    out = [widget]
    for child in getattr(widget, "children", ()):
        out += widgets(child)
    return out


def payload(app: ProfileApp) -> int:
    return len(json.dumps([w.get_state() for w in widgets(app)], default=str))


def run(events: int, *, quiet: bool = False) -> None:
    prof = synthetic_profile(events)
    assert prof.timeline.peak_bytes >= 0  # the replay is the profile's, made before measuring
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    start = time.perf_counter()
    app = ProfileApp(prof)
    first = time.perf_counter() - start
    first_size = payload(app)
    start = time.perf_counter()
    for i in range(1, len(app.tabs.children)):
        app.open_tab(i)
    rest = time.perf_counter() - start
    count, all_size = prof.event_count, payload(app)
    forget_latest()
    del prof
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    if quiet:
        return
    print(
        f"{count:>9,} events: first view {first:6.2f} s, {first_size / 1e6:5.2f} MB; "
        f"all tabs +{rest:6.2f} s, {all_size / 1e6:5.2f} MB; kept {kept / 1e6:5.2f} MB"
    )


if __name__ == "__main__":
    run(2_000, quiet=True)  # one-time costs (imports, caches) are not an app's
    for n in [int(a) for a in sys.argv[1:]] or [10_000, 100_000, 1_000_000]:
        run(n)
