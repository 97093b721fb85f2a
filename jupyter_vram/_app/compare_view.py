"""The Compare tab: a baseline next to each of its reruns (variants).

Each rerun adds a column. What the tab shows is computed once, when the variant arrives
(the engine's ``Profile.compare`` numbers and verdict, flame trees merged into a diff tree),
so the tab keeps working after the profiles themselves are gone: an app holds profiles only
weakly (see :mod:`.holder`), and the newest variant of the kernel strongly, like the newest
profile.
"""

from __future__ import annotations

import html
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ipywidgets as w
from bokeh.models import ColumnDataSource
from jupyter_bokeh import BokehModel

from .._analysis.flame import flame_tree
from .._render.compare_figures import (
    DiffNode,
    category_bars_figure,
    diff_flame_data,
    diff_flame_figure,
    diff_tree,
)
from .._render.figures import CATEGORY_COLORS, flame_height
from .._render.theme import apply_theme
from .._units import format_bytes, format_change

if TYPE_CHECKING:
    import pandas as pd

    from .._model import Profile

TITLE = "Compare"
MOVERS = 8  # modules / ops listed per variant
_latest_variant: list[Profile] = []  # the newest variant of the kernel, kept alive

STYLE = """<style>
.jv-compare-table td.jv-up,.jv-compare-table span.jv-up{color:var(--jp-error-color1,#a00)}
.jv-compare-table td.jv-down,.jv-compare-table span.jv-down{color:var(--jp-success-color1,#2a7a2a)}
.jv-verdicts{margin:4px 0}
.jv-verdict{font-size:14px;font-weight:bold;margin:2px 0;padding:2px 8px;
border-left:4px solid #4C72B0}
.jv-variant-notes{font-size:12px;color:var(--jp-warn-color1,#8a5a00);margin:0 0 2px 12px}
.jv-diff-legend{font-size:12px;margin:2px 0}
.jv-diff-legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px;
border-radius:2px}
</style>"""


@dataclass(frozen=True)
class VariantResult:
    """What the tab shows of one variant, computed when it arrives."""

    title: str
    verdict: str
    by_category: pd.DataFrame  # Profile.compare(by="category"): categories and a "peak" row
    modules: pd.DataFrame  # the modules that moved most
    ops: pd.DataFrame  # the ops that moved most
    baseline_wall_ns: int
    variant_wall_ns: int
    notes: tuple[str, ...]
    diff: DiffNode


def top_movers(frame: pd.DataFrame, n: int = MOVERS) -> pd.DataFrame:
    """The ``n`` rows that changed most (either way), unchanged rows left out."""
    moved = frame[frame["change_bytes"] != 0]
    order = moved["change_bytes"].abs().sort_values(ascending=False, kind="stable").index
    return moved.loc[order[:n]]


def compare_result(baseline: Profile, variant: Profile) -> VariantResult:
    """The engine's numbers and verdict for one variant, and the diff tree of what was live
    at each run's peak (module -> op)."""
    from .._analysis.compare import compare, describe_change, verdict

    applied = getattr(variant, "variant", None)
    notes = [str(n) for n in getattr(applied, "notes", ()) or ()]
    blocks = getattr(applied, "checkpointed", ()) or ()
    if blocks:  # which blocks were wrapped, first
        notes.insert(0, "checkpointed: " + ", ".join(str(b) for b in blocks))
    return VariantResult(
        title=describe_change(variant),
        verdict=verdict(baseline, variant),
        by_category=compare(baseline, variant, "category"),
        modules=top_movers(compare(baseline, variant, "module")),
        ops=top_movers(compare(baseline, variant, "op")),
        baseline_wall_ns=baseline.wall_ns,
        variant_wall_ns=variant.wall_ns,
        notes=tuple(notes),
        diff=diff_tree(
            flame_tree(baseline, "module", "peak"), flame_tree(variant, "module", "peak")
        ),
    )


