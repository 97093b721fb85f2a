"""Kernel interrupts the interpreter drops, sent again.

The Jupyter server interrupts a kernel with a signal (SIGINT); on the kernel's main thread
Python's handler raises KeyboardInterrupt wherever the thread is at that moment. That can be
inside a weakref callback (the CPU recorder runs one each time a storage it noted is freed,
thousands per training step), a ``__del__`` or a garbage collector callback, and there the
interpreter only prints the exception ("Exception ignored in ...") and goes on: the interrupt
is lost, and a cell that runs until interrupted would run for ever. So while a block of ours
runs (a recording, a widget's rerun), an unraisable hook counts the KeyboardInterrupts dropped
on the main thread and a helper thread sends each one again, as if SIGINT came again.

Blocks nest (a recording inside a rerun): one hook and one thread serve them all, and a drop
is sent again once. SIGINT's handler is left as it is (a re-send calls whatever handler is
set, and does nothing where SIGINT is ignored).
"""

from __future__ import annotations

import _thread
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from ._common import interrupts_deferred

RESEND_AFTER_S = 0.02
"""How long after a drop the helper thread sends it again: the main thread has left the
callback that dropped it by then (sent while it is still inside, it would be dropped there
again, and sent again)."""

THREAD_NAME = "jupyter_vram-interrupts"


class _Resender:
    """The process-wide count of dropped interrupts, and the hook and thread that serve every
    open block (all on the main thread: only it receives signals)."""

    def __init__(self) -> None:
        self.dropped = 0  # KeyboardInterrupts the interpreter swallowed while a block was open
        self.resent = 0  # of those, sent again (or handed to a block that ended first)
        self.blocks = 0
        self.active = False
        self.lock = threading.Lock()
        #: held while no drop waits: the hook releases it (a C call, which no interrupt can
        #: cut), and the helper thread sleeps on it instead of waking to look (a thread
        #: waking every few ms took a core from a step's own threads: +5 % on a GPT-2 step)
        self.wake = _thread.allocate_lock()
        self.thread: threading.Thread | None = None
        self.hook_before: Any = None

    def on_unraisable(self, unraisable: Any) -> None:
        """Only counts: this runs inside the callback that dropped the interrupt, and anything
        that waits here (starting a thread) would let the next interrupt land here too."""
        if unraisable.exc_type is KeyboardInterrupt and threading.current_thread() is _MAIN:
            self.dropped += 1
            try:  # noqa: SIM105 - as few calls as can be here: each one is a place to land
                self.wake.release()
            except RuntimeError:  # already released: the thread is on its way
                pass
        else:
            self.hook_before(unraisable)

    def resend_dropped(self) -> None:
        """The helper thread. Like the recorder's ticker thread, this loop makes no object the
        garbage collector tracks (no ``with`` on the lock, which makes a bound method): no
        collection starts on this thread while the main thread records."""
        lock, wake = self.lock, self.wake
        while True:
            wake.acquire()  # until a drop, or the last block's end
            if not self.active:
                return
            time.sleep(RESEND_AFTER_S)
            lock.acquire()
            try:
                if self.active and self.dropped > self.resent:
                    self.resent = self.dropped
                    _thread.interrupt_main()
            finally:
                lock.release()

    def open(self) -> None:
        self.blocks += 1
        if self.blocks > 1:
            return
        self.hook_before = sys.unraisablehook
        sys.unraisablehook = self.on_unraisable
        self.active = True
        self.wake.acquire(blocking=False)  # no drop waits yet
        self.thread = threading.Thread(target=self.resend_dropped, name=THREAD_NAME, daemon=True)
        self.thread.start()

    def close(self) -> int:
        """Leave a block: the drops not sent again yet, which its caller now owns."""
        self.lock.acquire()
        try:  # nothing is sent between this and the block's end
            unsent, self.resent = self.dropped - self.resent, self.dropped
            self.blocks -= 1
            last = self.blocks == 0
            if last:
                self.active = False
                with contextlib.suppress(RuntimeError):  # released: a drop woke it
                    self.wake.release()  # the thread wakes, and ends
        finally:
            self.lock.release()
        if last:
            thread, self.thread = self.thread, None
            try:
                if thread is not None and thread.ident is not None:  # started
                    thread.join()  # at once, or after a drop's RESEND_AFTER_S
            finally:
                if sys.unraisablehook == self.on_unraisable:
                    sys.unraisablehook = self.hook_before
                self.hook_before = None
        return unsent


_MAIN = threading.main_thread()
_RESENDER = _Resender()


class Interrupts:
    """The kernel interrupts the interpreter dropped during one block."""

    def __init__(self) -> None:
        self._from: int | None = None  # the process-wide count when the block began
        self._dropped = 0
        self.unsent = 0
        """Dropped, and not sent again before the block ended: the caller must act on them."""

    @property
    def dropped(self) -> int:
        """KeyboardInterrupts the interpreter swallowed during the block (so far)."""
        if self._from is not None:
            return _RESENDER.dropped - self._from
        return self._dropped

    @property
    def cancelled(self) -> bool:
        """An interrupt came during the block, though no KeyboardInterrupt may have reached
        it."""
        return self.dropped > 0

    def start(self) -> None:
        """Send dropped interrupts again from now on (on the main thread; elsewhere signals
        never arrive, and nothing changes)."""
        if threading.current_thread() is not _MAIN or self._from is not None:
            return
        self._from = _RESENDER.dropped
        _RESENDER.open()

    def stop(self) -> None:
        """No more re-sends for this block; ``unsent`` says what is left to act on."""
        if self._from is None:
            return
        self.unsent = _RESENDER.close()
        self._dropped, self._from = _RESENDER.dropped - self._from, None


@contextlib.contextmanager
def dropped_interrupts_resent() -> Iterator[Interrupts]:
    """An interrupt the interpreter drops on the main thread is sent again until the block
    ends; what it dropped and never sent again is ``unsent`` afterwards. Off the main thread
    (signals never reach it) nothing changes. ``start`` and ``stop`` are the same for a block
    that is not a ``with`` (called where interrupts are deferred)."""
    interrupts = Interrupts()
    with interrupts_deferred():  # an interrupt between two steps would leave the hook on
        interrupts.start()
    try:
        yield interrupts
    finally:
        with interrupts_deferred():
            interrupts.stop()
