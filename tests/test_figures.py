"""Figure builders: bounded, exact in their hover data, pure functions of analysis results."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from bokeh.models import ColumnDataSource
from bokeh.models.annotations import Label, Span
from jupyter_bokeh import BokehModel

from jupyter_vram import Profile
from jupyter_vram._analysis.flame import flame_tree
from jupyter_vram._capture.builder import ProfileBuilder
from jupyter_vram._model import CATEGORIES, CATEGORY_INDEX, Frame
from jupyter_vram._render.figures import (
    CATEGORY_COLORS,
    CHAR_PX,
    LABEL_PX,
    PATH_SEP,
    ROOT_COLOR,
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
    return Profile.of(b.build(device="cpu", source="test", wall_ns=10))


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


def _spike_profile() -> Profile:
    """1 s of 10 MiB allocated and freed every 10 ms, and one 100 MiB spike lasting 0.05 ms
    while one of those is live: the peak (110 MiB) lasts 1/20000 of the run."""
    b = ProfileBuilder()
    dev, op = b.devices("cpu"), b.ops("mm")
    s = b.intern_stack((Frame("/u/a.py", 1, "f"),))
    act, tmp = CATEGORY_INDEX["activation"], CATEGORY_INDEX["temporary"]
    mib = 2**20
    events: list[tuple[int, str, int, int]] = []  # (ns, kind, key, size)
    for i in range(100):
        events += [
            (i * 10_000_000, "alloc", i, 10 * mib),
            (i * 10_000_000 + 9_000_000, "free", i, 0),
        ]
    events += [(500_010_000, "alloc", -1, 100 * mib), (500_060_000, "free", -1, 0)]
    rows: dict[int, int] = {}
    for seq, (ns, kind, key, size) in enumerate(sorted(events)):
        if kind == "alloc":
            cat = tmp if key < 0 else act
            rows[key] = b.add(size, seq, ns, dev, op, b.modules("net"), s, 1, cat)
        else:
            b.free(rows[key], seq, ns)
    return b.build(device="cpu", source="test", wall_ns=10**9)


def _drawn_levels_cover_every_event(
    prof: Profile, data: dict[str, list[float]], xs: list[float]
) -> None:
    """Brute force: inside each drawn step [x, x_end), no event rises above the drawn level, and
    the drawn level is one of the events' levels there (or the level held from before)."""
    t = prof.timeline
    per = 2**30 if t.peak_bytes >= 2**30 else 2**20
    totals = [t.total_at(i) for i in range(len(t))]
    for k in range(len(data["x"])):
        lo, hi = data["x"][k], data["x_end"][k]
        inside = [v for x, v in zip(xs, totals, strict=True) if lo <= x < hi]
        drawn = round(data["total"][k] * per)
        if inside:
            assert max(inside) <= drawn, (k, lo, hi)


def test_timeline_draws_the_highest_moment_of_every_pixel() -> None:
    prof = _spike_profile()
    t = prof.timeline
    assert t.peak_bytes == 110 * 2**20
    data = timeline_data(t, buckets=400)
    # the spike is 1/20000 of the run, far narrower than a pixel: still drawn at full height
    assert max(data["total"]) * 2**20 == pytest.approx(t.peak_bytes)
    assert t.peak_index in data["index"]
    assert len(data["x"]) <= 2 * 400 + 2
    xs = [float(v) / 1e6 for v in t.time_ns]
    _drawn_levels_cover_every_event(prof, data, xs)
    for i in range(len(data["x"])):  # the stacked categories add up to the total
        assert sum(data[c][i] for c in CATEGORIES) == pytest.approx(data["total"][i])
    # the step holding the peak starts at the pixel containing the spike's time
    k = data["index"].index(t.peak_index)
    assert data["x"][k] <= 500.01 < data["x_end"][k] and data["x_end"][k] - data["x"][k] < 3


def test_timeline_by_event_axis() -> None:
    prof = synthetic_profile(20_000)
    t = prof.timeline
    data = timeline_data(t, axis="event", buckets=300)
    assert data["x_end"][-1] == len(t)  # events numbered 1..n
    assert max(data["total"]) * 2**20 == pytest.approx(t.peak_bytes)
    _drawn_levels_cover_every_event(prof, data, [float(i + 1) for i in range(len(t))])
    timed = timeline_data(t, buckets=300)
    _drawn_levels_cover_every_event(prof, timed, [float(v) / 1e6 for v in t.time_ns])


def test_timeline_figure_and_breakdown_build(small: Profile) -> None:
    t = small.timeline
    fig = timeline_figure(ColumnDataSource(timeline_data(t)), (0.001, 1000), peak_bytes=1000)
    assert fig.select_one({"type": Span}).location == 0.001
    assert fig.select_one({"type": Label}).text == "peak 1000 B"
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


