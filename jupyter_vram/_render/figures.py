"""Bokeh figures, built from analysis results only (pure: same input, same figure).

What is drawn is bounded whatever the run's size: flame graphs drop nodes too narrow to see
(their bytes stay in their parents), timelines are sampled to a fixed number of points that
keep every local maximum and the peak. Hover texts carry the exact numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from bokeh.models import (
    ColumnDataSource,
    FactorRange,
    HoverTool,
    Plot,
    Quad,
    Range1d,
    Scatter,
    TapTool,
    Text,
)
from bokeh.models.annotations import Label, Legend, LegendItem, Span, Title
from bokeh.models.widgets.tables import DataTable, NumberFormatter, StringFormatter, TableColumn
from bokeh.plotting import figure
from bokeh.transform import stack

from .._analysis.flame import FlameNode, icicle_layout
from .._model import CATEGORIES, Timeline
from .._units import format_bytes
from .text import format_moment

#: One colour per category (colour-blind-safe set), in CATEGORIES order.
CATEGORY_COLORS: dict[str, str] = dict(
    zip(
        CATEGORIES,
        (
            "#4C72B0",
            "#A1C9F4",
            "#64B5CD",
            "#8172B3",
            "#DD8452",
            "#C44E52",
            "#937860",
            "#55A868",
            "#DA8BC3",
            "#CCB974",
            "#8C8C8C",
        ),
        strict=True,
    )
)
PATH_SEP = "\x1f"  # joins a node's path in the data source; never appears in names
NUMERIC_FLAME_COLUMNS = ("left", "right", "top", "bottom", "bytes", "count")
MIN_WIDTH = 0.002  # nodes narrower than this fraction of the view are not drawn
BLOCK_LINE = "rgba(128,128,128,0.35)"  # block outlines: visible on light and dark pages


def category_mix(by_category: Sequence[int]) -> str:
    """'activation 60% · temporary 40%': the categories behind a node's bytes."""
    total = sum(by_category)
    if not total:
        return "-"
    parts = sorted(
        ((v, c) for c, v in zip(CATEGORIES, by_category, strict=True) if v), reverse=True
    )
    return " · ".join(f"{c} {100 * v / total:.0f}%" for v, c in parts[:4])


def _category_legend(fig: Plot) -> None:
    """A legend of every category colour, below the figure (the flame glyph has one renderer
    for all categories, so the swatches are empty renderers of their own)."""
    nowhere = ColumnDataSource({"x": [np.nan], "y": [np.nan]})
    items = []
    for name, color in CATEGORY_COLORS.items():
        square = Scatter(x="x", y="y", marker="square", size=10, fill_color=color,
                         line_color=color)  # fmt: skip
        swatch: list[Any] = [fig.add_glyph(nowhere, square)]
        items.append(LegendItem(label=name, renderers=swatch))
    fig.add_layout(
        Legend(items=items, orientation="horizontal", label_text_font_size="9pt",
               spacing=4, margin=0, nrows=2),
        "below",
    )  # fmt: skip


@dataclass(frozen=True)
class FlameLayout:
    """Icicle rectangles for one view of a flame tree (root at the top)."""

    data: dict[str, Any]
    depth: int
    focus: tuple[str, ...]


ROOT_COLOR = "#6b7785"  # the root is all categories at once: a neutral slate, not a category
CRUMB_SEP = " \u203a "
LABEL_PX = 560  # plot width labels are fitted to: a 1024 px window with the file browser open
CHAR_PX = 7.0  # width of one character of a 9pt label


def share_of_peak(n: int, peak_bytes: int, cumulative: bool = False) -> str:
    """'40.0%'; for cumulative bytes (every allocation of the run, freed ones included) the
    share says so, since it passes 100% whenever memory is freed and allocated again."""
    if not peak_bytes:
        return "-"
    pct = f"{100 * n / peak_bytes:.1f}%"
    return f"{pct} (allocated over the run, freed bytes counted again)" if cumulative else pct


