"""The app's leak list: memory the cell left alive, what holds it, and a Release button that
drops those references (only when clicked)."""

from __future__ import annotations

import weakref
from typing import Any

import ipywidgets as w
import pandas as pd

from .._leaks import after_release, find_leaks, group_leaks, release_leaks
from .._render.templating import render
from .export import CsvLink
from .holder import GONE, ProfileHandle

TITLE = "Leaks"
TEMPLATE = "leaks_view.html.j2"


def leaks_html(leaks: pd.DataFrame) -> str:
    """The leak table, one row per holder (or why it is empty)."""
    return render(
        TEMPLATE,
        "leaks_table",
        storages=len(leaks),
        total=int(leaks["bytes"].sum()) if not leaks.empty else 0,
        groups=group_leaks(leaks).to_dict("records") if not leaks.empty else [],
        note=leaks.attrs.get("note"),
    )


class LeaksView(w.VBox):  # type: ignore[misc]
    """The list, a Release button (drops what the list names) and a Refresh button."""

    def __init__(self, handle: ProfileHandle) -> None:
        self._handle = handle
        self.table = w.HTML()
        self.table.add_class("jv-leaks")
        self.status = w.HTML()
        self.status.add_class("jv-leaks-status")
        self.release_button = w.Button(description="Release", button_style="warning",
                                       tooltip="delete the variables, clear the outputs and "
                                       "traceback that hold this memory")  # fmt: skip
        self.release_button.add_class("jv-leaks-release")
        self.refresh_button = w.Button(description="Refresh")
        self.refresh_button.add_class("jv-leaks-refresh")
        self.release_button.on_click(self.release)
        self.refresh_button.on_click(self.refresh)
        self.export = CsvLink("leaks.csv")
        help_line = w.HTML(render(TEMPLATE, "help_line"))
        super().__init__(
            [help_line, w.HBox([self.release_button, self.refresh_button, self.export]),
             self.status, self.table]
        )  # fmt: skip
        self.add_class("jv-leaks-view")
        _views.add(self)
        self.refresh()

    def refresh(self, _: Any = None) -> None:
        profile = self._handle.get()
        if profile is None:
            self.table.value = f"<p class='jv-gone'>{GONE}</p>"
            self.release_button.disabled = True
            return
        leaks = find_leaks(profile)
        self.table.value = leaks_html(leaks)
        self.export.show(group_leaks(leaks) if not leaks.empty else leaks)
        self.release_button.disabled = leaks.empty

    def release(self, _: Any = None) -> list[str]:
        """Drop the references the list names; say what was done. Every leak table of the
        kernel then refreshes (a release frees what other cells' tables list too)."""
        profile = self._handle.get()
        if profile is None:
            return []
        done = release_leaks(profile)
        self.status.value = render(TEMPLATE, "released", done=done)
        return done


#: Every leak table shown in this kernel (ipywidgets keeps them while their output lives).
_views: weakref.WeakSet[LeaksView] = weakref.WeakSet()


def refresh_all() -> None:
    """Redraw every leak table: after a release, wherever it came from."""
    for view in list(_views):
        view.refresh()


after_release(refresh_all)
