"""A kernel interrupt as the Cancel of a long run a widget started (a rerun, a fit check).

The interrupt can land where the interpreter drops it (inside a weakref callback of the
recorder's: see ``_capture.resent_interrupts``); while such a run is on, an interrupt the
interpreter drops is sent again, and the run is told a Cancel came even when it ended before
the interrupt could land.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from .._capture.resent_interrupts import Interrupts, dropped_interrupts_resent


@contextlib.contextmanager
def interrupts_raise() -> Iterator[Interrupts]:
    """SIGINT raises KeyboardInterrupt in the block (an idle ipykernel ignores it, and a widget
    message is not always handled with Python's handler on; only the main thread may change
    that), and an interrupt the interpreter drops is sent again until the block ends. Off the
    main thread (signals never reach it) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield Interrupts()
        return
    try:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # an embedded interpreter that keeps signals for itself
        yield Interrupts()
        return
    try:
        with dropped_interrupts_resent() as interrupts:
            yield interrupts
    finally:
        signal.signal(signal.SIGINT, previous)
