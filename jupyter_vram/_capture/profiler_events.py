"""CPU recording from the allocator's own reports: torch.profiler's memory events.

The CPU allocator reports every allocation and free (address, size, time) to an active
profiler, including the ones an op makes and frees inside itself (oneDNN workspaces, sparse
index buffers). Nothing runs per op in Python and no dispatch mode is entered, so autograd
executes exactly the program it would without us (a dispatch mode makes it accumulate
gradients out of place, which raises the true peak of some models by a third).

Attribution is read back from the profiler's event tree at the end:

* the op is the innermost aten op around the allocation;
* the module is a ``jv.module:<id>`` range our global module hooks open around each call
  (a 1 us C++ range, no Python per op); backward ops name the forward op's module through the
  autograd sequence number the profiler records on both;
* the phase is forward inside a module (and until backward starts), backward inside the
  autograd engine's ranges, optimizer inside ``Optimizer.step``;
* Python stacks come from the profiler's Python tracer (``stacks=True``; off where
  torch.compile runs, and after the first chunk of a long cell);
* roles (parameter, gradient, optimizer state, activation, input) are noted by the
  :class:`~.tagging.Tagger` as (address, time) pairs and placed on the allocation that held that
  address at that time. Storages that existed before recording become baseline rows.

Private torch APIs used here: the profiler's event tree (``kineto_results``), the fast
record-function range, and c10's log-level flag (its allocator warns once per 1,000 frees of
memory allocated before profiling started; silenced while recording).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import re
import sys
import sysconfig
import threading
import time
import weakref
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from itertools import chain, repeat
from types import FrameType
from typing import Any

import torch

from .._model import Frame, Profile
from .builder import OTHER, TEMPORARY, Interner, ProfileBuilder
from .distributed_roles import DistributedRoles
from .row_addresses import note_addresses
from .stacks import FrameFilter, cell_name
from .tagging import (
    ACTIVATION,
    BUFFER,
    GRADIENT,
    OPTIMIZER_STATE,
    PARAMETER,
    PHASE_BACKWARD,
    PHASE_FORWARD,
    PHASE_OPTIMIZER,
    PHASE_OTHER,
    Tagger,
    reachable_objects,
    storages_of,
)

SOURCE = "allocator"
_RecordFunctionFast = torch._C._profiler._RecordFunctionFast
MODULE_RANGE = "jv.module:"
BASELINE_OP = "(before recording)"
ELSEWHERE_OP = "(another thread)"
_EVALUATE = "autograd::engine::evaluate_function"
_STEP = "Optimizer.step#"
#: Ops that only obtain memory for the op around them: the allocation is charged to that op.
_PLUMBING = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::resize_",
        "aten::as_strided",
    }
)
#: Read the profiler's events at the next top-level module call once a chunk is this old.
FLUSH_AFTER_NS = 1_000_000_000
#: A role noted within this many ns of an allocation's start still belongs to it: notes are
#: stamped with time.time_ns(), reports with the profiler's clock converted to the same
#: system time, and the two differ by a conversion error of about a microsecond.
_TOLERANCE_NS = 20_000


NO_STACKS_WITH_COMPILE = (
    "no Python stacks: torch.compile is in use, and its code must not run under the "
    "profiler's Python tracer"
)


def compile_in_use(modules: Sequence[Any] = ()) -> bool:
    """torch.compile has compiled something in this process, or a compiled module is at hand."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(dynamo_utils, "counters", None)
    if counters is not None and counters["frames"].get("total", 0):
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


def profiler_busy() -> bool:
    """True when a torch profiler is already running in this process (the user's own)."""
    return bool(torch.autograd.profiler._is_profiler_enabled)


class ProfilerSession:
    """One torch profiler recording allocator reports, plus the module ranges our hooks open.

    Shared by the CPU recorder (which reads everything from it) and the CUDA recorder (which
    takes only op / module / phase labels from it: the allocator history is its truth).
    """

    def __init__(self) -> None:
        self.profiler: Any = None
        self.ranges: list[Any] = []
        self.started_ns = 0
        self._names: dict[int, str] = {}

    def start(self, *, stacks: bool) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.profiler = profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=stacks
        )
        with _quiet_stderr():
            self.profiler.start()
        self.started_ns = time.monotonic_ns()

    def stop(self) -> Sequence[Any]:
        """Stop the profiler and return its event tree (empty if it cannot be read)."""
        self.close_ranges()
        profiler, self.profiler = self.profiler, None
        if profiler is None:
            return ()
        with _quiet_stderr(), contextlib.suppress(Exception):
            profiler.stop()
            return profiler.profiler.kineto_results.experimental_event_tree()  # type: ignore[no-any-return]
        return ()

    def enter(self, module_id: int) -> None:
        """Open the range of a module call (about 1 us: a C++ record function)."""
        name = self._names.get(module_id)
        if name is None:
            name = self._names[module_id] = f"{MODULE_RANGE}{module_id}"
        rf = _RecordFunctionFast(name)
        rf.__enter__()
        self.ranges.append(rf)

    def exit(self) -> None:
        if self.ranges:
            self.ranges.pop().__exit__(None, None, None)

    def close_ranges(self) -> None:
        """Module calls an interrupt left open."""
        while self.ranges:
            with contextlib.suppress(Exception):
                self.ranges.pop().__exit__(None, None, None)


#: what a role note's fast path compares with (dense tensors have one storage)
_STRIDED = torch.strided
_TENSOR = torch.Tensor
_PARAM = torch.nn.Parameter


