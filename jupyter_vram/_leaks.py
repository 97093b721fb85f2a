"""Leaks between cells: memory a recorded run allocated that is still alive, and what holds it.

``profile.leaks()`` lists them (one row per storage) and ``jv.release_leaks(profile)`` drops the
references that hold them, only when called: a variable is deleted, an ``Out[n]`` entry (and
``_``, ``__``, ``___``, ``_n``) cleared, the last error's traceback frames cleared, reference
cycles collected. Closures and module globals are named, never touched.

A leak is found in two steps. As the run ends, the storages it made that are still alive
(new since it started, each at the address of one of its never-freed allocations) are noted by
identity (a weak reference each), with that allocation: its op, module, category and site are
the leak's, exact even when many leaks share one size. ``leaks()`` then lists those still
alive, each with what holds it now: a storage made after the run, even of the same size at the
same address, is never one of its leaks. This needs the kernel that recorded the profile: a
loaded profile lists none. The addresses come from the capture, beside the profile (never
saved); where it gave none, a storage is matched by size alone, and its row says so.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ._model import CATEGORIES

if TYPE_CHECKING:
    import pandas as pd

    from ._capture.leaks import HeldStorage, Holder, SizeMatcher
    from ._model import Profile

COLUMNS = [
    "bytes", "holder_kind", "holders", "releasable", "op", "module", "category", "site",
    "matched_by", "storage",
]  # fmt: skip


@dataclass
class _RunState:
    """What the kernel knew when the run started: where its variables live, what existed."""

    namespace: Mapping[str, Any] | None
    before: dict[int, Any]  # storage id -> weakref
    device_type: str
    made: dict[int, Any] | None = None  # storage id -> weakref: what the run left alive
    rows: dict[int, int] = field(default_factory=dict)  # storage id -> its row, by address
    #: the never-freed rows whose address the capture gave (never matched by size)
    addressed: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    #: the bound that stopped the search for what the run left alive ("": none did)
    bound: str = ""


_runs: weakref.WeakKeyDictionary[Profile, _RunState] = weakref.WeakKeyDictionary()


def note_start(namespace: Mapping[str, Any] | None, device: str) -> _RunState:
    """Called when recording starts: weak references to the storages the notebook holds."""
    import torch

    from ._capture.leaks import storage_keys

    device_type = torch.device(device).type
    return _RunState(namespace, storage_keys(namespace, device_type), device_type)


def attach(profile: Profile, state: _RunState) -> None:
    """Tie a finished profile to its run (for as long as the profile lives), noting, right as
    the run ends, which storages it left alive and, where the capture gave addresses, the
    very allocation each is (never raises: leaks are a nicety; a Ctrl-C meanwhile is held
    until the note is taken, then raised)."""
    from ._capture import interrupts_deferred

    with interrupts_deferred():
        try:
            from ._capture.leaks import RowMatcher, made_by_run
            from ._capture.row_addresses import take_addresses

            at = _addresses(profile, take_addresses(profile))
            state.addressed = np.fromiter((row for row, _ in at.values()), np.int64, len(at))
            sizes = _never_freed(profile, state)[1]
            if sizes.empty() and not at:
                state.made = {}
            else:
                state.made, state.rows, state.bound = made_by_run(
                    state.namespace, state.device_type, state.before, RowMatcher(at, sizes)
                )
        except Exception:  # noqa: BLE001 - the profile stays; leaks() says none were noted
            state.made = None
        state.before = {}  # only needed until now
        _runs[profile] = state


def _addresses(
    profile: Profile, noted: tuple[np.ndarray, np.ndarray] | None
) -> dict[int, tuple[int, int]]:
    """address -> (row, bytes) of the run's never-freed rows on its device whose address the
    capture noted (none: every row is matched by size)."""
    if noted is None:
        return {}
    a = profile.allocations
    device = profile.devices.index(profile.device) if profile.device in profile.devices else -1
    rows, addrs = noted
    keep = (a.device[rows] == device) & (a.alloc_seq[rows] >= 0) & (a.free_seq[rows] < 0)
    rows, addrs = rows[keep], addrs[keep]
    return {
        ptr: (row, size)
        for ptr, row, size in zip(addrs.tolist(), rows.tolist(), a.size[rows].tolist(), strict=True)
    }


def _never_freed(profile: Profile, state: _RunState) -> tuple[dict[int, list[int]], SizeMatcher]:
    """The run's allocations never freed whose address is not known, by size (rows in
    allocation order), and a matcher of live storage sizes to them: the fallback."""
    from ._capture.leaks import SizeMatcher

    a = profile.allocations
    device = profile.devices.index(profile.device) if profile.device in profile.devices else -1
    rows = np.flatnonzero((a.alloc_seq >= 0) & (a.free_seq < 0) & (a.device == device))
    if state.addressed.size:
        rows = rows[~np.isin(rows, state.addressed)]
    by_size: dict[int, list[int]] = {}
    for row in rows[np.argsort(a.alloc_seq[rows], kind="stable")]:
        by_size.setdefault(int(a.size[row]), []).append(int(row))
    sizes = SizeMatcher({n: len(r) for n, r in by_size.items()}, state.device_type == "cuda")
    return by_size, sizes


def _held(
    profile: Profile,
) -> tuple[list[HeldStorage], dict[int, list[int]], SizeMatcher] | None:
    state = _runs.get(profile)
    if state is None or state.made is None:
        return None
    from ._capture.leaks import held

    by_size, sizes = _never_freed(profile, state)
    if not state.made:
        return [], by_size, sizes
    return held(state.namespace, state.device_type, state.made), by_size, sizes


BY_SIZE = "by size: "  # the prefix of a label the size alone gave (no address was known)


def find_leaks(profile: Profile) -> pd.DataFrame:
    """Storages the run made that are still alive, largest first, each with its holders.

    Columns: bytes, holder_kind (of the first holder), holders (names, ``; ``-separated),
    releasable (release_leaks can drop every holder), op / module / category / site (of the
    allocation that made it), matched_by (``address``: that allocation is the one at the
    storage's address, exact; ``size``: the capture gave no address, so the labels, prefixed
    ``by size:``, are those of the run's allocations of its size, ``one of: a | b`` when they
    differ), storage (an id). ``attrs["note"]`` says why a frame is empty when the profile
    was not recorded in this kernel, or what is uncertain in it.
    """
    import pandas as pd

    found = _held(profile)
    frame = pd.DataFrame(columns=COLUMNS)
    if found is None:
        state = _runs.get(profile)
        frame.attrs["note"] = (
            "leaks are found in the kernel that recorded the profile"
            if state is None
            else "what the run left alive could not be noted when it ended"
        )
        return frame
    state = _runs[profile]
    records = _records(profile, state, *found)
    notes = []
    if records:
        frame = pd.DataFrame(records, columns=COLUMNS)
        if (frame["matched_by"] == "size").any():
            notes.append(
                "rows labelled 'by size' were matched to the run's allocations by size only "
                "(the recording gave no address for them): op, module and site are those of "
                "its allocations of that size"
            )
    if state.bound:
        notes.append(_bound_note(state.bound))
    if notes:
        frame.attrs["note"] = "; ".join(notes)
    return frame


def _bound_note(bound: str) -> str:
    """What a search cut short by ``bound`` (see ``made_by_run``) may have left out."""
    from ._capture.leaks import MAX_TENSORS, NAMES_BOUND
    from ._capture.tagging import BASELINE_TENSORS

    looked_at = (
        f"the first {BASELINE_TENSORS:,} tensors the notebook's names reach, with every "
        "module's and optimizer's state"
        if bound == NAMES_BOUND
        else f"the first {MAX_TENSORS:,} of the garbage collector's tensors"
    )
    return (
        f"the search for what the cell left alive, as it ended, stopped at its bound "
        f"({looked_at}): some leaks may be missing"
    )


def _records(
    profile: Profile, state: _RunState, storages: list[HeldStorage],
    by_size: dict[int, list[int]], sizes: SizeMatcher,
) -> list[list[Any]]:  # fmt: skip
    """A row of :data:`COLUMNS` per storage still alive, largest first, labelled by the
    allocation at its address, else by the run's allocations of its size."""
    records = []
    guesses: dict[int, list[str]] = {}  # size -> the labels of its rows (one pass a size)
    for item in sorted(storages, key=lambda s: -s.nbytes):
        row = state.rows.get(item.key)
        if row is not None:
            matched, how = _labels(profile, [row], ""), "address"
        else:
            size = sizes.match(item.nbytes)
            if size is None:
                continue  # more storages of this size than the run left (another thread's)
            sizes.take(size)
            if size not in guesses:
                guesses[size] = _labels(profile, by_size[size], BY_SIZE)
            matched, how = guesses[size], "size"
        records.append(
            [
                item.nbytes,
                item.holders[0].kind if item.holders else "unknown",
                "; ".join(h.name for h in item.holders),
                bool(item.holders) and all(h.releasable for h in item.holders),
                *matched,
                how,
                item.key,
            ]
        )
    return records


