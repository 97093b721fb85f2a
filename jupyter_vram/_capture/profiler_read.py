"""Reading the profiler's event tree: each allocator report with its op, module, phase, stack.

The recorders keep only compact columns of what they read (:class:`Reports`), chunk by chunk.
"""

from __future__ import annotations

import contextlib
import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import astuple, dataclass, field
from itertools import repeat
from typing import Any

import numpy as np
import torch
from torch._C._profiler import (
    _ExtraFields_Allocation,
    _ExtraFields_PyCall,
    _ExtraFields_PyCCall,
    _ExtraFields_TorchOp,
)

from .._model import Frame
from .builder import UNKNOWN, Interner, ProfileBuilder
from .native import NativeChunk
from .profiler_session import MODULE_RANGE, ProfilerSession, SeqWindows
from .stacks import FrameFilter, cell_name
from .tagging import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OPTIMIZER, PHASE_OTHER

#: op name of an allocation made in a chunk recorded without op events
LEAN_OP = "(op not recorded)"
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


@dataclass
class AllocEvent:
    """One allocator report: ``size`` > 0 allocates at ``ptr``, < 0 frees it (a row of
    :class:`Reports`, for code that handles a few; a recording keeps the columns)."""

    time_ns: int
    ptr: int
    size: int
    op: int = 0
    module: int = 0
    phase: int = PHASE_OTHER
    stack: int = -1
    recompute_end: int = 0  # > 0: made while checkpointing recomputed a block ending then
    span_start: int = 0  # the outermost op around the report (0: none), for sampled stacks
    span_end: int = 0


_COLUMNS = (
    ("time_ns", "q"),
    ("ptr", "q"),
    ("size", "q"),
    ("op", "i"),
    ("module", "i"),
    ("phase", "b"),
    ("stack", "i"),
    ("recompute_end", "q"),
    ("span_start", "q"),
    ("span_end", "q"),
)


class Reports:
    """Allocator reports in time order, as compact columns (about 60 bytes a report, where a
    Python object a report costs several times that: a long cell makes millions)."""

    def __init__(self) -> None:
        for name, code in _COLUMNS:
            setattr(self, name, array(code))

    time_ns: array[int]
    ptr: array[int]
    size: array[int]
    op: array[int]
    module: array[int]
    phase: array[int]
    stack: array[int]
    recompute_end: array[int]
    span_start: array[int]
    span_end: array[int]

    def __len__(self) -> int:
        return len(self.time_ns)

    def __iter__(self) -> Iterator[AllocEvent]:
        columns = [getattr(self, name) for name, _ in _COLUMNS]
        return (AllocEvent(*values) for values in zip(*columns, strict=True))

    def extend(self, events: Iterable[AllocEvent | Sequence[int]]) -> None:
        """Append reports (objects, or rows in column order)."""
        rows = [astuple(e) if isinstance(e, AllocEvent) else e for e in events]
        if not rows:
            return
        for (name, _), values in zip(_COLUMNS, zip(*rows, strict=True), strict=False):
            getattr(self, name).extend(values)

    def view(self, name: str) -> np.ndarray:
        """A column as a numpy array over its memory (writes go to the column); drop it
        before the column grows."""
        column = getattr(self, name)
        return np.frombuffer(column, _DTYPES[column.typecode])

    def extend_columns(self, other: Reports) -> None:
        """Append another's reports (a chunk's, later in time)."""
        for name, _ in _COLUMNS:
            getattr(self, name).extend(getattr(other, name))

    @classmethod
    def of(cls, events: Iterable[AllocEvent]) -> Reports:
        reports = cls()
        reports.extend(events)
        return reports


@dataclass
class EventRead:
    """What the event tree says: allocator reports in time order, plus the op names."""

    events: Reports = field(default_factory=Reports)
    ops: list[str] = field(default_factory=lambda: [UNKNOWN])

    @classmethod
    def of(cls, ops: list[str], events: Iterable[AllocEvent]) -> EventRead:
        return cls(Reports.of(events), ops)


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
    """What reading one chunk of events hands to the next: op names, the module of each
    forward op's autograd sequence number (a backward may come chunks after its forward), and
    where the last chunk's sweep ended."""

    ops: Interner = field(default_factory=Interner)
    seq_module: dict[int, int] = field(default_factory=dict)
    #: module calls by sequence number, for backward nodes whose forward op no chunk recorded
    windows: SeqWindows = field(default_factory=SeqWindows)
    #: the last chunk ended in forward (after a top-level module call, before backward)
    sticky: bool = False
    #: where the last chunk's backward seed (a free-standing ones_like) is in the reports
    seed: int = -1
    #: the light recorder's name ids -> op ids (-1: none of this recording's reports used it)
    native_ops: list[int] = field(default_factory=list)