class ProfilerRecorder:
    """Records every CPU allocation and free through the allocator's profiler reports."""

    source = SOURCE

    def __init__(self, device: str = "cpu", *, stacks: bool = True) -> None:
        self.device = str(torch.device(device))
        self._device_type = torch.device(device).type
        self._stacks = stacks
        self._modules = Interner("")
        self._session = ProfilerSession()
        self.tagger = Tagger(
            self._on_role,
            self._modules,
            saved_hooks="per_call",
            on_enter=self._enter_module,
            on_exit=self._session.exit,  # no wrapper: with stacks each call is an event
            tag_graph=False,
        )
        self._notes: list[tuple[int, int, int, int, int, int]] = []  # t, ptr, size, cat, mod, key
        self._watched: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._freed: dict[int, int] = {}  # storage key -> time its memory was released
        self._boundary: tuple[str, str] | None = None
        self._active = False
        self._t0 = 0
        self._wall_ns = 0
        self._log_level: _LogLevel | None = None
        self._threads = _ThreadWatch()
        self._warnings: list[str] = []
        self._held_before: list[tuple[str, int]] = []
        self._builder = ProfileBuilder()
        self._builder.modules = self._modules
        self._state = ReadState()
        self._reader: StackReader | None = None
        self._reads: list[EventRead] = []
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
        tensors, modules, optimizers = reachable_objects(namespace, names=names)
        for tensor in tensors:
            self._on_role(tensor, OTHER, 0)
        self._held_before = held_by_variable(tensors, modules, optimizers, names, self._device_type)
        del tensors
        self.tagger.adopt(modules, optimizers)
        if self._stacks and sys.getprofile() is not None:
            # the profiler's Python tracer would replace (and at stop, remove) the hook
            self._stacks = False
            self._warnings.append(
                "no Python stacks: another profiler or tracer (sys.setprofile) is active"
            )
        if self._stacks and compile_in_use(modules):
            # torch.compile code run under the profiler's Python tracer can corrupt memory
            # that a later garbage collection trips on (a crash of the whole kernel)
            self._stacks = False
            self._warnings.append(NO_STACKS_WITH_COMPILE)
        del modules, optimizers
        if self._stacks:
            self._reader = StackReader(self._builder, self._boundary)
        self._log_level = _LogLevel.quiet()
        self._start_profiler()
        self._t0 = time.time_ns()
        self._threads.start()
        self.tagger.start()
        self._distributed.start()

    def stop(self, error: str | None = None) -> Profile:
        """Switch everything off (always), then read the profiler's events into a Profile."""
        events: Sequence[Any] = ()
        try:
            try:
                if self._active:
                    self.tagger.final_scan()
            finally:
                self.tagger.stop()
                self._distributed.stop()
                self._threads.stop()
                self._wall_ns = time.time_ns() - self._t0 if self._t0 else 0
                self._active = False
                if self._session.profiler is not None and not profiler_busy():
                    self._warnings.append(  # a profiler the cell ran ended ours
                        "a torch.profiler started inside the recording took over the "
                        "allocator's reports: this profile is incomplete"
                    )
                events = self._stop_profiler()
        finally:
            if self._log_level is not None:
                self._log_level.restore()
                self._log_level = None
            self._watched.clear()  # dropping the weakrefs cancels their callbacks
        freed, self._freed = self._freed, {}
        notes, self._notes = self._notes, []
        if error is not None and _DISCARD_ON_ERROR.get():
            # nobody will look at this profile (a cancelled rerun): reading it would keep the
            # kernel busy for seconds with Python stacks
            self._warnings.append(NOT_READ)
            events, notes, self._reads = (), [], []
        self._read(events)
        del events
        reads, self._reads = self._reads, []
        merged = EventRead(ops=self._state.ops.names)
        for read in reads:
            merged.events.extend(read.events)
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
        profile = builder.build(
            device=self.device,
            source=self.source,
            wall_ns=self._wall_ns,
            error=error,
            meta={
                "torch": torch.__version__,
                "stacks": self._stacks,
                "module_types": dict(self.tagger.module_types),
                "held_before": [list(item) for item in self._held_before],
                **({"other_threads": self._threads.names} if self._threads.names else {}),
                **({"inferred_frees": inferred} if inferred else {}),
                **({"warnings": self._warnings} if self._warnings else {}),
            },
        )
        profile = self._distributed.label(profile, self._t0)
        note_addresses(profile, addresses)
        return profile

    # -- the profiler, in chunks -------------------------------------------------------------

    def _start_profiler(self) -> None:
        self._session.start(stacks=self._stacks)

    def _stop_profiler(self) -> Sequence[Any]:
        return self._session.stop()

    def _read(self, events: Sequence[Any]) -> None:
        self._distributed.read(events)
        self._reads.append(
            read_events(events, self._device_type, self._modules, self._reader, self._state)
        )
        if self._reader is not None:
            self._reader.forget_events()  # they keep the profiler's whole result alive

    def _flush(self) -> None:
        """Read what the profiler holds so far and start a fresh one.

        The profiler keeps about 2 KB per event until it stops; a long cell (a training loop)
        would hold gigabytes. Called between two top-level module calls, where no op runs and
        no range of ours is open, so nothing is missed; only our compact rows are kept.
        """
        from ._common import interrupts_deferred

        self._flushing = True
        try:
            with interrupts_deferred():
                events = self._stop_profiler()
                if self._stacks:
                    # Restarting the profiler's Python tracer inside a call stack makes it
                    # record each call several times over (each restart more): the first
                    # chunk keeps its stacks, later ones go without.
                    self._stacks = False
                    self._warnings.append(
                        f"Python stacks cover the first {FLUSH_AFTER_NS / 1e9:g} s of the "
                        "cell: a long cell is read in chunks, and later chunks have none"
                    )
                self._start_profiler()
            self._read(events)
            del events
        except Exception:  # noqa: BLE001 - keep recording what we can
            self._warnings.append("reading the profiler mid-cell failed: the profile is partial")
        finally:
            self._flushing = False

    # -- hooks (never raise) -----------------------------------------------------------------

    def _enter_module(self, module_id: int) -> None:
        now = time.monotonic_ns()  # one clock read for both checks: a call is an event
        threads = self._threads
        if now >= threads.next_map:
            threads.sample_memory()
        session = self._session
        if (
            not session.ranges
            and now - session.started_ns > FLUSH_AFTER_NS
            and not self._flushing
            and session.profiler is not None
            and not self.tagger.optimizer_depth
            and torch._C._current_graph_task_id() == -1
        ):
            self._flush()
        session.enter(module_id)

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
                    self._watched[key] = weakref.ref(storage, self._released(key))
        except Exception:  # noqa: BLE001 - never raise from a hook
            pass

    def _released(self, key: int) -> Callable[[Any], None]:
        """A weakref callback: when a noted storage's memory goes, remember when (the profiler
        does not report frees of memory allocated before it started)."""
        freed = self._freed
        watched = self._watched

        def callback(_: Any) -> None:
            freed[key] = time.time_ns()
            watched.pop(key, None)

        return callback


# -- reading the profiler's events ---------------------------------------------------------


@dataclass
class AllocEvent:
    """One allocator report: ``size`` > 0 allocates at ``ptr``, < 0 frees it."""

    time_ns: int
    ptr: int
    size: int
    op: int = 0
    module: int = 0
    phase: int = PHASE_OTHER
    stack: int = -1
    recompute_end: int = 0  # > 0: made while checkpointing recomputed a block ending then


