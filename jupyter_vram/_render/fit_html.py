"""The Make-it-fit tab's bars: one row per option, its predicted peak as a bar against the
budget line (and the measured peak under it once verified), from plain numbers."""

from __future__ import annotations

import html
from dataclasses import dataclass

from .._units import format_bytes, format_change

STYLE = """<style>
.jv-fit-row{display:flex;align-items:center;gap:8px;font-size:12px;margin:2px 0}
.jv-fit-name{width:300px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.jv-fit-track{position:relative;width:360px;height:20px;
background:var(--jp-layout-color2,#eee)}
.jv-fit-bar{position:absolute;left:0;top:2px;height:9px;background:#4c78a8}
.jv-fit-bar.jv-over{background:#c44e52}
.jv-fit-measured{position:absolute;left:0;top:12px;height:6px;background:#54a24b}
.jv-fit-measured.jv-over{background:#e45756}
.jv-fit-line{position:absolute;top:0;height:20px;border-left:2px dashed #222}
.jv-fit-num{width:330px;white-space:nowrap}
.jv-fit-num .jv-over{color:var(--jp-error-color1,#a00)}
.jv-fit-legend{font-size:12px;color:var(--jp-ui-font-color2,#666);margin:4px 0}
</style>"""


@dataclass(frozen=True)
class FitRow:
    """What one option's row shows."""

    name: str
    predicted: int
    fits: bool
    time_factor: float | None
    why: str
    measured: int | None = None


def _pct(value: int, scale: float) -> str:
    return f"{min(100.0, 100.0 * value / scale):.2f}%"


def scale_of(rows: list[FitRow], budget: int, peak: int) -> float:
    """The bytes a full-width bar stands for: the largest of the run's peak, the budget and
    every predicted or measured peak, with a little room."""
    values = [budget, peak] + [r.predicted for r in rows] + [r.measured or 0 for r in rows]
    return 1.05 * max(values)


def row_html(row: FitRow, budget: int, scale: float) -> str:
    """One option: name (why as its tooltip), bars, budget line, numbers."""
    over = "" if row.fits else " jv-over"
    bars = (
        f"<div class='jv-fit-bar{over}' style='width:{_pct(row.predicted, scale)}'></div>"
        f"<div class='jv-fit-line' style='left:{_pct(budget, scale)}'></div>"
    )
    numbers = f"predicted {format_bytes(row.predicted)}"
    if row.time_factor is not None:
        numbers += f", time ~{row.time_factor:.2f}x"
    if row.measured is not None:
        m_over = " jv-over" if row.measured > budget else ""
        bars += (
            f"<div class='jv-fit-measured{m_over}' style='width:{_pct(row.measured, scale)}'></div>"
        )
        error = format_change(row.measured, row.predicted)
        numbers += (
            f"; <span class='jv-fit-measured-text{m_over}'>measured "
            f"{format_bytes(row.measured)}</span> (predicted {error})"
        )
    name = html.escape(row.name)
    return (
        f"<div class='jv-fit-row'><span class='jv-fit-name' title='{html.escape(row.why)}'>"
        f"{name}</span><div class='jv-fit-track'>{bars}</div>"
        f"<span class='jv-fit-num'>{numbers}</span></div>"
    )


def legend_html(summary: str, budget_label: str, cannot: tuple[str, ...]) -> str:
    """The line above the rows and the notes below them."""
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in cannot)
    return (
        f"{STYLE}<div class='jv-fit-summary'><b>{html.escape(summary)}</b></div>"
        f"<div class='jv-fit-legend'>Bars: predicted peak (top, red when over), measured peak "
        f"once verified (below); dashed line: the budget, {html.escape(budget_label)}. Cheapest "
        f"first; hover a name for why.</div><details class='jv-fit-legend'><summary>What the "
        f"plan cannot predict</summary><ul>{notes}</ul></details>"
    )
