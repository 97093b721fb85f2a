"""The torch profiler read a chunk at a time, under a cost budget, with Python stacks sampled.

Both recorders read the profiler this way: the CPU recorder for everything (the allocator's
reports are its truth), the CUDA recorder for the op, module and phase labels of the blocks
its allocator history records. The profiler keeps ~150 bytes an event while it runs and needs
~2 KB and ~2 us an event to post-process when it stops, so it is stopped and restarted every
few thousand allocator reports (``profiler_session``), at a module call or between two
bytecodes (``ticker``), and only compact columns of what was read are kept (``Reports``).

:class:`Budget` keeps recording light: past ``OPS_BUDGET`` of the cell's own time, chunks
record the allocator's reports without op events (two thirds of a training step's events);
past ``PAUSE_SHARE`` or ``MAX_REPORTS`` the rest of the cell runs unrecorded. The recorder's
profile says what was left out (:meth:`ChunkedProfiler.coverage`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from . import native
from ._common import interrupts_deferred
from .builder import Interner, ProfileBuilder
from .profiler_read import ReadState, Reports, StackReader, read_events, read_native
from .profiler_session import FULL, LEAN, ProfilerSession
from .stacks import FrameFilter
from .steady import SteadySteps
from .ticker import CHUNK_SIGNAL, Ticker

#: full stacks: the first chunk traces every Python call (exact stacks) and ends at the first
#: module call once it is this old; later chunks sample. It never ends between two bytecodes:
#: there the request may run inside the tracer's own callback, and stopping the tracer waits
#: for that callback to return (a rank of a distributed run hung there)
FLUSH_AFTER_NS = 1_000_000_000
#: read a chunk about every this many allocator reports (its duration follows their rate):
#: the profiler post-processes small chunks faster per report (allocations kept alive: 2.4 us
#: a report in chunks of 2,000, 5.2 us in chunks of 8,000)
CHUNK_REPORTS = 3_000
#: the light recorder's chunks: reading costs the same per report however many (its arrays
#: hold 48 bytes a report), so fewer, larger chunks save the flushes' fixed cost
LIGHT_CHUNK_REPORTS = 50_000
#: how many frames a module call's sample looks up for its enclosing call's frame
_INHERIT_WALK = 16
FIRST_CHUNK_NS = 10_000_000
MIN_CHUNK_NS = 2_000_000
MAX_CHUNK_NS = 1_000_000_000
#: a chunk that cannot be read now (an op or our own code is running) is tried again this soon
RETRY_NS = 2_000_000
#: reading the profiler may cost this share of the cell's own time (once it has cost this
#: much in all: a short cell keeps every op) before op names go
OPS_BUDGET = 0.15
OPS_BUDGET_AFTER_NS = 250_000_000
#: past this share (and this much time in all), the rest of the cell runs unrecorded
PAUSE_SHARE = 2.0
PAUSE_AFTER_NS = 2_000_000_000
PAUSE = "pause"
#: what making a row of a report costs at the end, counted as it is read
ROW_NS = 1_500
#: allocator reports kept at most (about 60 bytes each, plus a row per allocation)
MAX_REPORTS = 6_000_000
_CAPTURE_DIR = os.path.dirname(os.path.realpath(__file__)) + os.sep
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
#: torch code during which the profiler must not restart: compiling (dynamo, AOT autograd,
#: fx tracing, fake tensors) or running what it compiled (restarting there crashed the
#: process at a later garbage collection, 7 runs in 12)
_MACHINERY = tuple(
    _TORCH_DIR + part + os.sep
    for part in ("_dynamo", "_functorch", "_inductor", "fx", "_subclasses", "_higher_order_ops")
)


class Budget:
    """What the next chunk records, from what recording has cost so far against the cell's
    own time: every op while that share is at most ``OPS_BUDGET`` or the cost is at most
    ``OPS_BUDGET_AFTER_NS`` (then until the share falls to half that again), then only the
    allocator's reports; and once it passes ``PAUSE_SHARE`` (and ``PAUSE_AFTER_NS`` in all),
    nothing more: the rest of the cell runs unrecorded. ``ops="all"`` keeps every op whatever
    it costs. The cost counted is the time spent reading chunks plus what turning their
    reports into rows will take at the end."""

    def __init__(self, ops: str = "auto", chunk_reports: int = CHUNK_REPORTS) -> None:
        if ops not in ("auto", "all"):
            raise ValueError(f"ops must be 'auto' or 'all', not {ops!r}")
        self.ops = ops
        self.cost_ns = 0
        self.began_ns = time.monotonic_ns()
        self.mode = FULL
        self.chunk_ns = FIRST_CHUNK_NS
        self.chunk_reports = chunk_reports

    def spent(self, cost_ns: int, reports: int, chunk_ns: int) -> str:
        """Account for one chunk read; return the next chunk's mode (or PAUSE) and set its
        length from the rate its reports came at."""
        self.cost_ns += cost_ns + reports * ROW_NS
        own = max(1, time.monotonic_ns() - self.began_ns - self.cost_ns)
        share = self.cost_ns / own
        if self.ops == "auto" and share > PAUSE_SHARE and self.cost_ns > PAUSE_AFTER_NS:
            return PAUSE
        limit = OPS_BUDGET if self.mode == FULL else OPS_BUDGET / 2
        cheap = share <= limit or self.cost_ns <= OPS_BUDGET_AFTER_NS
        self.mode = FULL if self.ops == "all" or cheap else LEAN
        rate = reports / max(chunk_ns, 1)
        target = self.chunk_reports / rate if rate > 0 else MAX_CHUNK_NS
        # at most twice as long as the last: a lean chunk comes at several times the rate
        target = min(target, 2 * self.chunk_ns, MAX_CHUNK_NS)
        self.chunk_ns = int(max(target, MIN_CHUNK_NS))
        return self.mode


class ChunkedProfiler:
    """The profiler of one recording, read in chunks into :attr:`reports`.

    ``idle()``: the recorder's own word that no chunk may be read now (an optimizer step is
    running, recording stopped). ``detail_back(now)``: a loop's steps stopped repeating (see
    ``steady``): the recorder puts its hooks back (``now``), or at its next safe module
    call. ``readers``: more readers of each chunk's event tree (the distributed roles),
    called before it is read. ``warnings``: the recorder's list, where what the chunks left
    out is said.
    """

    def __init__(
        self,
        device_type: str,
        modules: Interner,
        *,
        ops: str,
        idle: Callable[[], bool],
        warnings: list[str],
        readers: Sequence[Callable[[Sequence[Any]], None]] = (),
        light: bool = False,
        detail_back: Callable[[bool], None] | None = None,
    ) -> None:
        self.session: ProfilerSession = ProfilerSession()
        self.light = light
        self.state = ReadState(windows=self.session.windows)
        self.reports = Reports()
        self.budget = Budget(ops)
        self.ticker: Ticker | None = None
        self.reader: StackReader | None = None
        self.lean_reports = 0
        self.paused_ns = 0
        self._device_type = device_type
        self._modules = modules
        self._idle = idle
        self._warnings = warnings
        self._readers = readers
        self._pause_reason = ""
        self._detail_back = detail_back
        self.steady: SteadySteps | None = None
        self._chunk_due_ns = 0  # when the next chunk is due (the ticker's due_ns may be sooner)
        self._library_raises = False  # a step that stops repeating raises the signal itself
        self._flushing = False
        self._t0 = 0
        self._call_samples: list[int] = []  # the sample of each module call open now
        self._call_frames: list[int] = []  # and the id of its frame (alive while it is open)
        self._engine_samples: list[int] = []  # where each open step's or backward's sample is
        self._thread = 0  # the recording thread
        self._keep = FrameFilter().keep

    def start(
        self,
        boundary: tuple[str, str] | None,
        *,
        traced: bool,
        sampled: bool,
        from_thread: bool,
        builder: ProfileBuilder,
    ) -> None:
        """Start the profiler (``traced``: its Python tracer in the first chunk) and the
        helper thread (``sampled``: it samples stacks; ``from_thread``: it may read frames,
        see ``ticker``)."""
        if traced:
            self.reader = StackReader(builder, boundary)
        lib = native.library() if self.light and not traced and not native.disabled() else None
        if lib is not None:
            self.session = native.NativeSession(lib)
            self.state.windows = self.session.windows
            if self._detail_back is not None and self.budget.ops != "all":
                self.steady = SteadySteps(self.session)
                self._library_raises = self.session.raises()
        self.session.start(stacks=traced)
        self._t0 = time.time_ns()
        self._thread = threading.get_ident()
        chunk = LIGHT_CHUNK_REPORTS if lib is not None else CHUNK_REPORTS
        self.budget = Budget(self.budget.ops, chunk)
        self.ticker = Ticker(boundary, self.on_due, sample=sampled, from_thread=from_thread)
        self.ticker.due_ns = time.monotonic_ns() + (FLUSH_AFTER_NS if traced else FIRST_CHUNK_NS)
        self._chunk_due_ns = self.ticker.due_ns
        self.ticker.start()

    def stop(self) -> tuple[Sequence[Any], bool]:
        """Stop the helper thread and the profiler: the last chunk's events, and whether it
        was lean (to :meth:`read`, or to drop)."""
        ticker = self.ticker
        if ticker is not None:
            if ticker.sampling and not self.session.stacks:
                # the block's end closes what it made since the last sample (a short block's
                # backward and optimizer step, with no module call after them)
                ticker.sample_end(sys._getframe(1))
            ticker.stop()
        if self.steady is not None:
            self.steady.finish()
        lean = self.session.mode == LEAN
        return self.session.stop(), lean

    # -- module calls (the recorder's hooks call these) ---------------------------------------

    def step_begins(self, module_id: int) -> bool:
        """A top-level module call begins: whether the loop's steps are recorded as reports
        alone from now on (``steady``); the caller then takes its hooks off."""
        steady = self.steady
        ticker = self.ticker
        # steady steps need the ticker's requests: they turn detail back on
        if steady is None or ticker is None or not ticker.signals or self.paused_ns:
            return False
        if not steady.step_begins(module_id, CHUNK_SIGNAL or 0):
            return False
        ticker.steady = True
        if ticker.due_ns:
            ticker.due_ns = self._next_due()
        return True

    def _next_due(self) -> int:
        """When the ticker asks next: the next chunk. While steps are steady the library's
        signal says when one stopped repeating; where it cannot raise it, the ticker asks at
        every tick instead."""
        if self.steady is not None and self.steady.on and not self._library_raises:
            return 1
        return self._chunk_due_ns

    def _resume(self) -> None:
        """Detail back on: the ticker samples again."""
        assert self.steady is not None
        self.steady.resume()
        if self.ticker is not None:
            self.ticker.steady = False
            if self.ticker.due_ns:
                self.ticker.due_ns = self._next_due()

    def enter(self, module_id: int, frame: Any) -> None:
        """A module call begins (``frame``: its caller's): read a chunk if one is due, take a
        sample, open the module's range."""
        ticker = self.ticker
        if ticker is not None:
            due = ticker.due_ns
            ready = due and time.monotonic_ns() >= due and self._allowed()
            if ready and not _unsafe_to_restart(frame):
                self.flush()
        self._open_sample(frame)
        self.session.enter(module_id)

    def _open_sample(self, frame: Any) -> None:
        """A call begins (``frame``: its caller's): the call's place, as a sample."""
        ticker = self.ticker
        if ticker is not None:
            sampled = ticker.sampling and not self.session.stacks
            self._call_samples.append(self._call_sample(frame) if sampled else -1)
            self._call_frames.append(id(frame))

    def _call_sample(self, frame: Any) -> int:
        """A module call's sample: the enclosing call's again where only frames a profile
        hides (torch's: ``nn.Sequential`` looping over its layers) lie between the two calls,
        since the frames kept are then the same; else a walk of the whole stack."""
        ticker = self.ticker
        assert ticker is not None
        outer = self._call_samples[-1] if self._call_samples else -1
        if outer >= 0:
            outer_frame, between = self._call_frames[-1], frame
            for _ in range(_INHERIT_WALK):
                if between is None or self._keep(between.f_code.co_filename):
                    break
                if id(between) == outer_frame:
                    ticker.samples.again(time.time_ns(), outer)
                    return outer
                between = between.f_back
        return ticker.sample(frame)

    def exit(self) -> None:
        """A module call returns (see :meth:`_close_sample`)."""
        self._close_sample(len(self._call_samples) - 1)
        self.session.exit()

    def _close_sample(self, at: int) -> None:
        """The call whose sample is ``at`` in the open calls' returns, with any call opened
        inside it that never said it ended: a sample closes what it made (a short cell's last
        call). Its caller is on the line that made the call still: the call's own sample
        again, a way out of it when no other call is open (the caller goes on from there)."""
        ticker = self.ticker
        if ticker is None or not 0 <= at < len(self._call_samples):
            return
        chain = self._call_samples[at]
        del self._call_samples[at:], self._call_frames[at:]
        if chain >= 0:
            ticker.samples.again(time.time_ns(), chain, leaving=not self._call_samples)

    def engine_call_enter(self, frame: Any) -> None:
        """An optimizer step or a backward begins on the recording thread (``frame``: on the
        stack of the line that called it): that line is the place of what it allocates, as a
        module call's is (a sample as it begins and one as it ends, both on that line). No
        chunk is read here: the step's or backward's range is open."""
        if threading.get_ident() == self._thread:
            self._engine_samples.append(len(self._call_samples))
            self._open_sample(frame)

    def engine_call_exit(self) -> None:
        """The optimizer step or backward that began last ends (its sample, and those of
        calls opened inside it that never said they ended, close)."""
        if threading.get_ident() == self._thread and self._engine_samples:
            self._close_sample(self._engine_samples.pop())

    # -- chunks --------------------------------------------------------------------------------

    def on_due(self, frame: Any) -> None:
        """The ticker's request, on the recording thread between two bytecodes of ``frame``:
        read the chunk unless an op, backward, an optimizer step or our own code may be
        running (the code running now is torch's, which opens ranges, or torch.compile's or
        ours is somewhere up the stack)."""
        ticker = self.ticker
        if ticker is None or not self._allowed():
            return
        if self.session.stacks:  # traced: only at a module call (see FLUSH_AFTER_NS)
            ticker.due_ns = time.monotonic_ns() + FLUSH_AFTER_NS
            return
        if self.steady is not None and self.steady.diverged():
            self._detail_again(frame)
        if time.monotonic_ns() < self._chunk_due_ns:  # only the steady steps' question
            ticker.due_ns = self._next_due()
            return
        innermost_torch = frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR)
        if innermost_torch or _unsafe_to_restart(frame):
            ticker.due_ns = time.monotonic_ns() + RETRY_NS
            return
        self.flush()

    def _detail_again(self, frame: Any) -> None:
        """A step stopped repeating: hooks and op names back on now if no module call or
        optimizer step is running (one half seen would be taken for a whole), else at the
        next module call outside any other."""
        safe = not _unsafe_to_restart(frame) and not _inside_a_call(frame)
        if safe:
            self._resume()
        if self._detail_back is not None:
            self._detail_back(safe)

    def wake(self, hook_frame: Any) -> bool:
        """A module call begins while steps repeat (``hook_frame``: inside it): whether
        detail comes back now (a step stopped repeating, and no other call is running)."""
        steady = self.steady
        if steady is None or not steady.diverged():
            return False
        frame = hook_frame
        while frame is not None and frame.f_code is not _CALL_IMPL:
            frame = frame.f_back
        outer = frame.f_back if frame is not None else None
        if _unsafe_to_restart(outer) or _inside_a_call(outer):
            return False
        self._resume()
        return True

    def _allowed(self) -> bool:
        """No chunk now: one is being read, recording paused, the recorder says not now, or
        backward runs."""
        if (
            self._flushing
            or self.paused_ns
            or not self.session.on
            or self._idle()
            or torch._C._current_graph_task_id() != -1
        ):
            if self.ticker is not None and self.ticker.due_ns:
                steady = self.steady is not None and self.steady.on  # its question comes again
                self.ticker.due_ns = 1 if steady else time.monotonic_ns() + RETRY_NS
            return False
        return True

    def flush(self) -> None:
        """Read what the profiler holds so far and start a fresh chunk. Called where no op
        runs and no range of ours is being opened or closed; ranges open now are closed
        before the profiler stops and opened again after (``restart``)."""
        self._flushing = True
        if self.ticker is not None:
            self.ticker.due_ns = 0  # no requests while this one is read
        began = time.monotonic_ns()
        session = self.session
        lean = session.mode == LEAN
        chunk_ns = began - session.started_ns
        try:
            with interrupts_deferred():
                if session.stacks:  # later chunks sample (see FLUSH_AFTER_NS)
                    self._warnings.append(
                        f"Python stacks exact (traced) for the first {chunk_ns / 1e9:.3g} s "
                        "of the cell, sampled after that"
                    )
                events = session.restart(mode=self.budget.mode)
            count = len(self.reports)
            self.read(events, lean)
            del events
            reports = len(self.reports) - count
            mode = self.budget.spent(time.monotonic_ns() - began, reports, chunk_ns)
            if mode == PAUSE or len(self.reports) >= MAX_REPORTS:
                self._pause(mode == PAUSE)
            elif mode != session.mode:  # what came in while this chunk was read is ~nothing
                was_lean = session.mode == LEAN
                self.read(session.restart(mode=mode), was_lean)
        except Exception:  # noqa: BLE001 - keep recording what we can
            self._warnings.append("reading the profiler mid-cell failed: the profile is partial")
        finally:
            self._flushing = False
            if self.ticker is not None and not self.paused_ns:
                self._chunk_due_ns = time.monotonic_ns() + self.budget.chunk_ns
                self.ticker.due_ns = self._next_due()

    def read(self, events: Sequence[Any], lean: bool = False) -> None:
        """Read a chunk into the reports whole: a Ctrl-C meanwhile waits until it is in
        (columns half extended would not line up)."""
        with interrupts_deferred(), gc_paused():
            if isinstance(events, native.NativeChunk):
                read_native(events, self._modules, self.state, self.reports)
                return
            for reader in self._readers:
                reader(events)
            before = len(self.reports)
            read_events(
                events,
                self._device_type,
                self._modules,
                self.reader,
                self.state,
                lean=lean,
                into=self.reports,
            )
            if lean:
                self.lean_reports += len(self.reports) - before
            if self.reader is not None:
                self.reader.forget_events()  # they keep the profiler's whole result alive

    def _pause(self, costly: bool) -> None:
        """Stop recording for the rest of the cell (``costly``: it cost over ``PAUSE_SHARE``
        of the cell's time; else ``MAX_REPORTS`` reached)."""
        self.paused_ns = time.time_ns()
        self._pause_reason = (
            f"recording would have cost over {PAUSE_SHARE:g}x the cell's own time"
            if costly
            else f"{MAX_REPORTS:,} allocator reports is the most a profile keeps"
        )
        if self.ticker is not None:
            self.ticker.due_ns = 0
        if self.steady is not None:
            self.steady.finish()
        lean = self.session.mode == LEAN
        self.read(self.session.stop(), lean)

    def coverage(self, cell_ns: int) -> dict[str, Any]:
        """What the chunks left out, for ``meta`` (and a warning line each)."""
        reports = len(self.reports)
        out: dict[str, Any] = {"reports": reports}
        if self.light:
            light = isinstance(self.session, native.NativeSession)
            out["reports_from"] = "light recorder" if light else "torch.profiler"
            why = native.why_not()
            if not light and why and not self.reader:
                self._warnings.append(
                    f"recorded through torch.profiler, 2-3x slower on small ops: {why}"
                )
        if self.lean_reports:
            out["reports_without_ops"] = self.lean_reports
            share = self.lean_reports / max(reports, 1)
            self._warnings.append(
                f"op names left out for {share:.0%} of the allocator's reports: reading every op "
                f"would have cost over {OPS_BUDGET:.0%} of the cell's time "
                "(record with ops='all', %%vram --all-ops, to keep them)"
            )
        if self.paused_ns:
            out["recorded_ns"] = self.paused_ns - self._t0
            out["cell_ns"] = cell_ns
            self._warnings.append(
                f"recorded the first {(self.paused_ns - self._t0) / 1e9:.3g} s of "
                f"{cell_ns / 1e9:.3g} s: {self._pause_reason}, so the rest of the cell "
                "ran unrecorded (its memory after that is not in this profile)"
            )
        return out


_CALL_IMPL = torch.nn.Module._call_impl.__code__
_OPTIM_DIR = _TORCH_DIR + "optim" + os.sep


def _inside_a_call(frame: Any) -> bool:
    """A module call or an optimizer step is on the stack."""
    while frame is not None:
        if frame.f_code is _CALL_IMPL or frame.f_code.co_filename.startswith(_OPTIM_DIR):
            return True
        frame = frame.f_back
    return False


def _unsafe_to_restart(frame: Any) -> bool:
    """Our code or torch's compile machinery is on the stack (see ``_MACHINERY``)."""
    while frame is not None:
        file = frame.f_code.co_filename
        if (
            file.startswith(_CAPTURE_DIR)
            or file.startswith(_MACHINERY)
            or file.startswith("<eval_with_key")
        ):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The garbage collector off while we make many small objects that form no cycles: each
    of its passes would walk every object the kernel holds (300,000 tensors kept: most of the
    time a chunk took to read)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