@dataclass
class EventRead:
    """What the event tree says: allocator reports in time order, plus the op names."""

    events: list[AllocEvent] = field(default_factory=list)
    ops: list[str] = field(default_factory=lambda: ["(unknown)"])


class StackReader:
    """Python stacks from the profiler's Python-call events, filtered like every other stack.

    A call event names its caller's frame with the exact line, and the called function only
    by its first line; ops reached through an operator (``a * b``) have no event of their
    own, so the innermost frame keeps line 0 ("somewhere in this function") until a builtin
    call inside it gives the exact line. A stack is (stack id, innermost frame is such a
    placeholder).
    """

    def __init__(self, builder: ProfileBuilder, boundary: tuple[str, str] | None) -> None:
        self._builder = builder
        self._boundary = boundary
        self._filter = FrameFilter()
        self._frames: dict[tuple[str, int, str], Frame | None] = {}
        self._ids: dict[tuple[Frame, ...], int] = {(): -1}
        self._tuples: dict[int, tuple[Frame, ...]] = {-1: ()}
        self._interned: dict[int, int] = {-1: -1}
        self._resolved: dict[int, tuple[Any, tuple[int, bool]]] = {}

    def _frame(self, file: str, line: int, function: str) -> Frame | None:
        key = (file, line, function)
        if key in self._frames:
            return self._frames[key]
        keep = self._filter.keep(file)
        frame = self._frames[key] = Frame(cell_name(file), line, function) if keep else None
        return frame

    def _id(self, frames: tuple[Frame, ...]) -> int:
        """A walk-local id: most stacks the walk passes through never allocate."""
        sid = self._ids.get(frames)
        if sid is None:
            sid = self._ids[frames] = len(self._tuples) - 1
            self._tuples[sid] = frames
        return sid

    def intern(self, sid: int) -> int:
        """The profile's stack id of a walk-local one (interned on first use)."""
        out = self._interned.get(sid)
        if out is None:
            out = self._interned[sid] = self._builder.intern_stack(self._tuples[sid])
        return out

    def resolve(self, node: Any) -> int:
        """The stack id of a chain of Python-call events (``(parent, event, builtin)``
        tuples), computed only for chains that reach an allocation, once per chain."""
        path = []
        while node is not None and id(node) not in self._resolved:
            path.append(node)
            node = node[0]
        stack, placeholder = self._resolved[id(node)][1] if node is not None else (-1, False)
        for item in reversed(path):
            with contextlib.suppress(UnicodeDecodeError, ValueError):  # an unnamed frame
                stack, placeholder = self.call(stack, placeholder, item[1], item[2])
            self._resolved[id(item)] = (item, (stack, placeholder))  # keeps ``item`` alive
        return self.intern(stack)

    def forget_events(self) -> None:
        self._resolved.clear()

    def call(self, stack: int, placeholder: bool, event: Any, builtin: bool) -> tuple[int, bool]:
        """The stack inside a Python call event (``builtin``: a C function, no frame)."""
        extra = event.extra_fields
        caller = extra.caller
        cfile, cline, cfunc = caller.file_name, caller.line_number, caller.function_name
        restart = self._boundary is not None and (cfile, cfunc) == self._boundary
        frames = () if restart else self._tuples[stack]
        if placeholder and not restart and frames:
            frames = frames[:-1]  # the caller's line is now known exactly
        here = self._frame(cfile, cline, cfunc)
        if here is not None:
            frames = (*frames, here)
        if builtin:
            return self._id(frames), False
        site = extra.callsite
        callee = self._frame(site.file_name, 0, site.function_name)
        if callee is None:
            return self._id(frames), False
        return self._id((*frames, callee)), True


@dataclass
class ReadState:
    """What reading one chunk of events hands to the next: op names, and the module of each
    forward op's autograd sequence number (a backward may come chunks after its forward)."""

    ops: Interner = field(default_factory=Interner)
    seq_module: dict[int, int] = field(default_factory=dict)


#: Our own functions the profiler's Python tracer sees between a module hook and the module
#: range it opens (the tagger's hook, the recorder's callback; the session's ``enter`` opens
#: it). What else they call is skipped when the tree is read.
_RANGE_PATH = frozenset({"_pre_forward", "_enter_module"})
#: Our bookkeeping, known to run no op and allocate nothing: reading the event tree skips
#: these calls and all they call (with Python stacks that is most of the tree, a dozen Python
#: and C calls per hook). Only named functions: other capture code can run the user's ops
#: (a capacity guard's ``__torch_dispatch__`` runs every op under it), so it is walked.
_BOOKKEEPING = frozenset(
    {
        ("profiler_events.py", "_on_role"),
        ("profiler_events.py", "exit"),
        ("profiler_events.py", "callback"),
        ("profiler_events.py", "sample_memory"),
        ("tagging.py", "_post_forward"),
        ("tagging.py", "_pack"),
        ("tagging.py", "_unpack"),
        ("tagging.py", "_module_id"),
        ("tagging.py", "_hold_call_hooks"),
        ("tagging.py", "_release_call_hooks"),
        ("tagging.py", "_backward_started"),
        ("tagging.py", "_backward_finished"),
        ("tagging.py", "_pre_step"),
        ("tagging.py", "_post_step"),
        ("tagging.py", "iter_tensors"),
    }
)
_CAPTURE_DIR = os.path.dirname(os.path.realpath(__file__)) + os.sep
_PY_USER, _PY_OWN, _PY_PATH, _PY_OPENER = range(4)
_OPENS = "<built-in method __enter__ of "  # the C call in ``enter`` that opens the range


def _py_kind(extra: Any) -> int:
    """Whose function a Python call event enters: the user's, a library's or capture code that
    may run ops (``_PY_USER``), or jupyter_vram's capture code on the way to a module range,
    the range opener, or bookkeeping (``_PY_OWN``: skipped with all it calls)."""
    try:
        site = extra.callsite
        file = site.file_name
        function = site.function_name
    except UnicodeDecodeError:  # a name torch cannot decode is not one of ours
        return _PY_USER
    base = os.path.basename(file)
    if os.path.isabs(file):
        own = os.path.realpath(file).startswith(_CAPTURE_DIR)
    else:  # named relative to its sys.path entry
        own = ("/" + file.replace(os.sep, "/")).endswith(f"/jupyter_vram/_capture/{base}")
        own = own and os.path.isfile(_CAPTURE_DIR + base)
    if not own:
        return _PY_USER
    opener = ProfilerSession.enter.__code__
    if (
        function == opener.co_name
        and base == os.path.basename(opener.co_filename)
        and site.line_number == opener.co_firstlineno
    ):
        return _PY_OPENER
    if function in _RANGE_PATH:
        return _PY_PATH
    return _PY_OWN if (base, function) in _BOOKKEEPING else _PY_USER