def fit_label(name: str, width: float, plot_px: float = LABEL_PX) -> str:
    """``name`` as much as fits in a block ``width`` (fraction of the plot) wide: whole, cut
    with an ellipsis, or nothing when not even three characters fit."""
    room = int((width * plot_px - 8) / CHAR_PX)
    if len(name) <= room:
        return name
    return name[: room - 1] + "\u2026" if room >= 3 else ""


def flame_layout(
    root: FlameNode,
    peak_bytes: int,
    focus: Sequence[str] = (),
    *,
    max_nodes: int = 4000,
    display: Callable[[tuple[str, ...]], str] | None = None,
    cumulative: bool = False,
) -> FlameLayout:
    """Lay out the subtree at ``focus`` across the full width, its ancestors as full-width bars
    above it (click one to zoom back out). ``display`` names a node from its path (e.g. a
    Sequential child "3" as "3: Conv2d"); by default its own name. ``cumulative``: the tree
    counts every allocation of the run, so shares of the peak can pass 100% (and say why)."""
    cols: dict[str, Any] = {
        k: []
        for k in ("left", "right", "top", "bottom", "name", "path", "full", "bytes", "bytes_h",
                  "pct_peak", "count", "mix", "color", "label")
    }  # fmt: skip
    chain = [root]
    for name in focus:
        child = chain[-1].children.get(name)
        if child is None:
            break
        chain.append(child)
    focus = tuple(n.name for n in chain[1:])

    def show(path: tuple[str, ...]) -> str:
        if not path:
            return root.name
        return display(path) if display is not None else path[-1]

    def add(node: FlameNode, path: tuple[str, ...], left: float, width: float, depth: int) -> None:
        by_cat = node.by_category
        # the first largest category, as numpy's argmax picks it
        dominant = CATEGORIES[by_cat.index(max(by_cat))] if any(by_cat) else "other"
        shown = show(path)
        cols["left"].append(left)
        cols["right"].append(left + width)
        cols["top"].append(-depth)
        cols["bottom"].append(-depth - 1)
        cols["name"].append(shown)
        cols["path"].append(PATH_SEP.join(path))
        cols["full"].append(
            CRUMB_SEP.join([root.name, *(show(path[: i + 1]) for i in range(len(path)))])
        )
        cols["bytes"].append(node.bytes)
        cols["bytes_h"].append(format_bytes(node.bytes))
        cols["pct_peak"].append(share_of_peak(node.bytes, peak_bytes, cumulative))
        cols["count"].append(node.count)
        cols["mix"].append(category_mix(by_cat))
        cols["color"].append(ROOT_COLOR if not path else CATEGORY_COLORS[dominant])
        cols["label"].append(fit_label(shown, width))

    for depth, node in enumerate(chain[:-1]):
        add(node, focus[:depth], 0.0, 1.0, depth)
    base_depth = len(chain) - 1
    nodes, paths, parents = _visible_subtree(chain[-1], focus, max_nodes - base_depth)
    rects = icicle_layout(parents, [node.bytes for node in nodes])
    for i, node in enumerate(nodes):
        add(node, paths[i], rects.x[i], rects.width[i], base_depth + rects.depth[i])
    for name in NUMERIC_FLAME_COLUMNS:  # sent as one binary buffer each, not item by item
        cols[name] = np.asarray(cols[name])
    return FlameLayout(cols, base_depth + max(rects.depth) + 1, focus)


def _visible_subtree(
    top: FlameNode, path: tuple[str, ...], max_nodes: int
) -> tuple[list[FlameNode], list[tuple[str, ...]], list[int]]:
    """``top`` and the nodes under it at least MIN_WIDTH of it wide, breadth first (shallow
    levels first) and at most ``max_nodes``: the nodes, their paths and their parents'
    indices, as columns for :func:`icicle_layout`."""
    nodes = [top]
    paths = [path]
    parents = [-1]
    total = top.bytes or 1
    head = 0
    while head < len(nodes) and len(nodes) < max_nodes:
        for child in nodes[head].sorted_children():
            if child.bytes / total < MIN_WIDTH or len(nodes) >= max_nodes:
                break  # children are sorted: the rest are narrower still
            nodes.append(child)
            paths.append((*paths[head], child.name))
            parents.append(head)
        head += 1
    return nodes, paths, parents


