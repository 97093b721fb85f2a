"""Flame graph panel: hierarchy and mode switches, click to zoom, a way back out."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w
from bokeh.models import ColumnDataSource
from jupyter_bokeh import BokehModel

from ..analysis.flame import FlameNode, Hierarchy, Mode, flame_tree
from ..model import Profile
from ..render.figures import PATH_SEP, flame_figure, flame_layout
from ..render.text import format_bytes

HIERARCHIES: dict[str, Hierarchy] = {"module → op": "module", "Python stack": "stack"}
MODES: dict[str, Mode] = {"live at peak": "peak", "cumulative allocated": "cumulative"}


class FlameView(w.VBox):  # type: ignore[misc]
    """The icicle graph and its controls. Trees are computed once per (hierarchy, mode)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._trees: dict[tuple[Hierarchy, Mode], FlameNode] = {}
        self.focus: tuple[str, ...] = ()
        fit = {"button_width": "auto"}
        self.hierarchy = w.ToggleButtons(options=list(HIERARCHIES), style=fit)
        self.mode = w.ToggleButtons(options=list(MODES), style=fit)
        small = w.Layout(width="auto")
        self.up = w.Button(
            description="up", icon="arrow-up", tooltip="zoom out one level", layout=small
        )
        self.reset = w.Button(
            description="reset", icon="home", tooltip="the whole tree", layout=small
        )
        self.crumbs = w.HTML()
        for widget, css in (
            (self.hierarchy, "jv-flame-hierarchy"), (self.mode, "jv-flame-mode"),
            (self.up, "jv-flame-up"), (self.reset, "jv-flame-reset"), (self.crumbs, "jv-crumbs"),
        ):  # fmt: skip
            widget.add_class(css)
        layout = flame_layout(self.tree, profile.peak_bytes)
        self.source = ColumnDataSource(layout.data)
        self.figure = flame_figure(self.source, layout.depth)
        self.plot = BokehModel(self.figure, combine_events=True)
        self.plot.add_class("jv-flame")
        self.source.selected.on_change("indices", self._on_tap)
        self.hierarchy.observe(self._on_switch, "value")
        self.mode.observe(self._on_switch, "value")
        self.up.on_click(lambda _: self.zoom(self.focus[:-1]))
        self.reset.on_click(lambda _: self.zoom(()))
        super().__init__(
            [w.HBox([self.hierarchy, self.mode, self.up, self.reset]), self.crumbs, self.plot]
        )
        self.add_class("jv-flame-view")
        self._show_crumbs()

    @property
    def tree(self) -> FlameNode:
        key = (HIERARCHIES[self.hierarchy.value], MODES[self.mode.value])
        tree = self._trees.get(key)
        if tree is None:
            tree = self._trees[key] = flame_tree(self.profile, *key)
        return tree

    def zoom(self, focus: tuple[str, ...]) -> None:
        """Show the subtree at ``focus`` across the full width."""
        layout = flame_layout(self.tree, self.profile.peak_bytes, focus)
        self.focus = layout.focus
        self.source.selected.indices = []
        self.source.data = layout.data
        self.figure.y_range.start = -max(layout.depth, 1)
        self.figure.height = max(220, 26 * layout.depth + 90)
        self._show_crumbs()

    def _on_tap(self, attr: str, old: Any, new: list[int]) -> None:
        if not new:
            return
        path = self.source.data["path"][new[0]]
        self.zoom(tuple(path.split(PATH_SEP)) if path else ())

    def _on_switch(self, change: Any) -> None:
        self.zoom(())

    def _show_crumbs(self) -> None:
        node = self.tree.find(list(self.focus)) or self.tree
        path = " \u203a ".join(html.escape(p) for p in ("all", *self.focus))
        peak = self.profile.peak_bytes
        share = f" ({100 * node.bytes / peak:.1f}% of peak)" if peak else ""
        self.crumbs.value = (
            f"<span class='jv-crumb-path'>{path}</span>: {format_bytes(node.bytes)}{share}"
            " · click a block to zoom in"
        )
