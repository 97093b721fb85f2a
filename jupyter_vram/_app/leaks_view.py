"""The app's leak list: memory the cell left alive, what holds it, and a Release button that
drops those references (only when clicked)."""

from __future__ import annotations

import html
import weakref
from typing import Any

import ipywidgets as w
import pandas as pd

from .._leaks import after_release, find_leaks, group_leaks, release_leaks
from .._units import format_bytes
from .export import CsvLink
from .holder import GONE, ProfileHandle

TITLE = "Leaks"


def leaks_html(leaks: pd.DataFrame) -> str:
    """The leak table, one row per holder (or why it is empty)."""
    note = leaks.attrs.get("note")
    if leaks.empty:
        why = note or "Nothing this cell made is still alive."
        return f"<p class='jv-note'>{html.escape(why)}</p>"
    groups = group_leaks(leaks)
    rows = "".join(
        f"<tr><td class='jv-num'>{format_bytes(int(r['bytes']))}</td>"
        f"<td class='jv-num'>{int(r['storages'])}</td>"
        f"<td>{html.escape(str(r['holder_kind']))}</td><td>{html.escape(str(r['holders']))}</td>"
        f"<td>{'yes' if r['releasable'] else 'by hand'}</td><td>{html.escape(str(r['op']))}</td>"
        f"<td>{html.escape(str(r['module']))}</td><td>{html.escape(str(r['site']))}</td></tr>"
        for _, r in groups.iterrows()
    )
    total = format_bytes(int(leaks["bytes"].sum()))
    return (
        f"<table class='jv-table jv-leaks-table'><caption>{len(leaks)} storages, {total}, made "
        "by the cell and still alive; a row per holder</caption><tr><th>bytes</th>"
        "<th>storages</th><th>held by</th><th>names</th><th>release</th><th>op</th>"
        f"<th>module</th><th>site</th></tr>{rows}</table>"
        + (f"<p class='jv-note'>{html.escape(note)}</p>" if note else "")
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
        help_line = w.HTML(
            "<div class='jv-label jv-note'>Memory the cell allocated that is still alive, and "
            "what keeps it: a variable, an output (<code>Out[n]</code>, <code>_</code>), the "
            "last error's traceback, a closure or a reference cycle. Release drops those "
            "references; closures and module globals are left to you.</div>"
        )
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
        items = "".join(f"<li>{html.escape(d)}</li>" for d in done)
        self.status.value = f"<ul class='jv-note'>{items}</ul>" if done else ""
        return done


#: Every leak table shown in this kernel (ipywidgets keeps them while their output lives).
_views: weakref.WeakSet[LeaksView] = weakref.WeakSet()


def refresh_all() -> None:
    """Redraw every leak table: after a release, wherever it came from."""
    for view in list(_views):
        view.refresh()


after_release(refresh_all)
