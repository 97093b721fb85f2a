"""Leaks between cells: memory a recorded run allocated that is still alive, and what holds it.

``profile.leaks()`` lists them (one row per storage) and ``jv.release_leaks(profile)`` drops the
references that hold them, only when called: a variable is deleted, an ``Out[n]`` entry (and
``_``, ``__``, ``___``, ``_n``) cleared, the last error's traceback frames cleared, reference
cycles collected. Closures and module globals are named, never touched.

A leak is found in two steps: the profile's allocations never freed (their sizes, op, module,
line), then the live storages of those sizes the notebook holds that did not exist when the
run started. This needs the kernel that recorded the profile: a loaded profile lists none.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .model import CATEGORIES

if TYPE_CHECKING:
    import pandas as pd

    from .capture.leaks import HeldStorage, Holder, SizeMatcher
    from .model import Profile

COLUMNS = [
    "bytes", "holder_kind", "holders", "releasable", "op", "module", "category", "site",
    "storage",
]  # fmt: skip


@dataclass
class _RunState:
    """What the kernel knew when the run started: where its variables live, what existed."""

    namespace: Mapping[str, Any] | None
    before: dict[int, Any]  # storage id -> weakref
    device_type: str


_runs: weakref.WeakKeyDictionary[Profile, _RunState] = weakref.WeakKeyDictionary()


def note_start(namespace: Mapping[str, Any] | None, device: str) -> _RunState:
    """Called when recording starts: weak references to the storages the notebook holds."""
    import torch

    from .capture.leaks import storage_keys

    device_type = torch.device(device).type
    return _RunState(namespace, storage_keys(namespace, device_type), device_type)


def attach(profile: Profile, state: _RunState) -> None:
    """Tie a finished profile to its run (for as long as the profile lives)."""
    _runs[profile] = state


def _held(
    profile: Profile,
) -> tuple[list[HeldStorage], dict[int, list[int]], SizeMatcher] | None:
    state = _runs.get(profile)
    if state is None:
        return None
    from .capture.leaks import SizeMatcher, held

    a = profile.allocations
    rows = np.flatnonzero((a.alloc_seq >= 0) & (a.free_seq < 0) & profile.timeline.device_mask)
    by_size: dict[int, list[int]] = {}
    for row in rows[np.argsort(a.alloc_seq[rows], kind="stable")]:
        by_size.setdefault(int(a.size[row]), []).append(int(row))
    sizes = SizeMatcher({n: len(r) for n, r in by_size.items()}, state.device_type == "cuda")
    if not by_size:
        return [], by_size, sizes
    return held(state.namespace, state.device_type, state.before, sizes.copy()), by_size, sizes


def find_leaks(profile: Profile) -> pd.DataFrame:
    """Storages the run made that are still alive, largest first, each with its holders.

    Columns: bytes, holder_kind (of the first holder), holders (names, ``; ``-separated),
    releasable (release_leaks can drop every holder), op / module / category / site (of the
    allocation that made it), storage (an id). ``attrs["note"]`` says why a frame is empty when
    the profile was not recorded in this kernel.
    """
    import pandas as pd

    from .analysis.groups import stack_label

    found = _held(profile)
    frame = pd.DataFrame(columns=COLUMNS)
    if found is None:
        frame.attrs["note"] = "leaks are found in the kernel that recorded the profile"
        return frame
    storages, by_size, sizes = found
    a = profile.allocations
    records = []
    for item in sorted(storages, key=lambda s: -s.nbytes):
        size = sizes.match(item.nbytes)
        if size is None:
            continue  # more storages of this size than the run left: the rest are older
        sizes.take(size)
        rows = by_size[size]
        records.append(
            [
                item.nbytes,
                item.holders[0].kind if item.holders else "unknown",
                "; ".join(h.name for h in item.holders),
                bool(item.holders) and all(h.releasable for h in item.holders),
                _which([profile.ops[int(a.op[r])] for r in rows]),
                _which([profile.modules[int(a.module[r])] for r in rows]),
                _which([CATEGORIES[int(a.category[r])] for r in rows]),
                _which([stack_label(profile, int(a.stack[r])) for r in rows]),
                item.key,
            ]
        )
    if records:
        frame = pd.DataFrame(records, columns=COLUMNS)
    return frame


def _which(values: list[str]) -> str:
    """The label of the allocations of one size: one label, or each when they differ (the size
    alone cannot tell which storage came from which allocation)."""
    unique = list(dict.fromkeys(values))
    return unique[0] if len(unique) == 1 else "one of: " + " | ".join(unique)


def release_leaks(profile: Profile, leaks: pd.DataFrame | None = None) -> list[str]:
    """Drop what holds the run's leaked memory (all of it, or the rows of ``leaks``, a frame
    from ``profile.leaks()``), and return what was done. Only names still bound to the same
    objects are touched; closures and globals are left to you (said so in the result)."""
    from .capture.leaks import release

    if leaks is None:
        leaks = find_leaks(profile)
    found = _held(profile)
    if found is None:
        return []
    storages = found[0]
    wanted = {int(k) for k in leaks["storage"]}
    holders: list[Holder] = []
    for item in storages:
        if item.key in wanted:
            holders.extend(h for h in item.holders if h not in holders)
    del storages
    state = _runs[profile]
    namespace = state.namespace if isinstance(state.namespace, MutableMapping) else None
    return release(namespace, holders)