def flame_height(depth: int) -> int:
    return max(200, 26 * depth + 40)


def flame_figure(
    source: ColumnDataSource, depth: int, *, title: str = "", legend: bool = False
) -> Plot:
    """The icicle figure over a source filled by :func:`flame_layout`. The app shows the
    category legend as HTML beside it; ``legend=True`` draws one in the figure (the report)."""
    fig = icicle_figure(
        source,
        depth,
        [
            ("block", "@full"),
            ("bytes", "@bytes_h (@bytes{0,0} B)"),
            ("of peak", "@pct_peak"),
            ("allocations", "@count{0,0}"),
            ("categories", "@mix"),
        ],
        title=title,
        extra_height=60 if legend else 0,
    )
    if legend:
        _category_legend(fig)
    return fig


def icicle_figure(
    source: ColumnDataSource,
    depth: int,
    tooltips: list[tuple[str, str]],
    *,
    title: str = "",
    extra_height: int = 0,
) -> Plot:
    """An icicle of labelled blocks (columns left, right, top, bottom, color, label) with
    ``tooltips`` on hover: the flame graph and the comparison's diff flame graph.

    A bare :class:`Plot`, not a ``figure``: no axes, grids or tools are shown, and every
    model a figure adds anyway (axes, tickers, formatters, grids, a selected and a
    nonselected copy of each glyph) is serialised to the page when the app first shows,
    which costs about twice as long. The renderers draw selected and nonselected blocks as
    the blocks themselves (a click zooms, it does not fade the others)."""
    fig = Plot(
        height=flame_height(depth) + extra_height,
        sizing_mode="stretch_width",
        x_range=Range1d(start=0, end=1),
        y_range=Range1d(start=-max(depth, 1), end=0),
        toolbar_location=None,
        title=Title(text=title) if title else None,
        min_border=2,
        outline_line_color=None,
    )
    block: dict[str, Any] = {"left": "left", "right": "right", "top": "top", "bottom": "bottom",
             "fill_color": "color", "line_width": 1}  # fmt: skip
    quads = fig.add_glyph(
        source,
        Quad(**block, line_color=BLOCK_LINE),
        hover_glyph=Quad(**block, line_color="black", fill_alpha=0.85),
        selection_glyph=None,
        nonselection_glyph=None,
    )
    fig.add_glyph(
        source,
        Text(x="left", y="top", text="label", x_offset=4, y_offset=5, text_font_size="9pt",
             text_baseline="top", text_color="white"),
        selection_glyph=None,
        nonselection_glyph=None,
    )  # fmt: skip
    fig.add_tools(HoverTool(renderers=[quads], tooltips=tooltips))
    return fig


def breakdown_figure(
    breakdown: Mapping[str, int], *, title: str = "At the peak", legend: bool = False
) -> Any:
    """One stacked horizontal bar: the categories live at the peak (hover a part for its
    bytes and share). The app shows the legend as HTML; ``legend=True`` draws one in it."""
    total = sum(breakdown.values())
    cats = [c for c in CATEGORIES if breakdown.get(c)]
    unit, per = byte_unit(total)
    data: dict[str, Any] = {"y": ["peak"]}
    for c in cats:
        data[c] = [breakdown[c] / per]
    fig = figure(
        y_range=FactorRange(factors=["peak"]), height=130 + (50 if legend else 0),
        sizing_mode="stretch_width", tools="", toolbar_location=None,
        title=f"{title}: {format_bytes(total)}", x_axis_label=unit, min_border_left=10,
    )  # fmt: skip
    if cats:
        renderers = fig.hbar_stack(
            cats, y="y", height=0.6, source=ColumnDataSource(data),
            color=[CATEGORY_COLORS[c] for c in cats],
            **({"legend_label": cats} if legend else {}),
        )  # fmt: skip
        for r, c in zip(renderers, cats, strict=True):
            share = 100 * breakdown[c] / total if total else 0
            fig.add_tools(
                HoverTool(
                    renderers=[r], tooltips=[(c, f"{format_bytes(breakdown[c])} ({share:.1f}%)")]
                )
            )
        if legend:
            fig.legend.orientation = "horizontal"
            fig.legend.label_text_font_size = "9pt"
            fig.legend.nrows = 2
            fig.add_layout(fig.legend[0], "below")
    fig.ygrid.visible = False
    fig.yaxis.visible = False
    return fig


