"""A kernel interrupt during a widget's long run (a rerun, a fit check): raised in the run,
and raised again when the interpreter drops it (inside a weakref callback)."""

from __future__ import annotations

import signal
import sys
import threading
import time
import weakref
from typing import Any

import pytest

from jupyter_vram._app.interrupts import interrupts_raise


class Dying:
    """An object whose weakref callback runs when the test lets it go."""


def test_an_interrupt_dropped_in_a_weakref_callback_is_raised_again() -> None:
    hook_before = sys.unraisablehook
    handler_before = signal.getsignal(signal.SIGINT)
    dying = Dying()
    # the SIGINT's KeyboardInterrupt is raised inside the callback: Python only reports it
    watch = weakref.ref(dying, lambda _: signal.raise_signal(signal.SIGINT))
    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt), interrupts_raise() as interrupts:
        del dying  # the callback runs here
        while time.perf_counter() < started + 20.0:  # a run that only an interrupt ends
            pass
    assert time.perf_counter() - started < 15.0
    assert interrupts.dropped == 1 and interrupts.cancelled
    assert watch() is None
    assert sys.unraisablehook is hook_before  # both put back
    assert signal.getsignal(signal.SIGINT) == handler_before


def test_a_run_that_ends_before_the_interrupt_lands_is_told_it_was_cancelled() -> None:
    dying = Dying()
    watch = weakref.ref(dying, lambda _: signal.raise_signal(signal.SIGINT))
    try:
        with interrupts_raise() as interrupts:
            del dying  # dropped; the block ends at once, before it is sent again
    except KeyboardInterrupt:  # landed before the end after all (a slow machine)
        pass
    assert interrupts.cancelled and watch() is None


def test_a_plain_interrupt_raises_and_other_unraisables_go_to_the_hook_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reported: list[type[BaseException] | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_type))

    def fail(_: Any) -> None:
        raise ValueError("not an interrupt")

    with pytest.raises(KeyboardInterrupt), interrupts_raise() as interrupts:
        dying = Dying()
        watch = weakref.ref(dying, fail)
        del dying
        signal.raise_signal(signal.SIGINT)
    assert reported == [ValueError] and watch() is None
    assert not interrupts.cancelled  # nothing was dropped: it reached the block


def test_off_the_main_thread_nothing_changes() -> None:
    seen: list[object] = []

    def run() -> None:
        with interrupts_raise() as interrupts:
            seen.extend([sys.unraisablehook, interrupts.cancelled])

    hook = sys.unraisablehook
    helper = threading.Thread(target=run)
    helper.start()
    helper.join()
    assert seen == [hook, False]
