"""The Make-it-fit tab's bars: one row per option, its predicted peak as a bar against the
budget line (and the measured peak under it once verified), from plain numbers."""

from __future__ import annotations

from dataclasses import dataclass

from .._units import format_change
from .templating import render

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
TEMPLATE = "fit_html.html.j2"


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
    measured_over = " jv-over" if row.measured is not None and row.measured > budget else ""
    return render(
        TEMPLATE,
        "row",
        row=row,
        over="" if row.fits else " jv-over",
        predicted_width=_pct(row.predicted, scale),
        budget_width=_pct(budget, scale),
        measured_over=measured_over,
        measured_width=_pct(row.measured, scale) if row.measured is not None else "",
        error=format_change(row.measured, row.predicted) if row.measured is not None else "",
    )


def legend_html(summary: str, budget_label: str, cannot: tuple[str, ...]) -> str:
    """The line above the rows and the notes below them."""
    return render(
        TEMPLATE, "legend", style=STYLE, summary=summary, budget_label=budget_label, cannot=cannot
    )