def read_events(
    roots: Sequence[Any],
    device_type: str,
    modules: Interner,
    stacks: StackReader | None = None,
    state: ReadState | None = None,
) -> EventRead:
    """Give each allocator report in the profiler's event tree its op, module, phase, stack.

    Two passes. The tree walk reads what nesting says reliably: the aten op around a report,
    whether it happens inside the autograd engine (and for which forward op's sequence
    number), and its Python stack. Ranges opened from Python (our module ranges, the
    optimizers' ``Optimizer.step#`` ranges) are leaves of the tree when Python calls are traced,
    so a second pass sweeps through time with them: module and optimizer ranges, the module of
    each forward op's sequence number, and the phase (forward between a top-level module call
    and the next backward / optimizer step, which covers the loss computation).

    Each node costs a few microseconds of Python (every attribute is a call into the
    profiler's bindings; ``children`` alone is the most), so the walk reads as few as it can:
    an event's kind comes from its ``extra_fields`` type, and the calls our own hooks make are
    skipped but for the way to the module ranges they open.
    """
    from torch._C._profiler import (
        _ExtraFields_Allocation,
        _ExtraFields_PyCall,
        _ExtraFields_PyCCall,
        _ExtraFields_TorchOp,
    )

    backward_scope = torch._C._profiler.RecordScope.BACKWARD_FUNCTION
    state = state if state is not None else ReadState()
    ops = state.ops
    allocs: list[tuple[AllocEvent, int]] = []  # report, forward seq of its backward op / -1
    points: list[tuple[int, int, int, int]] = []  # time, kind, value, end
    py_kinds: dict[str, int] = {}  # a Python call event's name -> _py_kind
    # walk context: op, chain of Python calls, backward seq (-2: not in backward), and where
    # in our own code (0: not in it, else _PY_PATH or _PY_OPENER)
    todo: list[tuple[Any, int, Any, int, int]] = [(r, 0, None, -2, 0) for r in reversed(roots)]
    pop, push = todo.pop, todo.extend
    while todo:
        event, op, chain, bseq, ours = pop()
        extra = event.extra_fields
        kind = type(extra)
        if kind is _ExtraFields_Allocation:
            if extra.device.type == device_type:
                stack = stacks.resolve(chain) if stacks is not None else -1
                t = event.start_time_ns
                allocs.append((AllocEvent(t, extra.ptr, extra.alloc_size, op, 0, 0, stack), bseq))
            continue
        if kind is _ExtraFields_TorchOp:
            name = event.name
            if name.startswith(MODULE_RANGE):
                mid = int(name[len(MODULE_RANGE) :])
                points.append((event.start_time_ns, _OPEN_MODULE, mid, event.end_time_ns))
                points.append((event.end_time_ns, _CLOSE_MODULE, mid, 0))
            elif name.startswith(_STEP):
                opt = modules(f"{name[len(_STEP) :].split('.')[0]}.step")
                points.append((event.start_time_ns, _OPEN_STEP, opt, 0))
                points.append((event.end_time_ns, _CLOSE_STEP, opt, 0))
            elif name.startswith(_EVALUATE):
                if bseq == -2:
                    points.append((event.start_time_ns, _BACKWARD, 0, event.end_time_ns))
                bseq = extra.sequence_number
            elif name.startswith("aten::"):
                if name not in _PLUMBING or not op:  # empty() alone is the op itself
                    op = ops(name[6:])
                    seq = extra.sequence_number
                    if seq >= 0 and bseq == -2:
                        points.append((event.start_time_ns, _FORWARD_OP, seq, 0))
            elif extra.scope == backward_scope:
                op = ops(name.rsplit("::", 1)[-1])
        elif kind is _ExtraFields_PyCall:
            try:
                name = event.name
            except UnicodeDecodeError:  # torch could not decode it: not one of our functions
                name = ""
            py = py_kinds.get(name) if name else None
            if py is None:
                py = _py_kind(extra)
                if name:
                    py_kinds[name] = py
            if py == _PY_OWN or (ours and py == _PY_USER):
                continue  # our bookkeeping, and what it calls
            if py != _PY_USER:
                ours = py
            elif stacks is not None:
                chain = (chain, event, False)
        elif kind is _ExtraFields_PyCCall:
            if ours:
                if ours != _PY_OPENER or not event.name.startswith(_OPENS):
                    continue
            elif stacks is not None:
                chain = (chain, event, True)
        children = event.children
        if children:
            context = repeat(op), repeat(chain), repeat(bseq), repeat(ours)
            push(zip(reversed(children), *context, strict=False))
    read = EventRead(ops=ops.names)
    read.events = _sweep(allocs, points, ops.index.get("ones_like", -1), state.seq_module)
    read.events.sort(key=_time_of)
    return read


def _time_of(event: AllocEvent) -> int:
    return event.time_ns


_OPEN_MODULE, _CLOSE_MODULE, _OPEN_STEP, _CLOSE_STEP, _BACKWARD, _FORWARD_OP, _ALLOC = range(7)


