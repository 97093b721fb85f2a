"""The profile app without a kernel: widget callbacks, lazy tabs, text fallback."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from jupyter_bokeh import BokehModel

import jupyter_vram as jv
from jupyter_vram._app import ProfileApp
from jupyter_vram._app.flame_view import FlameView
from jupyter_vram._app.timeline_view import TimelineView
from jupyter_vram._render.figures import CRUMB_SEP, PATH_SEP
from jupyter_vram._units import format_bytes

from .conftest import MLP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from synthetic import synthetic_profile


@pytest.fixture(scope="module")
def profile() -> jv.Profile:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(16, 256)
    for _ in range(2):
        with jv.record() as rec:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    return rec.profile


def test_tabs_are_built_lazily(profile: jv.Profile) -> None:
    app = ProfileApp(profile)
    assert isinstance(app.tabs.children[0], FlameView)
    assert not isinstance(app.tabs.children[2], TimelineView)
    app.tabs.selected_index = 2  # what a click on the tab does
    assert isinstance(app.tabs.children[2], TimelineView)
    assert app.tabs.selected_index == 2


def browser_clicks(plot: BokehModel, x: float, y: float) -> None:
    """What a click in the page sends: jupyter_bokeh's message for a bokeh Tap event at data
    coordinates (x, y), handled the way jupyter_bokeh handles it."""
    values = [["model", {"id": plot._model.id}], ["x", x], ["y", y], ["sx", 0], ["sy", 0],
              ["modifiers", {"type": "map", "entries": [["shift", False], ["ctrl", False],
                                                        ["alt", False]]}]]  # fmt: skip
    event = {"type": "event", "name": "tap", "values": {"type": "map", "entries": values}}
    content = {"event": "jsevent", "kind": "MessageSent", "msg_type": "bokeh_event"}
    plot._sync_model(plot, {**content, "msg_data": event}, [])


def browser_zooms(plot: BokehModel, x0: float, x1: float, y0: float, y1: float) -> None:
    """What the page sends after a zoom or pan: bokeh's RangesUpdate event."""
    values = [["model", {"id": plot._model.id}], ["x0", x0], ["x1", x1], ["y0", y0], ["y1", y1]]
    event = {"type": "event", "name": "rangesupdate", "values": {"type": "map", "entries": values}}
    content = {"event": "jsevent", "kind": "MessageSent", "msg_type": "bokeh_event"}
    plot._sync_model(plot, {**content, "msg_data": event}, [])


def centre(data: dict[str, list[float]], row: int) -> tuple[float, float]:
    """A point inside block ``row`` (data coordinates, as drawn)."""
    return (
        (data["left"][row] + data["right"][row]) / 2,
        (data["top"][row] + data["bottom"][row]) / 2,
    )


def test_flame_click_zooms_into_exactly_the_clicked_block(profile: jv.Profile) -> None:
    view = ProfileApp(profile).tabs.children[0]
    assert isinstance(view, FlameView)
    data = dict(view.source.data)
    depth = [-int(top) for top in data["top"]]
    # one block per depth 1..3, each with children (so a stale index would land elsewhere)
    targets = [next(i for i in range(len(depth)) if depth[i] == d) for d in (1, 2, 3)]
    targets.append(max(i for i in range(len(depth)) if depth[i] == 1))  # the last top block
    for target in targets:
        view.reset.click()
        assert view.source.data["path"] == data["path"]
        expected = tuple(data["path"][target].split(PATH_SEP))
        browser_clicks(view.plot, *centre(data, target))
        assert view.focus == expected, data["name"][target]
        crumbs = view.crumbs.value.split("</span>")[0].split(">")[-1]
        assert crumbs.split(CRUMB_SEP) == ["all", *(html.escape(n) for n in expected)]
    # clicking a block of the zoomed view: exactly that block, again
    zoomed = dict(view.source.data)
    row = len(zoomed["path"]) - 1  # the last block drawn: the deepest level
    deeper = tuple(zoomed["path"][row].split(PATH_SEP))
    assert len(deeper) > len(expected)
    browser_clicks(view.plot, *centre(zoomed, row))
    assert view.focus == deeper
    expected = deeper
    view.up.click()
    assert view.focus == expected[:-1]
    view.reset.click()
    assert view.focus == ()


def test_switching_hierarchy_and_mode_rebuilds(profile: jv.Profile) -> None:
    view = FlameView(profile)
    before = list(view.source.data["name"])
    view.hierarchy.value = "Python stack"
    assert view.source.data["name"] != before
    assert any("test_app.py" in n for n in view.source.data["name"])
    view.mode.value = "cumulative allocated"
    assert view.source.data["bytes"][0] >= profile.peak_bytes - profile.timeline.baseline_bytes


