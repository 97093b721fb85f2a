"""`jv.record()`: record the allocations of a block of code into a Profile."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from ._capture import (
    RECORDING_LOCK,
    Recorder,
    RecordingError,
    interrupts_deferred,
    make_recorder,
    stack_mode,
)
from ._capture.resent_interrupts import Interrupts
from ._model import Profile as ProfileData
from ._profile import Profile

#: jupyter_vram's own work started in the background (the spare estimator `%load_ext`
#: starts): it imports and starts a process, making thousands of objects the garbage
#: collector tracks, so a collection can start on its thread; a recording starts once it is
#: done (the recorder's own threads make none, see ``ticker``)
_EARLY_WORK: list[threading.Thread] = []
#: how long a recording's start waits for it (then it starts anyway)
EARLY_WORK_WAIT_S = 30.0


def started_early(thread: threading.Thread) -> None:
    """Start ``thread`` (our own work, in the background) and have recordings wait for it."""
    _EARLY_WORK[:] = [t for t in _EARLY_WORK if t.is_alive()]
    _EARLY_WORK.append(thread)
    thread.start()


def wait_for_early_work(timeout: float = EARLY_WORK_WAIT_S) -> None:
    """Wait (at most ``timeout`` seconds in all) for the work :func:`started_early` began."""
    deadline = time.monotonic() + timeout
    for thread in list(_EARLY_WORK):
        thread.join(max(0.0, deadline - time.monotonic()))


class Recording:
    """Context manager around one recorder; `.profile` is ready once the block exits.

    The profile is kept even when the block raises (it covers the run up to the error), and
    recording is switched off on every exit path. A ``torch.OutOfMemoryError`` also leaves a
    post-mortem in the profile (``profile.oom``) and propagates unchanged.
    """

    #: records the meta device (refused otherwise: a user's meta tensors hold no memory)
    fake_run = False

    def __init__(
        self,
        device: str | None = None,
        *,
        stacks: bool | str = "sampled",
        ops: str = "auto",
        namespace: Mapping[str, Any] | None = None,
        capacity: int | float | str | None = None,
        trace: bool = True,
    ) -> None:
        self._device = device
        self._stacks = stack_mode(stacks)
        self._trace = trace  # False: the code may compile; stacks are never traced
        if ops not in ("auto", "all"):
            raise ValueError(f"ops must be 'auto' or 'all', not {ops!r}")
        self._ops = ops
        self._namespace = namespace
        self._capacity = None if capacity is None else _parse_capacity(capacity)
        self._recorder: Recorder | None = None
        self._profile: Profile | None = None
        self._limit: Any = None  # capture.capacity.CapacityLimit
        self._oom_watch: Any = None  # capture.oom.OomWatch
        self._leak_state: Any = None  # leaks._RunState
        self._interrupts: Interrupts | None = None

    @property
    def profile(self) -> Profile:
        if self._profile is None:
            raise RuntimeError("the profile is available once the `with jv.record()` block ends")
        return self._profile

    @property
    def recorder(self) -> Recorder | None:
        """The capture object while the block runs (None outside it), for internal callers
        that need more than the profile (the estimator's backward-pass watch)."""
        return self._recorder

    def __enter__(self) -> Recording:
        wait_for_early_work()  # before the lock: a Ctrl-C here leaves nothing held
        if not RECORDING_LOCK.acquire(blocking=False):
            raise RecordingError(
                "jupyter_vram is already recording; nested recording is not supported"
            )
        from ._capture.tagging import one_scan

        try:
            # a half-started recorder is stopped whole, below; the namespace is walked once
            with interrupts_deferred(), one_scan():
                entry = sys._getframe(1)
                namespace = self._namespace if self._namespace is not None else entry.f_globals
                self._leak_state = _note_leak_start(namespace, self._device, self.fake_run)
                self._recorder = make_recorder(
                    self._device,
                    stacks=self._stacks,
                    ops=self._ops,
                    trace=self._trace,
                    fake=self.fake_run,
                )
                self._recorder.start(entry, self._namespace)
                self._start_watches(self._recorder.device, namespace)
                # the recorder's weakref callbacks run all the time, and an interrupt landing
                # in one is dropped by the interpreter: a Ctrl-C must still stop the block
                self._interrupts = Interrupts()
                self._interrupts.start()
        except BaseException:
            with interrupts_deferred():
                try:
                    self._stop_interrupts()
                    self._stop_watches()
                finally:
                    if self._recorder is not None:
                        self._recorder.stop()
            self._recorder = None
            RECORDING_LOCK.release()
            raise
        return self

    def _start_watches(self, device: str, namespace: Mapping[str, Any]) -> None:
        """The OOM listener, and the capacity when one is asked for (last on, first off)."""
        from ._capture.oom import OomWatch

        self._oom_watch = OomWatch(device, namespace)
        self._oom_watch.start()
        if self._capacity is not None:
            from ._capture.capacity import CapacityLimit

            self._limit = CapacityLimit(self._capacity, device)
            self._limit.start(namespace)

    def _stop_interrupts(self) -> int:
        """No more re-sends of dropped interrupts: how many were dropped and never sent."""
        interrupts, self._interrupts = self._interrupts, None
        if interrupts is None:
            return 0
        interrupts.stop()
        return interrupts.unsent

    def _stop_watches(self) -> None:
        limit, self._limit = self._limit, None
        watch = self._oom_watch
        try:
            if limit is not None:
                limit.stop()
        finally:
            if watch is not None:
                watch.stop()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._recorder is not None
        error = None if exc_type is None else f"{exc_type.__name__}: {exc}"
        limit = self._limit
        unsent = 0
        try:
            with interrupts_deferred():  # an interrupt here must not lose the profile
                try:
                    unsent = self._stop_interrupts()
                    self._stop_watches()
                finally:
                    self._profile = Profile.of(self._recorder.stop(error=error))
        finally:
            self._recorder = None
            RECORDING_LOCK.release()
        self._profile = self._after(self._profile, exc, limit)
        if unsent and exc_type is None:  # a Ctrl-C the interpreter dropped just before the end
            raise KeyboardInterrupt

    def _after(self, profile: ProfileData, exc: BaseException | None, limit: Any) -> Profile:
        """Post-mortem facts of an OOM (a refused CPU request taken out of the profile: see
        ``capture.refused``), and the run's leak baseline; never raises. The profile as users
        hold it (``jv.Profile``)."""
        watch, self._oom_watch = self._oom_watch, None
        state, self._leak_state = self._leak_state, None
        if self._capacity is not None:
            profile.meta["capacity_bytes"] = self._capacity
            if limit is not None and limit.facts:
                profile.meta["capacity"] = dict(limit.facts)
        try:
            import torch

            if isinstance(exc, torch.OutOfMemoryError) and watch is not None:
                failure = limit.failure if limit is not None else None
                from ._model.oom import META_KEY

                facts = watch.facts(exc, failure, self._capacity, profile.meta.get("oom"))
                if failure is not None:
                    from ._capture.refused import drop_refused

                    profile, refused = drop_refused(profile, failure)
                    facts.update(refused)
                profile.meta[META_KEY] = facts
        except Exception as problem:  # noqa: BLE001 - the post-mortem must not hide the error
            profile.meta.setdefault("warnings", []).append(f"OOM post-mortem failed: {problem}")
        if state is not None:
            from ._leaks import attach

            attach(profile, state)
        return Profile.of(profile)


class FakeRunRecording(Recording):
    """The estimator's recording of its fake-tensor run, on the meta device."""

    fake_run = True


def record(
    device: str | None = None,
    *,
    stacks: bool | str = "sampled",
    ops: str = "auto",
    namespace: Mapping[str, Any] | None = None,
    capacity: int | float | str | None = None,
) -> Recording:
    """Record every allocation made inside the ``with`` block.

    ``device=None`` records CUDA when it is available (the caching allocator's history) and
    otherwise the CPU allocator's own reports of every allocation and free. ``namespace``: the
    variables whose tensors count as memory held before the block (default: the calling
    module's globals, e.g. a notebook's namespace).

    ``stacks``: the Python stack of each allocation, ``"sampled"`` (default: a helper thread
    reads the stack every 5 ms; an allocation made while a sample fell inside its op gets that
    exact stack, others the part two samples around it agree on), ``"full"`` / ``True`` (the
    profiler's tracer: exact, but it records every Python call, which makes Python-heavy code
    many times slower) or ``False``. ``ops``: ``"auto"`` (default) records a loop's repeated
    steps on the CPU as the allocator's reports alone, labelled from the step they repeat
    (steps repeat when they made the same allocations and frees as the ones before them:
    one step, from one top-level module call to the next, or a group of up to 16), and
    drops op names once reading them has cost 15 % of the block's own time; ``"all"`` records
    every step and op in detail whatever it costs. A profile says in ``meta["warnings"]``
    what it left out.

    ``capacity`` (bytes, or a size such as ``"6GiB"``, ``"6GB"``, ``"512MiB"``): the block
    raises ``torch.OutOfMemoryError`` when live memory would pass it, as a device that size
    would. On CUDA the allocator enforces it (``set_per_process_memory_fraction``, restored
    after); on the CPU a dispatch mode counts live bytes, which may change the program slightly
    (autograd accumulates gradients out of place under a mode).
    """
    return Recording(device, stacks=stacks, ops=ops, namespace=namespace, capacity=capacity)


def _parse_capacity(value: int | float | str) -> int:
    from ._capture.capacity import parse_capacity

    return parse_capacity(value)


def _note_leak_start(namespace: Mapping[str, Any], device: str | None, fake: bool) -> Any:
    """What exists before the run, so leaks are only what it made (never raises)."""
    try:
        from ._capture import parse_device
        from ._leaks import note_start

        return note_start(namespace, parse_device(device, fake=fake))
    except Exception:  # noqa: BLE001 - leak finding is a nicety; recording goes on
        return None
