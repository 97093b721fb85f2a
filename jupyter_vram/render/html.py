"""HTML fragments (header, tables) and the standalone report."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..analysis.allocator import has_segments, reserved_peak
from ..analysis.groups import Group
from ..model import CATEGORIES
from .text import SOURCE_NAMES, format_bytes

if TYPE_CHECKING:
    from ..model import Profile


def header_facts(profile: Profile) -> list[tuple[str, str]]:
    """(label, value) pairs for the summary line; every number comes from the profile."""
    t = profile.timeline
    info = profile.device_info
    facts = [("peak allocated", format_bytes(profile.peak_bytes))]
    if t.peak_index >= 0:
        facts.append(("peak in", t.peak_phase))
    if has_segments(profile):
        facts.append(("peak reserved", format_bytes(reserved_peak(profile))))
    if info.get("device_used") is not None:
        facts.append(("device used", format_bytes(int(info["device_used"]))))
    if info.get("total") is not None:
        facts.append(("device total", format_bytes(int(info["total"]))))
    facts += [
        ("device", f"{profile.device} ({SOURCE_NAMES.get(profile.source, profile.source)})"),
        ("wall time", f"{profile.wall_ns / 1e9:.3f} s"),
        ("events", f"{profile.event_count:,}"),
    ]
    return facts


def facts_html(facts: list[tuple[str, str]]) -> str:
    """(label, value) pairs as the app's header shows them."""
    return "".join(
        f'<span class="jv-fact"><span class="jv-label">{html.escape(k)}</span> '
        f"<b>{html.escape(v)}</b></span>"
        for k, v in facts
    )


def header_html(profile: Profile) -> str:
    items = facts_html(header_facts(profile))
    error = ""
    if profile.error:
        error = (
            f'<div class="jv-error">The cell raised {html.escape(profile.error)}; '
            "the profile covers the run up to the error.</div>"
        )
    return f'<div class="jv-header">{items}</div>{error}'


def groups_table(groups: Sequence[Group], total: int, *, title: str, limit: int = 12) -> str:
    """A small HTML table of groups: label, bytes, share of ``total``, count."""
    rows = "".join(
        f"<tr><td>{html.escape(g.label)}</td><td style='text-align:right'>{format_bytes(g.bytes)}"
        f"</td><td style='text-align:right'>{100 * g.bytes / total:.1f}%</td>"
        f"<td style='text-align:right'>{g.count:,}</td></tr>"
        for g in groups[:limit]
        if total
    )
    more = (
        f"<tr><td colspan=4>… {len(groups) - limit} more</td></tr>" if len(groups) > limit else ""
    )
    return (
        f"<table class='jv-table'><caption>{html.escape(title)}</caption>"
        "<tr><th>name</th><th>bytes</th><th>share</th><th>allocations</th></tr>"
        f"{rows}{more}</table>"
    )


def breakdown_table(breakdown: dict[str, int]) -> str:
    total = sum(breakdown.values())
    rows = "".join(
        f"<tr><td>{c}</td><td style='text-align:right'>{format_bytes(breakdown[c])}</td>"
        f"<td style='text-align:right'>{100 * breakdown[c] / total:.1f}%</td></tr>"
        for c in CATEGORIES
        if breakdown.get(c) and total
    )
    return (
        "<table class='jv-table'><tr><th>category</th><th>bytes</th><th>share</th></tr>"
        f"{rows}<tr><td><b>total</b></td><td style='text-align:right'><b>{format_bytes(total)}"
        "</b></td><td></td></tr></table>"
    )


def write_report(
    profile: Profile, path: str | Path, *, resources: Literal["inline", "cdn"]
) -> Path:
    """A standalone HTML report with the app's figures (hover, click-to-zoom, sortable tables).

    ``resources="inline"`` embeds BokehJS so the file works offline (a few MB, once per file).
    """
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import TabPanel, Tabs
    from bokeh.models.widgets.markups import Div
    from bokeh.resources import CDN, INLINE

    from .figures import report_panels

    panels = [TabPanel(child=child, title=title) for title, child in report_panels(profile)]
    layout = column(
        Div(text=_REPORT_CSS + header_html(profile), sizing_mode="stretch_width"),
        Tabs(tabs=panels, sizing_mode="stretch_width"),
        sizing_mode="stretch_width",
    )
    page = file_html(
        layout, INLINE if resources == "inline" else CDN, title=f"jupyter_vram: {profile.device}"
    )
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path


_REPORT_CSS = """<style>
.jv-header{display:flex;flex-wrap:wrap;gap:4px 18px;font-family:sans-serif;font-size:13px}
.jv-label{color:#666}.jv-error{color:#a00;font-family:sans-serif;margin:4px 0}
</style>"""
