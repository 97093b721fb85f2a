"""The profile app: summary header and tabs. Tabs are built when first opened, so displaying
a profile sends only what is on screen."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w
from jupyter_bokeh import BokehModel

from ..analysis.allocator import AllocatorState, allocator_state
from ..analysis.groups import live_at_peak
from ..analysis.tables import top_sites
from ..model import Profile
from ..render.figures import breakdown_figure, sites_table, table_source
from ..render.html import breakdown_table, groups_table, header_html
from ..render.text import format_bytes, summary
from .flame_view import FlameView
from .timeline_view import TimelineView

TABS = ("Flame graph", "Breakdown", "Timeline", "Top sites", "Allocator")
STYLE = """<style>
.jv-header{display:flex;flex-wrap:wrap;gap:4px 18px;font-size:13px;padding:4px 0}
.jv-label{color:var(--jp-ui-font-color2,#666)}
.jv-error{color:#a00;margin:2px 0}
.jv-table{border-collapse:collapse;font-size:12px;margin:4px 0}
.jv-table td,.jv-table th{padding:1px 8px;border-bottom:1px solid #ddd}
.jv-table caption{text-align:left;font-weight:bold}
</style>"""


class ProfileApp(w.VBox):  # type: ignore[misc]
    """Header + tabs for one Profile. Without a widget frontend it shows the text summary."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.header = w.HTML(STYLE + header_html(profile))
        self.header.add_class("jv-header-box")
        self._builders: dict[int, Callable[[], w.Widget]] = {
            0: lambda: FlameView(profile),
            1: self._breakdown,
            2: lambda: TimelineView(profile),
            3: self._sites,
            4: self._allocator,
        }
        self.tabs = w.Tab(children=[_placeholder() for _ in TABS])
        for i, title in enumerate(TABS):
            self.tabs.set_title(i, title)
        self.tabs.add_class("jv-tabs")
        self.tabs.observe(self._on_tab, "selected_index")
        super().__init__([self.header, self.tabs])
        self.add_class("jv-app")
        self.open_tab(0)

    def open_tab(self, index: int) -> w.Widget:
        """Build the tab's content if needed and select it."""
        children = list(self.tabs.children)
        builder = self._builders.pop(index, None)
        if builder is not None:
            children[index] = builder()
            self.tabs.children = children
        if self.tabs.selected_index != index:
            self.tabs.selected_index = index
        return self.tabs.children[index]

    def _on_tab(self, change: dict[str, Any]) -> None:
        if change["new"] is not None and change["new"] in self._builders:
            self.open_tab(change["new"])

    def _breakdown(self) -> w.Widget:
        breakdown = self.profile.peak_breakdown()
        bar = BokehModel(breakdown_figure(breakdown), combine_events=True)
        bar.add_class("jv-breakdown")
        peak = self.profile.peak_bytes
        tables = w.HTML(
            "<div style='display:flex;gap:24px;flex-wrap:wrap'>"
            + breakdown_table(breakdown)
            + groups_table(live_at_peak(self.profile, "module"), peak, title="modules at the peak")
            + groups_table(live_at_peak(self.profile, "op"), peak, title="ops at the peak")
            + "</div>"
        )
        box = w.VBox([bar, tables])
        box.add_class("jv-breakdown-view")
        return box

    def _sites(self) -> w.Widget:
        by = w.ToggleButtons(options=["live at peak", "allocated"], description="rank by")
        source = table_source(top_sites(self.profile, limit=200))
        table = BokehModel(sites_table(source), combine_events=True)
        table.add_class("jv-sites")

        def rerank(change: dict[str, Any]) -> None:
            ranked = top_sites(
                self.profile,
                limit=200,
                by="peak" if change["new"] == by.options[0] else "allocated",
            )
            source.data = dict(table_source(ranked).data)

        by.observe(rerank, "value")
        return w.VBox([by, table])

    def _allocator(self) -> w.Widget:
        box = w.HTML(allocator_html(allocator_state(self.profile)))
        box.add_class("jv-allocator")
        return box

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):
            bundle["text/plain"] = summary(self.profile)
        return bundle


def _placeholder() -> w.Widget:
    return w.HTML("<i>loading…</i>")


def allocator_html(state: AllocatorState) -> str:
    rows = [("allocated (peak)", state.peak_allocated)]
    if state.peak_reserved is not None:
        rows.append(("reserved (peak)", state.peak_reserved))
    if state.device_used is not None:
        rows.append(("device used", state.device_used))
    if state.device_total is not None:
        rows.append(("device total", state.device_total))
    levels = "".join(
        f"<tr><td>{k}</td><td style='text-align:right'>{format_bytes(v)}</td></tr>" for k, v in rows
    )
    frag = (
        "<p>Fragmentation at the reserved peak: "
        f"<b>{100 * state.fragmentation:.1f}%</b> of reserved memory was cached but free.</p>"
        if state.fragmentation is not None
        else ""
    )
    gaps = "".join(
        f"<li><b>{html.escape(g.label)}</b>"
        + (f" ({format_bytes(g.bytes)})" if g.bytes else "")
        + f": {html.escape(g.explanation)}</li>"
        for g in state.gaps
    )
    advice = "".join(f"<li>{html.escape(a)}</li>" for a in state.advice)
    return f"<table class='jv-table'>{levels}</table>{frag}<ul>{gaps}</ul>" + (
        f"<div class='jv-advice'><b>Advice</b><ul>{advice}</ul></div>" if advice else ""
    )