def test_timeline_click_anywhere_picks_that_moment(profile: jv.Profile) -> None:
    view = TimelineView(profile)
    assert "Live at the peak" in view.moment.value
    data = dict(view.source.data)
    t = profile.timeline
    drawn = [k for k in range(len(data["x"]) - 1) if data["index"][k] >= 0]  # holds an event
    widest = max(drawn, key=lambda k: data["x_end"][k] - data["x"][k])
    for k in (drawn[1], widest, drawn[len(drawn) // 2]):
        x = (data["x"][k] + data["x_end"][k]) / 2
        for y in (0.0, max(data["total"]) * 1.1):  # inside the area, and above it
            browser_clicks(view.plot, x, y)
            event = data["index"][k]
            # the event drawn there: the highest of its pixel, by the timeline's own totals
            assert t.total_at(event) == max(
                [
                    t.total_at(i)
                    for i in range(len(t))
                    if data["x"][k] <= t.time_ns[i] / 1e6 < data["x_end"][k]
                ]
                or [t.total_at(event)]
            )
            assert "Live at the selected moment" in view.moment.value
            assert f"{t.time_ns[event] / 1e6:.3f} ms, event {event + 1:,}" in view.moment.value
            assert f"<b class='jv-moment-total'>{format_bytes(t.total_at(event))}</b>" in (
                view.moment.value
            )
    # zoomed into the middle third: the chart is redrawn for that range, pixel by pixel
    end = data["x_end"][-1]
    browser_zooms(view.plot, end / 3, 2 * end / 3, 0.0, 1.0)
    zoomed = dict(view.source.data)
    assert zoomed["x"][0] == end / 3 and zoomed["x_end"][-1] == 2 * end / 3
    # a pixel that holds an event (the middle one may fall in a pause of the cell's clock)
    held = [k for k in range(len(zoomed["x"]) - 1) if zoomed["index"][k] >= 0]
    k = held[len(held) // 2]
    browser_clicks(view.plot, (zoomed["x"][k] + zoomed["x_end"][k]) / 2, 0.0)
    event = zoomed["index"][k]
    assert f"{t.time_ns[event] / 1e6:.3f} ms, event {event + 1:,}" in view.moment.value
    view.axis.value = "allocation events"
    assert view.source.data["x_end"][-1] == len(t)
    browser_clicks(view.plot, t.peak_index + 1.5, 0.0)  # the peak's own step, by event number
    assert f"event {t.peak_index + 1:,}" in view.moment.value


def test_text_fallback_and_state(profile: jv.Profile) -> None:
    app = ProfileApp(profile)
    bundle = app._repr_mimebundle_()
    assert bundle["text/plain"].startswith("jupyter_vram · cpu")
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "peak allocated" in app.header.value


def test_every_tab_builds_and_payload_is_small(profile: jv.Profile) -> None:
    app = ProfileApp(profile)
    for i in range(len(app.tabs.children)):
        app.open_tab(i)
    states = [w.get_state() for w in _all_widgets(app)]
    size = len(json.dumps(states, default=str))
    assert size < 1_000_000
    assert "no caching allocator" in app.tabs.children[4].value


def _all_widgets(widget: object) -> list[object]:
    out = [widget]
    for child in getattr(widget, "children", ()):
        out += _all_widgets(child)
    return out


def _cells(table_html: str, column: int) -> list[str]:
    """The text of one column of an HTML table's body rows (tags dropped)."""
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table_html, flags=re.S)
    out = []
    for row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)
        if len(cells) > column:
            out.append(re.sub(r"<[^>]+>", "", cells[column]))
    return out


def test_top_sites_in_binary_units_with_a_share_and_sorting(profile: jv.Profile) -> None:
    app = ProfileApp(profile)
    view = app.open_tab(3)
    row, _, table = view.children
    sort = row.children[0]
    # expected, from the allocation columns alone: bytes live at the peak per (stack, op)
    a = profile.allocations
    t = profile.timeline
    s = t.seq[t.peak_index]
    live: dict[tuple[int, int], int] = {}
    for i in range(len(a)):
        if a.alloc_seq[i] >= 0 and a.alloc_seq[i] <= s and not (0 <= a.free_seq[i] <= s):
            key = (int(a.stack[i]), int(a.op[i]))
            live[key] = live.get(key, 0) + int(a.size[i])
    top = max(live.values())
    assert _cells(table.value, 2)[0] == format_bytes(top)
    assert _cells(table.value, 3)[0] == f"{100 * top / profile.peak_bytes:.1f}%"
    assert all(c.endswith(("B", "KiB", "MiB", "GiB")) for c in _cells(table.value, 4))
    sort.value = "allocations"
    counts = [int(c.replace(",", "")) for c in _cells(table.value, 5)]
    assert counts == sorted(counts, reverse=True) and len(counts) > 3
    sort.value = "op"
    ops = _cells(table.value, 1)
    assert ops == sorted(ops)


def test_long_tables_expand_in_the_page() -> None:
    prof = synthetic_profile(20_000)
    sites = ProfileApp(prof).open_tab(3).children[2].value
    rows = re.findall(r"<tr", sites)
    extra = sites.count("class='jv-extra'")
    assert extra == 200 - 50 and f"\u2026 {extra} more (show)" in sites
    assert len(rows) == 1 + 200 + 1  # head, every row, the "more" row
    toggle = re.search(r"<input type='checkbox' id='([^']+)' class='jv-more-toggle'>", sites)
    assert toggle and f"<label for='{toggle.group(1)}'" in sites


def test_cpu_allocator_tab_shows_the_tracker_and_a_gpu_model(profile: jv.Profile) -> None:
    from jupyter_vram._estimator.cuda_model import simulate

    text = ProfileApp(profile).open_tab(4).value
    a = profile.allocations
    during = int(((a.alloc_seq >= 0) & (a.device == profile.devices.index(profile.device))).sum())
    assert f"<td>allocations during the cell</td><td class='jv-num'>{during:,}</td>" in text
    sim = simulate(profile)
    assert sim.peak_reserved >= sim.peak_allocated >= profile.peak_bytes
    assert f"On a GPU this run would reserve <b>{format_bytes(sim.peak_reserved)}</b>" in text


def _fact(head: str, label: str) -> str:
    """The value the header shows for ``label`` (escaped HTML, as in the page)."""
    found = re.findall(rf'<span class="jv-label">{label}</span> <b>(.*?)</b>', head)
    assert len(found) == 1, (label, found)
    return found[0]


def test_header_splits_the_peak_into_before_and_added_by_the_cell() -> None:
    """Memory alive before the cell is inside the peak: the header says how much, which
    variables hold it (largest first, three at most), and what the cell added."""
    kept_logits = torch.ones(512, 1024)  # 4 x 524,288 = 2,097,152 B = 2.0 MiB
    net = torch.nn.Linear(256, 128)  # 4 x (256 x 128 + 128) = 131,584 B = 128.5 KiB
    small = torch.ones(4)  # 16 B
    tiny = torch.ones(1)  # 4 B: the fourth, not named
    namespace = {"kept_logits": kept_logits, "net": net, "small": small, "tiny": tiny}
    with torch.no_grad(), jv.record("cpu", namespace=namespace) as rec:
        out = net(torch.randn(64, 256))  # 64 x 256 x 4 = 65,536 B in, 64 x 128 x 4 = 32,768 out
    del out
    prof = rec.profile
    before = 2_097_152 + 131_584 + 16 + 4  # 2,228,756 B = 2.1 MiB
    assert prof.timeline.baseline_bytes == before
    assert prof.peak_bytes == before + 65_536 + 32_768
    head = ProfileApp(prof).header.value
    assert _fact(head, "peak allocated") == "2.2 MiB"  # 2,327,060 / 2^20 = 2.219
    assert (
        _fact(head, "before the cell") == "2.1 MiB (kept_logits 2.0 MiB, net 128.5 KiB, small 16 B)"
    )
    assert _fact(head, "added by the cell") == "96.0 KiB"

    # a profile without the names (older, or CUDA): the bytes alone
    meta = {k: v for k, v in prof.meta.items() if k != "held_before"}
    head = ProfileApp(prof.replace(meta=meta)).header.value
    assert _fact(head, "before the cell") == "2.1 MiB"
    assert _fact(head, "added by the cell") == "96.0 KiB"


def test_header_with_nothing_before_the_cell() -> None:
    with torch.no_grad(), jv.record("cpu", namespace={}) as rec:
        torch.ones(256, 64)  # 65,536 B, freed at once
    head = ProfileApp(rec.profile).header.value
    assert rec.profile.timeline.baseline_bytes == 0
    assert _fact(head, "before the cell") == "0 B"
    assert _fact(head, "added by the cell") == _fact(head, "peak allocated") == "64.0 KiB"
