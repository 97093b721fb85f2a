"""A Ctrl-C (a kernel interrupt) during `jv.record()` always stops the block, even when it
lands inside the recorder's weakref callback, where the interpreter drops it.

The recorder watches each storage it notes with a weakref whose callback runs when the storage
is freed; a KeyboardInterrupt raised inside that callback is only reported ("Exception ignored
in ...") and the block would run on: a cell that trains until interrupted would never stop.
Real SIGINTs are sent from another thread at swept delays while the block frees noted storages
one after another (its time is mostly spent in those callbacks), and every one must end the
block with KeyboardInterrupt, with recording fully off afterwards.
"""

from __future__ import annotations

import gc
import signal
import sys
import threading
import time
import weakref

import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._capture.resent_interrupts import Interrupts, dropped_interrupts_resent
from jupyter_vram._recording import started_early, wait_for_early_work

from .conftest import CLEAN, interrupts_raise, recording_state

POOL = 40_000
"""Tensors noted before the block (its namespace holds them) and freed one by one inside it."""

DELAYS_S = [0.0006 * k for k in range(40)]
"""When each SIGINT is sent after the block starts freeing: all while it still frees (the
pool takes longer than the last delay: checked below)."""


def freeing_block(delay_s: float) -> tuple[bool, float]:
    """Record a block that frees the pool while a SIGINT is sent ``delay_s`` after it begins:
    whether the block ended with KeyboardInterrupt, and the time the pool took to empty
    (inf when the interrupt stopped it first)."""
    namespace = {"pool": [torch.ones(4) for _ in range(POOL)]}
    pool = namespace["pool"]
    freeing, sent = threading.Event(), threading.Event()
    main = threading.main_thread().ident
    assert main is not None

    def send() -> None:
        if freeing.wait(30):
            time.sleep(delay_s)
            signal.pthread_kill(main, signal.SIGINT)
        sent.set()

    sender = threading.Thread(target=send, name="test-sigint-sender")
    emptied = float("inf")
    sender.start()
    try:
        with jv.record("cpu", namespace=namespace):
            begun = time.perf_counter()
            freeing.set()
            while pool:
                pool.pop()  # the recorder's weakref callback runs for the freed storage
            emptied = time.perf_counter() - begun
            # the pool is gone; the interrupt comes now at the latest, and only a dropped one
            # lets the block end normally (bounded: the sender sets ``sent`` right after)
            sent.wait(30)
    except KeyboardInterrupt:
        return True, emptied
    finally:
        sender.join()
    return False, emptied


def test_every_interrupt_during_a_recording_stops_it() -> None:
    # SIGINT raises here even where the session was started with interrupts ignored
    lost = []
    fastest_pool = float("inf")
    with interrupts_raise():
        for delay_s in DELAYS_S:
            raised, emptied = freeing_block(delay_s)
            if not raised:
                lost.append(delay_s)
            fastest_pool = min(fastest_pool, emptied)
            assert recording_state() == {**CLEAN, "sigint": signal.default_int_handler}
    assert not lost, f"{len(lost)} of {len(DELAYS_S)} interrupts lost (at {lost} s)"
    # every interrupt was sent while the pool was still being freed, where the drops happen
    assert fastest_pool == float("inf") or fastest_pool > DELAYS_S[-1]


class Dying:
    """An object whose weakref callback runs when the test lets it go."""


def test_nested_blocks_send_a_dropped_interrupt_once() -> None:
    # a recording inside a rerun: one hook and one thread for both, and the inner block, which
    # ended before the drop was sent again, owns it (and raises it); the outer sends nothing
    hook = sys.unraisablehook
    with interrupts_raise(), dropped_interrupts_resent() as outer:
        inner = Interrupts()
        inner.start()
        dying = Dying()
        watch = weakref.ref(dying, lambda _: signal.raise_signal(signal.SIGINT))
        del dying  # dropped inside the callback
        inner.stop()  # at once: before the helper thread looks (every 20 ms)
        time.sleep(0.2)  # the outer's thread would have sent it by now: nothing comes
    assert watch() is None
    assert (inner.dropped, inner.unsent) == (1, 1)
    assert (outer.dropped, outer.unsent) == (1, 0)
    assert sys.unraisablehook is hook
    assert not [t for t in threading.enumerate() if t.name == "jupyter_vram-interrupts"]


