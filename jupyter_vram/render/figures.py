"""Bokeh figures, built from analysis results only (pure: same input, same figure).

What is drawn is bounded whatever the run's size: flame graphs drop nodes too narrow to see
(their bytes stay in their parents), timelines are sampled to a fixed number of points that
keep every local maximum and the peak. Hover texts carry the exact numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, Range1d, TapTool
from bokeh.models.annotations import Legend, LegendItem, Span
from bokeh.models.widgets.tables import DataTable, NumberFormatter, StringFormatter, TableColumn
from bokeh.plotting import figure
from bokeh.transform import stack

from ..analysis.flame import FlameNode
from ..analysis.timeline import Timeline
from ..model import CATEGORIES
from .text import format_bytes

#: One colour per category (colour-blind-safe set), in CATEGORIES order.
CATEGORY_COLORS: dict[str, str] = dict(
    zip(
        CATEGORIES,
        ("#4C72B0", "#8172B3", "#DD8452", "#C44E52", "#937860", "#55A868", "#CCB974", "#8C8C8C"),
        strict=True,
    )
)
PATH_SEP = "\x1f"  # joins a node's path in the data source; never appears in names
MIN_WIDTH = 0.002  # nodes narrower than this fraction of the view are not drawn


def category_mix(by_category: Sequence[int]) -> str:
    """'activation 60% · temporary 40%': the categories behind a node's bytes."""
    total = sum(by_category)
    if not total:
        return "-"
    parts = sorted(
        ((v, c) for c, v in zip(CATEGORIES, by_category, strict=True) if v), reverse=True
    )
    return " · ".join(f"{c} {100 * v / total:.0f}%" for v, c in parts[:4])


def _category_legend(fig: Any) -> None:
    """A legend of every category colour, below the figure (the flame glyph has one renderer
    for all categories, so the swatches are empty renderers of their own)."""
    items = []
    for name, color in CATEGORY_COLORS.items():
        swatch = fig.scatter([np.nan], [np.nan], marker="square", size=10, color=color)
        items.append(LegendItem(label=name, renderers=[swatch]))
    fig.add_layout(
        Legend(items=items, orientation="horizontal", label_text_font_size="9pt",
               spacing=4, margin=0),
        "below",
    )  # fmt: skip


@dataclass(frozen=True)
class FlameLayout:
    """Icicle rectangles for one view of a flame tree (root at the top)."""

    data: dict[str, Any]
    depth: int
    focus: tuple[str, ...]


def flame_layout(
    root: FlameNode, peak_bytes: int, focus: Sequence[str] = (), *, max_nodes: int = 4000
) -> FlameLayout:
    """Lay out the subtree at ``focus`` across the full width, its ancestors as full-width bars
    above it (click one to zoom back out)."""
    cols: dict[str, Any] = {
        k: []
        for k in ("left", "right", "top", "bottom", "name", "path", "bytes", "bytes_h",
                  "pct_peak", "count", "mix", "color", "label")
    }  # fmt: skip
    chain = [root]
    for name in focus:
        child = chain[-1].children.get(name)
        if child is None:
            break
        chain.append(child)
    focus = tuple(n.name for n in chain[1:])

    def add(node: FlameNode, path: tuple[str, ...], left: float, width: float, depth: int) -> None:
        by_cat = node.by_category
        dominant = CATEGORIES[int(np.argmax(by_cat))] if any(by_cat) else "other"
        cols["left"].append(left)
        cols["right"].append(left + width)
        cols["top"].append(-depth)
        cols["bottom"].append(-depth - 1)
        cols["name"].append(node.name)
        cols["path"].append(PATH_SEP.join(path))
        cols["bytes"].append(node.bytes)
        cols["bytes_h"].append(format_bytes(node.bytes))
        cols["pct_peak"].append(f"{100 * node.bytes / peak_bytes:.1f}%" if peak_bytes else "-")
        cols["count"].append(node.count)
        cols["mix"].append(category_mix(by_cat))
        cols["color"].append(CATEGORY_COLORS[dominant])
        cols["label"].append(node.name if width > 0.06 else "")

    for depth, node in enumerate(chain[:-1]):
        add(node, focus[:depth], 0.0, 1.0, depth)
    top = chain[-1]
    base_depth = len(chain) - 1
    max_depth = base_depth
    queue: list[tuple[FlameNode, tuple[str, ...], float, float, int]] = [
        (top, focus, 0.0, 1.0, base_depth)
    ]
    total = top.bytes or 1
    while queue and len(cols["name"]) < max_nodes:
        node, path, left, width, depth = queue.pop(0)  # breadth first: shallow levels first
        add(node, path, left, width, depth)
        max_depth = max(max_depth, depth)
        x = left
        for child in node.sorted_children():
            w = child.bytes / total
            if w < MIN_WIDTH:
                break  # children are sorted: the rest are narrower still
            queue.append((child, (*path, child.name), x, w, depth + 1))
            x += w
    return FlameLayout(cols, max_depth + 1, focus)