def _change_cell(base: float, new: float, text: str) -> str:
    """A table cell with a change, red when it grew, green when it shrank."""
    css = "jv-up" if new > base else "jv-down" if new < base else ""
    pct = f" ({format_change(base, new, space='')})" if base or new else ""
    return f"<td class='jv-num {css}'>{text}{pct}</td>"


def column(frame: pd.DataFrame, name: str) -> dict[str, int]:
    """One column of a comparison frame as {row name: bytes}, the peak first."""
    values = {str(k): int(v) for k, v in frame[name].items()}
    return {"peak": values.pop("peak", 0), **values}


def summary_table(results: list[VariantResult]) -> str:
    """Peak, the most each category held at once, and wall time: the baseline, then each
    variant with its change."""
    baseline = column(results[0].by_category, "baseline_bytes")
    variants = [column(r.by_category, "variant_bytes") for r in results]
    head = "".join(f"<th>#{i + 1}: {html.escape(r.title)}</th>" for i, r in enumerate(results))
    rows = []
    for name, base in baseline.items():
        if not base and not any(v.get(name, 0) for v in variants):
            continue
        swatch = (
            f"<span class='jv-swatch' style='background:{CATEGORY_COLORS[name]}'></span>"
            if name in CATEGORY_COLORS
            else ""
        )
        label = f"<b>{name}</b>" if name == "peak" else name
        cells = "".join(
            _change_cell(base, v.get(name, 0), format_bytes(v.get(name, 0))) for v in variants
        )
        rows.append(
            f"<tr class='jv-row-{html.escape(name)}'><td>{swatch}{label}</td>"
            f"<td class='jv-num'>{format_bytes(base)}</td>{cells}</tr>"
        )
    base_ms = results[0].baseline_wall_ns / 1e6
    times = "".join(
        _change_cell(base_ms, r.variant_wall_ns / 1e6, f"{r.variant_wall_ns / 1e6:,.1f} ms")
        for r in results
    )
    rows.append(
        f"<tr class='jv-row-wall'><td>wall time</td><td class='jv-num'>{base_ms:,.1f} ms</td>"
        f"{times}</tr>"
    )
    return (
        "<table class='jv-table jv-compare-table'><caption>Peak, and the most each category "
        "held at once during the run</caption><tr><th></th><th>baseline</th>"
        f"{head}</tr>{''.join(rows)}</table>"
    )


def movers_table(frame: pd.DataFrame, title: str) -> str:
    """Name, baseline, variant and change of the rows that moved most."""
    if frame.empty:
        return f"<p class='jv-label'>No {html.escape(title)} changed.</p>"
    rows = "".join(
        f"<tr><td class='jv-name' title='{html.escape(str(name), quote=True)}'>"
        f"<div class='jv-cut'>{html.escape(str(name))}</div></td>"
        f"<td class='jv-num'>{format_bytes(int(row['baseline_bytes']))}</td>"
        f"<td class='jv-num'>{format_bytes(int(row['variant_bytes']))}</td>"
        + _change_cell(
            int(row["baseline_bytes"]), int(row["variant_bytes"]),
            ("+" if row["change_bytes"] > 0 else "") + format_bytes(int(row["change_bytes"])),
        )
        + "</tr>"
        for name, row in frame.iterrows()
    )  # fmt: skip
    return (
        f"<table class='jv-table jv-compare-table'><caption>{html.escape(title)} that moved "
        "most (most held at once)</caption><tr><th>name</th><th>baseline</th><th>variant</th>"
        "<th>change</th></tr>"
        f"{rows}</table>"
    )


def verdicts_html(results: list[VariantResult]) -> str:
    out = []
    for r in results:
        out.append(f"<div class='jv-verdict'>{html.escape(r.verdict)}</div>")
        out.extend(f"<div class='jv-variant-notes'>{html.escape(n)}</div>" for n in r.notes)
    return f"<div class='jv-verdicts'>{''.join(out)}</div>"