def test_an_interrupt_dropped_just_before_the_block_ends_is_raised_at_its_end() -> None:
    dying = Dying()
    watch = weakref.ref(dying, lambda _: signal.raise_signal(signal.SIGINT))
    with (
        interrupts_raise(),
        pytest.raises(KeyboardInterrupt),
        jv.record("cpu", namespace={}) as rec,
    ):
        kept = torch.ones(256)  # 1 KiB
        del dying  # dropped inside the callback; the block ends at once
    assert watch() is None
    assert 1024 in set(rec.profile.to_dataframe()["bytes"])  # the profile is kept
    del kept


def test_a_recording_leaves_the_sigint_handler_alone() -> None:
    def own(signum: int, frame: object) -> None:
        seen.append(signum)

    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, own)
    try:
        with jv.record("cpu", namespace={}):
            assert signal.getsignal(signal.SIGINT) is own
            signal.raise_signal(signal.SIGINT)
            x = torch.ones(8)
        del x
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIGINT]


def test_the_helper_thread_sets_off_no_garbage_collection() -> None:
    # a collection started on a helper thread walks the recording thread's frames while it is
    # inside an op with the GIL released (a crash, with torch.compile): the loop allocates no
    # object the collector tracks. With the threshold at 1 and one tracked object held, any
    # such allocation on the helper thread would start a collection there.
    main = threading.get_ident()
    starts: list[str] = []

    def on_collection(phase: str, info: object) -> None:
        if phase == "start" and threading.get_ident() != main:
            starts.append(threading.current_thread().name)

    wait_for_early_work()  # an earlier test's %load_ext started our spare estimator
    threshold = gc.get_threshold()
    gc.callbacks.append(on_collection)
    try:
        with dropped_interrupts_resent():
            time.sleep(0.05)  # the thread is in its loop
            gc.collect()
            gc.set_threshold(1)
            held = [[]]  # the count is now above 0: one more tracked object collects
            time.sleep(0.3)  # about 15 rounds of the loop
            gc.set_threshold(*threshold)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(on_collection)
    assert starts == [] and held  # names the threads that started one


def test_a_recording_starts_once_our_early_work_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    """`%load_ext` starts a spare estimator on a thread that imports and starts a process,
    making thousands of objects the garbage collector tracks (a collection may start there):
    a recording begun meanwhile starts once that work is done."""
    import jupyter_vram

    done = threading.Event()
    started: list[threading.Thread] = []

    def slow_start() -> None:
        time.sleep(0.3)
        done.set()

    monkeypatch.setattr(jupyter_vram, "_start_spare", slow_start)
    monkeypatch.setattr(jupyter_vram, "started_early", lambda t: (started.append(t), t.start()))
    monkeypatch.setenv(jupyter_vram.EARLY_ESTIMATOR_ENV, "1")
    jupyter_vram._start_estimator_early()
    assert [t.name for t in started] == [jupyter_vram.EARLY_START_THREAD]
    started[0].join()
    done.clear()
    worker = threading.Thread(target=slow_start, daemon=True)
    started_early(worker)
    assert not done.is_set()
    with jv.record("cpu", namespace={}):
        assert done.is_set() and not worker.is_alive()


def test_a_ctrl_c_while_a_recording_waits_for_our_early_work_holds_nothing() -> None:
    """Ctrl-C while a recording's start waits for our background work: the cell stops, and
    the next recording starts (nothing was left held). The work ends only when released,
    after the Ctrl-C: the Ctrl-C came while the start waited."""
    release = threading.Event()
    worker = threading.Thread(target=release.wait, args=(60,), daemon=True)
    started_early(worker)
    main = threading.main_thread().ident
    assert main is not None
    # a real signal to the main thread: it breaks the wait (a simulated one lands after it)
    timer = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT))
    try:
        with interrupts_raise():
            timer.start()
            with pytest.raises(KeyboardInterrupt), jv.record("cpu", namespace={}):
                pass
    finally:
        timer.cancel()
        release.set()
    worker.join()
    with jv.record("cpu", namespace={}) as rec:
        kept = torch.ones(256)
    assert 1024 in set(rec.profile.to_dataframe()["bytes"])
    del kept
