"""How apps hold their profile.

ipywidgets keeps every displayed widget alive for the life of the kernel, so an app holding
its Profile would keep every profile ever shown (a large cell's profile is ~100 MB). An app
holds its profile through a weak reference; only the latest app's profile is also held here,
so ``jv.show(Profile.load(...))`` stays interactive while nothing else refers to it. An older
app whose profile is gone keeps what it already shows (its static view) and says so when asked
for more.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._model import Profile

_latest: list[object] = []

GONE = (
    "This profile is no longer in memory (a newer one replaced it), so this view stays as it "
    "is. Keep a reference to it (<code>p = _vram</code>) and <code>jv.show(p)</code> to explore "
    "it again."
)


class ProfileHandle:
    """A weak reference to a profile; the newest handle also keeps its profile alive."""

    def __init__(self, profile: Profile, *also: object) -> None:
        """``also``: what else the latest app needs kept (its estimate)."""
        self._ref = weakref.ref(profile)
        _latest[:] = [profile, *also]

    def get(self) -> Profile | None:
        """The profile, or None once nothing else holds it."""
        return self._ref()


def handle_of(profile: Profile | ProfileHandle) -> ProfileHandle:
    return profile if isinstance(profile, ProfileHandle) else ProfileHandle(profile)


def forget_latest() -> None:
    """Drop the strong reference to the latest app's profile (tests, memory-minded users)."""
    _latest.clear()
