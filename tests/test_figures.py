"""Figure builders: bounded, exact in their hover data, pure functions of analysis results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from bokeh.models import ColumnDataSource, Span
from jupyter_bokeh import BokehModel

from jupyter_vram.analysis.flame import flame_tree
from jupyter_vram.capture.builder import ProfileBuilder
from jupyter_vram.model import CATEGORIES, CATEGORY_INDEX, Frame, Profile
from jupyter_vram.render.figures import (
    CATEGORY_COLORS,
    PATH_SEP,
    breakdown_figure,
    category_mix,
    flame_figure,
    flame_layout,
    timeline_data,
    timeline_figure,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from synthetic import synthetic_profile


@pytest.fixture
def small() -> Profile:
    b = ProfileBuilder()
    dev = b.devices("cpu")
    mm = b.ops("mm")
    s = b.intern_stack((Frame("/u/a.py", 1, "f"),))
    act, tmp = CATEGORY_INDEX["activation"], CATEGORY_INDEX["temporary"]
    b.add(600, 0, 0, dev, mm, b.modules("net.a"), s, 1, act)
    b.add(300, 1, 1, dev, mm, b.modules("net.b"), s, 1, act)
    b.add(100, 2, 2, dev, mm, b.modules("net.b"), s, 1, tmp)
    return b.build(device="cpu", source="test", wall_ns=10)


def test_flame_layout_widths_are_byte_shares(small: Profile) -> None:
    tree = flame_tree(small, "module", "peak")
    layout = flame_layout(tree, small.peak_bytes)
    d = layout.data
    row = {name: i for i, name in enumerate(d["name"]) if name in ("a", "b")}
    width = {n: d["right"][i] - d["left"][i] for n, i in row.items()}
    assert width == pytest.approx({"a": 0.6, "b": 0.4})
    b = row["b"]
    assert d["bytes"][b] == 400 and d["pct_peak"][b] == "40.0%"
    assert d["mix"][b] == "activation 75% · temporary 25%"
    assert d["color"][b] == CATEGORY_COLORS["activation"]
    assert d["path"][b] == PATH_SEP.join(["net", "b"])


def test_flame_zoom_puts_focus_full_width(small: Profile) -> None:
    tree = flame_tree(small, "module", "peak")
    layout = flame_layout(tree, small.peak_bytes, ("net", "b"))
    d = layout.data
    assert layout.focus == ("net", "b")
    # ancestors all, net are full-width bars above the focus
    assert d["name"][:3] == ["all", "net", "b"]
    assert all(d["left"][i] == 0 and d["right"][i] == 1 for i in range(3))
    mm = d["name"].index("mm", 3)
    assert d["right"][mm] - d["left"][mm] == pytest.approx(1.0)
    assert flame_layout(tree, 1, ("net", "nope")).focus == ("net",)  # unknown path stops early


def test_flame_payload_is_bounded_at_1m_events() -> None:
    prof = synthetic_profile(1_000_000)
    for hierarchy in ("module", "stack"):
        layout = flame_layout(flame_tree(prof, hierarchy, "cumulative"), prof.peak_bytes)
        n = len(layout.data["name"])
        assert 0 < n <= 4000
        fig = flame_figure(ColumnDataSource(layout.data), layout.depth)
        size = len(json.dumps(BokehModel(fig).get_state()["render_bundle"], default=str))
        assert size < 2_000_000


def test_timeline_sampling_keeps_the_peak_exactly() -> None:
    prof = synthetic_profile(200_000)
    t = prof.timeline
    data = timeline_data(t, max_points=500)
    assert len(data["t"]) <= 502  # samples, the peak, and the baseline at t=0
    assert t.peak_index in data["index"]
    assert max(data["total"]) * 2**20 == pytest.approx(prof.peak_bytes)
    # the stacked categories add up to the total at every sampled point
    for i in range(0, len(data["t"]), 50):
        assert sum(data[c][i] for c in CATEGORIES) == pytest.approx(data["total"][i])


def test_timeline_figure_and_breakdown_build(small: Profile) -> None:
    t = small.timeline
    fig = timeline_figure(ColumnDataSource(timeline_data(t)), 0.001)
    assert fig.select_one({"type": Span}).location == 0.001
    bar = breakdown_figure(small.peak_breakdown())
    assert bar.title.text == "At the peak: 1000 B"


def test_category_mix() -> None:
    assert category_mix([0] * len(CATEGORIES)) == "-"
    mix = [0] * len(CATEGORIES)
    mix[CATEGORY_INDEX["gradient"]] = 1
    assert category_mix(mix) == "gradient 100%"


def test_standalone_report(small: Profile, tmp_path: Path) -> None:
    path = small.to_html(tmp_path / "report.html", resources="cdn")
    page = path.read_text()
    assert "Flame graphs" in page and "Top sites" in page and "peak allocated" in page
    inline = small.to_html(tmp_path / "offline.html").read_text()
    assert "cdn.bokeh.org" not in inline and len(inline) > 1_000_000  # BokehJS is inside
