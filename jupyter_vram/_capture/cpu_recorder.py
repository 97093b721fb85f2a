"""CPU recording from the allocator's own reports: torch.profiler's memory events.

The CPU allocator reports every allocation and free (address, size, time) to an active
profiler, including the ones an op makes and frees inside itself (oneDNN workspaces, sparse
index buffers). Nothing runs per op in Python and no dispatch mode is entered, so autograd
executes exactly the program it would without us (a dispatch mode makes it accumulate
gradients out of place, which raises the true peak of some models by a third).

The reports come from the light recorder (``native``: a C++ memory reporter that notes the op,
backward node and ranges around each report as the cell runs, ~20 % on a small training step
where the profiler costs 2-3x), or from the profiler's event tree (``profiler_read``) where
that library cannot be built, Python stacks are traced, or a distributed run needs the
profiler's collective ranges. Either is read a chunk at a time, at a module call or between
two bytecodes (``ticker``), and only compact columns are kept, so host memory stays bounded
however long the cell runs.

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

A loop's repeated steps are recorded as the allocator's reports alone (``steady``): once the
last steps (one, or a group) made the same allocations and frees as the ones before them, the
hooks and the library's op callback go, and later steps take the labels of the steps they
repeat.

Recording stays light (``profiler_chunks.Budget``): when reading the profiler has cost more
than 15 % of the cell's own time, later chunks record the allocator's reports without op
events (two thirds of a training step's events), and past a cap the rest of the cell runs
unrecorded. The profile says what it left out.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
from .distributed_roles import DistributedRoles, distributed_run
from .profiler_chunks import ChunkedProfiler, gc_paused
from .profiler_read import EventRead, Reports
from .profiler_session import LogLevel, profiler_busy
from .row_addresses import note_addresses
from .stacks import FrameFilter, cell_name
from .steady import copy_roles
from .storage_watch import StorageWatch
from .tagging import (
    BASELINE_TENSORS,
    BareStorages,
    Tagger,
    bare_storages,
    device_test,
    names_from,
    reachable_objects,
    storage_watch,
    storages_on,
)
from .ticker import StackSamples, compiled_anything

SOURCE = "allocator"
#: a role note: time, address, size, category, module, storage key
Note = tuple[int, int, int, int, int, int]


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
    bare: BareStorages,
    modules: Sequence[Any],
    optimizers: Sequence[Any],
    names: Mapping[int, str],
    device_type: str = "cpu",
    top: int = 8,
) -> list[tuple[str, int]]:
    """The variables holding the most memory before recording: (name, bytes), largest first.

    A variable's bytes are the distinct storages it reaches: its tensors (``bare``), and the
    parameters, buffers, gradients or optimizer state of the modules and optimizers it holds.
    """
    per_name: dict[str, dict[int, int]] = {}
    on_device = device_test(device_type)

    def add(name: str, tensor: Any) -> None:
        if isinstance(tensor, torch.Tensor):  # the recorded device's memory only
            for storage in storages_on(tensor, device_type, on_device):
                per_name.setdefault(name, {})[storage._cdata] = storage.nbytes()

    for name, key, size in zip(bare.names, bare.keys, bare.sizes, strict=True):
        per_name.setdefault(name, {})[key] = size
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


_NONE = np.zeros(0, np.int64)
#: what a role note's fast path compares with (dense tensors have one storage)
_STRIDED = torch.strided
_TENSOR = torch.Tensor
_PARAM = torch.nn.Parameter


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
        self._on_device = device_test(self._device_type)
        self._stacks = stack_mode(stacks)
        self._trace = trace  # False: the code may compile (torch.compile): never the tracer
        self._modules = Interner("")
        self._warnings: list[str] = []
        self._distributed = DistributedRoles(self._device_type)
        self._chunks = ChunkedProfiler(
            self._device_type,
            self._modules,
            ops=ops,
            idle=self._idle,
            warnings=self._warnings,
            readers=(self._distributed.read,),
            light=True,
            detail_back=self._detail_back,
        )
        self.tagger = Tagger(
            self._on_role,
            self._modules,
            saved_hooks="per_call",
            on_enter=self._enter_module,
            on_exit=self._exit_module,
            on_step=self._on_step,
            on_wake=self._on_wake,
            on_engine_call=self._on_engine_call,
            tag_graph=False,
        )
        self._notes: list[Note] = []
        #: the namespace's storages, noted first as the recording starts: (n, 6) like notes
        self._baseline_notes = np.zeros((0, 6), np.int64)
        #: each noted storage, weakly: its death is when memory no report frees went
        self._watch = StorageWatch()
        self._boundary: tuple[str, str] | None = None
        self._active = False
        self._t0 = 0
        self._wall_ns = 0
        self._log_level: LogLevel | None = None
        self._threads = ThreadWatch()
        self._held_before: list[tuple[str, int]] = []
        self._builder = ProfileBuilder()
        self._builder.modules = self._modules

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
        self._watch = storage_watch()  # the leak baseline's references, when it made them
        if namespace is None and entry_frame is not None:
            namespace = entry_frame.f_globals
        names: dict[int, str] = {}
        sampled: list[str] = []
        tensors, modules, optimizers = reachable_objects(namespace, names=names, sampled=sampled)
        bare = bare_storages(namespace, self._device_type)
        self._note_baseline(bare, tensors, names, sampled)
        self._held_before = held_by_variable(bare, modules, optimizers, names, self._device_type)
        del tensors, bare
        self.tagger.adopt(modules, optimizers)
        compiling = not self._trace or compile_in_use(modules)
        traced = self._check_stacks(compiling)
        del modules, optimizers
        self._log_level = LogLevel.quiet()
        # the distributed roles read collectives' ranges from the profiler's own event tree
        self._chunks.light = not distributed_run()
        self._chunks.start(
            self._boundary,
            traced=traced,
            sampled=self._stacks != "none",
            from_thread=not compiling,
            builder=self._builder,
        )
        self._t0 = time.time_ns()
        self._threads.start()
        self.tagger.start()
        self._distributed.start()

    def _note_baseline(
        self,
        bare: BareStorages,
        tensors: list[torch.Tensor],
        names: Mapping[int, str],
        sampled: list[str],
    ) -> None:
        """Note the storages of the tensors the namespace holds (memory from before the cell),
        at most ``BASELINE_TENSORS`` tensors of it one by one; say what the walk left out."""
        self._on_storages(bare, OTHER, 0)
        if len(tensors) > BASELINE_TENSORS:
            where = sorted(names_from(tensors, BASELINE_TENSORS, names))
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
        chunks = self._chunks
        try:
            try:
                if self._active and not chunks.paused_ns:
                    self.tagger.final_scan()
            finally:
                self.tagger.stop()
                self._wall_ns = time.time_ns() - self._t0 if self._t0 else 0
                self._active = False
                if chunks.session.taken_over():
                    self._warnings.append(  # a profiler the cell ran ended ours
                        "a torch.profiler started inside the recording took over the "
                        "allocator's reports: this profile is incomplete"
                    )
                events, lean = chunks.stop()  # its helper thread gone before the census
                self._distributed.stop()
                self._threads.stop()
        finally:
            if self._log_level is not None:
                self._log_level.restore()
                self._log_level = None
            freed = self._watch.freed
            self._watch.close()  # dropping the weakrefs cancels their callbacks
            self._watch = StorageWatch()
        notes = self._notes_table()
        if error is not None and _DISCARD_ON_ERROR.get():
            # nobody will look at this profile (a cancelled rerun): reading it would keep the
            # kernel busy for seconds with Python stacks
            self._warnings.append(NOT_READ)
            events, notes, chunks.reports = (), notes[:0], Reports()
        chunks.read(events, lean)
        del events
        with gc_paused():
            return self._rows(error, notes, freed)

    def _notes_table(self) -> np.ndarray:
        """Every note so far, in order, as rows of six integers (and none kept here)."""
        notes, self._notes = self._notes, []
        baseline, self._baseline_notes = self._baseline_notes, self._baseline_notes[:0]
        if not notes:
            return baseline
        return np.concatenate([baseline, np.array(notes, np.int64).reshape(-1, 6)])

    def _rows(self, error: str | None, notes: np.ndarray, freed: dict[int, int]) -> Profile:
        """The rows of everything read, with sampled stacks placed, as a Profile."""
        chunks = self._chunks
        reports = chunks.reports
        steady = chunks.steady
        if chunks.ticker is not None:  # first: a repeated step takes its template's stacks
            chunks.ticker.settle()
            place_stacks(reports, chunks.ticker.samples, self._builder)
        repeated, template = steady.label(reports) if steady is not None else (_NONE, _NONE)
        builder = self._builder
        first = len(builder)
        rows = build_rows(
            builder,
            EventRead(reports, chunks.state.ops.names),
            notes,
            freed,
            t0=self._t0,
            threads_ran_from=self._threads.ran_from,
            maps=self._threads.maps,
        )
        copy_roles(builder, reports.view("size"), first, repeated, template)
        if steady is not None:
            steady_meta, lines = steady.describe(reports.view("size"), len(repeated))
            self._warnings.extend(lines)
        inferred = rows.inferred_frees
        paused = chunks.paused_ns
        profile = builder.build(
            device=self.device,
            source=self.source,
            wall_ns=paused - self._t0 if paused else self._wall_ns,
            error=error,
            meta={
                "torch": torch.__version__,
                "stacks": self._stacks,
                "module_types": dict(self.tagger.module_types),
                "held_before": [list(item) for item in self._held_before],
                **chunks.coverage(self._wall_ns),
                **(steady_meta if steady is not None else {}),
                **({"other_threads": self._threads.names} if self._threads.names else {}),
                **({"inferred_frees": inferred} if inferred else {}),
                **({"warnings": self._warnings} if self._warnings else {}),
            },
        )
        chunks.reports = Reports()
        profile = self._distributed.label(profile, self._t0)
        note_addresses(profile, rows.addresses)  # for leaks (not saved)
        return profile

    def _idle(self) -> bool:
        """No chunk may be read now: recording stopped, or an optimizer is stepping (its
        ``Optimizer.step`` range would be cut)."""
        return not self._active or bool(self.tagger.optimizer_depth)

    # -- hooks (never raise) -----------------------------------------------------------------

    def _enter_module(self, module_id: int) -> None:
        threads = self._threads
        if time.monotonic_ns() >= threads.next_map:
            threads.sample_memory()
        self._chunks.enter(module_id, sys._getframe(2))  # the frame above our hooks

    def _exit_module(self) -> None:
        self._chunks.exit()

    def _on_engine_call(self, begins: bool) -> None:
        """An optimizer step or backward begins / ends: sample the line that called it."""
        if begins:
            self._chunks.engine_call_enter(sys._getframe(2))  # the frame above our hooks
        else:
            self._chunks.engine_call_exit()

    def _on_step(self, module_id: int) -> bool:
        """A top-level module call begins: whether the loop's steps repeat (the tagger then
        watches for their end, see ``steady``)."""
        return self._active and self._chunks.step_begins(module_id)

    def _on_wake(self) -> bool:
        """While steps repeat, a call of their module (or any, see ``_detail_back``): put
        detail back if a step stopped repeating."""
        return self._active and self._chunks.wake(sys._getframe(2))

    def _detail_back(self, now: bool) -> None:
        """A step stopped repeating: the hooks again (``now``), or at the next module call
        that is not inside another."""
        if not self._active:
            return
        if now:
            self.tagger.start()
        else:
            self.tagger.wake_any = True

    def _on_role(self, tensor: torch.Tensor, category: int, module: int) -> None:
        self._on_roles((tensor,), category, module)

    def _on_roles(self, tensors: Iterable[torch.Tensor], category: int, module: int) -> None:
        """Note each tensor's storages in a role (address, size, key, now), and watch each
        storage for when its memory goes. Never raises: the tagger's hooks call this."""
        if not self._active:
            return
        notes, watch, timed = self._notes, self._watch, self._watch.timed
        device_type, on_device = self._device_type, self._on_device
        now = time.time_ns()
        for tensor in tensors:
            try:
                for storage in storages_on(tensor, device_type, on_device):
                    ptr = storage.data_ptr()
                    size = storage.nbytes()
                    if not ptr or not size:
                        continue
                    key = storage._cdata
                    notes.append((now, ptr, size, category, module, key))
                    if key not in timed:
                        watch.add_timed(storage, key)
            except Exception:  # noqa: BLE001 - never raise from a hook
                pass

    def _on_storages(self, bare: BareStorages, category: int, module: int) -> None:
        """:meth:`_on_roles` for the namespace's storages as the recording starts (tens of
        thousands: noted as one block of rows, watched in C loops)."""
        ptrs = np.array(bare.ptrs, np.int64)
        sizes = np.array(bare.sizes, np.int64)
        kept = np.flatnonzero((ptrs != 0) & (sizes != 0))
        keys = np.array(bare.keys, np.int64)[kept]
        block = np.empty((len(kept), 6), np.int64)
        block[:, 0] = time.time_ns()
        block[:, 1] = ptrs[kept]
        block[:, 2] = sizes[kept]
        block[:, 3] = category
        block[:, 4] = module
        block[:, 5] = keys
        self._baseline_notes = np.concatenate([self._baseline_notes, block])
        storages = bare.storages
        kept_keys = keys.tolist()
        self._watch.watch([storages[i] for i in kept.tolist()], kept_keys)
        self._watch.time_frees(kept_keys)


def place_stacks(reports: Reports, samples: StackSamples, builder: ProfileBuilder) -> None:
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

    keep = FrameFilter().keep
    found, which, exact = samples.place(
        column("time_ns"), column("span_start"), column("span_end"), keep
    )
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
