"""The first view of a profile where the page draws saved profiles itself.

Building the live app (about 25 widgets and a bokeh document) and sending it to the page costs
~40 ms per output, more than recording a short loop does. The ``jupyter-vram`` lab extension
draws the saved profile (header, breakdown, flame graph with hover and zoom, timeline, top
modules) from the output's data, without the kernel. Where it is in the page (see
``_session.saved_view_first``), an output carries only that, the static report and the text,
and the live app (reruns, leaks, allocator state, sortable sites, make-it-fit) is built when
the user asks for it: the extension's button calls :func:`open_live`, which replaces the
output in place.
"""

from __future__ import annotations

import functools
import uuid
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .holder import ProfileHandle, current_cell, on_cell_rerun

if TYPE_CHECKING:
    from .._estimator.api import Comparison
    from .._model import Profile
    from .profile_app import ProfileApp

#: saved views whose live app can still be opened, at most (the oldest are forgotten)
KEPT_VIEWS = 64


@dataclass
class _Pending:
    """What opening one saved view's live app needs."""

    handle: ProfileHandle
    comparison: Comparison | None
    cell: str | None


_pending: dict[str, _Pending] = {}


class SavedView:
    """A profile's output without widgets: the saved profile (with the key its live app
    opens by), the static report and the text. Displayed with that key as its display id."""

    def __init__(self, profile: Profile, comparison: Comparison | None = None) -> None:
        self.key = uuid.uuid4().hex
        self._profile = weakref.ref(profile)
        self._comparison = comparison
        cell = current_cell()
        _pending[self.key] = _Pending(ProfileHandle(profile), comparison, cell)
        while len(_pending) > KEPT_VIEWS:
            del _pending[next(iter(_pending))]
        if cell is not None:
            on_cell_rerun(cell, functools.partial(_forget, self.key))

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        from .._render.static_report import saved_views
        from .._render.text import summary

        profile = self._profile()
        if profile is None:
            return {"text/plain": "(a jupyter_vram profile no longer in memory)"}
        text = summary(profile)
        notes = []
        if self._comparison is not None:
            from .._render.estimate_text import comparison_text

            notes.append(comparison_text(self._comparison))
            text += "\n" + notes[-1]
        try:
            return {**saved_views(profile, notes=notes, live=self.key), "text/plain": text}
        except Exception as exc:  # noqa: BLE001 - the text still shows, and says why
            return {"text/plain": f"{text}\n(the saved view failed: {exc!r})"}

    def __repr__(self) -> str:
        return f"<SavedView {self.key}>"


def show_saved(profile: Profile, comparison: Comparison | None = None) -> SavedView:
    """Display ``profile``'s saved view (its live app opens with :func:`open_live`)."""
    from IPython.display import display

    view = SavedView(profile, comparison)
    display(view, display_id=view.key)  # type: ignore[no-untyped-call]
    return view


def holds(key: str) -> bool:
    """Whether the live app of the saved view ``key`` can still be opened here."""
    pending = _pending.get(key)
    return pending is not None and pending.handle.get() is not None


def open_live(key: str) -> ProfileApp | str:
    """Replace the saved view ``key`` by its live app, in place, and return the app (the
    extension's button asks for this as a user expression, whose answer is the app's bundle:
    a page loaded after the cell ran gets no update for its output, and applies that); "gone"
    where its profile is no longer in memory (the saved view stays; the extension says so)."""
    from IPython.display import update_display

    from .holder import displayed_in_cell
    from .profile_app import ProfileApp

    pending = _pending.pop(key, None)
    profile = pending.handle.get() if pending is not None else None
    if pending is None or profile is None:
        return "gone"
    app = ProfileApp(profile, comparison=pending.comparison)
    displayed_in_cell(app, pending.cell)
    update_display(app, display_id=key)  # type: ignore[no-untyped-call]
    return app


def _forget(key: str) -> ProfileHandle | None:
    pending = _pending.pop(key, None)
    return pending.handle if pending is not None else None