DIFF_LEGEND = (
    "<div class='jv-diff-legend'>Live at each run's peak, module \u2192 op; width: the larger "
    "of the two runs' bytes.<span style='background:#c44e52'></span>grew"
    "<span style='background:#2a7a2a'></span>shrank<span style='background:#9a9a9a'></span>"
    "unchanged (hover a block for both runs' bytes)</div>"
)


class CompareView(w.VBox):  # type: ignore[misc]
    """Verdicts, the side-by-side table, category bars, movers and a diff flame graph of the
    variant picked (the newest by default)."""

    def __init__(self) -> None:
        self.results: list[VariantResult] = []
        self._variants: list[weakref.ref[Profile]] = []
        self.verdicts = w.HTML()
        self.verdicts.add_class("jv-verdicts-box")
        self.table = w.HTML()
        self.table.add_class("jv-compare-summary")
        self.bars = w.VBox(layout=w.Layout(width="100%", max_width="900px"))
        self.bars.add_class("jv-compare-bars")
        self.pick = w.Dropdown(description="variant", layout=w.Layout(width="420px"))
        self.pick.add_class("jv-compare-pick")
        self.movers = w.HTML()
        self.movers.add_class("jv-compare-movers")
        self.source = ColumnDataSource(diff_flame_data(DiffNode("all"))[0])
        self.figure = diff_flame_figure(self.source, 1)
        apply_theme(self.figure)
        self.flame = BokehModel(self.figure, combine_events=True)
        self.flame.add_class("jv-diff-flame")
        self.pick.observe(lambda change: self._show_variant(change["new"]), "value")
        super().__init__(
            [
                w.HTML(STYLE),
                self.verdicts,
                self.table,
                self.bars,
                self.pick,
                self.movers,
                w.HTML(DIFF_LEGEND),
                self.flame,
            ]
        )
        self.add_class("jv-compare-view")

    @property
    def variants(self) -> list[Profile | None]:
        """The variant profiles, oldest first (None where nothing holds one any more)."""
        return [ref() for ref in self._variants]

    def add(self, baseline: Profile, variant: Profile) -> VariantResult:
        """Add a variant's column (and make it the one picked)."""
        result = compare_result(baseline, variant)
        self.results.append(result)
        self._variants.append(weakref.ref(variant))
        _latest_variant[:] = [variant]
        self.verdicts.value = verdicts_html(self.results)
        self.table.value = summary_table(self.results)
        runs = [("base", column(result.by_category, "baseline_bytes"))]
        for i, r in enumerate(self.results):
            runs.append((f"#{i + 1}", column(r.by_category, "variant_bytes")))
        bars = category_bars_figure(runs)
        apply_theme(bars)
        self.bars.children = [BokehModel(bars, combine_events=True)]
        self.pick.options = [(f"#{i + 1}: {r.title}", i) for i, r in enumerate(self.results)]
        self.pick.value = len(self.results) - 1
        self._show_variant(self.pick.value)
        return result

    def _show_variant(self, index: int | None) -> None:
        if index is None:
            return
        r = self.results[index]
        self.movers.value = (
            "<div class='jv-tables'>" + movers_table(r.modules, "modules")
            + movers_table(r.ops, "ops") + "</div>"
        )  # fmt: skip
        data, depth = diff_flame_data(r.diff)
        self.source.data = data
        self.figure.y_range.start = -max(depth, 1)
        self.figure.height = flame_height(depth)

    def text(self) -> str:
        """The verdicts, one line each (the app's text fallback)."""
        return "\n".join(["Reruns:", *(f"  {r.verdict}" for r in self.results)])


def latest_variant() -> Profile | None:
    """The profile of the newest rerun made from an app in this kernel (None before one)."""
    return _latest_variant[0] if _latest_variant else None


def compare_app(baseline: Profile, *variants: Profile) -> CompareView:
    """A comparison of any profiles (e.g. two saved ones): ``jv.show``-able on its own."""
    view = CompareView()
    for v in variants:
        view.add(baseline, v)
    return view