#: Our own functions the profiler's Python tracer sees between a module hook and the module
#: range it opens (the tagger's hook, the recorder's callback, the session's ``enter``, whose
#: ``_open_range`` opens it). What else they call is skipped when the tree is read.
_RANGE_PATH = frozenset({"_pre_forward", "_enter_module", "enter"})
#: Our bookkeeping, known to run no op and allocate nothing: reading the event tree skips
#: these calls and all they call (with Python stacks that is most of the tree, a dozen Python
#: and C calls per hook). Only named functions: other capture code can run the user's ops
#: (a capacity guard's ``__torch_dispatch__`` runs every op under it), so it is walked.
_BOOKKEEPING = frozenset(
    {
        ("cpu_recorder.py", "_on_role"),
        ("cpu_recorder.py", "_on_roles"),
        ("cpu_recorder.py", "_exit_module"),
        ("profiler_session.py", "exit"),
        ("profiler_session.py", "open"),
        ("profiler_session.py", "close"),
        ("cpu_recorder.py", "_released"),
        ("cpu_recorder.py", "_on_due"),
        ("ticker.py", "_handle"),
        ("ticker.py", "sample"),
        ("cpu_threads.py", "sample_memory"),
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
_OPENS = "_record_function_with_args_enter"  # the C call in ``enter`` that opens it


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
    opener = ProfilerSession._open_range.__code__
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
    *,
    lean: bool = False,
    into: Reports | None = None,
) -> EventRead:
    """Give each allocator report in the profiler's event tree its op, module, phase, stack.

    Two passes. The tree walk reads what nesting says reliably: the aten op around a report
    (and the outermost op, whose span places a sampled stack), whether it happens inside the
    autograd engine (and for which forward op's sequence number), and its Python stack. Ranges
    opened from Python (our module ranges, the optimizers' ``Optimizer.step#`` ranges) are
    leaves of the tree when Python calls are traced, so a second pass sweeps through time with
    them: module and optimizer ranges, the module of each forward op's sequence number, and
    the phase (forward between a top-level module call and the next backward / optimizer
    step, which covers the loss computation).

    The reports are appended to ``into`` (a recording's, chunk after chunk) when given.
    A ``lean`` chunk (no op events, see ``profiler_session``) names a report made in backward
    by its autograd node (``AddmmBackward0``) and one made elsewhere ``LEAN_OP``.

    Each node costs a few microseconds of Python (every attribute is a call into the
    profiler's bindings; ``children`` alone is the most), so the walk reads as few as it can:
    an event's kind comes from its ``extra_fields`` type, and the calls our own hooks make are
    skipped but for the way to the module ranges they open.
    """
    state = state if state is not None else ReadState()
    allocs: list[list[int]] = []  # report rows in column order, then the backward's seq
    points: list[tuple[int, int, int, int]] = []  # time, kind, value, end
    first_op = state.ops(LEAN_OP) if lean else 0
    _walk(roots, device_type, modules, stacks, state.ops, allocs, points, first_op)
    allocs.sort(key=_first)
    table = np.asfortranarray(np.array(allocs, np.int64).reshape(len(allocs), len(_ROW)))
    return _swept(table, points, state, into, lean)


def _swept(
    table: np.ndarray,
    points: list[tuple[int, int, int, int]],
    state: ReadState,
    into: Reports | None,
    lean: bool,
) -> EventRead:
    """Sweep a chunk's reports (rows of ``table`` in time order, see ``_ROW``; column-major,
    so each column is one block of memory) through its points, onto ``into``."""
    read = EventRead(into if into is not None else Reports(), state.ops.names)
    seed_op = -1 if lean else state.ops.index.get("ones_like", -2)
    _sweep(table, points, seed_op, state, read.events)
    for j, (name, code) in enumerate(_COLUMNS):  # not the backward seq
        column = np.ascontiguousarray(table[:, j], _DTYPES[code])  # a copy only to narrow
        getattr(read.events, name).frombytes(column.data.cast("B"))
    return read


def read_native(
    chunk: NativeChunk, modules: Interner, state: ReadState, into: Reports | None = None
) -> EventRead:
    """What :func:`read_events` gives for the profiler's tree, from a chunk of the light
    recorder (``native``), which noted each report's op, backward node and outermost span,
    and the ranges' time points, as it ran."""
    ops = state.native_ops  # the library's name ids -> op ids (-1: not needed yet)
    ops.extend([-1] * (len(chunk.names) - len(ops)))
    used = np.bincount(chunk.reports[:, 3], minlength=len(ops))  # (no sort: ids are small)
    for i in np.flatnonzero(used).tolist():  # only the ops of this recording's
        if ops[i] < 0:  # reports: the library names every op the process ever ran
            ops[i] = state.ops(chunk.names[i]) if i else 0
    reports = chunk.reports
    if len(reports) > 1 and not (reports[1:, 0] >= reports[:-1, 0]).all():
        reports = reports[np.argsort(reports[:, 0], kind="stable")]  # threads interleave
    table = np.zeros((len(reports), len(_ROW)), np.int64, order="F")  # see _ROW
    for j, column in ((_T, 0), (_PTR, 1), (_SIZE, 2), (_BSEQ, 4)):  # library's columns
        table[:, j] = reports[:, column]
    if len(reports):
        table[:, _OP] = np.asarray(ops, np.int64)[reports[:, 3]]
    table[:, _STACK] = -1
    span = reports[:, 5] - chunk.span_base
    known = np.flatnonzero((reports[:, 5] >= 0) & (span >= 0) & (span < len(chunk.spans)))
    table[known, _SPAN_START] = chunk.spans[span[known], 0]
    table[known, _SPAN_END] = chunk.spans[span[known], 1]
    points = [
        (t, kind, modules(chunk.names[value]) if kind in (_OPEN_STEP, _CLOSE_STEP)
         else value, end)
        for t, kind, value, end in chunk.points.tolist()
    ]  # fmt: skip
    return _swept(table, points, state, into, False)


def _first(row: list[int]) -> int:
    return row[0]


def _device_matters(device_type: str) -> bool:
    """Reports can be of another device than ``device_type`` (else the walk skips asking:
    each report's device is a new object)."""
    return device_type != "cpu" or torch.cuda.is_initialized()  # type: ignore[no-untyped-call]


def _walk(
    roots: Sequence[Any],
    device_type: str,
    modules: Interner,
    stacks: StackReader | None,
    ops: Interner,
    allocs: list[list[int]],
    points: list[tuple[int, int, int, int]],
    first_op: int,
) -> None:
    """The tree walk of :func:`read_events`: reports into ``allocs``, ranges into ``points``."""
    check_device = _device_matters(device_type)
    py_kinds: dict[str, int] = {}  # a Python call event's name -> _py_kind
    # walk context: op, chain of Python calls, backward seq (-2: not in backward), where in
    # our own code (0: not in it, else _PY_PATH or _PY_OPENER), and the outermost op's span
    todo: list[tuple[Any, int, Any, int, int, int, int]] = []
    add = allocs.append
    root_stack = stacks.resolve(None) if stacks is not None else -1
    pop, push = todo.pop, todo.extend
    for root in roots:  # most events of a lean chunk: reports outside any range
        extra = root.extra_fields
        if type(extra) is _ExtraFields_Allocation:
            if not check_device or extra.device.type == device_type:
                t = root.start_time_ns
                add([t, extra.ptr, extra.alloc_size, first_op, 0, 0, root_stack, 0, 0, 0, -2])
            continue
        todo.append((root, first_op, None, -2, 0, 0, 0))
        while todo:
            event, op, chain, bseq, ours, s0, s1 = pop()
            extra = event.extra_fields
            kind = type(extra)
            if kind is _ExtraFields_Allocation:
                if not check_device or extra.device.type == device_type:
                    stack = stacks.resolve(chain) if stacks is not None else -1
                    t = event.start_time_ns
                    add([t, extra.ptr, extra.alloc_size, op, 0, 0, stack, 0, s0, s1, bseq])
                continue
            if kind is _ExtraFields_TorchOp:
                name = event.name
                if name.startswith("aten::"):  # the common case first (no range starts so)
                    if name not in _PLUMBING or not op:  # empty() alone is the op itself
                        op = ops(name[6:])
                        seq = extra.sequence_number
                        if seq >= 0 and bseq == -2:
                            points.append((event.start_time_ns, _FORWARD_OP, seq, 0))
                else:
                    op, bseq = _range_or_node(event, name, extra, op, bseq, points, modules, ops)
                if op != first_op and not s0:
                    s0, s1 = event.start_time_ns, event.end_time_ns
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
                    if ours != _PY_OPENER or _OPENS not in event.name:
                        continue
                elif stacks is not None:
                    chain = (chain, event, True)
            children = event.children
            if children:
                context = repeat(op), repeat(chain), repeat(bseq), repeat(ours)
                spans = repeat(s0), repeat(s1)
                push(zip(reversed(children), *context, *spans, strict=False))


def _range_or_node(
    event: Any, name: str, extra: Any, op: int, bseq: int,
    points: list[tuple[int, int, int, int]], modules: Interner, ops: Interner,
) -> tuple[int, int]:  # fmt: skip
    """A torch op event that is not an aten op: our module range, an optimizer step, the
    autograd engine running a node, or (a lean chunk) the node itself. Its time points go to
    ``points``; returns the (op, backward seq) its children run under."""
    if name.startswith(MODULE_RANGE):
        mid = int(name[len(MODULE_RANGE) :])
        points.append((event.start_time_ns, _OPEN_MODULE, mid, event.end_time_ns))
        points.append((event.end_time_ns, _CLOSE_MODULE, mid, 0))
    elif name.startswith(_STEP):
        opt = modules(f"{name[len(_STEP) :].split('.', maxsplit=1)[0]}.step")
        points.append((event.start_time_ns, _OPEN_STEP, opt, 0))
        points.append((event.end_time_ns, _CLOSE_STEP, opt, 0))
    elif name.startswith(_EVALUATE):
        if bseq == -2:
            points.append((event.start_time_ns, _BACKWARD, 0, event.end_time_ns))
        bseq = extra.sequence_number
    elif extra.scope == torch._C._profiler.RecordScope.BACKWARD_FUNCTION:
        op = ops(name.rsplit("::", 1)[-1])
        if bseq == -2:  # a lean chunk: the node without the engine's range around it
            bseq = extra.sequence_number
            points.append((event.start_time_ns, _BACKWARD, bseq, event.end_time_ns))
    return op, bseq


_OPEN_MODULE, _CLOSE_MODULE, _OPEN_STEP, _CLOSE_STEP, _BACKWARD, _FORWARD_OP, _ALLOC = range(7)
#: a report row: the columns of ``Reports``, then the backward node's sequence number
_ROW = (*(name for name, _ in _COLUMNS), "backward_seq")
_T, _PTR, _SIZE, _OP, _MODULE, _PHASE, _STACK, _RECOMPUTE, _SPAN_START, _SPAN_END, _BSEQ = (
    _ROW.index(name)
    for name in ("time_ns", "ptr", "size", "op", "module", "phase", "stack", "recompute_end",
                 "span_start", "span_end", "backward_seq")
)  # fmt: skip
_DTYPES = {"q": np.int64, "i": np.int32, "b": np.int8}


def _sweep(
    table: np.ndarray,
    points: list[tuple[int, int, int, int]],
    seed_op: int,
    state: ReadState,
    into: Reports,
) -> None:
    """Module, phase and recompute window of each report (a row of ``table``, in time order)
    from the ranges open at its time; written into ``table``'s columns.

    The points are walked in Python (a few per module call: the state after each is kept);
    the reports, often far more, take the state of the last point at or before them in numpy.
    ``table``'s reports will follow those already in ``into``; what the sweep knows at a
    chunk's end (forward until backward starts, the seed of backward) goes on to the next
    chunk through ``state``. Backward's seed is the last free-standing allocation before it by
    the op that makes it (``seed_op``: ``ones_like``); a lean chunk (``seed_op`` -1) has no op
    names, so there it counts as forward (a few bytes: the loss's gradient).
    """
    points.sort()
    if seed_op == -1:
        _merge_backward_nodes(points)
    ranges = _ranges_after_points(points, state)
    t, bseq = table[:, _T], table[:, _BSEQ]
    k = np.searchsorted(np.array([p[0] for p in points], np.int64), t, side="right")
    in_backward = (bseq != -2) | (t < ranges.backward_until[k])
    if seed_op == -1:  # made by the engine just after the node that began last (a lean chunk)
        bseq = np.where((bseq == -2) & in_backward, ranges.node_seq[k], bseq)
    in_step = ranges.step_depth[k] > 0
    in_module = ranges.module_depth[k] > 0
    backward = in_backward & ~in_step
    recompute_until = ranges.recompute_until[k]
    recompute = backward & (recompute_until > 0) & (t <= recompute_until) & in_module
    forward = ~in_step & ~in_backward & (in_module | ranges.sticky[k])
    table[:, _PHASE] = np.select(
        [in_step, backward, forward], [PHASE_OPTIMIZER, PHASE_BACKWARD, PHASE_FORWARD], PHASE_OTHER
    )
    module = np.where(in_step, ranges.step_top[k], np.where(in_module, ranges.module_top[k], 0))
    by_node = backward & ~recompute
    if by_node.any():
        seqs, where = np.unique(bseq[by_node], return_inverse=True)
        of_node = [_module_of_node(state, seq) for seq in seqs.tolist()]
        module[by_node] = np.asarray(of_node, np.int64)[where]
    table[:, _MODULE] = module
    table[:, _RECOMPUTE] = np.where(recompute, recompute_until, 0)
    free_standing = ~in_step & ~in_module & (table[:, _OP] == seed_op)
    _seeds(table, k, (table[:, _SIZE] > 0) & ~in_backward, free_standing, ranges, state, into)


def _module_of_node(state: ReadState, seq: int) -> int:
    """The module whose call made backward node ``seq``'s forward op."""
    module = state.seq_module.get(seq)
    return module if module is not None else state.windows.module_of(seq)


@dataclass
class _Ranges:
    """The ranges open after each point of a chunk (index 0: before the first), as columns."""

    module_depth: np.ndarray
    module_top: np.ndarray
    step_depth: np.ndarray
    step_top: np.ndarray
    backward_until: np.ndarray  # end of the top-level backward ranges so far
    recompute_until: np.ndarray  # end of a module call made inside backward (checkpointing)
    sticky: np.ndarray  # forward: after a top-level module call, until backward
    node_seq: np.ndarray  # a lean chunk: the backward node that began last
    backward_points: list[int]  # indices (into the points) of the backward ranges' starts


def _ranges_after_points(points: list[tuple[int, int, int, int]], state: ReadState) -> _Ranges:
    """The ranges open after each of a chunk's points (in time order), as columns, and the
    module of each forward op's sequence number (into ``state``). A close with nothing open
    is ignored; a module call that opens inside backward with none open is a recompute
    (activation checkpointing) until the call ends; one outside makes the phase forward
    (``sticky``) until backward or an optimizer step."""
    p = np.array(points, np.int64).reshape(-1, 4)
    t, kind, value, end = p[:, 0], p[:, 1], p[:, 2], p[:, 3]
    module_depth, module_top = _stack(kind, value, _OPEN_MODULE, _CLOSE_MODULE)
    step_depth, step_top = _stack(kind, value, _OPEN_STEP, _CLOSE_STEP)
    backward = kind == _BACKWARD
    until = np.maximum.accumulate(np.concatenate([[0], np.where(backward, end, 0)]))
    opens_top = (kind == _OPEN_MODULE) & (module_depth[:-1] == 0)  # nothing open before
    recomputes = opens_top & (t < until[:-1])
    recompute = _last_set(
        recomputes | ((kind == _CLOSE_MODULE) & (module_depth[1:] == 0)),
        np.where(recomputes, end, 0),
        0,
    )
    sticky = _last_set(
        (opens_top & ~recomputes) | (kind == _OPEN_STEP) | backward,
        opens_top & ~recomputes,
        state.sticky,
    )
    node = _last_set(backward, value, -1)
    forward = np.flatnonzero(kind == _FORWARD_OP)
    seqs, first = np.unique(value[forward], return_index=True)
    tops = np.where(module_depth > 0, module_top, 0)[forward[first] + 1]
    for seq, module in zip(seqs.tolist(), tops.tolist(), strict=True):
        state.seq_module.setdefault(seq, module)
    return _Ranges(
        module_depth, module_top, step_depth, step_top, until, recompute, sticky.astype(bool),
        node, np.flatnonzero(backward).tolist(),
    )  # fmt: skip


def _stack(
    kind: np.ndarray, value: np.ndarray, push: int, pop: int
) -> tuple[np.ndarray, np.ndarray]:
    """Depth and top value of a stack after each point (index 0: before the first), where
    ``push`` points push their value and ``pop`` points pop (a pop of an empty stack does
    nothing): a floored running sum, and the value of the last push that reached that depth."""
    step = np.where(kind == push, 1, np.where(kind == pop, -1, 0))
    total = np.concatenate([[0], np.cumsum(step)])
    depth = total - np.minimum.accumulate(np.minimum(total, 0))
    after = np.flatnonzero(kind == push) + 1  # the index after each push
    width = len(total) + 1
    keys = depth[after] * width + after  # by depth reached, then by time
    order = np.argsort(keys, kind="stable")
    keys, after = keys[order], after[order]
    found = np.searchsorted(keys, depth * width + np.arange(len(total)), side="right") - 1
    top = np.zeros(len(total), np.int64)
    held = (depth > 0) & (found >= 0)
    held[held] = depth[after[found[held]]] == depth[held]
    top[held] = value[after[found[held]] - 1]
    return depth, top


def _last_set(where: np.ndarray, values: np.ndarray, initial: int) -> np.ndarray:
    """After each point (index 0: before the first), the value set by the last point that
    sets one (``where``), or ``initial``."""
    at = np.concatenate([[0], np.where(where, np.arange(1, len(where) + 1), 0)])
    at = np.maximum.accumulate(at)
    chosen: np.ndarray = np.concatenate([[initial], np.asarray(values, np.int64)])
    return np.asarray(chosen[at])


def _seeds(
    table: np.ndarray,
    k: np.ndarray,
    candidate: np.ndarray,
    free_standing: np.ndarray,
    ranges: _Ranges,
    state: ReadState,
    into: Reports,
) -> None:
    """Backward's seed: at each backward range's start, the last allocation made outside
    backward before it, if none was seed since and it is a free-standing ``seed_op`` (else
    the one an earlier chunk left in ``state``, if no allocation came between). Report ``i``
    comes before point ``j`` when ``k[i] <= j``."""
    rows = np.flatnonzero(candidate)
    before = k[rows]
    consumed_to = -1  # the last backward point so far: candidates before it are spent
    base = len(into)
    # the last candidate before each backward point
    lasts = np.searchsorted(before, ranges.backward_points, side="right") - 1
    for j, last in zip(ranges.backward_points, lasts.tolist(), strict=True):
        if last >= 0 and before[last] > consumed_to:
            row = rows[last]
            if free_standing[row]:
                table[row, _PHASE], table[row, _MODULE] = PHASE_BACKWARD, 0
        elif last < 0 and consumed_to < 0 and state.seed >= 0:  # made at an earlier chunk's end
            into.phase[state.seed] = PHASE_BACKWARD
            into.module[state.seed] = 0
        state.seed = -1
        consumed_to = j
    state.sticky = bool(ranges.sticky[-1])
    if len(rows) and k[rows[-1]] > consumed_to:  # the chunk ends after an allocation
        row = rows[-1]
        state.seed = base + int(row) if free_standing[row] else -1


def _merge_backward_nodes(points: list[tuple[int, int, int, int]]) -> None:
    """A lean chunk has backward's nodes but not the engine's range around each: the nodes of
    one pass (no module call or optimizer step between them) become one range, so what the
    engine allocates between two nodes is backward too."""
    run: list[int] = []  # indices of the current pass's node points
    for i, (_, kind, _, _) in enumerate([*points, (0, _OPEN_STEP, 0, 0)]):
        if kind == _BACKWARD:
            run.append(i)
        elif kind in (_OPEN_MODULE, _OPEN_STEP) and run:
            end = max(points[j][3] for j in run)
            for j in run:
                t, k, v, _ = points[j]
                points[j] = (t, k, v, end)
            run = []