def flame_figure(source: ColumnDataSource, depth: int, *, title: str = "") -> Any:
    """The icicle figure over a source filled by :func:`flame_layout`."""
    fig = figure(
        height=max(220, 26 * depth + 90),
        sizing_mode="stretch_width",
        x_range=Range1d(start=0, end=1),
        y_range=Range1d(start=-max(depth, 1), end=0),
        tools="",
        toolbar_location=None,
        title=title,
    )
    quads = fig.quad(
        left="left", right="right", top="top", bottom="bottom", source=source,
        fill_color="color", line_color="white", line_width=1,
        hover_fill_alpha=0.85, hover_line_color="black",
        selection_fill_alpha=1.0, nonselection_fill_alpha=1.0,
    )  # fmt: skip
    fig.text(
        x="left", y="top", text="label", source=source, x_offset=4, y_offset=4,
        text_font_size="9pt", text_baseline="top", text_color="white",
    )  # fmt: skip
    fig.add_tools(
        HoverTool(
            renderers=[quads],
            tooltips=[
                ("name", "@name"),
                ("bytes", "@bytes_h (@bytes{0,0} B)"),
                ("of peak", "@pct_peak"),
                ("allocations", "@count{0,0}"),
                ("categories", "@mix"),
            ],
        ),
        TapTool(renderers=[quads]),
    )
    fig.axis.visible = False
    fig.grid.visible = False
    fig.outline_line_color = None
    _category_legend(fig)
    return fig


def breakdown_figure(breakdown: Mapping[str, int], *, title: str = "At the peak") -> Any:
    """One stacked horizontal bar: the categories live at the peak."""
    total = sum(breakdown.values())
    cats = [c for c in CATEGORIES if breakdown.get(c)]
    data: dict[str, Any] = {"y": ["peak"]}
    for c in cats:
        data[c] = [breakdown[c] / 2**20]
    fig = figure(
        y_range=FactorRange(factors=["peak"]), height=150, sizing_mode="stretch_width", tools="",
        toolbar_location=None, title=f"{title}: {format_bytes(total)}", x_axis_label="MiB",
    )  # fmt: skip
    if cats:
        renderers = fig.hbar_stack(
            cats, y="y", height=0.6, source=ColumnDataSource(data),
            color=[CATEGORY_COLORS[c] for c in cats], legend_label=cats,
        )  # fmt: skip
        for r, c in zip(renderers, cats, strict=True):
            share = 100 * breakdown[c] / total if total else 0
            fig.add_tools(
                HoverTool(
                    renderers=[r], tooltips=[(c, f"{format_bytes(breakdown[c])} ({share:.1f}%)")]
                )
            )
        fig.legend.orientation = "horizontal"
        fig.legend.location = "top_left"
        fig.legend.label_text_font_size = "9pt"
        fig.add_layout(fig.legend[0], "below")
    fig.ygrid.visible = False
    return fig


def timeline_data(timeline: Timeline, max_points: int = 2000) -> dict[str, Any]:
    """Sampled categories-over-time columns: t (ms), one column per category (MiB), total."""
    idx = timeline.sample(max_points)
    by_cat = timeline.by_category(idx)
    base = timeline.baseline_by_category()
    totals = [timeline.baseline_bytes, *timeline.total[idx].tolist()]
    data: dict[str, Any] = {  # a first point at t=0: the baseline, before the first event
        "t": [0.0, *(timeline.time_ns[idx] / 1e6).tolist()],
        "index": [-1, *idx.tolist()],
        "total": [v / 2**20 for v in totals],
        "total_h": [format_bytes(int(v)) for v in totals],
    }
    for i, c in enumerate(CATEGORIES):
        data[c] = [base[i] / 2**20, *(by_cat[:, i] / 2**20).tolist()]
    return data