def _deep_profile(meta: dict[str, object] | None = None) -> Profile:
    """A Sequential of 6 children, each allocating through a long-named op, 5 levels deep."""
    b = ProfileBuilder()
    dev = b.devices("cpu")
    s = b.intern_stack((Frame("/u/a.py", 1, "f"),))
    act = CATEGORY_INDEX["activation"]
    for i in range(6):
        op = b.ops("max_pool2d_with_indices" if i % 2 else "convolution")
        b.add((6 - i) * 1000, i, i, dev, op, b.modules(f"Net.features.{i}"), s, 1, act)
    return b.build(device="cpu", source="test", wall_ns=10, meta=meta or {})


def test_flame_labels_fit_their_block_at_every_depth() -> None:
    prof = _deep_profile()
    d = flame_layout(flame_tree(prof, "module", "peak"), prof.peak_bytes).data
    for i in range(len(d["name"])):
        room = (d["right"][i] - d["left"][i]) * LABEL_PX
        label = d["label"][i]
        assert len(label) * CHAR_PX + 8 <= room + CHAR_PX, (label, room)  # never runs over
        if len(d["name"][i]) * CHAR_PX + 8 <= room:
            assert label == d["name"][i]  # whole when it fits
        elif room >= 4 * CHAR_PX + 8:
            assert label.endswith("\u2026") and d["name"][i].startswith(label[:-1])
    depth = {-int(t) for t, lab in zip(d["top"], d["label"], strict=True) if lab}
    assert depth == {0, 1, 2, 3, 4}  # labels at every depth, the ops' included


def test_flame_tooltips_name_the_full_path_and_the_root_is_no_category() -> None:
    prof = _deep_profile()
    d = flame_layout(flame_tree(prof, "module", "peak"), prof.peak_bytes).data
    leaf = d["path"].index(PATH_SEP.join(["Net", "features", "1", "max_pool2d_with_indices"]))
    assert d["full"][leaf] == " \u203a ".join(
        ["all", "Net", "features", "1", "max_pool2d_with_indices"]
    )
    assert d["color"][0] == ROOT_COLOR and ROOT_COLOR not in CATEGORY_COLORS.values()
    assert all(c in CATEGORY_COLORS.values() for c in d["color"][1:])


def test_numbered_children_show_their_class_when_the_recording_kept_it() -> None:
    from jupyter_vram._app.flame_view import FlameView

    types = {f"Net.features.{i}": ("Conv2d" if i % 2 == 0 else "MaxPool2d") for i in range(6)}
    view = FlameView(_deep_profile({"module_types": types}))
    names = set(view.source.data["name"])
    assert {"0: Conv2d", "1: MaxPool2d", "features", "Net"} <= names
    assert "all \u203a Net \u203a features \u203a 3: MaxPool2d" in view.source.data["full"]
    plain = FlameView(_deep_profile())  # without types: the attribute name alone
    assert "0" in plain.source.data["name"]


