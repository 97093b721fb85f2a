"""The apps' widget comms open outside the cell's request, so a headless run stores no app.

nbclient (``jupyter nbconvert --execute``, papermill) keeps the state of every widget whose
messages answer a cell (their parent is the cell's execute request) and saves it in the
notebook; nbconvert then draws such an output's widget view instead of its ``text/html``. For
our apps that view needs widget JavaScript from the internet and cannot draw the bokeh figures
from saved state anyway, so the page showed no profile at all. Opened with no parent request,
the comms still reach every widget frontend (a ``comm_open`` is handled whatever its parent),
but nbclient, which follows only the cell's messages, keeps nothing of them: nbconvert shows
the static report. Later messages (clicks, reruns) are unaffected.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def outside_the_cell() -> Iterator[None]:
    """While inside, the kernel's messages carry no parent request (a no-op outside a kernel,
    or with an ipykernel that keeps its parent some other way)."""
    parent = _parent_var()
    if parent is None:
        yield
        return
    token = parent.set({})
    try:
        yield
    finally:
        parent.reset(token)


def _parent_var() -> ContextVar[dict[str, Any]] | None:
    """ipykernel's current shell request (a context variable since ipykernel 6.?), if any."""
    module = sys.modules.get("IPython.core.getipython")
    shell = module.get_ipython() if module is not None else None
    var = getattr(getattr(shell, "kernel", None), "_shell_parent", None)
    return var if isinstance(var, ContextVar) else None


def opens_outside_the_cell(init: F) -> F:
    """For an app's ``__init__``: the widgets it makes open their comms outside the cell."""

    @functools.wraps(init)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with outside_the_cell():
            return init(*args, **kwargs)

    return wrapped  # type: ignore[return-value]
