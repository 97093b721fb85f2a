"""The profile app: summary header and tabs. Tabs are built when first opened, so displaying
a profile sends only what is on screen."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from ..estimator.api import Comparison, Estimate

TABS = ("Flame graph", "Breakdown", "Timeline", "Top sites", "Allocator")
STYLE = """<style>
.jv-header{display:flex;flex-wrap:wrap;gap:4px 18px;font-size:13px;padding:4px 0;line-height:1.6}
.jv-label{color:var(--jp-ui-font-color2,#666)}
.jv-error{color:#a00;margin:2px 0}
.jv-table{border-collapse:collapse;font-size:12px;margin:4px 0;line-height:1.5}
.jv-table td,.jv-table th{padding:1px 8px;border-bottom:1px solid #ddd}
.jv-table caption{text-align:left;font-weight:bold}
.jv-estimate-badge{display:inline-block;margin:2px 0;padding:1px 8px;border-radius:3px;
font-weight:bold;font-size:13px;background:#fff3cd;color:#6b4e00;border:1px solid #e0c36a}
.jv-estimate-note{font-size:12px;line-height:1.6;color:var(--jp-ui-font-color2,#666);margin:2px 0}
.jv-estimate-note summary{cursor:pointer}
.jv-comparison{font-size:13px;line-height:1.6;margin:4px 0;padding:2px 8px;
border-left:4px solid #4C72B0}
.jv-fit-no td{color:#a00}
.jv-up{color:#a00}.jv-down{color:#2a7a2a}
.jv-whatifs td,.jv-whatifs th{white-space:nowrap}
.jv-whatifs td.jv-whatif-note{white-space:normal;max-width:480px;color:#8a5a00;font-style:italic}
.jv-note{font-size:12px;line-height:1.5;max-width:900px}
</style>"""


class ProfileApp(w.VBox):  # type: ignore[misc]
    """Header + tabs for one Profile. Without a widget frontend it shows the text summary.

    An estimate's profile (``source == "estimate"``) gets a header that says so. With
    ``estimate`` (the :class:`Estimate` behind it) a "Fit & what-ifs" tab is added; with
    ``comparison`` (a measured profile against an earlier estimate) the header shows the error.
    """

    def __init__(
        self,
        profile: Profile,
        *,
        estimate: Estimate | None = None,
        comparison: Comparison | None = None,
    ) -> None:
        self.profile = profile
        self.estimate = estimate
        self.comparison = comparison
        self.header = w.HTML(STYLE + self._header_html())
        self.header.add_class("jv-header-box")
        self._builders: dict[int, Callable[[], w.Widget]] = {
            0: lambda: FlameView(profile),
            1: self._breakdown,
            2: lambda: TimelineView(profile),
            3: self._sites,
            4: self._allocator,
        }
        titles = list(TABS)
        if estimate is not None:
            from .estimate_view import TITLE, EstimateView

            self._builders[len(titles)] = lambda: EstimateView(estimate)
            titles.append(TITLE)
        self.tabs = w.Tab(children=[_placeholder() for _ in titles])
        for i, title in enumerate(titles):
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

    def _header_html(self) -> str:
        if self.profile.source == "estimate":
            from .estimate_view import estimate_header_html

            text = estimate_header_html(self.profile)
        else:
            text = header_html(self.profile)
        if self.comparison is not None:
            from .estimate_view import comparison_html

            text += comparison_html(self.comparison)
        return text

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
            bundle["text/plain"] = self.text()
        return bundle

    def text(self) -> str:
        """What a frontend without widgets shows: the text summary (and comparison)."""
        if self.estimate is not None:
            from ..render.estimate_text import estimate_summary

            text = estimate_summary(self.estimate)
        else:
            text = summary(self.profile)
        if self.comparison is not None:
            from ..render.estimate_text import comparison_text

            text += "\n" + comparison_text(self.comparison)
        return text


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
