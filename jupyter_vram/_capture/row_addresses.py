"""The address of each allocation a recording left alive, kept beside its profile (never saved
with it): what ties a storage alive as the run ends to the very row that made it.

A recorder notes them as it builds the profile; leak finding takes them as the run ends. A
profile without them (loaded, converted from a file, a capture that had none) matches leaks
by size only.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .._model import Profile

#: profile -> (rows, addresses) of its allocations made while recording and never freed
_noted: weakref.WeakKeyDictionary[Profile, tuple[np.ndarray, np.ndarray]] = (
    weakref.WeakKeyDictionary()
)


def note_addresses(
    profile: Profile, addresses: Mapping[int, int] | Sequence[int] | np.ndarray
) -> None:
    """Keep the addresses (row -> address, or one per row with -1 for none) of ``profile``'s
    rows that were allocated while recording and never freed; never raises (the profile
    matters more)."""
    try:
        a = profile.allocations
        alive = (a.alloc_seq >= 0) & (a.free_seq < 0)
        if isinstance(addresses, Mapping):
            rows = np.fromiter(addresses.keys(), np.int64, len(addresses))
            addrs = np.fromiter(addresses.values(), np.int64, len(addresses))
            keep = (rows >= 0) & (rows < len(alive))
            rows, addrs = rows[keep], addrs[keep]
            keep = alive[rows]
            rows, addrs = rows[keep], addrs[keep]
        else:
            column = np.asarray(addresses, np.int64)
            rows = np.flatnonzero(alive[: len(column)])
            addrs = column[rows]
            rows, addrs = rows[addrs >= 0], addrs[addrs >= 0]
        _noted[profile] = (rows, addrs)
    except Exception:  # noqa: BLE001 - without addresses, leaks are matched by size
        pass


def take_addresses(profile: Profile) -> tuple[np.ndarray, np.ndarray] | None:
    """The (rows, addresses) noted for ``profile``, forgotten here (None: none were noted)."""
    return _noted.pop(profile, None)
