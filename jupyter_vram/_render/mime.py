"""The saved profile: a compact JSON summary stored in every output, drawn without a kernel.

Every ``%%vram`` / ``%vram_estimate`` output carries it as ``PROFILE_MIME`` next to the widget,
so a frontend can draw the profile when the widget cannot be restored (kernel gone, notebook
reopened): the lab extension's MIME renderer draws it, and the static report
(:mod:`.static_report`) is made from it. All numbers come from :mod:`..analysis`; this module
only selects, bounds and names them. Its size is bounded by MAX_NODES, TIMELINE_BUCKETS and
TOP, not by the run: 52 KB (118 KB as a notebook stores it, indented) for a 1M-event profile
(bench/static_report.py).

Schema, version 1 (changes within a version are additive only: readers ignore unknown keys).
Bytes are integers; ``categories`` fixes the order of every per-category array::

    {
      "version": 1,
      "kind": "profile" | "estimate",
      "title": str,                 # "jupyter_vram · cuda:0 (CUDA allocator)"
      "device": str,                # "cuda:0", "cpu"
      "source": str,                # "dispatch" | "cuda_snapshot" | "estimate" | ...
      "source_label": str,          # the source in words: "tensor tracker", ...
      "peak_bytes": int,            # peak allocated (live bytes on the device), baseline included
      "baseline_bytes": int,        # alive before the cell (inside the peak)
      "reserved_bytes": int | null, # peak reserved (CUDA recordings, CUDA estimates)
      "device_total_bytes": int | null,
      "device_used_bytes": int | null,
      "duration_s": float,          # wall time of the cell (an estimate: of the fake run)
      "events": int,                # alloc + free events recorded
      "peak_phase": str,            # "forward" | "backward" | "optimizer" | "other" | "baseline"
      "peak_x": float | null,       # the peak on the timeline's x axis (null: none above baseline)
      "error": str | null,          # the exception the cell raised, if any
      "warnings": [str],            # what the recorder left out or degraded (may be absent)
      "facts": [[label, value], ...],   # the header as the app shows it (formatted strings)
      "categories": [str, ...],     # category names, in order
      "colors": [str, ...],         # one CSS colour per category
      "breakdown": [int, ...],      # bytes per category live at the peak; sums to peak_bytes
      "flame": {                    # module -> op tree of the bytes live at the peak
        "hierarchy": "module",
        "min_bytes": int,           # nodes smaller than this were dropped (~0.1 % of the peak)
        "dropped": int,             # how many nodes were dropped (their bytes stay in parents)
        "name": [str, ...],         # one entry per node, depth first, largest child first;
        "parent": [int, ...],       #   node 0 is the root "all" (parent -1); a parent comes
        "bytes": [int, ...],        #   before its children; bytes include the children's
        "count": [int, ...],        # allocations under the node
        "category": [int, ...],     # index of the category holding most of the node's bytes
        "mix": [[[int, int], ...], ...], # per node: (category index, bytes), largest first, <= 3
        "type": [str, ...],         # a module node's class name ("Linear"), else ""
        "x": [int, ...],            # the layout (icicle_layout): left edge and width in
        "width": [int, ...],        #   millionths of the root's bytes, rows below the root;
        "depth": [int, ...]         #   a zoomed view rescales its node's subtree (may be absent)
      },
      "timeline": {                 # live bytes over the run, each bucket at its highest moment
        "axis": "time" | "event",   # ms since the cell started, or event number (estimates)
        "x": [float, ...],          # step starts (the level holds until the next x)
        "total": [int, ...],        # live bytes at each step
        "by_category": {str: [int, ...]},  # categories ever non-zero only
        "reserved": [int, ...]      # only with allocator segments (CUDA recordings)
      },
      "top_modules": [{"name", "bytes", "count", "category"}, ...],  # self bytes at the peak
      "top_sites": [{"site", "op", "live_at_peak_bytes", "allocated_bytes", "allocations",
                     "largest_bytes", "category", "stack"}, ...],     # ranked by live at peak
      "estimate": {"summary": str, "model": str, "input": str, "parameters": int,
                   "batch_size": int} | null   # estimates: the text the kernel would print
    }
"""

from __future__ import annotations