def test_cumulative_shares_say_why_they_pass_100() -> None:
    prof = _deep_profile()
    tree = flame_tree(prof, "module", "cumulative")
    d = flame_layout(tree, prof.peak_bytes // 2, cumulative=True).data
    assert d["pct_peak"][0].startswith("200.0% (allocated over the run")


def test_zoomed_timeline_draws_each_pixel_of_the_range() -> None:
    prof = _spike_profile()
    t = prof.timeline
    data = timeline_data(t, buckets=200, start=499.5, end=502.5)  # 3 ms around the spike
    assert data["x"][0] == 499.5 and data["x_end"][-1] == 502.5
    xs = [float(v) / 1e6 for v in t.time_ns]
    _drawn_levels_cover_every_event(prof, data, xs)
    # the level at the left edge is what held before the range (after the free at 499 ms)
    before = max(i for i, x in enumerate(xs) if x < 499.5)
    assert data["index"][0] == before and data["total"][0] * 2**20 == t.total_at(before)
    assert max(data["total"]) * 2**20 == t.peak_bytes
    k = data["index"].index(t.peak_index)
    # 200 slices over 3 ms: the spike's step is one slice (15 us) wide, not a whole pixel of
    # the full chart
    assert data["x_end"][k] - data["x"][k] == pytest.approx(3.0 / 200)
    empty = timeline_data(t, buckets=200, start=600.5, end=600.9)  # nothing happens there
    assert empty["x"] == [600.5, 600.9] and empty["x_end"][-1] == 600.9
    assert empty["total"][0] * 2**20 == t.total_at(max(i for i, x in enumerate(xs) if x < 600.5))


def _random_timeline_profile(rng: random.Random) -> Profile:
    """Allocations of few distinct sizes (ties in level are common) at times that repeat."""
    b = ProfileBuilder()
    dev, op = b.devices("cpu"), b.ops("mm")
    s = b.intern_stack((Frame("/u/a.py", 1, "f"),))
    tmp = CATEGORY_INDEX["temporary"]
    live: list[int] = []
    ns = 0
    for seq in range(rng.randint(1, 300)):
        ns += rng.choice([0, 0, 1_000, 250_000, 3_000_000])
        if live and rng.random() < 0.45:
            b.free(live.pop(rng.randrange(len(live))), seq, ns)
        else:
            live.append(b.add(rng.choice([64, 128, 256]), seq, ns, dev, op, 0, s, 1, tmp))
    return b.build(device="cpu", source="test", wall_ns=max(ns, 1))


def _bucket_peaks_by_hand(
    xs: list[float], totals: list[int], buckets: int, lo: float, hi: float
) -> tuple[list[float], list[int]]:
    """``Timeline.bucket_peaks`` as its docstring says, event by event: each slice with events
    is drawn at its highest event (the earliest of equals) from the slice's start; where the
    next slice with events is not the next slice (or at the end), its last event's level
    follows from the next slice's start."""
    width = (hi - lo) / buckets
    inside = [i for i, x in enumerate(xs) if lo <= x <= hi]
    slices: dict[int, list[int]] = {}
    for i in inside:
        slices.setdefault(min(int((xs[i] - lo) / width), buckets - 1), []).append(i)
    used = sorted(slices)
    x: list[float] = []
    index: list[int] = []
    if used[0] > 0:
        x.append(lo)
        index.append(inside[0] - 1)
    for k, b in enumerate(used):
        events = slices[b]
        best = events[0]
        for i in events:
            if totals[i] > totals[best]:
                best = i
        x.append(lo + b * width)
        index.append(best)
        following = used[k + 1] if k + 1 < len(used) else buckets
        if following > b + 1 or (k + 1 == len(used) and events[-1] != best):
            x.append(min(lo + (b + 1) * width, hi))
            index.append(events[-1])
    if x[-1] < hi:
        x.append(hi)
        index.append(index[-1])
    return x, index


def test_bucket_peaks_match_a_slice_by_slice_walk() -> None:
    rng = random.Random(11)
    for trial in range(200):
        t = _random_timeline_profile(rng).timeline
        if len(t) == 0:
            continue
        buckets = rng.choice([1, 3, 17, 300])
        xs = [float(v) for v in t.x_values("time")]
        totals = [t.total_at(i) for i in range(len(t))]
        hi = xs[-1] if xs[-1] > 0 else 1.0  # (bucket_peaks widens an empty range to 1)
        x, index = t.bucket_peaks(buckets, axis="time")
        want_x, want_index = _bucket_peaks_by_hand(xs, totals, buckets, 0.0, hi)
        assert index.tolist() == want_index, trial
        assert x.tolist() == pytest.approx(want_x), trial


def test_live_bytes_per_category_at_chosen_events_match_a_running_sum() -> None:
    """``by_category(indices)`` (what the timeline charts ask for: a few hundred events, -1 for
    before the first, in any order, repeated) equals a running sum kept event by event."""
    rng = random.Random(3)
    for trial in range(100):
        b = ProfileBuilder()
        dev, op = b.devices("cpu"), b.ops("mm")
        s = b.intern_stack((Frame("/u/a.py", 1, "f"),))
        cats = [CATEGORY_INDEX[c] for c in ("activation", "temporary", "gradient")]
        b.add(1000, -1, 0, dev, op, 0, s, 1, cats[2])  # alive before the run
        live: list[int] = []
        for seq in range(rng.randint(1, 200)):
            if live and rng.random() < 0.4:
                b.free(live.pop(rng.randrange(len(live))), seq, seq * 10)
            else:
                size = rng.choice([8, 100, 2**40])
                live.append(b.add(size, seq, seq * 10, dev, op, 0, s, 1, rng.choice(cats)))
        t = b.build(device="cpu", source="test", wall_ns=10**6).timeline
        a = t.allocations
        level = [0] * len(CATEGORIES)
        level[cats[2]] = 1000
        walked = [list(level)]  # walked[i + 1]: after event i
        for i in range(len(t)):
            row = int(t.alloc_index[i])
            level[int(a.category[row])] += int(t.delta[i])
            walked.append(list(level))
        asked = [rng.randrange(-1, len(t)) for _ in range(rng.randint(1, 40))]
        got = t.by_category(np.asarray(asked, np.int64))
        assert got.tolist() == [walked[i + 1] for i in asked], trial
