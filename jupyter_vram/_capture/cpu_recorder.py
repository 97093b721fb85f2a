"""CPU recording from the allocator's own reports: torch.profiler's memory events.

The CPU allocator reports every allocation and free (address, size, time) to an active
profiler, including the ones an op makes and frees inside itself (oneDNN workspaces, sparse
index buffers). Nothing runs per op in Python and no dispatch mode is entered, so autograd
executes exactly the program it would without us (a dispatch mode makes it accumulate
gradients out of place, which raises the true peak of some models by a third).

Attribution is read back from the profiler's event tree (``profiler_read``), a chunk at a
time: the profiler is stopped and restarted every few tens of thousands of events, at a module
call or between two bytecodes (``ticker``), and only compact columns are kept, so host memory
stays bounded however long the cell runs.

* the op is the innermost aten op around the allocation;
* the module is a ``jv.module:<id>`` range our global module hooks open around each call
  (a 1 us C++ range, no Python per op); backward ops name the forward op's module through the
  autograd sequence number;
* the phase is forward inside a module (and until backward starts), backward inside the
  autograd engine's ranges, optimizer inside ``Optimizer.step``;
* Python stacks are sampled by a helper thread (``stacks="sampled"``, the default) or come
  from the profiler's Python tracer (``stacks="full"``: exact, but it records every Python
  call; off where torch.compile runs, and after the first chunk of a long cell);
* roles (parameter, gradient, optimizer state, activation, input) are noted by the
  :class:`~.tagging.Tagger` as (address, time) pairs and placed on the allocation that held that
  address at that time (``cpu_rows``). Storages that existed before recording become baseline
  rows.

Recording stays light (:class:`Budget`): when reading the profiler has cost more than
``OPS_BUDGET`` of the cell's own time, later chunks record the allocator's reports without op
events (two thirds of a training step's events), and past ``MAX_REPORTS`` reports the rest of
the cell runs unrecorded. The profile says what it left out.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from types import FrameType
from typing import Any

import numpy as np
import torch

from .._model import Frame, Profile
from ._common import stack_mode
from .builder import OTHER, Interner, ProfileBuilder
from .cpu_rows import build_rows
from .cpu_threads import ThreadWatch
from .distributed_roles import DistributedRoles
from .profiler_read import EventRead, ReadState, Reports, StackReader, read_events
from .profiler_session import FULL, LEAN, LogLevel, ProfilerSession, profiler_busy
from .row_addresses import note_addresses
from .stacks import FrameFilter, cell_name
from .tagging import BASELINE_TENSORS, Tagger, reachable_objects, storages_of
from .ticker import StackSamples, Ticker, compiled_anything

SOURCE = "allocator"
#: a role note: time, address, size, category, module, storage key
Note = tuple[int, int, int, int, int, int]
#: full stacks: the first chunk traces every Python call (exact stacks) and ends at the first
#: module call once it is this old; later chunks sample. It never ends between two bytecodes:
#: there the request may run inside the tracer's own callback, and stopping the tracer waits
#: for that callback to return (a rank of a distributed run hung there)
FLUSH_AFTER_NS = 1_000_000_000
#: read a chunk about every this many allocator reports (its duration follows their rate):
#: the profiler post-processes small chunks faster per report (allocations kept alive: 2.4 us
#: a report in chunks of 2,000, 5.2 us in chunks of 8,000)
CHUNK_REPORTS = 3_000
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


SAMPLED_WITH_COMPILE = (
    "Python stacks sampled, not traced: torch.compile is in use, and its code must not run "
    "under the profiler's Python tracer"
)


def compile_in_use(modules: Sequence[Any] = ()) -> bool:
    """torch.compile has compiled something in this process, or a compiled module is at hand."""
    if compiled_anything():
        return True
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    compiled = getattr(eval_frame, "OptimizedModule", None)
    return compiled is not None and any(isinstance(m, compiled) for m in modules)


def held_by_variable(
    tensors: Sequence[torch.Tensor],
    modules: Sequence[Any],
    optimizers: Sequence[Any],
    names: Mapping[int, str],
    device_type: str = "cpu",
    top: int = 8,
) -> list[tuple[str, int]]:
    """The variables holding the most memory before recording: (name, bytes), largest first.

    A variable's bytes are the distinct storages it reaches: tensors, and the parameters,
    buffers, gradients or optimizer state of the modules and optimizers it holds.
    """
    per_name: dict[str, dict[int, int]] = {}

    def add(name: str, tensor: Any) -> None:
        if isinstance(tensor, torch.Tensor):
            for storage in storages_of(tensor):
                if storage.device.type == device_type:  # the recorded device's memory only
                    per_name.setdefault(name, {})[storage._cdata] = storage.nbytes()

    for tensor in tensors:
        add(names.get(id(tensor), "?"), tensor)
    for module in modules:
        with contextlib.suppress(Exception):
            name = names.get(id(module), "?")
            for p in module.parameters():
                add(name, p)
                add(name, p.grad)
            for b in module.buffers():
                add(name, b)
    for opt in optimizers:
        with contextlib.suppress(Exception):
            name = names.get(id(opt), "?")
            for state in opt.state.values():
                for value in state.values():
                    add(name, value)
    totals = [(name, sum(sizes.values())) for name, sizes in per_name.items()]
    totals = [t for t in totals if t[1] > 0 and not t[0].startswith("_")]
    return sorted(totals, key=lambda t: -t[1])[:top]


NOT_READ = "not read: the run raised, and its caller discards the profile"
_DISCARD_ON_ERROR: ContextVar[bool] = ContextVar("jv_discard_on_error", default=False)


@contextlib.contextmanager
def discarded_on_error() -> Iterator[None]:
    """Recordings made inside are thrown away by the caller when the recorded code raises (a
    rerun, whose Cancel is a kernel interrupt): stopping then skips reading the profiler's
    events, so the interrupt ends the run in the time torch takes to stop its profiler."""
    token = _DISCARD_ON_ERROR.set(True)
    try:
        yield
    finally:
        _DISCARD_ON_ERROR.reset(token)


#: what a role note's fast path compares with (dense tensors have one storage)
_STRIDED = torch.strided
_TENSOR = torch.Tensor
_PARAM = torch.nn.Parameter


class Budget:
    """What the next chunk records, from what recording has cost so far against the cell's
    own time: every op while that share is at most ``OPS_BUDGET`` or the cost is at most
    ``OPS_BUDGET_AFTER_NS`` (then until the share falls to half that again), then only the
    allocator's reports; and once it passes ``PAUSE_SHARE`` (and
    ``PAUSE_AFTER_NS`` in all), nothing more: the rest of the cell runs unrecorded.
    ``ops="all"`` keeps every op whatever it costs. The cost counted is the time spent reading
    chunks plus what turning their reports into rows will take at the end."""

    def __init__(self, ops: str = "auto") -> None:
        if ops not in ("auto", "all"):
            raise ValueError(f"ops must be 'auto' or 'all', not {ops!r}")
        self.ops = ops
        self.cost_ns = 0
        self.began_ns = time.monotonic_ns()
        self.mode = FULL
        self.chunk_ns = FIRST_CHUNK_NS

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
        target = CHUNK_REPORTS / rate if rate > 0 else MAX_CHUNK_NS
        # at most twice as long as the last: a lean chunk comes at several times the rate
        target = min(target, 2 * self.chunk_ns, MAX_CHUNK_NS)
        self.chunk_ns = int(max(target, MIN_CHUNK_NS))
        return self.mode


class ProfilerRecorder:
    """Records every CPU allocation and free through the allocator's profiler reports."""

    source = SOURCE

    def __init__(
        self,
        device: str = "cpu",
        *,
        stacks: bool | str = "sampled",
        ops: str = "auto",
        trace: bool = True,
    ) -> None:
        self.device = str(torch.device(device))
        self._device_type = torch.device(device).type
        self._stacks = stack_mode(stacks)
        self._trace = trace  # False: the code may compile (torch.compile): never the tracer
        self._budget = Budget(ops)
        self._modules = Interner("")
        self._session = ProfilerSession()
        self.tagger = Tagger(
            self._on_role,
            self._modules,
            saved_hooks="per_call",
            on_enter=self._enter_module,
            on_exit=self._exit_module,
            tag_graph=False,
        )
        self._notes: list[Note] = []
        self._watched: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._keys: dict[weakref.ref[torch.UntypedStorage], int] = {}  # what _released reads
        self._freed: dict[int, int] = {}  # storage key -> time its memory was released
        self._boundary: tuple[str, str] | None = None
        self._active = False
        self._t0 = 0
        self._wall_ns = 0
        self._log_level: LogLevel | None = None
        self._threads = ThreadWatch()
        self._warnings: list[str] = []
        self._held_before: list[tuple[str, int]] = []
        self._builder = ProfileBuilder()
        self._builder.modules = self._modules
        self._state = ReadState(windows=self._session.windows)
        self._reader: StackReader | None = None
        self._reports = Reports()
        self._lean_reports = 0
        self._ticker: Ticker | None = None
        self._paused_ns = 0
        self._pause_reason = ""
        self._flushing = False
        self._distributed = DistributedRoles(self._device_type)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(
        self, entry_frame: FrameType | None = None, namespace: Mapping[str, Any] | None = None
    ) -> None:
        """Note the tensors the calling code can reach, then start the profiler and hooks.

        ``entry_frame`` is the frame that asked for recording: stacks stop there, and its
        globals are the namespace unless ``namespace`` (a notebook's) is given. Tensors that
        namespace reaches are the baseline, with the modules and optimizers that run.
        """
        import torch.profiler  # noqa: F401 - imported here, not inside the recorded cell

        if profiler_busy():
            from ._common import RecordingError

            raise RecordingError("a torch profiler is already running")
        if entry_frame is not None:
            self._boundary = (entry_frame.f_code.co_filename, entry_frame.f_code.co_name)
        self._active = True
        if namespace is None and entry_frame is not None:
            namespace = entry_frame.f_globals
        names: dict[int, str] = {}
        sampled: list[str] = []
        tensors, modules, optimizers = reachable_objects(namespace, names=names, sampled=sampled)
        self._note_baseline(tensors, names, sampled)
        self._held_before = held_by_variable(
            tensors[:BASELINE_TENSORS], modules, optimizers, names, self._device_type
        )
        del tensors
        self.tagger.adopt(modules, optimizers)
        compiling = not self._trace or compile_in_use(modules)
        traced = self._check_stacks(compiling)
        del modules, optimizers
        if traced:
            self._reader = StackReader(self._builder, self._boundary)
        self._log_level = LogLevel.quiet()
        self._session.start(stacks=traced)
        self._t0 = time.time_ns()
        self._budget = Budget(self._budget.ops)
        self._ticker = Ticker(
            self._boundary, self._on_due, sample=self._stacks != "none", from_thread=not compiling
        )
        first = FLUSH_AFTER_NS if traced else FIRST_CHUNK_NS
        self._ticker.due_ns = time.monotonic_ns() + first
        self._ticker.start()
        self._threads.start()
        self.tagger.start()
        self._distributed.start()

    def _note_baseline(
        self, tensors: list[torch.Tensor], names: Mapping[int, str], sampled: list[str]
    ) -> None:
        """Note the tensors the namespace holds (memory from before the cell), at most
        ``BASELINE_TENSORS`` of them one by one; say what the walk left out."""
        for tensor in tensors[:BASELINE_TENSORS]:
            self._on_role(tensor, OTHER, 0)
        if len(tensors) > BASELINE_TENSORS:
            where = sorted({names.get(id(t), "?") for t in tensors[BASELINE_TENSORS:]})
            self._warnings.append(
                f"the notebook holds over {BASELINE_TENSORS:,} tensors outside modules and "
                f"optimizers: {BASELINE_TENSORS:,} count as memory held before the cell, the "
                f"others (in {', '.join(where[:5])}) are not in this profile unless it uses them"
            )
        if sampled:
            self._warnings.append(
                "large containers with no tensor in a sample of their items were not looked "
                f"into: {', '.join(sorted(set(sampled))[:5])}"
            )

    def _check_stacks(self, compiling: bool) -> bool:
        """Whether the first chunk traces Python calls: for full stacks, but never where the
        tracer can harm (full stacks are then sampled, and the profile says so)."""
        if self._stacks != "full":
            return False
        warning = None
        if compiling:
            # torch.compile code run under the profiler's Python tracer can corrupt memory
            # that a later garbage collection trips on (a crash of the whole kernel)
            warning = SAMPLED_WITH_COMPILE
        elif sys.getprofile() is not None:
            # the profiler's Python tracer would replace (and at stop, remove) the hook
            warning = (
                "Python stacks sampled, not traced: another profiler or tracer "
                "(sys.setprofile) is active"
            )
        if warning is None:
            return True
        self._stacks = "sampled"
        self._warnings.append(warning)
        return False

    def stop(self, error: str | None = None) -> Profile:
        """Switch everything off (always), then read the profiler's events into a Profile."""
        events: Sequence[Any] = ()
        lean = False
        try:
            try:
                if self._active and not self._paused_ns:
                    self.tagger.final_scan()
            finally:
                self.tagger.stop()
                if self._ticker is not None:
                    self._ticker.stop()
                self._distributed.stop()
                self._threads.stop()
                self._wall_ns = time.time_ns() - self._t0 if self._t0 else 0
                self._active = False
                if self._session.on and not profiler_busy():
                    self._warnings.append(  # a profiler the cell ran ended ours
                        "a torch.profiler started inside the recording took over the "
                        "allocator's reports: this profile is incomplete"
                    )
                lean = self._session.mode == LEAN
                events = self._session.stop()
        finally:
            if self._log_level is not None:
                self._log_level.restore()
                self._log_level = None
            self._watched.clear()  # dropping the weakrefs cancels their callbacks
            self._keys.clear()
        freed, self._freed = self._freed, {}
        notes, self._notes = self._notes, []
        if error is not None and _DISCARD_ON_ERROR.get():
            # nobody will look at this profile (a cancelled rerun): reading it would keep the
            # kernel busy for seconds with Python stacks
            self._warnings.append(NOT_READ)
            events, notes, self._reports = (), [], Reports()
        self._read(events, lean)
        del events
        return self._profile(error, notes, freed)

    def _profile(self, error: str | None, notes: list[Note], freed: dict[int, int]) -> Profile:
        """The rows of everything read, with sampled stacks placed, as a Profile."""
        with gc_paused():
            return self._rows(error, notes, freed)

    def _rows(self, error: str | None, notes: list[Note], freed: dict[int, int]) -> Profile:
        reports, self._reports = self._reports, Reports()
        if self._ticker is not None:
            self._ticker.settle()
            place_stacks(reports, self._ticker.samples, self._builder, self._boundary)
        merged = EventRead(reports, self._state.ops.names)
        builder = self._builder
        addresses: dict[int, int] = {}  # row -> address, for leaks (not saved)
        inferred = build_rows(
            builder,
            merged,
            notes,
            freed,
            t0=self._t0,
            threads_ran_from=self._threads.ran_from,
            maps=self._threads.maps,
            addresses=addresses,
        )
        wall_ns = self._paused_ns - self._t0 if self._paused_ns else self._wall_ns
        profile = builder.build(
            device=self.device,
            source=self.source,
            wall_ns=wall_ns,
            error=error,
            meta={
                "torch": torch.__version__,
                "stacks": self._stacks,
                "module_types": dict(self.tagger.module_types),
                "held_before": [list(item) for item in self._held_before],
                **self._coverage(len(reports)),
                **({"other_threads": self._threads.names} if self._threads.names else {}),
                **({"inferred_frees": inferred} if inferred else {}),
                **({"warnings": self._warnings} if self._warnings else {}),
            },
        )
        profile = self._distributed.label(profile, self._t0)
        note_addresses(profile, addresses)
        return profile

    def _coverage(self, reports: int) -> dict[str, Any]:
        """What the profile leaves out, for ``meta`` (and a warning line each)."""
        out: dict[str, Any] = {"reports": reports}
        if self._lean_reports:
            out["reports_without_ops"] = self._lean_reports
            share = self._lean_reports / max(reports, 1)
            self._warnings.append(
                f"op names left out for {share:.0%} of the allocator's reports: reading every op "
                f"would have cost over {OPS_BUDGET:.0%} of the cell's time "
                "(record with ops='all', %%vram --all-ops, to keep them)"
            )
        if self._paused_ns:
            out["recorded_ns"] = self._paused_ns - self._t0
            out["cell_ns"] = self._wall_ns
            self._warnings.append(
                f"recorded the first {(self._paused_ns - self._t0) / 1e9:.3g} s of "
                f"{self._wall_ns / 1e9:.3g} s: {self._pause_reason}, so the rest of the cell "
                "ran unrecorded (its memory after that is not in this profile)"
            )
        return out

    # -- the profiler, in chunks -------------------------------------------------------------

    def _read(self, events: Sequence[Any], lean: bool = False) -> None:
        """Read a chunk into the reports whole: a Ctrl-C meanwhile waits until it is in
        (columns half extended would not line up)."""
        from ._common import interrupts_deferred

        with interrupts_deferred(), gc_paused():
            self._read_chunk(events, lean)

    def _read_chunk(self, events: Sequence[Any], lean: bool) -> None:
        self._distributed.read(events)
        before = len(self._reports)
        read_events(
            events,
            self._device_type,
            self._modules,
            self._reader,
            self._state,
            lean=lean,
            into=self._reports,
        )
        if lean:
            self._lean_reports += len(self._reports) - before
        if self._reader is not None:
            self._reader.forget_events()  # they keep the profiler's whole result alive

    def _flush(self) -> None:
        """Read what the profiler holds so far and start a fresh chunk (see the module doc).

        Called where no op runs and no range of ours is being opened or closed; ranges open
        now are closed before the profiler stops and opened again after (``restart``).
        """
        from ._common import interrupts_deferred

        self._flushing = True
        if self._ticker is not None:
            self._ticker.due_ns = 0  # no requests while this one is read
        began = time.monotonic_ns()
        session = self._session
        lean = session.mode == LEAN
        chunk_ns = began - session.started_ns
        try:
            with interrupts_deferred():
                if session.stacks:  # later chunks sample (see FLUSH_AFTER_NS)
                    self._warnings.append(
                        f"Python stacks exact (traced) for the first {chunk_ns / 1e9:.3g} s "
                        "of the cell, sampled after that"
                    )
                events = session.restart(mode=self._budget.mode)
            count = len(self._reports)
            self._read(events, lean)
            del events
            reports = len(self._reports) - count
            mode = self._budget.spent(time.monotonic_ns() - began, reports, chunk_ns)
            if mode == PAUSE or len(self._reports) >= MAX_REPORTS:
                self._pause(mode == PAUSE)
            elif mode != session.mode:  # what came in while this chunk was read is ~nothing
                was_lean = session.mode == LEAN
                self._read(session.restart(mode=mode), was_lean)
        except Exception:  # noqa: BLE001 - keep recording what we can
            self._warnings.append("reading the profiler mid-cell failed: the profile is partial")
        finally:
            self._flushing = False
            if self._ticker is not None and not self._paused_ns:
                self._ticker.due_ns = time.monotonic_ns() + self._budget.chunk_ns

    def _pause(self, costly: bool) -> None:
        """Stop recording for the rest of the cell (``costly``: it cost over ``PAUSE_SHARE``
        of the cell's time; else ``MAX_REPORTS`` reached)."""
        self._paused_ns = time.time_ns()
        self._pause_reason = (
            f"recording would have cost over {PAUSE_SHARE:g}x the cell's own time"
            if costly
            else f"{MAX_REPORTS:,} allocator reports is the most a profile keeps"
        )
        self._active = False  # role notes stop; the hooks stay until stop() removes them
        if self._ticker is not None:
            self._ticker.due_ns = 0
        self._read(self._session.stop(), self._session.mode == LEAN)

    def _on_due(self, frame: Any) -> None:
        """The ticker's request, on this thread between two bytecodes of ``frame``: read the
        chunk unless an op, backward, an optimizer step or our own code may be running (the
        code running now is torch's, which opens ranges, or ours somewhere up the stack)."""
        ticker = self._ticker
        if ticker is None or not self._chunk_allowed():
            return
        if self._session.stacks:  # traced: only at a module call (see FLUSH_AFTER_NS)
            ticker.due_ns = time.monotonic_ns() + FLUSH_AFTER_NS
            return
        if frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
            ticker.due_ns = time.monotonic_ns() + RETRY_NS
            return
        if _unsafe_to_restart(frame):
            ticker.due_ns = time.monotonic_ns() + RETRY_NS
            return
        self._flush()

    def _chunk_allowed(self) -> bool:
        """No chunk now: one is being read, recording stopped, or backward or a step runs."""
        if (
            self._flushing
            or not self._active
            or not self._session.on
            or self.tagger.optimizer_depth
            or torch._C._current_graph_task_id() != -1
        ):
            if self._ticker is not None and self._ticker.due_ns:
                self._ticker.due_ns = time.monotonic_ns() + RETRY_NS
            return False
        return True

    # -- hooks (never raise) -----------------------------------------------------------------

    def _enter_module(self, module_id: int) -> None:
        now = time.monotonic_ns()  # one clock read for all checks: a call is an event
        threads = self._threads
        if now >= threads.next_map:
            threads.sample_memory()
        session = self._session
        ticker = self._ticker
        if ticker is not None:
            if (
                ticker.due_ns
                and now >= ticker.due_ns
                and self._chunk_allowed()
                and not _unsafe_to_restart(sys._getframe(2))
            ):
                self._flush()
            if ticker.sampling and not session.stacks:  # the call's place: above our hook
                ticker.sample(sys._getframe(2))
        session.enter(module_id)

    def _exit_module(self) -> None:
        """A module call returns: a sample closes what it made (a short cell's last call)."""
        ticker = self._ticker
        if ticker is not None and ticker.sampling and not self._session.stacks:
            ticker.sample(sys._getframe(2))
        self._session.exit()

    def _on_role(self, tensor: torch.Tensor, category: int, module: int) -> None:
        if not self._active:
            return
        try:
            # a plain dense tensor has one storage: no call to find it (with Python stacks
            # the profiler records each call a hook makes, and this runs for every role)
            if tensor.layout is _STRIDED and (type(tensor) is _TENSOR or type(tensor) is _PARAM):
                storages: Sequence[torch.UntypedStorage] = (tensor.untyped_storage(),)
            else:
                storages = storages_of(tensor)
            for storage in storages:
                if storage.device.type != self._device_type:
                    continue
                ptr = storage.data_ptr()
                size = storage.nbytes()
                if not ptr or not size:
                    continue
                key = storage._cdata
                self._notes.append((time.time_ns(), ptr, size, category, module, key))
                if key not in self._watched:
                    ref = weakref.ref(storage, self._released)
                    self._watched[key] = ref
                    self._keys[ref] = key
        except Exception:  # noqa: BLE001 - never raise from a hook
            pass

    def _released(self, ref: weakref.ref[torch.UntypedStorage]) -> None:
        """A weakref callback: when a noted storage's memory goes, remember when (the profiler
        does not report frees of memory allocated before it started)."""
        key = self._keys.pop(ref, None)
        if key is not None:
            self._freed[key] = time.time_ns()
            self._watched.pop(key, None)


