"""Size and time of the static views every output carries: the saved profile (JSON) and the
static report (HTML), for 10k / 100k / 1M-event synthetic profiles (target: <= 150 KB each),
and for a worst case built to fill the saved profile's flame tree to its 1,000-node cap.

Usage: python bench/static_report.py [events ...]
"saved profile" is the JSON compact, then as a notebook stores it (nbformat indents it);
"report" is the text/html; times are from profile (timeline replayed) to finished output.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import nbformat
from synthetic import synthetic_profile

from jupyter_vram._capture.builder import ProfileBuilder
from jupyter_vram._model import CATEGORY_INDEX, PHASE_INDEX, Profile
from jupyter_vram._render.mime import PROFILE_MIME, profile_payload
from jupyter_vram._render.static_report import report_html


def saved_size(data: dict[str, object]) -> int:
    """Bytes an output of ``data`` (mimetype -> value) adds to a notebook file (nbformat
    writes indented JSON and splits text into lines)."""
    empty = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
    full = nbformat.v4.new_notebook(cells=[cell])
    return len(nbformat.writes(full).encode()) - len(nbformat.writes(empty).encode())


def wide_profile(modules: int = 900) -> Profile:
    """``modules`` modules of one equal allocation each, all live at the end: every module,
    its submodule and its op are 1/modules of the peak (just above the 0.1 % cut)."""
    b = ProfileBuilder()
    dev, op = b.devices("cuda:0"), b.ops("aten::mm_with_a_long_name")
    for i in range(modules):
        module = b.modules(f"model.layers_{i:04d}.attention_projection")
        b.add(2**20, i, i * 1000, dev, op, module, -1, PHASE_INDEX["forward"],
              CATEGORY_INDEX["activation"])  # fmt: skip
    return b.build(device="cuda:0", source="synthetic", wall_ns=modules * 1000)


def run(label: str, profile: Profile) -> None:
    assert profile.timeline.peak_bytes >= 0  # the replay is the profile's, made before timing
    start = time.perf_counter()
    payload = profile_payload(profile)
    made = time.perf_counter() - start
    start = time.perf_counter()
    page = report_html(payload)
    formatted = time.perf_counter() - start
    compact = len(json.dumps(payload, separators=(",", ":")).encode())
    flame = payload["flame"]
    assert isinstance(flame, dict)
    stored = saved_size({PROFILE_MIME: payload})
    both = saved_size({PROFILE_MIME: payload, "text/html": page})
    print(
        f"{label:>22}: saved profile {compact / 1e3:6.1f} KB ({stored / 1e3:6.1f} KB "
        f"in the notebook, {len(flame['name']):,} flame nodes) in {made:5.2f} s; report "
        f"{len(page.encode()) / 1e3:6.1f} KB in {formatted:5.3f} s; both in the notebook "
        f"{both / 1e3:6.1f} KB"
    )


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [10_000, 100_000, 1_000_000]:
        run(f"{n:,} events", synthetic_profile(n))
    run("wide tree (900 modules)", wide_profile())
