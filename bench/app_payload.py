"""Profile -> widget state: time and payload for 10k / 100k / 1M events (target <= 5 MB).

Usage: python bench/app_payload.py [events ...]
"first view" is what %%vram sends when it displays (header + flame graph tab);
"all tabs" adds every other tab, as if the user opened each one.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from synthetic import synthetic_profile

from jupyter_vram.app import ProfileApp


def widgets(widget: Any) -> list[Any]:
    out = [widget]
    for child in getattr(widget, "children", ()):
        out += widgets(child)
    return out


def payload(app: ProfileApp) -> int:
    return len(json.dumps([w.get_state() for w in widgets(app)], default=str))


def run(events: int) -> None:
    prof = synthetic_profile(events)
    start = time.perf_counter()
    app = ProfileApp(prof)
    first = time.perf_counter() - start
    first_size = payload(app)
    start = time.perf_counter()
    for i in range(1, len(app.tabs.children)):
        app.open_tab(i)
    rest = time.perf_counter() - start
    print(
        f"{prof.event_count:>9,} events: first view {first:6.2f} s, {first_size / 1e6:5.2f} MB; "
        f"all tabs +{rest:6.2f} s, {payload(app) / 1e6:5.2f} MB"
    )


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [10_000, 100_000, 1_000_000]:
        run(n)
