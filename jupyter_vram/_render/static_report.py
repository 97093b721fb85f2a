"""The static report: a profile as self-contained HTML with no JavaScript.

Every ``%%vram`` / ``%vram_estimate`` output carries it as ``text/html`` next to the widget, so
nbconvert, nbviewer, GitHub, VS Code and Colab show a real profile, with or without a kernel:
header, category bar, a flame graph as inline SVG (module -> op, live at the peak; hover a block
for its bytes), the timeline, the top modules and sites, and an estimate's summary. It formats
the saved profile (:func:`.mime.profile_payload`), so the two always agree. Colours: the app's
category palette on blocks (white labels); text inherits the page's colour, lines are
translucent grey, so light and dark pages both read. About 40 KB for a 1M-event profile (see
bench/static_report.py).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._units import format_bytes
from .html import site_label
from .mime import profile_payload
from .svg_flame import category_bar_svg, flame_svg, timeline_svg

if TYPE_CHECKING:
    from .._estimator.api import Estimate
    from .._model import Profile

ESTIMATE_BADGE = "Estimate · simulated on fake tensors, no GPU used"
SAVED_NOTE = (
    "Static view, saved with the notebook (no kernel needed). Run the cell again for the "
    "interactive app: flame zoom, Python-stack tree, timeline moments, allocator."
)
STYLE = """<style>
.jvs-report{font-family:-apple-system,BlinkMacSystemFont,'Segoe UI',Helvetica,Arial,sans-serif;
font-size:13px;line-height:1.45;color:inherit;max-width:1200px;margin:2px 0}
.jvs-report .jvs-title{font-weight:600;font-size:14px}
.jvs-report .jvs-facts{display:flex;flex-wrap:wrap;gap:0 16px}
.jvs-report .jvs-label,.jvs-report .jvs-note{opacity:.72}
.jvs-report .jvs-note{font-size:11px}
.jvs-report h4{margin:10px 0 3px;font-size:13px;font-weight:600}
.jvs-report .jvs-error{color:#c0392b}
.jvs-report .jvs-warning{color:#8a5a00;font-size:12px}
.jvs-report .jvs-badge{display:inline-block;padding:0 8px;border-radius:3px;font-weight:600;
background:#fff3cd;color:#6b4e00;border:1px solid #e0c36a}
.jvs-report pre.jvs-summary{white-space:pre-wrap;font-size:12px;margin:4px 0;background:none;
color:inherit}
.jvs-report .jvs-tables{display:flex;flex-wrap:wrap;gap:8px 28px;align-items:flex-start}
.jvs-report table.jvs-table{border-collapse:collapse;font-size:12px;margin:2px 0;
background:transparent;color:inherit;table-layout:auto}
.jvs-report table.jvs-table td,.jvs-report table.jvs-table th{padding:1px 8px;text-align:left;
vertical-align:top;border:none;border-bottom:1px solid rgba(128,128,128,.3);background:none;
color:inherit}
.jvs-report table.jvs-table td.jvs-num{text-align:right;white-space:nowrap}
.jvs-report table.jvs-table td.jvs-site{overflow-wrap:anywhere;max-width:420px}
.jvs-report .jvs-swatch{display:inline-block;width:10px;height:10px;margin-right:5px;
border-radius:2px;vertical-align:baseline}
.jvs-report svg{display:block;overflow:visible}
</style>"""


def static_report_html(profile: Profile, estimate: Estimate | None = None) -> str:
    """The report of ``profile`` (and the :class:`Estimate` behind it, for its summary)."""
    return report_html(profile_payload(profile, estimate))


def report_html(payload: Mapping[str, Any], *, notes: Sequence[str] = ()) -> str:
    """The report of a saved profile (:func:`.mime.profile_payload`'s dict); ``notes``:
    plain-text paragraphs shown under the header (an estimate's answer for a GPU, a
    comparison with an estimate)."""
    cats: list[str] = payload["categories"]
    colors: list[str] = payload["colors"]
    peak = int(payload["peak_bytes"])
    parts = [STYLE, "<div class='jvs-report' data-jupyter-vram-report='1'>", _header(payload)]
    parts += [f"<pre class='jvs-summary jvs-notes'>{html.escape(n)}</pre>" for n in notes if n]
    bar = category_bar_svg(payload["breakdown"], cats, colors)
    if bar:
        parts += [f"<h4>At the peak: {format_bytes(peak)}</h4>", bar, _legend(payload)]
    parts += [
        "<h4>Flame graph: module → op, memory live at the peak</h4>",
        "<div class='jvs-note'>A block's width is its bytes (its children's included); "
        "hover a block for its bytes and categories.</div>",
        flame_svg(payload["flame"], cats, colors, peak),
    ]
    line = timeline_svg(payload["timeline"], peak, payload.get("peak_x"))
    if line:
        last = float(payload["timeline"]["x"][-1])
        span = (
            f"0 to {last:,.1f} ms"
            if payload["timeline"]["axis"] == "time"
            else f"allocation / free events 1 to {last:,.0f}"
        )
        parts += [
            f"<h4>Live memory over the run ({span}; dotted: the peak)</h4>",
            line,
        ]
    parts += [
        "<div class='jvs-tables'>",
        _modules_table(payload),
        "</div>",
        _sites_table(payload),
    ]
    if payload.get("estimate"):
        summary = html.escape(payload["estimate"]["summary"])
        parts.append(f"<h4>Estimate</h4><pre class='jvs-summary'>{summary}</pre>")
    parts += [f"<div class='jvs-note'>{html.escape(SAVED_NOTE)}</div>", "</div>"]
    return "".join(parts)


def _header(payload: Mapping[str, Any]) -> str:
    facts = "".join(
        f"<span><span class='jvs-label'>{html.escape(k)}</span> <b>{html.escape(v)}</b></span>"
        for k, v in payload["facts"]
    )
    badge = (
        f"<div><span class='jvs-badge'>{html.escape(ESTIMATE_BADGE)}</span></div>"
        if payload["kind"] == "estimate"
        else ""
    )
    error = (
        f"<div class='jvs-error'>The {'step' if payload['kind'] == 'estimate' else 'cell'} "
        f"raised {html.escape(str(payload['error']))}; the "
        "profile covers the run up to the error.</div>"
        if payload.get("error")
        else ""
    )
    warnings = "".join(
        f"<div class='jvs-warning'>{html.escape(str(w))}</div>" for w in payload.get("warnings", ())
    )
    return (
        f"{badge}<div class='jvs-title'>{html.escape(payload['title'])}</div>"
        f"<div class='jvs-facts'>{facts}</div>{error}{warnings}"
    )


def _swatch(color: str) -> str:
    return f"<span class='jvs-swatch' style='background:{color}'></span>"


def _legend(payload: Mapping[str, Any]) -> str:
    """The categories at the peak with their bytes and share (the bar's legend)."""
    peak = int(payload["peak_bytes"]) or 1
    items = "".join(
        f"<span>{_swatch(color)}{html.escape(name)} <b>{format_bytes(size)}</b> "
        f"<span class='jvs-label'>{100 * size / peak:.1f}%</span></span>"
        for name, color, size in zip(
            payload["categories"], payload["colors"], payload["breakdown"], strict=True
        )
        if size
    )
    return f"<div class='jvs-facts jvs-legend'>{items}</div>"


def _color_of(payload: Mapping[str, Any], category: str) -> str:
    cats: list[str] = payload["categories"]
    return str(payload["colors"][cats.index(category)]) if category in cats else "#8C8C8C"


def _modules_table(payload: Mapping[str, Any]) -> str:
    peak = int(payload["peak_bytes"]) or 1
    rows = "".join(
        f"<tr><td>{html.escape(m['name'])}</td><td class='jvs-num'>{format_bytes(m['bytes'])}"
        f"</td><td class='jvs-num'>{100 * m['bytes'] / peak:.1f}%</td>"
        f"<td class='jvs-num'>{m['count']:,}</td>"
        f"<td>{_swatch(_color_of(payload, m['category']))}{html.escape(m['category'])}</td></tr>"
        for m in payload["top_modules"]
    )
    if not rows:
        return ""
    return (
        "<div><h4>Top modules at the peak</h4><div class='jvs-note'>self bytes: made in the "
        "module itself, not in its submodules</div><table class='jvs-table jvs-modules'>"
        "<tr><th>module</th><th>bytes</th><th>of peak</th><th>allocations</th>"
        f"<th>mostly</th></tr>{rows}</table></div>"
    )


def _sites_table(payload: Mapping[str, Any]) -> str:
    peak = int(payload["peak_bytes"]) or 1
    rows = "".join(
        f"<tr><td class='jvs-site' title='{html.escape(s['stack'].replace(' > ', chr(10)))}'>"
        f"{html.escape(site_label(s['site']))}</td><td>{html.escape(s['op'])}</td>"
        f"<td class='jvs-num'>{format_bytes(s['live_at_peak_bytes'])}</td>"
        f"<td class='jvs-num'>{100 * s['live_at_peak_bytes'] / peak:.1f}%</td>"
        f"<td class='jvs-num'>{format_bytes(s['allocated_bytes'])}</td>"
        f"<td class='jvs-num'>{s['allocations']:,}</td>"
        f"<td class='jvs-num'>{format_bytes(s['largest_bytes'])}</td>"
        f"<td>{_swatch(_color_of(payload, s['category']))}{html.escape(s['category'])}</td></tr>"
        for s in payload["top_sites"]
    )
    if not rows:
        return ""
    return (
        "<h4>Top allocation sites (live at the peak)</h4><div class='jvs-note'>the innermost "
        "line of your code and the op that allocated; hover a site for its whole stack</div>"
        "<table class='jvs-table jvs-sites'><tr><th>site (file:line function)</th><th>op</th>"
        "<th>live at peak</th><th>of peak</th><th>allocated</th><th>count</th>"
        f"<th>largest</th><th>mostly</th></tr>{rows}</table>"
    )
