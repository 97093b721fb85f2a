"""Flame graph panel: hierarchy and mode switches, click to zoom, a way back out."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any, cast

import ipywidgets as w
import numpy as np
from bokeh.events import DoubleTap, Tap
from bokeh.models import ColumnDataSource, Range1d
from ipywidgets.widgets.widget_string import HTMLStyle
from jupyter_bokeh import BokehModel

from .._analysis.flame import FlameNode, Hierarchy, Mode, shared_flame_tree
from .._model import Profile
from .._render.figures import (
    CRUMB_SEP,
    PATH_SEP,
    flame_figure,
    flame_height,
    flame_layout,
)
from .._render.html import legend_html
from .._render.mime import module_types
from .._render.svg_flame import display_name
from .._render.theme import apply_theme
from .._units import format_bytes
from .holder import GONE, ProfileHandle, handle_of
from .shared import kept

HIERARCHIES: dict[str, Hierarchy] = {"module → op": "module", "Python stack": "stack"}
MODES: dict[str, Mode] = {"live at peak": "peak", "cumulative allocated": "cumulative"}


def on_click(fig: Any, handler: Callable[[float, float], None]) -> None:
    """Call ``handler(x, y)`` (data coordinates) for every click on ``fig``.

    Clicks arrive as bokeh Tap events, not as selections: a selection is an index into data
    the kernel may already have replaced (jupyter_bokeh also runs selection callbacks twice,
    the second time after the first has replaced the data), and clicking the same row twice
    changes no selection. The handler finds what is under (x, y) in the data it shows now.
    BokehJS reports a click within 300 ms of the previous one as a double tap instead of a
    tap, so both count (a quick second click still picks what it hits).
    """

    def call(event: Any) -> None:
        if event.x is not None and event.y is not None:
            handler(float(event.x), float(event.y))

    for kind in (Tap, DoubleTap):
        fig.on_event(kind, call)


class FlameView(w.VBox):  # type: ignore[misc]
    """The icicle graph and its controls. Trees are computed once per (hierarchy, mode)."""

    def __init__(self, profile: Profile | ProfileHandle) -> None:
        self._handle = handle_of(profile)
        prof = self._handle.get()
        assert prof is not None
        self.peak_bytes = prof.peak_bytes
        self._types = module_types(prof)
        self.focus: tuple[str, ...] = ()
        # Each widget is a comm the page opens, each change after it is made one more
        # message: widgets are made with their classes and text, and their styles and
        # layouts (none of them ever changed) are the kernel's shared ones.
        fit = kept(w.ToggleButtonsStyle, button_width="auto")
        plain = kept(w.Layout)
        self.hierarchy = w.ToggleButtons(
            options=list(HIERARCHIES), style=fit, layout=plain,
            _dom_classes=("jv-flame-hierarchy",),
        )  # fmt: skip
        self.mode = w.ToggleButtons(
            options=list(MODES), style=fit, layout=plain, _dom_classes=("jv-flame-mode",)
        )
        button = kept(w.ButtonStyle)
        self.up = w.Button(
            description="up",
            icon="arrow-up",
            tooltip="zoom out one level",
            style=button,
            layout=kept(w.Layout, width="64px", min_width="64px", flex="0 0 auto"),
            _dom_classes=("jv-flame-up",),
        )
        self.reset = w.Button(
            description="reset",
            icon="home",
            tooltip="the whole tree",
            style=button,
            layout=kept(w.Layout, width="76px", min_width="76px", flex="0 0 auto"),
            _dom_classes=("jv-flame-reset",),
        )
        layout = flame_layout(
            self._tree(prof), self.peak_bytes, display=self._display, cumulative=False
        )
        text = kept(HTMLStyle)
        self.crumbs = w.HTML(
            self._crumbs_html(layout.data), style=text, layout=plain, _dom_classes=("jv-crumbs",)
        )
        self.legend = w.HTML(
            legend_html(), style=text, layout=plain, _dom_classes=("jv-legend-box",)
        )
        self.source = ColumnDataSource(layout.data)
        self.figure = flame_figure(self.source, layout.depth)
        apply_theme(self.figure)
        on_click(self.figure, self._on_click)  # before the figure joins a document
        self.plot = BokehModel(
            self.figure, combine_events=True, layout=plain, _dom_classes=("jv-flame",)
        )
        self.hierarchy.observe(self._on_switch, "value")
        self.mode.observe(self._on_switch, "value")
        self.up.on_click(lambda _: self.zoom(self.focus[:-1]))
        self.reset.on_click(lambda _: self.zoom(()))
        controls = w.HBox(
            [self.hierarchy, self.mode, self.up, self.reset],
            layout=kept(w.Layout, flex_flow="row wrap"),
        )
        super().__init__(
            [controls, self.crumbs, self.plot, self.legend],
            layout=plain,
            _dom_classes=("jv-flame-view",),
        )

    def _display(self, path: tuple[str, ...]) -> str:
        """A node's name as shown: a numbered child (Sequential, ModuleList) with its class."""
        name = path[-1]
        if not name.isdigit() or not self._types:
            return name
        modules = [p for p in path if not p.startswith("[")]
        return display_name(name, self._types.get(".".join(modules), ""))

    def _tree(self, profile: Profile) -> FlameNode:
        """Trees are computed once per profile and kept with it (an app holds its profile
        only weakly)."""
        return shared_flame_tree(profile, HIERARCHIES[self.hierarchy.value], MODES[self.mode.value])

    @property
    def tree(self) -> FlameNode | None:
        """The current tree, or None when the profile is gone."""
        profile = self._handle.get()
        return self._tree(profile) if profile is not None else None

    def zoom(self, focus: tuple[str, ...]) -> None:
        """Show the subtree at ``focus`` across the full width."""
        tree = self.tree
        if tree is None:
            self.crumbs.value = f"<span class='jv-gone'>{GONE}</span>"
            return
        layout = flame_layout(
            tree,
            self.peak_bytes,
            focus,
            display=self._display,
            cumulative=MODES[self.mode.value] == "cumulative",
        )
        self.focus = layout.focus
        self.source.data = layout.data
        cast(Range1d, self.figure.y_range).start = -max(layout.depth, 1)
        self.figure.height = flame_height(layout.depth)
        self._show_crumbs(layout.data)

    def block_at(self, x: float, y: float) -> int | None:
        """The row of the block drawn at (x, y), or None."""
        d = self.source.data
        left, right = np.asarray(d["left"]), np.asarray(d["right"])
        top, bottom = np.asarray(d["top"]), np.asarray(d["bottom"])
        hit = np.flatnonzero((left <= x) & (x < right) & (bottom <= y) & (y < top))
        return int(hit[-1]) if len(hit) else None

    def _on_click(self, x: float, y: float) -> None:
        row = self.block_at(x, y)
        if row is not None:
            path = self.source.data["path"][row]
            self.zoom(tuple(path.split(PATH_SEP)) if path else ())

    def _on_switch(self, change: Any) -> None:
        self.zoom(())

    def _show_crumbs(self, data: dict[str, Any]) -> None:
        self.crumbs.value = self._crumbs_html(data)

    def _crumbs_html(self, data: dict[str, Any]) -> str:
        """The focused node's path and bytes, and how to read the graph."""
        row = len(self.focus)  # the focused node: the row after its ancestors
        names = [html.escape(n) for n in data["full"][row].split(CRUMB_SEP)]
        node_bytes = int(data["bytes"][row])
        peak = self.peak_bytes
        cumulative = MODES[self.mode.value] == "cumulative"
        pct = 100 * node_bytes / peak if peak else 0.0
        share = (
            ""
            if not peak
            else f" ({pct:.0f}% of the peak: allocated over the cell, freed bytes counted again)"
            if cumulative
            else f" ({pct:.1f}% of the peak)"
        )
        note = (
            " · a block's bytes include its children's"
            if not cumulative
            else " · cumulative: every allocation made during the cell, freed or not, so blocks "
            "can add up to more than the peak"
        )
        return (
            f"<span class='jv-crumb-path'>{CRUMB_SEP.join(names)}</span>: "
            f"{format_bytes(node_bytes)}{share} · click a block to zoom in"
            f"<span class='jv-label'>{note}</span>"
        )