import heapq
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .._analysis.allocator import has_segments, reserved_at, reserved_peak
from .._analysis.flame import FlameNode, icicle_layout, saved_layout_columns, shared_flame_tree
from .._analysis.groups import live_at_peak
from .._analysis.tables import site_rows
from .._model import CATEGORIES
from .figures import CATEGORY_COLORS
from .html import header_facts
from .text import SOURCE_NAMES

if TYPE_CHECKING:
    from .._estimator.api import Estimate
    from .._model import Profile

Axis = Literal["time", "event"]
PROFILE_MIME = "application/vnd.jupyter-vram.profile+json"
VERSION = 1
MIN_SHARE = 0.001  # flame nodes under this share of the peak are dropped
MAX_NODES = 500  # and at most this many are kept (the largest), whatever the tree's size
TIMELINE_BUCKETS = 300  # at most two steps per bucket: <= ~600 points
TOP = 20  # rows of the top-modules and top-sites lists


def profile_payload(profile: Profile, estimate: Estimate | None = None) -> dict[str, Any]:
    """The saved profile (schema in the module docstring); ``estimate``: the Estimate behind
    an estimate's profile, for its summary and predicted reserved / device-used bytes."""
    from .._units import format_bytes

    t = profile.timeline
    info = profile.device_info
    axis: Axis = "event" if profile.source == "estimate" else "time"
    reserved: int | None = reserved_peak(profile) if has_segments(profile) else None
    used = _int_or_none(info.get("device_used"))
    facts = header_facts(profile)
    est: dict[str, Any] | None = None
    if estimate is not None:
        from .._estimator.api import estimate_summary

        if estimate.settings.target_type == "cuda":
            reserved = int(estimate.reserved_bytes)
            used = int(estimate.predicted_device_bytes)
            # the estimator's figures replace the profile's (the fake run's time is no GPU's)
            facts = [
                *facts[:1],
                ("predicted reserved", format_bytes(reserved)),
                ("predicted device used", f"≈ {format_bytes(used)}"),
                *(f for f in facts[1:] if f[0] not in ("peak reserved", "wall time")),
            ]
        est = {
            "summary": estimate_summary(estimate),
            "model": estimate.model_name,
            "input": estimate.input,
            "parameters": int(estimate.parameters),
            "batch_size": int(estimate.batch_size),
        }
    source = SOURCE_NAMES.get(profile.source, profile.source)
    title = f"jupyter_vram · {profile.device} ({source})"
    if est is not None:
        title = f"jupyter_vram estimate · {est['model'] or 'model'} · input {est['input']}"
    breakdown = profile.peak_breakdown()
    x_peak = t.peak_x(axis)
    return {
        "version": VERSION,
        "kind": "estimate" if profile.source == "estimate" else "profile",
        "title": title,
        "device": profile.device,
        "source": profile.source,
        "source_label": source,
        "peak_bytes": int(profile.peak_bytes),
        "baseline_bytes": int(t.baseline_bytes),
        "reserved_bytes": reserved,
        "device_total_bytes": _int_or_none(info.get("total")),
        "device_used_bytes": used,
        "duration_s": round(profile.wall_ns / 1e9, 6),
        "events": int(profile.event_count),
        "peak_phase": t.peak_phase,
        "peak_x": None if x_peak is None else round(float(x_peak), 3),
        "error": profile.error,
        "warnings": [str(w) for w in profile.meta.get("warnings", ())],
        "facts": [[k, v] for k, v in facts],
        "categories": list(CATEGORIES),
        "colors": [CATEGORY_COLORS[c] for c in CATEGORIES],
        "breakdown": [int(breakdown[c]) for c in CATEGORIES],
        "flame": flame_payload(
            shared_flame_tree(profile, "module", "peak"), profile.peak_bytes, module_types(profile)
        ),
        "timeline": timeline_payload(profile, axis),
        "top_modules": [
            {
                "name": g.label,
                "bytes": g.bytes,
                "count": g.count,
                "category": CATEGORIES[int(np.argmax(g.by_category))],
            }
            for g in live_at_peak(profile, "module", limit=TOP)
            if g.bytes
        ],
        "top_sites": _sites(profile),
        "estimate": est,
    }


