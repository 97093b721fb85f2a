"""The request a CPU capacity refused, taken out of the profile and kept for the post-mortem.

On the CPU the capacity guard (:mod:`.capacity`) sees an op's outputs only once the op has made
them, so the allocator did allocate the refused output, and the guard dropped it at once. A
device of that capacity would never have held it: left in the profile it would raise the peak
above the capacity and show at the peak as a temporary. So the rows of the outputs the guard
dropped are removed, and the post-mortem keeps what it needs of them (when, which module and
phase asked).

The rows are told apart without clocks: the refused op was the last call of its op before the
error, so its outputs are the latest freed rows of that op (or, where the profile names the op
differently, of those sizes), and they must look like outputs dropped at once: every other row
allocated after them and before their free was already freed by then (a workspace inside the
op). Rows that do not fit this are left in place; the peak then still holds the request.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from .._model import PHASES, Allocations
from .row_addresses import note_addresses, take_addresses

if TYPE_CHECKING:
    from .._model import Profile
    from .capacity import CapacityFailure


def drop_refused(profile: Profile, failure: CapacityFailure) -> tuple[Profile, dict[str, Any]]:
    """The profile without the refused op's dropped outputs, and the post-mortem's facts of
    the request (``refused_seq``: its sequence number, ``refused_module``, ``refused_phase``);
    the profile unchanged and no facts when the rows cannot be told for certain."""
    outputs = _output_rows(profile, failure)
    if outputs is None:
        return profile, {}
    a = profile.allocations
    dropped = _pick(outputs, a.size, failure.output_bytes[failure.refused_index :])
    if not dropped:
        return profile, {}
    refused = max(
        (r for r in dropped if a.size[r] == failure.requested_bytes), key=lambda r: a.alloc_seq[r]
    )
    facts = {
        "refused_seq": int(a.alloc_seq[refused]),
        "refused_module": profile.modules[int(a.module[refused])],
        "refused_phase": PHASES[int(a.phase[refused])],
        "refused_rows": len(dropped),
    }
    return without_rows(profile, dropped), facts


def _output_rows(profile: Profile, failure: CapacityFailure) -> list[int] | None:
    """The rows of every new output of the refused op (see the module docstring)."""
    a = profile.allocations
    if not failure.output_bytes or profile.device not in profile.devices:
        return None
    freed = (a.alloc_seq >= 0) & (a.free_seq >= 0)
    freed &= a.device == profile.devices.index(profile.device)
    named = np.array([name == failure.op for name in profile.ops], dtype=bool)
    for candidates in (freed & named[a.op], freed):  # by the op's name first, then by size
        rows = _pick(np.flatnonzero(candidates), a.size, failure.output_bytes, a.alloc_seq)
        if rows is not None and _dropped_at_once(a, rows):
            return rows
    return None


def _pick(
    rows: Any,
    sizes: np.ndarray[Any, Any],
    wanted: tuple[int, ...],
    order: np.ndarray[Any, Any] | None = None,
) -> list[int] | None:
    """For each wanted size, that many of ``rows`` of that size, latest (by ``order``) first;
    None when some size is short. Vectorized: a profile may have a million rows."""
    rows = np.asarray(rows, np.int64)
    picked: list[int] = []
    for size, count in Counter(wanted).items():
        same = rows[sizes[rows] == size]
        if order is not None:
            same = same[np.argsort(-order[same], kind="stable")]
        if len(same) < count:
            return None
        picked += same[:count].tolist()
    return picked


def _dropped_at_once(a: Allocations, rows: list[int]) -> bool:
    """Every other row allocated after the first of ``rows`` and before the first of their
    frees was freed by then: nothing else the op made outlived it."""
    first_alloc = int(a.alloc_seq[rows].min())
    first_free = int(a.free_seq[rows].min())
    if first_free < int(a.alloc_seq[rows].max()):
        return False
    between = (a.alloc_seq > first_alloc) & (a.alloc_seq < first_free)
    between[rows] = False
    outlived = (a.free_seq < 0) | (a.free_seq > first_free)
    return not bool((between & outlived).any())


def without_rows(profile: Profile, rows: list[int]) -> Profile:
    """A copy of ``profile`` without allocation ``rows`` (and their two events each); the
    addresses noted for leak finding follow the rows that stay."""
    a = profile.allocations
    keep = np.ones(len(a), dtype=bool)
    keep[rows] = False
    columns = {name: getattr(a, name)[keep] for name in a.__dataclass_fields__}
    events = 2 * len(rows)
    smaller = profile.replace(
        allocations=Allocations.from_columns(columns),
        event_count=max(0, profile.event_count - events),
    )
    noted = take_addresses(profile)
    if noted is not None:
        new_index = np.cumsum(keep) - 1
        old_rows, addresses = noted
        stays = keep[old_rows]
        mapping = dict(
            zip(new_index[old_rows[stays]].tolist(), addresses[stays].tolist(), strict=True)
        )
        note_addresses(smaller, mapping)
    return smaller
