"""The Compare tab: a baseline next to each of its reruns (variants).

Each rerun adds a column. What the tab shows is computed once, when the variant arrives
(the engine's ``Profile.compare`` numbers and verdict, flame trees merged into a diff tree),
so the tab keeps working after the profiles themselves are gone: an app holds profiles only
weakly (see :mod:`.holder`), and the newest variant of the kernel strongly, like the newest
profile.
"""

from __future__ import annotations

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
from .._render.templating import render
from .._render.theme import apply_theme
from .._units import format_bytes, format_change

if TYPE_CHECKING:
    import pandas as pd

    from .._model import Profile

TITLE = "Compare"
MOVERS = 8  # modules / ops listed per variant
_latest_variant: list[Profile] = []  # the newest variant of the kernel, kept alive
TEMPLATE = "compare_view.html.j2"

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


@dataclass(frozen=True)
class Change:
    """A changed number as its cell shows it: the text with the change, and its colour class
    (``jv-up`` grew, ``jv-down`` shrank)."""

    css: str
    text: str


def _change(base: float, new: float, text: str) -> Change:
    css = "jv-up" if new > base else "jv-down" if new < base else ""
    pct = f" ({format_change(base, new, space='')})" if base or new else ""
    return Change(css, text + pct)


def _change_cell(base: float, new: float, text: str) -> str:
    """A table cell with a change, red when it grew, green when it shrank."""
    return render(TEMPLATE, "change_cell", change=_change(base, new, text))


def column(frame: pd.DataFrame, name: str) -> dict[str, int]:
    """One column of a comparison frame as {row name: bytes}, the peak first."""
    values = {str(k): int(v) for k, v in frame[name].items()}
    return {"peak": values.pop("peak", 0), **values}


@dataclass(frozen=True)
class SummaryRow:
    """A row of the side-by-side table: the baseline's number, each variant's change."""

    name: str  # its class: jv-row-<name>
    label: str
    color: str | None
    baseline: str
    changes: list[Change]


def summary_table(results: list[VariantResult]) -> str:
    """Peak, the most each category held at once, and wall time: the baseline, then each
    variant with its change."""
    baseline = column(results[0].by_category, "baseline_bytes")
    variants = [column(r.by_category, "variant_bytes") for r in results]
    rows = [
        SummaryRow(
            name, name, CATEGORY_COLORS.get(name), format_bytes(base),
            [_change(base, v.get(name, 0), format_bytes(v.get(name, 0))) for v in variants],
        )
        for name, base in baseline.items()
        if base or any(v.get(name, 0) for v in variants)
    ]  # fmt: skip
    base_ms = results[0].baseline_wall_ns / 1e6
    times = [
        _change(base_ms, r.variant_wall_ns / 1e6, f"{r.variant_wall_ns / 1e6:,.1f} ms")
        for r in results
    ]
    rows.append(SummaryRow("wall", "wall time", None, f"{base_ms:,.1f} ms", times))
    return render(TEMPLATE, "summary_table", titles=[r.title for r in results], rows=rows)


def movers_table(frame: pd.DataFrame, title: str) -> str:
    """Name, baseline, variant and change of the rows that moved most."""
    return render(TEMPLATE, "movers_table", title=title, rows=_movers(frame))


def _movers(frame: pd.DataFrame) -> list[tuple[str, int, int, Change]]:
    """(name, baseline, variant, change) of each row of a comparison frame."""
    keys = ("baseline_bytes", "variant_bytes", "change_bytes")
    rows = []
    for name, row in frame.iterrows():
        base, new, change = (int(row[k]) for k in keys)
        sign = "+" if change > 0 else ""
        rows.append((str(name), base, new, _change(base, new, sign + format_bytes(change))))
    return rows


def verdicts_html(results: list[VariantResult]) -> str:
    return render(TEMPLATE, "verdicts", results=results)


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
                w.HTML(render(TEMPLATE, "diff_legend")),
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
        self.movers.value = render(
            TEMPLATE, "movers", modules=_movers(r.modules), ops=_movers(r.ops)
        )
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