def _labels(profile: Profile, rows: list[int], prefix: str) -> list[str]:
    """Op, module, category and site of these rows (each one value, or the ones they have)."""
    from ._analysis.groups import stack_label

    a = profile.allocations
    return [
        prefix + _which([profile.ops[int(a.op[r])] for r in rows]),
        prefix + _which([profile.modules[int(a.module[r])] for r in rows]),
        prefix + _which([CATEGORIES[int(a.category[r])] for r in rows]),
        prefix + _which([stack_label(profile, int(a.stack[r])) for r in rows]),
    ]


def _which(values: list[str]) -> str:
    """The label of a leak's allocation, or, matched by size, of each allocation of its size
    when they differ (the size alone cannot tell which storage came from which)."""
    unique = list(dict.fromkeys(values))
    return unique[0] if len(unique) == 1 else "one of: " + " | ".join(unique)


GROUP_COLUMNS = [
    "bytes", "storages", "holder_kind", "holders", "releasable", "op", "module", "category",
    "site",
]  # fmt: skip


def group_leaks(leaks: pd.DataFrame) -> pd.DataFrame:
    """The leaks of :func:`find_leaks` one row per holder (the same ``holders``): their bytes
    and storage count; op, module, category and site where the group shares one, else the
    few it has (``a | b``) or how many. Largest first. A list of 100 tensors is one row."""
    import pandas as pd

    rows = []
    for holders, group in leaks.groupby("holders", sort=False):
        rows.append(
            [
                int(group["bytes"].sum()),
                len(group),
                str(group["holder_kind"].iloc[0]),
                str(holders),
                bool(group["releasable"].all()),
                *(_in_short(group[c]) for c in ("op", "module", "category", "site")),
            ]
        )
    frame = pd.DataFrame(rows, columns=GROUP_COLUMNS)
    frame = frame.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)
    frame.attrs.update(leaks.attrs)
    return frame


def _in_short(values: pd.Series[Any]) -> str:
    unique = list(dict.fromkeys(str(v) for v in values))
    if len(unique) <= 3:
        return " | ".join(unique)
    return f"{len(unique)} different"


#: Called after every release (the app's leak tables refresh themselves).
_after_release: list[Callable[[], None]] = []


def after_release(callback: Callable[[], None]) -> None:
    """Call ``callback`` after each :func:`release_leaks`, wherever it was asked from."""
    if callback not in _after_release:
        _after_release.append(callback)


def release_leaks(profile: Profile, leaks: pd.DataFrame | None = None) -> list[str]:
    """Drop what holds the run's leaked memory (all of it, or the rows of ``leaks``, a frame
    from ``profile.leaks()``), and return what was done. Only names still bound to the same
    objects are touched; closures and globals are left to you (said so in the result)."""
    from ._capture.leaks import release

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
    done = release(namespace, holders)
    for callback in list(_after_release):
        with contextlib.suppress(Exception):  # a display that fails must not undo the release
            callback()
    return done
