"""Styles and layouts that the apps' widgets share and nothing changes, made once per kernel.

Each ipywidgets style and layout is a widget of its own: a comm the page opens when an app
shows, and closes when the app is closed (a re-run cell closes its previous app), one kernel
message each way. Of the 46 widgets an app first showed, 18 were such look-alikes (a plain
layout, a button style, a fixed width). Those made here live as long as the kernel (a few
hundred bytes each, whatever the number of apps), and :func:`.holder.close_tree` leaves them
open. A widget whose look changes later (shown, hidden) keeps a layout of its own.
"""

from __future__ import annotations

from typing import Any, TypeVar

import ipywidgets as w

W = TypeVar("W", bound=w.Widget)

#: (class, traits) -> the kernel's one such widget
_kept: dict[tuple[type, tuple[tuple[str, str], ...]], Any] = {}


def kept(kind: type[W], **traits: str) -> W:
    """The kernel's one ``kind(**traits)`` (a layout or a style). Never change its traits:
    every app shows them."""
    key = (kind, tuple(sorted(traits.items())))
    widget = _kept.get(key)
    if widget is None or widget.comm is None:  # closed by someone else (Widget.close_all)
        widget = _kept[key] = kind(**traits)
    return widget  # type: ignore[no-any-return]


def is_kept(widget: object) -> bool:
    """Whether ``widget`` is one of the shared ones (which no app's close may close)."""
    return any(widget is one for one in _kept.values())
