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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .html import site_label
from .mime import profile_payload
from .svg_flame import category_bar_svg, flame_svg, timeline_svg
from .templating import render

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


def saved_views(
    profile: Profile,
    estimate: Estimate | None = None,
    *,
    notes: Sequence[str] = (),
    live: str | None = None,
) -> dict[str, Any]:
    """The views of an output that need no kernel: the saved profile (``PROFILE_MIME``; with
    ``live``, the key its live app opens by) and the static report made from it."""
    from .mime import PROFILE_MIME

    payload = profile_payload(profile, estimate)
    if live is not None:
        payload["live"] = live
    return {PROFILE_MIME: payload, "text/html": report_html(payload, notes=notes)}


def report_html(payload: Mapping[str, Any], *, notes: Sequence[str] = ()) -> str:
    """The report of a saved profile (:func:`.mime.profile_payload`'s dict); ``notes``:
    plain-text paragraphs shown under the header (an estimate's answer for a GPU, a
    comparison with an estimate)."""
    cats: list[str] = payload["categories"]
    colors: list[str] = payload["colors"]
    peak = int(payload["peak_bytes"])
    timeline = payload["timeline"]
    line = timeline_svg(timeline, peak, payload.get("peak_x"))
    span = ""
    if line:
        last = float(timeline["x"][-1])
        span = (
            f"0 to {last:,.1f} ms"
            if timeline["axis"] == "time"
            else f"allocation / free events 1 to {last:,.0f}"
        )
    return render(
        "static_report.html.j2",
        "report",
        p=payload,
        peak=peak,
        style=STYLE,
        notes=notes,
        bar=category_bar_svg(payload["breakdown"], cats, colors),
        legend=[item for item in zip(cats, colors, payload["breakdown"], strict=True) if item[2]],
        flame=flame_svg(payload["flame"], cats, colors, peak),
        line=line,
        span=span,
        colors=dict(zip(cats, colors, strict=True)),
        site_label=site_label,
        badge=ESTIMATE_BADGE,
        saved_note=SAVED_NOTE,
    )
