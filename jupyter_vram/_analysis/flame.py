"""Flame trees: where the bytes come from, by module path -> op, or by Python stack."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from .._model import CATEGORIES, PHASES

if TYPE_CHECKING:
    from .._model import Profile

Hierarchy = Literal["module", "stack"]
Mode = Literal["peak", "cumulative"]


@dataclass
class FlameNode:
    """A node of the tree; ``bytes`` includes its children."""

    name: str
    bytes: int = 0
    count: int = 0
    by_category: tuple[int, ...] = (0,) * len(CATEGORIES)
    children: dict[str, FlameNode] = field(default_factory=dict)

    def sorted_children(self) -> list[FlameNode]:
        return sorted(self.children.values(), key=lambda n: -n.bytes)

    def find(self, path: list[str]) -> FlameNode | None:
        node: FlameNode | None = self
        for name in path:
            node = node.children.get(name) if node is not None else None
        return node

    def walk(self, depth: int = 0) -> list[tuple[int, FlameNode]]:
        """(depth, node) pairs, depth first, largest child first."""
        out = [(depth, self)]
        for c in self.sorted_children():
            out.extend(c.walk(depth + 1))
        return out


@dataclass(frozen=True)
class IcicleLayout:
    """Where each node of a flame tree is drawn, per node in column order: ``x`` (left edge)
    and ``width`` as fractions of node 0's bytes, ``depth`` in rows below node 0."""

    x: list[float]
    width: list[float]
    depth: list[int]


def icicle_layout(parents: Sequence[int], sizes: Sequence[int]) -> IcicleLayout:
    """The one flame layout: node 0 spans the whole width, each node's children sit side by
    side inside it in column order, as wide as their bytes. ``parents[i]`` is the column of
    node i's parent (-1 for node 0) and comes before i; ``sizes`` include the children's.
    The bokeh view, the static SVG and the saved profile (hence the lab extension) all draw
    this; zooming into a node is a transform of these rectangles, not a second layout."""
    n = len(parents)
    total = sizes[0] if n and sizes[0] > 0 else 1
    x = [0.0] * n
    width = [1.0] * n
    depth = [0] * n
    next_left = [0.0] * n  # where the next child of each node starts
    for i in range(1, n):
        p = parents[i]
        x[i] = next_left[p]
        width[i] = sizes[i] / total
        next_left[p] += width[i]
        next_left[i] = x[i]
        depth[i] = depth[p] + 1
    return IcicleLayout(x, width, depth)


def _module_path(profile: Profile, module_id: int, phase: int) -> list[str]:
    name = profile.modules[module_id]
    prefix = [] if PHASES[phase] in ("forward", "other") else [f"[{PHASES[phase]}]"]
    if not name:
        return [*prefix, "(no module)"]
    return prefix + name.split(".")


def _stack_path(profile: Profile, stack_id: int) -> list[str]:
    frames = profile.stack_of(stack_id)
    return [str(f) for f in frames] or ["(no Python stack)"]


def flame_tree(
    profile: Profile,
    hierarchy: Hierarchy = "module",
    mode: Mode = "peak",
    mask: npt.NDArray[np.bool_] | None = None,
) -> FlameNode:
    """Aggregate allocations into a tree.

    ``mode="peak"``: allocations live at the peak (or ``mask``); ``"cumulative"``: every
    allocation made during the run. The module hierarchy puts backward and optimizer work under
    ``[backward]`` / ``[optimizer]`` so a module's forward and backward bytes stay apart; each
    path ends in the op that allocated.
    """
    from .groups import allocated_during_run

    if mask is None:
        if mode == "peak":
            mask = profile.timeline.live_mask(profile.timeline.peak_index)
        else:
            mask = allocated_during_run(profile)
    uniq, sums = _leaf_sums(profile, hierarchy, np.flatnonzero(mask))
    # Tree shape in plain dicts first (one entry per node), then sums with numpy.
    names, parents, leaves = _shape(profile, hierarchy, uniq)
    return _rolled_up(names, parents, leaves, sums)


# Trees of whole profiles, freed with the profile (see shared_flame_tree).
_SHARED: weakref.WeakKeyDictionary[Profile, dict[tuple[Hierarchy, Mode], FlameNode]] = (
    weakref.WeakKeyDictionary()
)


def shared_flame_tree(
    profile: Profile, hierarchy: Hierarchy = "module", mode: Mode = "peak"
) -> FlameNode:
    """:func:`flame_tree` of the whole profile, computed once per (hierarchy, mode) and kept
    while the profile lives: displaying a profile needs the same tree for the app's flame
    graph and for the saved profile. Callers only read it (a tree is never changed)."""
    trees = _SHARED.setdefault(profile, {})
    tree = trees.get((hierarchy, mode))
    if tree is None:
        tree = trees[(hierarchy, mode)] = flame_tree(profile, hierarchy, mode)
    return tree


@dataclass(frozen=True)
class _LeafSums:
    """Per leaf: bytes, allocations, bytes per category (a row each)."""

    totals: npt.NDArray[Any]
    counts: npt.NDArray[Any]
    per_cat: npt.NDArray[Any]