def _sweep(
    allocs: list[tuple[AllocEvent, int]],
    points: list[tuple[int, int, int, int]],
    ones_like: int,
    seq_module: dict[int, int],
) -> list[AllocEvent]:
    """Module, phase and recompute window of each report from the ranges open at its time."""
    timeline: list[tuple[int, int, int, int]] = list(points)
    timeline.extend((ev.time_ns, _ALLOC, i, 0) for i, (ev, _) in enumerate(allocs))
    timeline.sort()
    module_stack: list[int] = []
    opt_stack: list[int] = []
    backward_until = 0  # end of the current top-level backward range
    recompute_until = 0  # end of a module call made inside backward (checkpointing)
    sticky = False
    seed: AllocEvent | None = None  # the last free-standing ones_like: backward's seed
    for t, kind, value, end in timeline:
        if kind == _ALLOC:
            ev, bseq = allocs[value]
            in_backward = bseq != -2 or t < backward_until
            if opt_stack:
                ev.phase, ev.module = PHASE_OPTIMIZER, opt_stack[-1]
            elif in_backward:
                ev.phase = PHASE_BACKWARD
                if recompute_until and t <= recompute_until and module_stack:
                    ev.module, ev.recompute_end = module_stack[-1], recompute_until
                else:
                    ev.module = seq_module.get(bseq, 0)
            elif module_stack:
                ev.phase, ev.module = PHASE_FORWARD, module_stack[-1]
            else:
                ev.phase = PHASE_FORWARD if sticky else PHASE_OTHER
            if ev.size > 0 and not in_backward:
                free_standing = not opt_stack and not module_stack and ev.op == ones_like
                seed = ev if free_standing else None
            continue
        if kind == _BACKWARD:
            backward_until = max(backward_until, end)
            sticky = False
            if seed is not None:
                seed.phase, seed.module = PHASE_BACKWARD, 0
            seed = None
        elif kind == _OPEN_MODULE:
            if t < backward_until and not module_stack:
                recompute_until = end
            elif not module_stack:
                sticky = True
            module_stack.append(value)
        elif kind == _CLOSE_MODULE:
            if module_stack:
                module_stack.pop()
            if not module_stack:
                recompute_until = 0
        elif kind == _OPEN_STEP:
            opt_stack.append(value)
            sticky = False
        elif kind == _CLOSE_STEP:
            if opt_stack:
                opt_stack.pop()
        elif kind == _FORWARD_OP:
            seq_module.setdefault(value, module_stack[-1] if module_stack else 0)
    return [ev for ev, _ in allocs]


# -- rows ------------------------------------------------------------------------------------


def build_rows(
    builder: ProfileBuilder,
    read: EventRead,
    notes: Sequence[tuple[int, int, int, int, int, int]],
    freed: dict[int, int],
    *,
    t0: int,
    threads_ran_from: int | None = None,
    maps: Sequence[MemoryMap] = (),
    addresses: dict[int, int] | None = None,
) -> int:
    """Turn allocator reports, role notes and release times into allocation rows; return how
    many frees were inferred (made where the allocator does not report: another thread).

    Each report pairs with the live allocation at its address. Each note (time, address, size,
    category, module, storage key) goes to the allocation holding that address at that time,
    or, when none does, to a row for memory no report covers. That memory was held before
    recording (a baseline row) unless there is evidence that another thread made it during
    the recording (an ``(another thread)`` row):

    * the address: a report made during the recording, before the note, covered some of the
      same bytes (an allocation, or a free of memory an earlier recording allocated), or a
      memory map snapshot (``maps``) taken during the recording did not have them mapped, so
      this memory came later; the row starts when those bytes were last seen not to be it;
    * a thread: another thread is known to have run user code from ``threads_ran_from`` on
      (see :class:`_ThreadWatch`), the note comes after that, and it is data (an input, an
      activation, a tensor the cell keeps), not a model's parameters, buffers, gradients or
      optimizer state, which come from before the cell unless their address says otherwise.
      This is weaker evidence (data held before the cell that the namespace scan did not
      reach looks the same), so the row starts with the recording, as memory held before
      would: a wrong guess moves bytes out of "before the cell", never out of a peak.

    Without either (no other thread, or only idle ones) the memory was there before the cell,
    as it would be in a run alone. Baseline and other-thread rows end when their storage died
    (``freed``), the allocator reported their free, or a later report reused their bytes.

    The allocator reports a free only on the thread that makes it: memory allocated here and
    freed on another thread (gloo's work threads free DDP buffers) would stay live to the end.
    Such frees are inferred, each at the latest time the evidence allows: a later allocation
    overlapping the block (the allocator reuses addresses) ends it just before; the death of
    its noted storage (a weakref) ends it then; a noted storage of another thread over its
    bytes ends it just before the note; a snapshot of the process's memory map (``maps``,
    taken at the start, at module calls at most every 50 ms, and at the end) in which its
    first byte is not mapped at all ends it then (memory still allocated is always mapped).

    ``addresses``, when given, gets the address (row -> address) of each row made while
    recording whose free no report gave: what ties a storage alive at the end to its row.
    """
    for name in read.ops[1:]:
        builder.ops(name)
    cpu = builder.devices("cpu")
    # 1. allocations made while recording; ``starts`` orders the live blocks by address
    by_ptr: dict[int, list[tuple[int, int]]] = {}
    live: dict[int, tuple[int, int]] = {}  # ptr -> (row, end address)
    starts: list[int] = []
    alloc_time: dict[int, int] = {}
    reported: dict[int, int] = {}  # row -> time of its reported free
    inferred: dict[int, int] = {}  # row -> time of a free the allocator did not report
    evicted: dict[int, int] = {}  # row -> address, of blocks ended by a later one over them
    blocks: list[tuple[int, int, int]] = []  # (address, end address, row)
    orphans: list[tuple[int, int, int]] = []  # frees nobody here allocated: (address, end, time)
    recompute_end: dict[int, int] = {}
    free_phase: dict[int, int] = {}
    for ev in read.events:
        t = ev.time_ns
        if ev.size > 0:
            stop_at = ev.ptr + ev.size
            i = bisect.bisect_left(starts, stop_at)
            while i > 0:  # live blocks never overlap: the ones further left end before
                other = starts[i - 1]
                held, other_end = live[other]
                if other_end <= ev.ptr:
                    break
                del starts[i - 1], live[other]
                inferred[held] = t - 1  # freed unseen before its bytes were handed out again
                evicted[held] = other
                i -= 1
            row = builder.add(
                ev.size, 0, t - t0, cpu, ev.op, ev.module, ev.stack, ev.phase, TEMPORARY
            )
            live[ev.ptr] = (row, stop_at)
            bisect.insort(starts, ev.ptr)
            alloc_time[row] = t
            by_ptr.setdefault(ev.ptr, []).append((t, row))
            blocks.append((ev.ptr, stop_at, row))
            if ev.recompute_end:
                recompute_end[row] = ev.recompute_end
        elif ev.size < 0:
            held_or_none = live.pop(ev.ptr, None)
            if held_or_none is None:
                orphans.append((ev.ptr, ev.ptr - ev.size, t))
                continue
            del starts[bisect.bisect_left(starts, ev.ptr)]
            reported[held_or_none[0]] = t
            free_phase[held_or_none[0]] = ev.phase
    free_time: dict[int, int] = {**inferred, **reported}
    space = _Space(blocks, orphans, alloc_time, free_time)
    # 2. roles
    baseline: dict[int, int] = {}  # storage key -> its row (before recording / elsewhere)
    unreported: dict[int, tuple[int, int, int]] = {}  # that row -> (key, ptr, last note)
    for t, ptr, size, category, module, key in notes:
        row_or_none = _holder(by_ptr.get(ptr), t, free_time)
        if row_or_none is None:
            row_or_none = space.inside(ptr, size, t)  # a storage over part of a block's bytes
        if row_or_none is not None:
            row = row_or_none
            died = freed.get(key)
            if (
                row not in reported
                and died is not None
                and died >= t - _TOLERANCE_NS
                and died < free_time.get(row, sys.maxsize)
                and builder.size[row] == size
            ):
                free_time[row] = inferred[row] = died  # its last reference went elsewhere
        elif key in baseline:
            row = baseline[key]
            unreported[row] = (key, ptr, t)
        else:
            made = None
            if t > t0:
                for other in space.live_at(ptr, size, t):
                    if other not in reported:  # its bytes are this storage's now
                        free_time[other] = inferred[other] = t - 1
                made = _made_after(space.gone_before(ptr, size, t, t0), maps, ptr, t, t0)
                if (
                    made is None
                    and threads_ran_from is not None
                    and t >= threads_ran_from
                    and category not in _MODEL_STATE
                ):
                    made = t0
            if made is not None:
                row = builder.add(size, 0, made - t0, cpu, builder.ops(ELSEWHERE_OP), 0, -1, 0, 0)
                alloc_time[row] = made
            else:
                row = builder.add(size, -1, 0, cpu, builder.ops(BASELINE_OP), 0, -1, 0, 0)
            builder.category[row] = OTHER
            baseline[key] = row
            unreported[row] = (key, ptr, t)
        builder.promote(row, category)
        if module and not builder.module[row]:
            builder.module[row] = module
    for row, (key, ptr, noted) in unreported.items():
        released = _release(key, ptr, builder.size[row], noted, freed, space)
        if released is not None:
            free_time[row] = released
    # 3. what the roles cannot say: kept across a recompute, or saved outside module calls
    for row, until in recompute_end.items():
        if builder.category[row] == TEMPORARY and free_time.get(row, sys.maxsize) > until:
            builder.category[row] = ACTIVATION
    for row, phase in free_phase.items():
        if (
            phase == PHASE_BACKWARD
            and builder.category[row] == TEMPORARY
            and builder.phase[row] == PHASE_FORWARD
        ):
            # kept from forward until backward released it: saved for backward where our
            # saved-tensor hooks were not on (the loss, outside any module call)
            builder.category[row] = ACTIVATION
    # 4. unmapped while we still thought it held
    if maps:
        last = maps[-1]
        for ptr, row, since in _unreported_blocks(live, evicted, unreported, alloc_time):
            if row in inferred or not last.holds(ptr):
                gone = _unmapped_by(maps, ptr, since, free_time.get(row, sys.maxsize))
                if gone is not None:
                    free_time[row] = inferred[row] = gone
    if addresses is not None:
        addresses.update((row, ptr) for ptr, (row, _) in live.items())
        addresses.update((row, ptr) for row, (_, ptr, _) in unreported.items())
    # 5. one sequence over every alloc and free
    timeline = [(t, 0, row) for row, t in alloc_time.items()]
    timeline.extend((t, 1, row) for row, t in free_time.items())
    timeline.sort()
    for seq, (t, kind, row) in enumerate(timeline):
        if kind == 0:
            builder.alloc_seq[row] = seq
        else:
            builder.free(row, seq, max(0, t - t0))
    return sum(1 for row in inferred if row not in reported)