def timeline_figure(
    source: ColumnDataSource,
    peak_time_ms: float | None,
    *,
    reserved: ColumnDataSource | None = None,
) -> Any:
    """Stacked areas of live bytes per category over the run, the peak marked; clicking a
    point selects that moment (the app shows what was live then)."""
    fig = figure(
        height=300, sizing_mode="stretch_width", tools="xwheel_zoom,xpan,reset",
        toolbar_location="right", x_axis_label="time (ms)", y_axis_label="MiB live",
        title="Live memory by category",
    )  # fmt: skip
    cats = list(CATEGORIES)
    for i, c in enumerate(cats):  # steps, not slopes: memory changes at events, not between
        fig.varea_step(
            x="t", y1=stack(*cats[:i]), y2=stack(*cats[: i + 1]), step_mode="after",
            source=source, color=CATEGORY_COLORS[c], legend_label=c,
        )  # fmt: skip
    points = fig.scatter(
        "t", "total", source=source, size=7, fill_alpha=0.0, line_alpha=0.0,
        selection_fill_alpha=1.0, selection_line_alpha=1.0, selection_color="black",
        nonselection_fill_alpha=0.0, nonselection_line_alpha=0.0,
        hover_fill_alpha=0.6, hover_fill_color="black",
    )  # fmt: skip
    if reserved is not None:
        fig.step("t", "reserved", source=reserved, mode="after", line_color="black",
                 line_dash="dashed", legend_label="reserved")  # fmt: skip
    if peak_time_ms is not None:
        fig.add_layout(Span(location=peak_time_ms, dimension="height", line_color="#C44E52",
                            line_dash="dotted", line_width=2))  # fmt: skip
    fig.add_tools(
        HoverTool(renderers=[points], tooltips=[("t", "@t{0.000} ms"), ("live", "@total_h")],
                  mode="vline", point_policy="snap_to_data"),
        TapTool(renderers=[points]),
    )  # fmt: skip
    fig.legend.orientation = "horizontal"
    fig.legend.label_text_font_size = "8pt"
    fig.add_layout(fig.legend[0], "below")
    return fig


def table_source(frame: Any) -> ColumnDataSource:
    """A DataTable source from a pandas frame (columns kept as they are)."""
    return ColumnDataSource({str(c): list(frame[c]) for c in frame.columns})


def sites_table(source: ColumnDataSource) -> DataTable:
    """Top allocation sites: sortable by any column (click a header)."""
    nums = NumberFormatter(format="0,0")
    columns = [
        TableColumn(field="site", title="site", formatter=StringFormatter(), width=260),
        TableColumn(field="op", title="op", width=110),
        TableColumn(field="live_at_peak_bytes", title="live at peak (B)", formatter=nums),
        TableColumn(field="allocated_bytes", title="allocated (B)", formatter=nums),
        TableColumn(field="allocations", title="count", formatter=nums, width=60),
        TableColumn(field="largest_bytes", title="largest (B)", formatter=nums),
        TableColumn(field="category", title="category", width=110),
    ]
    return DataTable(source=source, columns=columns, sortable=True, index_position=None,
                     sizing_mode="stretch_width", height=360)  # fmt: skip


def flame_tap_zoom(source: ColumnDataSource, fig: Any) -> None:
    """Standalone (no kernel) zoom: clicking a node narrows the x range to it."""
    from bokeh.models import CustomJS, ResetTool

    source.selected.js_on_change(
        "indices",
        CustomJS(
            args={"source": source, "xr": fig.x_range},
            code="""
            const i = source.selected.indices[0];
            if (i === undefined) return;
            xr.start = source.data.left[i]; xr.end = source.data.right[i];
            """,
        ),
    )
    fig.add_tools(ResetTool())
    fig.toolbar_location = "right"


def report_panels(profile: Any) -> list[tuple[str, Any]]:
    """(title, bokeh layout) pairs of the standalone report, one per app tab."""
    from bokeh.layouts import column

    from ..analysis.flame import flame_tree
    from ..analysis.tables import top_sites

    panels: list[tuple[str, Any]] = []
    flames = []
    for hierarchy, label in (("module", "module → op"), ("stack", "Python stack")):
        for mode, mode_label in (("peak", "live at peak"), ("cumulative", "cumulative allocated")):
            tree = flame_tree(profile, hierarchy, mode)  # type: ignore[arg-type]
            layout = flame_layout(tree, profile.peak_bytes)
            src = ColumnDataSource(layout.data)
            fig = flame_figure(src, layout.depth, title=f"{label}, {mode_label}")
            flame_tap_zoom(src, fig)
            flames.append(fig)
    panels.append(("Flame graphs", column(flames, sizing_mode="stretch_width")))
    t = profile.timeline
    peak_ms = float(t.time_ns[t.peak_index] / 1e6) if t.peak_index >= 0 else None
    panels.append(
        (
            "Breakdown",
            column(
                breakdown_figure(profile.peak_breakdown()),
                timeline_figure(ColumnDataSource(timeline_data(t)), peak_ms),
                sizing_mode="stretch_width",
            ),
        )
    )
    panels.append(("Top sites", sites_table(table_source(top_sites(profile, limit=200)))))
    return panels
