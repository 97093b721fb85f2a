"""The profile app without a kernel: widget callbacks, lazy tabs, text fallback."""

from __future__ import annotations

import json

import pytest
import torch

import jupyter_vram as jv
from jupyter_vram.app import ProfileApp
from jupyter_vram.app.flame_view import FlameView
from jupyter_vram.app.timeline_view import TimelineView
from jupyter_vram.render.figures import PATH_SEP

from .conftest import MLP


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


def test_flame_click_zooms_and_up_goes_back(profile: jv.Profile) -> None:
    view = ProfileApp(profile).tabs.children[0]
    assert isinstance(view, FlameView)
    paths = view.source.data["path"]
    target = max(
        range(len(paths)), key=lambda i: (paths[i].count(PATH_SEP), view.source.data["bytes"][i])
    )
    expected = tuple(paths[target].split(PATH_SEP))
    view.source.selected.indices = [target]  # a tap on that block
    assert view.focus == expected
    assert view.source.data["name"][len(expected)] == expected[-1]
    assert " \N{SINGLE RIGHT-POINTING ANGLE QUOTATION MARK} ".join(expected) in view.crumbs.value
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


def test_timeline_pick_shows_what_was_live(profile: jv.Profile) -> None:
    view = TimelineView(profile)
    assert "Live at the peak" in view.moment.value
    view.source.selected.indices = [0]
    assert "Live at the selected moment" in view.moment.value
    first = view.source.data["index"][0]
    from jupyter_vram.render.text import format_bytes

    assert format_bytes(profile.timeline.total_at(first)) in view.moment.value


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
