"""A kernel interrupt as the Cancel of a long run a widget started (a rerun, a fit check).

The Jupyter server interrupts a kernel with a signal (SIGINT); on the kernel's main thread
Python's handler raises KeyboardInterrupt wherever the thread is at that moment. That can be
inside a weakref callback (the recorder runs one each time a storage it noted is freed, and
they are many while a step runs), a ``__del__`` or a garbage collector callback, and there the
interpreter only prints the exception ("Exception ignored in ...") and goes on: the one
interrupt a Cancel sends would be lost, the run would go on (for ever, for a cell that runs
until interrupted) and the bar would keep saying "running". So while such a run is on, an
interrupt the interpreter drops is sent again, and the run is told a Cancel came even when it
ended before the interrupt could land.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

RESEND_AFTER_S = 0.02
"""How often the helper thread looks for a dropped interrupt, and so the least time before it
sends it again: the main thread has left the callback that dropped it by then (sent while it
is still inside, it would be dropped there again, and sent again)."""


class Interrupts:
    """Kernel interrupts during one run (see :func:`interrupts_raise`). The unraisable hook
    only counts (it runs inside the callback that dropped the interrupt: anything that waits
    there, such as starting a thread, would let the next interrupt land there too); a helper
    thread sends each drop again."""

    def __init__(self) -> None:
        self.dropped = 0  # KeyboardInterrupts the interpreter swallowed during the run
        self._resent = 0
        self._active = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def cancelled(self) -> bool:
        """A Cancel came during the run, though no KeyboardInterrupt may have reached it."""
        return self.dropped > 0

    def _start(self) -> None:
        self._active = True
        self._thread = threading.Thread(
            target=self._resend_dropped, name="jupyter_vram-interrupts", daemon=True
        )
        self._thread.start()

    def _resend_dropped(self) -> None:
        """Send each dropped interrupt again, as if SIGINT arrived again (the handler raises).
        Like the recorder's ticker thread, this loop makes no object the garbage collector
        tracks: no collection starts on this thread while the main thread records."""
        while self._active:
            time.sleep(RESEND_AFTER_S)
            with self._lock:
                if self._active and self.dropped > self._resent:
                    self._resent = self.dropped
                    _thread.interrupt_main()

    def _stop(self) -> None:
        with self._lock:  # no interrupt is sent after this
            self._active = False
        thread, self._thread = self._thread, None
        if thread is not None and thread.ident is not None:  # started
            thread.join()  # it wakes within RESEND_AFTER_S


@contextlib.contextmanager
def interrupts_raise() -> Iterator[Interrupts]:
    """SIGINT raises KeyboardInterrupt in the block (an idle ipykernel ignores it, and a widget
    message is not always handled with Python's handler on; only the main thread may change
    that), and an interrupt the interpreter drops is sent again until the block ends. Off the
    main thread (signals never reach it) nothing changes."""
    interrupts = Interrupts()
    main = threading.main_thread().ident
    if threading.get_ident() != main:
        yield interrupts
        return
    try:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # an embedded interpreter that keeps signals for itself
        yield interrupts
        return
    previous_hook = sys.unraisablehook

    def on_unraisable(unraisable: Any) -> None:
        if unraisable.exc_type is KeyboardInterrupt and threading.get_ident() == main:
            interrupts.dropped += 1
        else:
            previous_hook(unraisable)

    sys.unraisablehook = on_unraisable
    try:
        interrupts._start()
        yield interrupts
    finally:
        try:
            interrupts._stop()
        finally:
            if sys.unraisablehook is on_unraisable:
                sys.unraisablehook = previous_hook
            signal.signal(signal.SIGINT, previous)