def byte_unit(peak_bytes: int) -> tuple[str, float]:
    """The unit a chart of bytes up to ``peak_bytes`` reads best in: (name, bytes per unit)."""
    return ("GiB", 2.0**30) if peak_bytes >= 2**30 else ("MiB", 2.0**20)


def timeline_data(
    timeline: Timeline,
    *,
    axis: Literal["time", "event"] = "time",
    buckets: int = 600,
    start: float | None = None,
    end: float | None = None,
) -> dict[str, Any]:
    """Columns of the timeline chart, one row per drawn step (see ``Timeline.bucket_peaks``):
    x, x_end (the step's right edge), index (the event whose state is drawn), when (that
    event, for tooltips), total and one column per category in the chart's unit, and their
    texts. Each pixel-wide slice is drawn at its highest level, so the chart reaches the peak
    however short it was."""
    x, idx = timeline.bucket_peaks(buckets, axis=axis, start=start, end=end)
    by_cat = timeline.by_category(idx)
    totals = np.where(idx >= 0, timeline.total[np.maximum(idx, 0)] if len(timeline) else 0,
                      timeline.baseline_bytes)  # fmt: skip
    _, per = byte_unit(timeline.peak_bytes)
    times = np.where(idx >= 0, timeline.time_ns[np.maximum(idx, 0)] if len(timeline) else 0, 0)
    data: dict[str, Any] = {
        "x": x.tolist(),
        "x_end": [*x[1:].tolist(), float(x[-1])],
        "index": idx.tolist(),
        "when": [format_moment(t, i) for i, t in zip(idx.tolist(), times.tolist(), strict=True)],
        "total": (totals / per).tolist(),
        "total_h": [format_bytes(int(v)) for v in totals.tolist()],
    }
    for i, c in enumerate(CATEGORIES):
        data[c] = (by_cat[:, i] / per).tolist()
    data["breakdown"] = [
        "".join(
            f"<div class='jv-cat-{c}'><span style='color:{CATEGORY_COLORS[c]}'>\u25a0</span> {c}: "
            f"{format_bytes(int(v))}</div>"
            for c, v in zip(CATEGORIES, row, strict=True)
            if v
        )
        for row in by_cat.tolist()
    ]
    return data


def _legend_label(label: str, legend: bool) -> dict[str, Any]:
    return {"legend_label": label} if legend else {}