#: torch code during which the profiler must not restart: compiling (dynamo, AOT autograd,
#: fx tracing, fake tensors) or running what it compiled (restarting there crashed the
#: process at a later garbage collection, 7 runs in 12)
_MACHINERY = tuple(
    _TORCH_DIR + part + os.sep
    for part in ("_dynamo", "_functorch", "_inductor", "fx", "_subclasses", "_higher_order_ops")
)


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


def place_stacks(
    reports: Reports,
    samples: StackSamples,
    builder: ProfileBuilder,
    boundary: tuple[str, str] | None,
) -> None:
    """Give each allocation without a traced stack its sampled one (see ``StackSamples``); a
    traced stack that ends in "somewhere in this function" (the tracer sees no call for an
    operator such as ``a @ b``) takes the exact line of a sample that fell while its op ran."""
    stack = np.frombuffer(reports.stack, np.int32)
    size = np.frombuffer(reports.size, np.int64)
    vague = _vague_stacks(builder)
    todo = np.flatnonzero((size > 0) & ((stack < 0) | np.isin(stack, vague)))
    if not len(todo) or not len(samples):
        return

    def column(name: str) -> np.ndarray:
        return np.frombuffer(getattr(reports, name), np.int64)[todo]

    found, which, exact = samples.place(column("time_ns"), column("span_start"), column("span_end"))
    keep = FrameFilter().keep
    ids = np.empty(len(found), np.int32)
    for k, sites in enumerate(found):
        kept = tuple(
            Frame(cell_name(file), line, function) for file, line, function in sites if keep(file)
        )
        ids[k] = builder.intern_stack(kept) if kept else -1
    placed = ids[which]
    use = (stack[todo] < 0) | (exact & (placed >= 0))
    stack[todo[use]] = placed[use]


def _vague_stacks(builder: ProfileBuilder) -> np.ndarray:
    """Stack ids whose innermost frame has no line (line 0)."""
    frames = builder.frames
    return np.array(
        [sid for sid, ids in enumerate(builder.stacks) if ids and frames[ids[-1]].line == 0],
        np.int32,
    )