def module_types(profile: Profile) -> dict[str, str]:
    """Module path -> class name, where the recording kept them (``meta["module_types"]``)."""
    types = profile.meta.get("module_types")
    return {str(k): str(v) for k, v in types.items()} if isinstance(types, dict) else {}


def flame_payload(
    root: FlameNode,
    peak_bytes: int,
    types: dict[str, str] | None = None,
    *,
    min_share: float = MIN_SHARE,
    max_nodes: int = MAX_NODES,
) -> dict[str, Any]:
    """The tree as columns, keeping nodes of at least ``min_share`` of the peak, at most
    ``max_nodes`` of them (the largest: a parent is never smaller than its child, so what is
    kept stays a tree). ``types``: module path -> class name, for the ``type`` column."""
    min_bytes = max(1, int(np.ceil(min_share * max(peak_bytes, root.bytes))))
    kept: set[int] = {id(root)}
    heap: list[tuple[int, int, FlameNode]] = []
    order = 0
    for child in root.children.values():
        heapq.heappush(heap, (-child.bytes, order := order + 1, child))
    while heap and len(kept) < max_nodes:
        neg, _, node = heapq.heappop(heap)
        if -neg < min_bytes:
            break
        kept.add(id(node))
        for child in node.children.values():
            heapq.heappush(heap, (-child.bytes, order := order + 1, child))
    cols: dict[str, list[Any]] = {k: [] for k in ("name", "parent", "bytes", "count")}
    category: list[int] = []
    mix: list[list[list[int]]] = []
    kinds: list[str] = []
    paths: list[tuple[str, ...]] = []  # module path parts of each written node
    stack: list[tuple[FlameNode, int]] = [(root, -1)]
    total_nodes = 0
    types = types or {}
    while stack:
        node, parent = stack.pop()
        total_nodes += 1
        if id(node) not in kept:  # counted, with every node below it, as dropped
            stack.extend((c, -1) for c in node.children.values())
            continue
        index = len(cols["name"])
        path = () if parent < 0 else (*paths[parent], node.name)
        paths.append(tuple(p for p in path if not p.startswith("[")))  # no [backward] prefix
        kinds.append(types.get(".".join(paths[-1]), "") if paths[-1] else "")
        cols["name"].append(node.name)
        cols["parent"].append(parent)
        cols["bytes"].append(node.bytes)
        cols["count"].append(node.count)
        by_cat = node.by_category
        category.append(int(np.argmax(by_cat)) if any(by_cat) else CATEGORIES.index("other"))
        parts = sorted(((v, i) for i, v in enumerate(by_cat) if v), reverse=True)[:3]
        mix.append([[i, v] for v, i in parts])
        # reversed: the largest child is popped, and so written, first
        stack.extend((c, index) for c in reversed(node.sorted_children()))
    return {
        "hierarchy": "module",
        "min_bytes": min_bytes,
        "dropped": total_nodes - len(cols["name"]),
        **cols,
        "category": category,
        "mix": mix,
        "type": kinds,
        **saved_layout_columns(icicle_layout(cols["parent"], cols["bytes"])),
    }


def timeline_payload(profile: Profile, axis: Axis) -> dict[str, Any]:
    """Live bytes per category at each bucket's highest moment (``Timeline.bucket_peaks``)."""
    t = profile.timeline
    x, idx = t.bucket_peaks(TIMELINE_BUCKETS, axis=axis)
    by_cat = t.by_category(idx)
    totals = by_cat.sum(axis=1)
    out: dict[str, Any] = {
        "axis": axis,
        "x": np.round(np.asarray(x, np.float64), 3).tolist(),
        "total": totals.tolist(),
        "by_category": {
            c: by_cat[:, i].tolist() for i, c in enumerate(CATEGORIES) if by_cat[:, i].any()
        },
    }
    if has_segments(profile):
        seqs = np.asarray([t.seq_at(int(i)) for i in idx], np.int64)
        out["reserved"] = [int(v) for v in reserved_at(profile, seqs)]
    return out


def _sites(profile: Profile) -> list[dict[str, Any]]:
    return [asdict(row) for row in site_rows(profile, limit=TOP) if row.live_at_peak_bytes > 0]


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)