def timeline_figure(
    source: ColumnDataSource,
    peak: tuple[float, int] | None,
    *,
    peak_bytes: int,
    axis: Literal["time", "event"] = "time",
    reserved: bool = False,
    legend: bool = False,
) -> Any:
    """Stacked areas of live bytes per category over the run, the peak marked and labelled.

    Every step of the chart is also a transparent column from the floor to the top, so
    hovering anywhere shows that moment's categories and a click anywhere selects it (the app
    shows what was live then). ``peak``: (x of the peak, peak bytes)."""
    unit, per = byte_unit(peak_bytes)
    top = max(peak_bytes / per, 1e-9) * 1.15
    data = source.data
    x_end = float(data["x_end"][-1]) if len(data.get("x_end", [])) else 1.0
    x_end = x_end if x_end > 0 else 1.0
    fig = figure(
        height=300, sizing_mode="stretch_width", tools="xwheel_zoom,xpan,reset",
        toolbar_location="right", y_range=Range1d(start=0, end=top), min_border_left=50,
        x_range=Range1d(start=0, end=x_end, bounds=(0, x_end)),
        x_axis_label="time since the cell started (ms)" if axis == "time"
        else "allocation / free event #",
        y_axis_label=f"{unit} live",
        title="Live memory by category (each pixel: its highest moment)",
    )  # fmt: skip
    cats = list(CATEGORIES)
    for i, c in enumerate(cats):  # steps, not slopes: memory changes at events, not between
        fig.varea_step(
            x="x", y1=stack(*cats[:i]), y2=stack(*cats[: i + 1]), step_mode="after",
            source=source, color=CATEGORY_COLORS[c], **_legend_label(c, legend),
        )  # fmt: skip
    if reserved:
        fig.step("x", "reserved", source=source, mode="after", line_color="#888888",
                 line_dash="dashed", **_legend_label("reserved", legend))  # fmt: skip
    columns = fig.quad(
        left="x", right="x_end", bottom=0, top=top, source=source,
        fill_alpha=0.0, line_alpha=0.0, hover_fill_color="#888888", hover_fill_alpha=0.25,
        selection_fill_alpha=0.0, nonselection_fill_alpha=0.0, nonselection_line_alpha=0.0,
        selection_line_alpha=0.0,
    )  # fmt: skip
    if peak is not None:
        x, peak_b = peak
        right = x > 0.6 * x_end  # label on the side of the line with room
        fig.add_layout(Span(location=x, dimension="height", line_color="#C44E52",
                            line_dash="dotted", line_width=2))  # fmt: skip
        fig.add_layout(
            Label(x=x, y=peak_b / per, text=f"peak {format_bytes(peak_b)}",
                  x_offset=-4 if right else 4, text_align="right" if right else "left",
                  y_offset=2, text_font_size="9pt", text_color="#C44E52",
                  text_font_style="bold", name="jv-peak-label")
        )  # fmt: skip
    fig.add_tools(
        HoverTool(renderers=[columns], tooltips="<div class='jv-tip-when'><b>@when</b></div>"
                  "<div class='jv-tip-live'>live: <b>@total_h</b></div>@breakdown{safe}",
                  point_policy="follow_mouse"),
    )  # fmt: skip
    if legend:
        fig.legend.orientation = "horizontal"
        fig.legend.label_text_font_size = "8pt"
        fig.legend.nrows = 2
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
    fig.add_tools(ResetTool(), TapTool(renderers=fig.renderers[:1]))  # the blocks
    fig.toolbar_location = "right"


def report_panels(profile: Any) -> list[tuple[str, Any]]:
    """(title, bokeh layout) pairs of the standalone report, one per app tab."""
    from bokeh.layouts import column

    from .._analysis.flame import flame_tree
    from .._analysis.tables import top_sites

    panels: list[tuple[str, Any]] = []
    flames = []
    for hierarchy, label in (("module", "module → op"), ("stack", "Python stack")):
        for mode, mode_label in (("peak", "live at peak"), ("cumulative", "cumulative allocated")):
            tree = flame_tree(profile, hierarchy, mode)  # type: ignore[arg-type]
            layout = flame_layout(tree, profile.peak_bytes, cumulative=mode == "cumulative")
            src = ColumnDataSource(layout.data)
            fig = flame_figure(src, layout.depth, title=f"{label}, {mode_label}", legend=True)
            flame_tap_zoom(src, fig)
            flames.append(fig)
    panels.append(("Flame graphs", column(flames, sizing_mode="stretch_width")))
    t = profile.timeline
    x_peak = t.peak_x()
    peak = (x_peak, t.peak_bytes) if x_peak is not None else None
    chart = timeline_figure(
        ColumnDataSource(timeline_data(t)), peak, peak_bytes=t.peak_bytes, legend=True
    )
    panels.append(
        (
            "Breakdown",
            column(
                breakdown_figure(profile.peak_breakdown(), legend=True),
                chart,
                sizing_mode="stretch_width",
            ),
        )
    )
    panels.append(("Top sites", sites_table(table_source(top_sites(profile, limit=200)))))
    return panels
