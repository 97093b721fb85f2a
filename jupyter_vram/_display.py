"""Plain-text views for classes that live below the display layer.

An :class:`~jupyter_vram._estimator.Estimate` shows its summary when IPython prints it, but
the estimator returns data and imports no renderer. So its ``_repr_pretty_`` asks here for
the view registered under its kind, and the package registers the renderer's at import
(``jupyter_vram/_profile_services.py``). A leaf: it imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_views: dict[str, Callable[[Any], str]] = {}


def register(kind: str, view: Callable[[Any], str]) -> None:
    """Show objects of ``kind`` as ``view(obj)`` (the package does it once, at import)."""
    _views[kind] = view


def text(kind: str, obj: Any) -> str:
    """``obj`` in words, by the view registered for ``kind``; its repr if there is none."""
    view = _views.get(kind)
    return view(obj) if view is not None else repr(obj)