def _leaf_sums(
    profile: Profile, hierarchy: Hierarchy, rows: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.int64], _LeafSums]:
    """The distinct leaves of ``rows`` (a key of path and op each), and their sums."""
    a = profile.allocations
    if hierarchy == "module":
        prefix_key = a.module[rows].astype(np.int64) * len(PHASES) + a.phase[rows]
    else:
        prefix_key = a.stack[rows].astype(np.int64) + 1
    keys = prefix_key * len(profile.ops) + a.op[rows]
    uniq, inverse = np.unique(keys, return_inverse=True)
    n_cat = len(CATEGORIES)
    sizes = a.size[rows].astype(np.float64)
    totals = np.bincount(inverse, weights=sizes, minlength=len(uniq))
    counts = np.bincount(inverse, minlength=len(uniq))
    per_cat = np.bincount(
        inverse * n_cat + a.category[rows], weights=sizes, minlength=len(uniq) * n_cat
    ).reshape(-1, n_cat)
    return uniq, _LeafSums(totals, counts, per_cat)


def _shape(
    profile: Profile, hierarchy: Hierarchy, uniq: npt.NDArray[np.int64]
) -> tuple[list[str], list[int], npt.NDArray[np.int64]]:
    """The tree's nodes (name and parent of each, the root first, a parent always before its
    children) and the node of each leaf key."""
    names = ["all"]
    parents = [-1]
    index: dict[tuple[int, str], int] = {}
    leaves = np.empty(len(uniq), np.int64)
    prefix_nodes: dict[int, int] = {}
    for i, key in enumerate(uniq.tolist()):
        prefix, op = divmod(key, len(profile.ops))
        node = prefix_nodes.get(prefix)
        if node is None:
            if hierarchy == "module":
                module, phase = divmod(prefix, len(PHASES))
                path = _module_path(profile, module, phase)
            else:
                path = _stack_path(profile, prefix - 1)
            node = 0
            for name in path:
                node = _child(index, names, parents, node, name)
            prefix_nodes[prefix] = node
        leaves[i] = _child(index, names, parents, node, profile.ops[op])
    return names, parents, leaves


def _rolled_up(
    names: list[str], parents: list[int], leaves: npt.NDArray[np.int64], sums: _LeafSums
) -> FlameNode:
    """The tree of FlameNodes, each with the sums of the leaves below it."""
    n_nodes = len(names)
    node_bytes = np.bincount(leaves, weights=sums.totals, minlength=n_nodes)
    node_counts = np.bincount(leaves, weights=sums.counts, minlength=n_nodes)
    node_cats = np.zeros((n_nodes, len(CATEGORIES)))
    np.add.at(node_cats, leaves, sums.per_cat)
    # roll sums up the tree, deepest level first (a parent is always created before its child)
    parent_of = np.asarray(parents, np.int64)
    depths = [0] * n_nodes
    for i in range(1, n_nodes):
        depths[i] = depths[parents[i]] + 1
    depth = np.asarray(depths, np.int64)
    for d in range(int(depth.max(initial=0)), 0, -1):
        level = np.flatnonzero(depth == d)
        up = parent_of[level]
        np.add.at(node_bytes, up, node_bytes[level])
        np.add.at(node_counts, up, node_counts[level])
        np.add.at(node_cats, up, node_cats[level])
    # whole numbers as Python ints, rounded half to even as round() does, all at once
    sizes = np.rint(node_bytes).astype(np.int64).tolist()
    counts = np.rint(node_counts).astype(np.int64).tolist()
    cats = np.rint(node_cats).astype(np.int64).tolist()
    built = [FlameNode(names[i], sizes[i], counts[i], tuple(cats[i])) for i in range(n_nodes)]
    for i in range(1, n_nodes):
        built[parents[i]].children[names[i]] = built[i]
    return built[0]


def _child(
    index: dict[tuple[int, str], int], names: list[str], parents: list[int], parent: int, name: str
) -> int:
    node = index.get((parent, name))
    if node is None:
        node = index[(parent, name)] = len(names)
        names.append(name)
        parents.append(parent)
    return node


#: the saved flame layout's x and width: millionths of the root's bytes
LAYOUT_UNITS = 1_000_000


def saved_layout_columns(layout: IcicleLayout) -> dict[str, list[int]]:
    """The layout as integers (compact JSON), each x and width rounded on its own so a block
    at least 0.1 % of the root wide is saved at least 1000 millionths wide."""
    return {
        "x": [round(v * LAYOUT_UNITS) for v in layout.x],
        "width": [round(v * LAYOUT_UNITS) for v in layout.width],
        "depth": layout.depth,
    }


def saved_flame_layout(flame: Mapping[str, Any]) -> IcicleLayout:
    """The layout a saved profile's ``flame`` carries, as fractions; computed from its
    parent and bytes columns for profiles saved before it was (same function, same result
    but for the rounding)."""
    if all(k in flame for k in ("x", "width", "depth")):
        return IcicleLayout(
            [v / LAYOUT_UNITS for v in flame["x"]],
            [v / LAYOUT_UNITS for v in flame["width"]],
            list(flame["depth"]),
        )
    return icicle_layout(flame["parent"], flame["bytes"])
