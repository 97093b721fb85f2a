"""Export a table of the app as CSV: a download link that carries the table itself.

The link is a ``data:`` URL in the page, so the download needs no kernel round trip and no
file on the server, and works for a table the app already shows.
"""

from __future__ import annotations

import html
import urllib.parse

import ipywidgets as w
import pandas as pd


def csv_text(frame: pd.DataFrame) -> str:
    """The frame as CSV, exact values, no index: byte counts a missing value made float (a
    what-if that could not run) are written as integers, the missing ones empty."""
    out = frame.copy()
    for column in out.columns:
        values = out[column]
        if values.dtype.kind == "f" and values.notna().any():
            present = values.dropna()
            if (present == present.round()).all() and present.abs().max() < 2**63:
                out[column] = values.astype("Int64")
    return str(out.to_csv(index=False, lineterminator="\n"))


def csv_link_html(frame: pd.DataFrame, filename: str, label: str = "Export CSV") -> str:
    """An ``<a download>`` whose href holds the CSV (empty frames: nothing to export)."""
    if frame.empty:
        return ""
    href = "data:text/csv;charset=utf-8," + urllib.parse.quote(csv_text(frame))
    return (
        f"<a class='jv-csv' download='{html.escape(filename, quote=True)}' "
        f"href='{html.escape(href, quote=True)}' title='download this table as CSV'>"
        f"{html.escape(label)}</a>"
    )


class CsvLink(w.HTML):  # type: ignore[misc]
    """The link, kept in step with the table it exports (``show`` on each change)."""

    def __init__(self, filename: str) -> None:
        super().__init__()
        self.filename = filename
        self.add_class("jv-csv-box")

    def show(self, frame: pd.DataFrame) -> None:
        self.value = csv_link_html(frame, self.filename)
