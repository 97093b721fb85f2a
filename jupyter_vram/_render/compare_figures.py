"""Figures of a comparison: per-category bars of a baseline and its variants, and a diff
flame graph (blocks coloured by how much they grew or shrank).

Pure functions of analysis results (flame trees, per-category bytes), like :mod:`.figures`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bokeh.models import ColumnDataSource, DataRange1d, FactorRange, HoverTool
from bokeh.plotting import figure

from .._analysis.flame import FlameNode
from .._model import CATEGORIES
from .._units import format_bytes, format_change
from .figures import (
    CATEGORY_COLORS,
    CRUMB_SEP,
    MIN_WIDTH,
    PATH_SEP,
    ROOT_COLOR,
    byte_unit,
    fit_label,
    icicle_figure,
)

GROW = (0xC4, 0x4E, 0x52)  # the error red of the app's "up" numbers
SHRINK = (0x2A, 0x7A, 0x2A)  # the success green of its "down" numbers
SAME = (0x9A, 0x9A, 0x9A)  # unchanged: neutral grey, readable on light and dark pages


@dataclass
class DiffNode:
    """A block of the merged tree: its bytes in the baseline and in the variant (children
    included), and ``size``, the width it is drawn with: the larger of the two, and never
    less than its children together (so children always fit inside their parent)."""

    name: str
    baseline: int = 0
    variant: int = 0
    size: int = 0
    children: dict[str, DiffNode] = field(default_factory=dict)

    @property
    def change(self) -> int:
        return self.variant - self.baseline


def diff_tree(baseline: FlameNode, variant: FlameNode) -> DiffNode:
    """Merge two flame trees by path; a block present in one run only has 0 in the other."""

    def merge(name: str, a: FlameNode | None, b: FlameNode | None) -> DiffNode:
        node = DiffNode(name, a.bytes if a else 0, b.bytes if b else 0)
        names = dict.fromkeys([*(a.children if a else {}), *(b.children if b else {})])
        for child in names:
            node.children[child] = merge(
                child,
                a.children.get(child) if a else None,
                b.children.get(child) if b else None,
            )
        inner = sum(c.size for c in node.children.values())
        node.size = max(node.baseline, node.variant, inner)
        return node

    return merge(baseline.name, baseline, variant)


def change_color(baseline: int, variant: int) -> str:
    """Red for growth, green for shrinkage, grey when unchanged; the stronger the colour, the
    larger the change relative to the block (a block new in the variant is full red)."""
    top = max(baseline, variant)
    ratio = (variant - baseline) / top if top else 0.0
    end = GROW if ratio > 0 else SHRINK
    t = min(abs(ratio), 1.0) ** 0.6  # small changes still visibly tinted
    rgb = (round(s + (e - s) * t) for s, e in zip(SAME, end, strict=True))
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def change_text(baseline: int, variant: int) -> str:
    """'+12.0 MiB (+35.2%)', '+1.2 MiB (63,616x)', 'new in the variant', 'gone in the
    variant', 'unchanged'."""
    if baseline == variant:
        return "unchanged"
    if not baseline:
        return f"+{format_bytes(variant)} (new in the variant)"
    if not variant:
        return f"-{format_bytes(baseline)} (gone in the variant)"
    diff = variant - baseline
    sign = "+" if diff > 0 else ""
    return f"{sign}{format_bytes(diff)} ({format_change(baseline, variant, space='')})"


DIFF_COLUMNS = ("left", "right", "top", "bottom", "name", "path", "full", "baseline_h",
                "variant_h", "change_h", "color", "label")  # fmt: skip


def diff_flame_data(root: DiffNode, *, max_nodes: int = 3000) -> tuple[dict[str, Any], int]:
    """Icicle rectangles of the merged tree (root on top, widths by ``size``), and its depth.
    Blocks narrower than the figures' minimum width are left out (their bytes stay in the
    parent), as in the flame graph."""
    cols: dict[str, list[Any]] = {k: [] for k in DIFF_COLUMNS}
    total = root.size or 1
    depth_max = 0
    queue: list[tuple[DiffNode, tuple[str, ...], float, float, int]] = [(root, (), 0.0, 1.0, 0)]
    while queue and len(cols["name"]) < max_nodes:
        node, path, left, width, depth = queue.pop(0)  # breadth first: shallow levels first
        depth_max = max(depth_max, depth)
        cols["left"].append(left)
        cols["right"].append(left + width)
        cols["top"].append(-depth)
        cols["bottom"].append(-depth - 1)
        cols["name"].append(node.name)
        cols["path"].append(PATH_SEP.join(path))
        cols["full"].append(CRUMB_SEP.join([root.name, *path]))
        cols["baseline_h"].append(format_bytes(node.baseline))
        cols["variant_h"].append(format_bytes(node.variant))
        cols["change_h"].append(change_text(node.baseline, node.variant))
        cols["color"].append(
            ROOT_COLOR if not path and node.baseline == node.variant
            else change_color(node.baseline, node.variant)
        )  # fmt: skip
        cols["label"].append(fit_label(node.name, width))
        x = left
        for child in sorted(node.children.values(), key=lambda c: -c.size):
            w = child.size / total
            if w < MIN_WIDTH:
                break  # sorted: the rest are narrower still
            queue.append((child, (*path, child.name), x, w, depth + 1))
            x += w
    return cols, depth_max + 1


def diff_flame_figure(source: ColumnDataSource, depth: int, *, title: str = "") -> Any:
    """The diff icicle over a source filled by :func:`diff_flame_data`: hover a block for its
    bytes in both runs and the change."""
    tooltips = [
        ("block", "@full"),
        ("baseline", "@baseline_h"),
        ("variant", "@variant_h"),
        ("change", "@change_h"),
    ]
    return icicle_figure(source, depth, tooltips, title=title)


def category_bars_figure(runs: Sequence[tuple[str, Mapping[str, int]]]) -> Any:
    """Grouped bars: for the peak and each category, one bar per run, baseline first.
    ``runs``: (short name drawn under the bar, {"peak" and category -> bytes}); hover a bar
    for its bytes. Bars take the category's colour; the baseline's are paler."""
    rows = ["peak", *(c for c in CATEGORIES if any(r.get(c) for _, r in runs))]
    top = max((int(r.get(k, 0)) for _, r in runs for k in rows), default=0)
    unit, per = byte_unit(top)
    data: dict[str, Any] = {k: [] for k in ("x", "value", "color", "alpha", "text", "run")}
    for row in rows:
        for i, (name, values) in enumerate(runs):
            n = int(values.get(row, 0))
            data["x"].append((row, name))
            data["value"].append(n / per)
            data["color"].append(ROOT_COLOR if row == "peak" else CATEGORY_COLORS[row])
            data["alpha"].append(0.45 if i == 0 and len(runs) > 1 else 1.0)
            data["text"].append(format_bytes(n))
            data["run"].append(f"{row}, {name}")
    fig = figure(
        x_range=FactorRange(factors=list(data["x"]), group_padding=1.0, factor_padding=0.1),
        height=260, sizing_mode="stretch_width", tools="", toolbar_location=None,
        y_range=DataRange1d(start=0), y_axis_label=unit, min_border_left=40,
        title="Peak, and the most each category held at once",
    )  # fmt: skip
    bars = fig.vbar(
        x="x", top="value", width=0.85, source=ColumnDataSource(data),
        fill_color="color", fill_alpha="alpha", line_color=None,
    )  # fmt: skip
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[("", "@run"), ("bytes", "@text")]))
    fig.xgrid.visible = False
    fig.xaxis.major_label_text_font_size = "8pt"
    return fig