def _holder(allocs: list[tuple[int, int]] | None, t: int, free_time: dict[int, int]) -> int | None:
    """The row that held an address at time ``t`` (None: memory older than the recording)."""
    if not allocs:
        return None
    i = bisect.bisect_right(allocs, (t + _TOLERANCE_NS, sys.maxsize)) - 1
    while i >= 0:
        start, row = allocs[i]
        if free_time.get(row, sys.maxsize) >= t - _TOLERANCE_NS:
            return row
        if start < t - _TOLERANCE_NS:
            return None
        i -= 1
    return None


#: Roles of a model's own memory: a thread having run is no evidence about these.
_MODEL_STATE = frozenset({PARAMETER, BUFFER, GRADIENT, OPTIMIZER_STATE})


class _Intervals:
    """Address ranges ``(start, stop, value)``, searchable by overlap with another range.

    Ranges are grouped by length (each group within a factor of 16), each group sorted by
    start: a range over ``[ptr, ptr + size)`` starts at most its group's longest length before
    ``ptr``, so each group is searched in a window as narrow as its own lengths. One window for
    all (as wide as the longest range: a 150 MB embedding gradient) made every search scan
    most of the recording's blocks.
    """

    def __init__(self, items: list[tuple[int, int, int]]) -> None:
        groups: dict[int, list[tuple[int, int, int]]] = {}
        for item in items:
            groups.setdefault((item[1] - item[0]).bit_length() // 4, []).append(item)
        self._groups: list[tuple[list[tuple[int, int, int]], list[int], int]] = []
        for group in groups.values():
            group.sort()
            span = max(stop - start for start, stop, _ in group)
            self._groups.append((group, [start for start, _, _ in group], span))

    def over(self, ptr: int, size: int) -> list[tuple[int, int, int]]:
        """The ranges with bytes in ``[ptr, ptr + size)``, in (start, stop, value) order."""
        found: list[tuple[int, int, int]] = []
        end = ptr + size
        for group, starts, span in self._groups:
            lo = bisect.bisect_right(starts, ptr - span)
            hi = bisect.bisect_left(starts, end, lo)
            if lo < hi:
                found.extend(item for item in group[lo:hi] if item[1] > ptr)
        if len(self._groups) > 1:
            found.sort()
        return found


class _Space:
    """A recording's reported blocks and orphan frees (frees of memory an earlier recording
    allocated, still in the allocator's table), searchable by address range."""

    def __init__(
        self,
        blocks: list[tuple[int, int, int]],
        orphans: list[tuple[int, int, int]],
        alloc_time: dict[int, int],
        free_time: dict[int, int],
    ) -> None:
        self._blocks = _Intervals(blocks)
        self._orphan_ranges = _Intervals(orphans)
        self._orphans = sorted(orphans)
        self._orphan_starts = [o[0] for o in self._orphans]
        self._alloc_time = alloc_time
        self._free_time = free_time

    def _blocks_over(self, ptr: int, size: int) -> list[tuple[int, int, int]]:
        return self._blocks.over(ptr, size)

    def _alive(self, row: int, t: int) -> bool:
        return (
            self._alloc_time[row] < t - _TOLERANCE_NS and self._free_time.get(row, sys.maxsize) >= t
        )

    def inside(self, ptr: int, size: int, t: int) -> int | None:
        """A block alive at ``t`` whose bytes hold all of these (a storage made over part of
        another's memory, as ``from_blob`` does)."""
        for start, stop, row in self._blocks_over(ptr, size):
            if start <= ptr and ptr + size <= stop and self._alive(row, t):
                return row
        return None

    def live_at(self, ptr: int, size: int, t: int) -> list[int]:
        """Blocks over some of these bytes that were allocated before ``t`` and not freed."""
        return [row for _, _, row in self._blocks_over(ptr, size) if self._alive(row, t)]

    def gone_before(self, ptr: int, size: int, t: int, t0: int) -> int | None:
        """The latest time in the recording before ``t`` that these bytes were seen to be free
        or another block's (None: never), so memory noted over them at ``t`` came after."""
        limit = t - _TOLERANCE_NS
        times = [
            min(self._free_time.get(row, t), t)
            for _, _, row in self._blocks_over(ptr, size)
            if t0 <= self._alloc_time[row] <= limit
        ]
        orphans = self._orphan_ranges.over(ptr, size)
        times.extend(when for _, _, when in orphans if t0 <= when <= limit)
        return max(times) if times else None

    def reused_after(self, ptr: int, size: int, t: int) -> int | None:
        """The first allocation over some of these bytes after ``t`` (they were free by then)."""
        times = [
            self._alloc_time[row]
            for _, _, row in self._blocks_over(ptr, size)
            if self._alloc_time[row] > t + _TOLERANCE_NS
        ]
        return min(times) if times else None

    def orphan_free(self, ptr: int, t: int) -> int | None:
        """The first free of memory at ``ptr`` allocated under an earlier recording."""
        i = bisect.bisect_left(self._orphan_starts, ptr)
        times = []
        while i < len(self._orphans) and self._orphans[i][0] == ptr:
            if self._orphans[i][2] >= t - _TOLERANCE_NS:
                times.append(self._orphans[i][2])
            i += 1
        return min(times) if times else None


def _release(
    key: int, ptr: int, size: int, noted: int, freed: dict[int, int], space: _Space
) -> int | None:
    """When memory no report allocated went (last noted alive at ``noted``): its storage's
    death, an allocator free at its address (memory allocated under an earlier recording is
    still known to the allocator's table), or just before a report reused its bytes."""
    candidates = []
    orphan = space.orphan_free(ptr, noted)
    if orphan is not None:
        candidates.append(orphan)
    if key in freed:
        candidates.append(freed[key])
    reused = space.reused_after(ptr, size, noted)
    if reused is not None:
        candidates.append(reused - 1)
    return min(candidates) if candidates else None


# -- process-wide switches, always restored ------------------------------------------------------


_MAP_EVERY_NS = 50_000_000
_MAX_MAPS = 2_000


class _ThreadWatch:
    """Which other threads ran user code during the recording, and from when.

    The CPU allocator reports to the profiler only on the recording thread, so memory that
    other threads allocate (a DataLoader's or a ThreadPoolExecutor's workers, a background
    training loop) is not in the profile: the profile says so, naming them. A thread counts
    only when it ran: one started during the recording from its first call into user code
    (a profile hook on new threads, removed there); one already running when it used CPU
    time meanwhile and was in user code at the start or the end. An idle thread (blocked on
    a pipe or a lock) made nothing, so it changes nothing in the profile.
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        #: the earliest time another thread is known to have run user code (None: none did)
        self.ran_from: int | None = None
        #: snapshots of the memory map: what another thread freed is unmapped in the next one
        self.maps: list[MemoryMap] = []
        #: monotonic time before which a memory map snapshot is not taken again
        self.next_map = 0
        self._started: dict[str, int] = {}
        self._before: dict[int, tuple[int | None, bool]] = {}  # ident -> (CPU ns, user code)
        self._previous: Any = None
        self._on = False
        self._me = 0
        self._t_start = 0
        self._user: dict[Any, bool] = {}

    def start(self) -> None:
        self._me = threading.get_ident()
        self._t_start = time.time_ns()
        self.maps = []
        self.sample_memory(last=True)
        self.next_map = time.monotonic_ns() + _MAP_EVERY_NS  # a first read can be slow
        with contextlib.suppress(Exception):
            self._before = self._census()
        self._previous = threading.getprofile()
        threading.setprofile(self._watch_new)
        self._on = True

    def _census(self) -> dict[int, tuple[int | None, bool]]:
        found: dict[int, tuple[int | None, bool]] = {}
        frames = sys._current_frames()
        try:
            for thread in threading.enumerate():
                ident = thread.ident
                if ident is None or ident == self._me:
                    continue
                found[ident] = (_cpu_ns(thread.native_id), _running_user_code(frames.get(ident)))
        finally:
            # this function's own frame is among them: holding it in a local would make
            # a cycle that keeps the caller's locals (the cell's value) alive until a gc
            frames.clear()
            del frames
        return found

    def _watch_new(self, frame: Any, event: str, arg: Any) -> None:
        """Profile hook of threads started while recording, until they call user code."""
        try:
            if event != "call" and self._on:
                return
            if self._on:
                code = frame.f_code
                user = self._user.get(code)
                if user is None:
                    user = self._user[code] = _user_file(code.co_filename)
                if not user:
                    return
                self._started.setdefault(threading.current_thread().name, time.time_ns())
        except Exception:  # noqa: BLE001 - never raise from a hook
            pass
        sys.setprofile(self._previous)

    def sample_memory(self, *, last: bool = False) -> None:
        """Snapshot the memory map, at most every ``_MAP_EVERY_NS`` (or 20 times what the
        last one took: at most 5 % of the time) and ``_MAX_MAPS`` times a recording;
        ``last``: the first and the last one, always. Never raises."""
        began = time.monotonic_ns()
        if not last and (began < self.next_map or len(self.maps) >= _MAX_MAPS):
            return
        with contextlib.suppress(Exception):
            snapshot = MemoryMap.now()
            if snapshot is not None:
                self.maps.append(snapshot)
        self.next_map = began + max(_MAP_EVERY_NS, 20 * (time.monotonic_ns() - began))

    def stop(self) -> None:
        if not self._on:
            return
        self._on = False
        threading.setprofile(self._previous)
        self.sample_memory(last=True)
        ran = dict(self._started)
        with contextlib.suppress(Exception):
            after = self._census()
            for thread in threading.enumerate():
                ident = thread.ident
                if ident not in self._before or ident not in after:
                    continue
                cpu_before, user_before = self._before[ident]
                cpu_after, user_after = after[ident]
                used_cpu = cpu_before is None or cpu_after is None or cpu_after > cpu_before
                if used_cpu and (user_before or user_after):
                    ran.setdefault(thread.name, self._t_start)
        self.names = sorted(ran)
        self.ran_from = min(ran.values()) if ran else None


def _cpu_ns(native_id: int | None) -> int | None:
    """CPU time a thread has used (Linux; None elsewhere or when it has ended)."""
    if native_id is None or not sys.platform.startswith("linux"):
        return None
    try:
        return time.clock_gettime_ns(((~native_id) << 3) | 6)  # the thread's CPUCLOCK_SCHED
    except (OSError, OverflowError, ValueError):
        return None


_LIBRARY_DIRS = tuple(
    {os.path.realpath(p) + os.sep for key, p in sysconfig.get_paths().items() if "lib" in key}
)


#: jupyter_vram's own files: its helper threads (the estimator's pipe readers, ...) make no
#: tensors, wherever the package is installed
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep


def _user_file(filename: str) -> bool:
    """Code of the user's (a notebook cell, a script, ``exec``'d text) or torch's, not the
    Python installation's libraries or jupyter_vram's own."""
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    path = os.path.realpath(filename)
    if path.startswith(_OWN_DIR):
        return False
    return path.startswith(_TORCH_DIR) or not path.startswith(_LIBRARY_DIRS)


def _running_user_code(frame: Any, depth: int = 8) -> bool:
    """A thread's innermost frames include torch or code outside the Python installation
    (jupyter_vram's own helper threads excepted)."""
    for _ in range(depth):
        if frame is None:
            return False
        filename = frame.f_code.co_filename
        if os.path.realpath(filename).startswith(_OWN_DIR):
            return False
        if _user_file(filename) and not filename.startswith("<"):
            return True
        frame = frame.f_back
    return False


_MAP_RANGE = re.compile(rb"^([0-9a-f]+)-([0-9a-f]+)", re.MULTILINE)


@dataclass
class MemoryMap:
    """Which addresses the process had mapped at one moment (Linux's /proc/self/maps, read
    between ``before`` and ``after``), as sorted ranges with touching ones merged. Memory
    still allocated is always mapped, whatever maps it (malloc, a file, a driver)."""

    before: int
    after: int
    lows: array[int]
    highs: array[int]

    @classmethod
    def now(cls) -> MemoryMap | None:
        before = time.time_ns()
        try:
            with open("/proc/self/maps", "rb") as maps:
                data = maps.read()
            # A handful of calls whatever the number of lines: with Python stacks the
            # profiler records every call made from Python code, and this runs at module calls.
            bounds = list(map(int, chain.from_iterable(_MAP_RANGE.findall(data)), repeat(16)))
        except (OSError, ValueError):
            return None
        starts, ends = bounds[0::2], bounds[1::2]
        # sorted ranges; touching (or overlapping) ones merged
        first = [i for i in range(len(starts)) if not i or starts[i] > ends[i - 1]]
        lows = array("Q", [starts[i] for i in first])
        highs = array("Q", [ends[i - 1] for i in first[1:]] + ends[-1:])
        return cls(before, time.time_ns(), lows, highs)

    def holds(self, ptr: int) -> bool:
        i = bisect.bisect_right(self.lows, ptr) - 1
        return i >= 0 and ptr < self.highs[i]


def _unreported_blocks(
    live: dict[int, tuple[int, int]],
    evicted: dict[int, int],
    unreported: dict[int, tuple[int, int, int]],
    alloc_time: dict[int, int],
) -> Iterator[tuple[int, int, int]]:
    """(address, row, alive at) of the memory whose free no report gave: blocks still open,
    blocks a later one reused the bytes of, and rows for memory no report allocated."""
    for ptr, (row, _) in live.items():
        yield ptr, row, alloc_time[row]
    for row, ptr in evicted.items():
        yield ptr, row, alloc_time[row]
    for row, (_, ptr, noted) in unreported.items():
        yield ptr, row, noted


def _made_after(
    gone: int | None, maps: Sequence[MemoryMap], ptr: int, t: int, t0: int
) -> int | None:
    """The earliest time memory noted at ``t`` can have been made, from the reports (bytes
    seen free or another block's at ``gone``) and the memory maps (an address unmapped in a
    snapshot during the recording); None: nothing says it came after the start."""
    made = None if gone is None else gone + 1
    for snapshot in maps:
        if snapshot.before > t - _TOLERANCE_NS:
            break
        if snapshot.before >= t0 and not snapshot.holds(ptr):
            made = max(made or 0, snapshot.before)
    return made


def _unmapped_by(maps: Sequence[MemoryMap], ptr: int, since: int, until: int) -> int | None:
    """The first snapshot after ``since`` and before ``until`` with ``ptr`` unmapped."""
    i = bisect.bisect_right([m.before for m in maps], since + _TOLERANCE_NS)
    for snapshot in maps[i:]:
        if snapshot.after >= until:
            return None
        if not snapshot.holds(ptr):
            return snapshot.after
    return None


class _LogLevel:
    """c10's minimum log level, raised to errors while recording (the CPU allocator logs a
    warning for frees of memory allocated before profiling started)."""

    def __init__(self, flag: ctypes.c_int | None) -> None:
        self._flag = flag
        self._saved = flag.value if flag is not None else 0

    @classmethod
    def quiet(cls) -> _LogLevel:
        flag: ctypes.c_int | None = None
        with contextlib.suppress(Exception):
            lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
            flag = ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level")
        level = cls(flag)
        if flag is not None:
            flag.value = max(flag.value, 2)
        return level

    def restore(self) -> None:
        if self._flag is not None:
            self._flag.value = self._saved


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Kineto prints a line to file descriptor 2 on every start and stop; in a kernel that
    line would land in the cell's output."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
