"""Flame trees: where the bytes come from, by module path -> op, or by Python stack."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from ..model import CATEGORIES, PHASES

if TYPE_CHECKING:
    from ..model import Profile

Hierarchy = Literal["module", "stack"]
Mode = Literal["peak", "cumulative"]


@dataclass
class FlameNode:
    """A node of the tree; ``bytes`` includes its children."""

    name: str
    bytes: int = 0
    count: int = 0
    by_category: list[int] = field(default_factory=lambda: [0] * len(CATEGORIES))
    children: dict[str, FlameNode] = field(default_factory=dict)

    def child(self, name: str) -> FlameNode:
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = FlameNode(name)
        return node

    def add(self, nbytes: int, count: int, by_category: npt.NDArray[np.float64]) -> None:
        self.bytes += nbytes
        self.count += count
        for i, v in enumerate(by_category):
            self.by_category[i] += int(round(v))

    def sorted_children(self) -> list[FlameNode]:
        return sorted(self.children.values(), key=lambda n: -n.bytes)

    def find(self, path: list[str]) -> FlameNode | None:
        node: FlameNode | None = self
        for name in path:
            node = node.children.get(name) if node is not None else None
        return node

    def walk(self, depth: int = 0) -> list[tuple[int, FlameNode]]:
        out = [(depth, self)]
        for c in self.sorted_children():
            out.extend(c.walk(depth + 1))
        return out


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

    a = profile.allocations
    if mask is None:
        if mode == "peak":
            mask = profile.timeline.live_mask(profile.timeline.peak_index)
        else:
            mask = allocated_during_run(profile)
    rows = np.flatnonzero(mask)
    n_cat = len(CATEGORIES)
    if hierarchy == "module":
        keys = np.stack([a.module[rows], a.phase[rows].astype(np.int32), a.op[rows]], axis=1)
    else:
        keys = np.stack([a.stack[rows], a.op[rows]], axis=1)
    root = FlameNode("all")
    if len(rows) == 0:
        return root
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    sizes = a.size[rows]
    totals = np.bincount(inverse, weights=sizes, minlength=len(uniq))
    counts = np.bincount(inverse, minlength=len(uniq))
    cat_idx = inverse.astype(np.int64) * n_cat + a.category[rows]
    per_cat = np.bincount(cat_idx, weights=sizes, minlength=len(uniq) * n_cat).reshape(-1, n_cat)
    for i, key in enumerate(uniq):
        if hierarchy == "module":
            path = _module_path(profile, int(key[0]), int(key[1]))
        else:
            path = _stack_path(profile, int(key[0]))
        path.append(profile.ops[int(key[-1])])
        nbytes, count = int(round(totals[i])), int(counts[i])
        node = root
        node.add(nbytes, count, per_cat[i])
        for name in path:
            node = node.child(name)
            node.add(nbytes, count, per_cat[i])
    return root
