"""Inline SVG for the static report: the flame graph, the category bar, the timeline.

No script and no stylesheet needed: every colour and size is an SVG attribute, so the drawing
survives renderers that drop ``<style>`` (GitHub) and pages without JavaScript (nbconvert,
nbviewer). Block positions are percentages of the drawing's width, so the SVG fills whatever
width the page gives it while labels keep their pixel size; each block is its own nested
``<svg>``, which clips its label. Hover a block for its ``<title>``: path, bytes, share.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._analysis.flame import saved_flame_layout
from .._units import format_bytes
from .figures import BLOCK_LINE, CRUMB_SEP, ROOT_COLOR, fit_label

ROW_PX = 20  # height of one flame level
FONT = "font-family='-apple-system,BlinkMacSystemFont,Segoe UI,Helvetica,Arial,sans-serif'"
SVG_MIN_SHARE = 0.003  # blocks narrower than this share of the peak are left out of the SVG
SVG_MAX_BLOCKS = 300  # and at most this many (the largest) are drawn
LABEL_WIDTH_PX = 900  # labels are cut to fit a drawing this wide (the SVG clips them too)


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.3f}".rstrip("0").rstrip(".") + "%"


def display_name(name: str, kind: str) -> str:
    """A numbered child of a Sequential / ModuleList reads '3: Linear'; others keep their name."""
    return f"{name}: {kind}" if kind and name.isdigit() else name


def flame_svg(
    flame: Mapping[str, Any],
    categories: Sequence[str],
    colors: Sequence[str],
    peak_bytes: int,
    *,
    min_share: float = SVG_MIN_SHARE,
    max_blocks: int = SVG_MAX_BLOCKS,
) -> str:
    """The icicle graph of a saved profile's ``flame`` columns (root on top, children left to
    right, largest first; widths proportional to bytes)."""
    names: list[str] = flame["name"]
    parents: list[int] = flame["parent"]
    sizes: list[int] = flame["bytes"]
    kinds: list[str] = flame.get("type") or [""] * len(names)
    if not names or sizes[0] <= 0:
        return "<p class='jvs-none'>Nothing was live at the peak.</p>"
    total = sizes[0]
    # keep the largest blocks; a parent is never smaller than its child, so ties broken by
    # order (parents come first) keep a tree
    wanted = [i for i in range(len(names)) if i == 0 or sizes[i] >= min_share * total]
    keep = set(sorted(wanted, key=lambda i: (-sizes[i], i))[:max_blocks])
    layout = saved_flame_layout(flame)
    full: list[str] = [""] * len(names)
    blocks: list[str] = []
    max_depth = 0
    for i, name in enumerate(names):
        shown = display_name(name, kinds[i])
        p = parents[i]
        full[i] = f"{full[p]}{CRUMB_SEP}{shown}" if p >= 0 else shown
        if i not in keep:
            continue
        depth, width = layout.depth[i], layout.width[i]
        max_depth = max(max_depth, depth)
        mix = " · ".join(
            f"{categories[c]} {100 * b / sizes[i]:.0f}%" for c, b in flame["mix"][i] if sizes[i]
        )
        tip = (
            f"{full[i]}\n{format_bytes(sizes[i])} ({sizes[i]:,} B) · "
            f"{100 * sizes[i] / peak_bytes if peak_bytes else 0:.1f}% of the peak · "
            f"{flame['count'][i]:,} allocations" + (f"\n{mix}" if mix else "")
        )
        label = f"{shown} · peak {format_bytes(sizes[i])}" if p < 0 else shown
        text = fit_label(label, width, LABEL_WIDTH_PX)
        color = ROOT_COLOR if p < 0 else colors[flame["category"][i]]
        blocks.append(
            f"<svg class='jvs-block' x='{_pct(layout.x[i])}' y='{depth * ROW_PX}' "
            f"width='{_pct(width)}' height='{ROW_PX - 1}' data-bytes='{sizes[i]}'>"
            f"<title>{html.escape(tip)}</title>"
            f"<rect width='100%' height='100%' fill='{color}' stroke='{BLOCK_LINE}'/>"
            + (f"<text x='4' y='14'>{html.escape(text)}</text>" if text else "")
            + "</svg>"
        )
    height = (max_depth + 1) * ROW_PX
    dropped = len(names) - len(keep) + int(flame.get("dropped", 0))
    note = f" ({dropped:,} smaller blocks not drawn)" if dropped else ""
    return (
        f"<svg class='jvs-flame' width='100%' height='{height}' role='img' "
        f"aria-label='flame graph of the memory live at the peak{note}' {FONT} font-size='11' "
        f"fill='#fff' xmlns='http://www.w3.org/2000/svg'>{''.join(blocks)}</svg>"
    )


def category_bar_svg(
    breakdown: Sequence[int], categories: Sequence[str], colors: Sequence[str]
) -> str:
    """One stacked bar of the bytes per category at the peak (hover a part for its bytes)."""
    total = sum(breakdown)
    if total <= 0:
        return ""
    parts = []
    x = 0.0
    for name, color, size in zip(categories, colors, breakdown, strict=True):
        if size <= 0:
            continue
        share = size / total
        label = f"{name} {100 * share:.0f}%"
        text = fit_label(label, share, LABEL_WIDTH_PX)
        parts.append(
            f"<svg class='jvs-part' x='{_pct(x)}' y='0' width='{_pct(share)}' height='22'>"
            f"<title>{html.escape(name)}: {format_bytes(size)} ({size:,} B, "
            f"{100 * share:.1f}% of the peak)</title>"
            f"<rect width='100%' height='100%' fill='{color}'/>"
            + (f"<text x='4' y='15'>{html.escape(text)}</text>" if text else "")
            + "</svg>"
        )
        x += share
    return (
        f"<svg class='jvs-bar' width='100%' height='22' role='img' aria-label='bytes per "
        f"category at the peak' {FONT} font-size='11' fill='#fff' "
        f"xmlns='http://www.w3.org/2000/svg'>{''.join(parts)}</svg>"
    )


def timeline_svg(timeline: Mapping[str, Any], peak_bytes: int, peak_x: float | None) -> str:
    """Live bytes over the run as one step area (each step: its slice's highest moment), the
    peak marked. Drawn in a 1000 x 100 box stretched to the width (no text inside)."""
    xs: list[float] = timeline["x"]
    totals: list[int] = timeline["total"]
    if len(xs) < 2 or peak_bytes <= 0 or xs[-1] <= xs[0]:
        return ""
    span = xs[-1] - xs[0]

    def px(x: Sequence[float]) -> npt.NDArray[np.float64]:
        return np.round(1000 * (np.asarray(x, np.float64) - xs[0]) / span, 1)

    # each step: (x, level) to (next x, level), as one string per step (about 1,000 steps)
    left = px(xs)
    right = np.append(left[1:], left[-1])
    level = np.round(100 - 95 * np.asarray(totals, np.float64) / peak_bytes, 1)
    points = ["0,100"]
    points.extend(
        f"{a},{v} {b},{v}"
        for a, b, v in zip(left.tolist(), right.tolist(), level.tolist(), strict=True)
    )
    points.append("1000,100")
    marker = ""
    if peak_x is not None:
        mx = float(px([peak_x])[0])
        marker = (
            f"<line x1='{mx}' x2='{mx}' y1='0' y2='100' stroke='#C44E52' stroke-width='2' "
            "stroke-dasharray='4 3' vector-effect='non-scaling-stroke'/>"
        )
    return (
        "<svg class='jvs-timeline' width='100%' height='90' viewBox='0 0 1000 100' "
        "preserveAspectRatio='none' role='img' aria-label='live memory over the run' "
        "xmlns='http://www.w3.org/2000/svg'><title>live bytes over the run; each step is the "
        f"highest moment of its slice; dotted: the peak ({format_bytes(peak_bytes)})</title>"
        f"<polygon points='{' '.join(points)}' fill='#4C72B0' fill-opacity='0.55' "
        "stroke='#4C72B0' vector-effect='non-scaling-stroke'/>"
        f"{marker}</svg>"
    )
