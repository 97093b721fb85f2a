"""How apps hold their profile.

ipywidgets keeps every displayed widget alive for the life of the kernel, so an app holding
its Profile would keep every profile ever shown (a large cell's profile is ~100 MB). An app
holds its profile through a weak reference; the newest apps' profiles are also held here, up
to ``KEPT_APPS`` of them and ``KEPT_BYTES`` of their columns (the newest always), so the apps
of the last few cells stay interactive (a leak found two cells ago can still be released) and
``jv.show(Profile.load(...))`` works while nothing else refers to it. An older app whose
profile is gone keeps what it already shows and says so when asked for more.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._model import Profile

#: the newest apps' profiles (and what each needs with it), newest last
_latest: list[tuple[object, ...]] = []
KEPT_APPS = 4
#: host bytes the kept profiles' allocation columns may take together (the newest is kept
#: whatever its size)
KEPT_BYTES = 256 * 2**20

GONE = (
    "This profile is no longer in memory (newer ones replaced it), so this view stays as it "
    "is. Keep a reference to it (<code>p = _vram</code>) and <code>jv.show(p)</code> to explore "
    "it again."
)


def column_bytes(profile: Profile) -> int:
    """Host bytes of a profile's allocation columns, what grows with the cell's length."""
    a = profile.allocations
    return sum(int(getattr(a, f.name).nbytes) for f in dataclasses.fields(a))


def latest_held() -> list[object]:
    """What the held apps keep alive, newest first."""
    return [item for entry in reversed(_latest) for item in entry]


class ProfileHandle:
    """A weak reference to a profile; the newest handles also keep theirs alive."""

    def __init__(self, profile: Profile, *also: object) -> None:
        """``also``: what else the app needs kept (its estimate)."""
        self._ref = weakref.ref(profile)
        _latest[:] = [e for e in _latest if e[0] is not profile]
        _latest.append((profile, *also))
        total = 0
        keep = 0
        for entry in reversed(_latest):
            total += column_bytes(entry[0])  # type: ignore[arg-type]
            if keep and (keep >= KEPT_APPS or total > KEPT_BYTES):
                break
            keep += 1
        del _latest[: len(_latest) - keep]

    def get(self) -> Profile | None:
        """The profile, or None once nothing else holds it."""
        return self._ref()


def handle_of(profile: Profile | ProfileHandle) -> ProfileHandle:
    return profile if isinstance(profile, ProfileHandle) else ProfileHandle(profile)


def forget_latest() -> None:
    """Drop the strong reference to the latest app's profile (tests, memory-minded users)."""
    _latest.clear()


# -- one app per cell: a re-run cell's old app is closed ------------------------------------

#: the cell running now, as the frontend named it (None: a frontend that sends no ids)
_cell: list[str | None] = [None]
#: cell id -> the apps displayed while it ran (weakly: ipywidgets keeps them, not us)
_apps_of_cell: dict[str, list[weakref.ref[Any]]] = {}


#: cell id -> what else its previous run left to let go of (saved views' live apps)
_forget_of_cell: dict[str, list[Callable[[], ProfileHandle | None]]] = {}


def cell_started(cell_id: str | None) -> None:
    """A cell is about to run: the apps its previous run displayed are closed (the frontend
    replaces that output) and their profiles no longer held; later apps belong to it."""
    _cell[0] = cell_id
    if cell_id is None:
        return
    handles = [forget() for forget in _forget_of_cell.pop(cell_id, [])]
    for ref in _apps_of_cell.pop(cell_id, []):
        app = ref()
        if app is not None:
            close_tree(app)
            handles.append(getattr(app, "_handle", None))
    gone = [h.get() for h in handles if isinstance(h, ProfileHandle)]
    _latest[:] = [e for e in _latest if not any(e[0] is p for p in gone)]


def current_cell() -> str | None:
    """The id of the cell running now (None: the frontend sends none)."""
    return _cell[0]


def displayed_in_this_cell(app: Any) -> None:
    """Note that ``app`` belongs to the running cell (closed when that cell runs again)."""
    displayed_in_cell(app, _cell[0])


def displayed_in_cell(app: Any, cell_id: str | None) -> None:
    """Note that ``app`` belongs to cell ``cell_id`` (closed when that cell runs again)."""
    if cell_id is not None:
        _apps_of_cell.setdefault(cell_id, []).append(weakref.ref(app))


def on_cell_rerun(cell_id: str, forget: Callable[[], ProfileHandle | None]) -> None:
    """Call ``forget`` when cell ``cell_id`` runs again; the handle it returns, if any, no
    longer keeps its profile."""
    _forget_of_cell.setdefault(cell_id, []).append(forget)


def close_tree(root: Any) -> None:
    """Close a widget and every widget it holds (children, layouts, styles, tabs made later)
    but the kernel's shared styles and layouts (see :mod:`.shared`): ipywidgets keeps each
    one in the kernel until it is closed, and ``close`` is not recursive."""
    import ipywidgets as w
    from jupyter_bokeh import BokehModel

    from .shared import is_kept

    todo = [root]
    seen: set[int] = set()
    while todo:
        widget = todo.pop()
        if id(widget) in seen or not isinstance(widget, w.Widget) or is_kept(widget):
            continue
        seen.add(id(widget))
        for name in widget.keys:
            value = widget._trait_values.get(name)
            if isinstance(value, w.Widget):
                todo.append(value)
            elif isinstance(value, (list, tuple)):
                todo.extend(v for v in value if isinstance(v, w.Widget))
        if isinstance(widget, BokehModel):
            # jupyter_bokeh's close is not idempotent (a second one, from ``__del__`` at
            # garbage collection, raises KeyError into the cell's output): close the comm
            # only, and leave the document's callback to that final close
            w.Widget.close(widget)
        else:
            widget.close()
