"""One torch profiler recording the allocator's reports, read in chunks, plus our module ranges.

Shared by the CPU recorder (which reads everything from it) and the CUDA recorder (which takes
only op / module / phase labels from it: the allocator history is its truth).

The profiler keeps about 150 bytes per event while it runs and needs about 2 KB per event, and
~1.5-2.5 us, to post-process it when it stops; a long cell would hold gigabytes until its end.
So the recorders stop and restart it every few tens of thousands of events (:meth:`restart`)
and keep only compact columns of what they read. A chunk records either every op
(:data:`FULL`) or only the allocator's reports, our ranges and autograd's backward nodes
(:data:`LEAN`): ops are two thirds of the events on a training step, so a recorder that
falls behind the cell drops op names first (see ``cpu_recorder``).

Private torch APIs used here: the profiler's enable / disable calls with a scope filter, the
record-function enter / exit calls (a ~1 us C++ range), and c10's log-level flag.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import sys
import time
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import torch

FULL = "full"  # every op, every allocator report
LEAN = "lean"  # allocator reports, our ranges, optimizer steps, backward nodes: no op names
MODULE_RANGE = "jv.module:"

_AUTOGRAD: Any = torch._C._autograd  # the profiler's switches (private, partly untyped)
_PROFILER: Any = torch.autograd.profiler
_sequence_nr = _AUTOGRAD._get_sequence_nr
_enter_range = _AUTOGRAD._record_function_with_args_enter
_exit_range = _AUTOGRAD._record_function_with_args_exit


def profiler_busy() -> bool:
    """True when a torch profiler is already running in this process (the user's own)."""
    return bool(torch.autograd.profiler._is_profiler_enabled)


def _scopes(mode: str) -> set[Any]:
    """The record-function scopes a chunk keeps: empty means all of them."""
    if mode == FULL:
        return set()
    scope = torch._C._profiler.RecordScope
    return {scope.USER_SCOPE, scope.BACKWARD_FUNCTION}


class SeqWindows:
    """Module calls as windows of autograd sequence numbers: each node autograd makes gets the
    next number, so a backward node's forward op ran in the innermost call whose window holds
    its number. This names the module of a backward op whose forward op no chunk recorded (a
    lean chunk), at two counter reads a module call."""

    #: a window still open reaches this far
    OPEN = 1 << 62

    def __init__(self) -> None:
        self.starts = array("q")
        self.ends = array("q")
        self.modules = array("i")
        self._open: list[int] = []
        self._found: dict[int, int] = {}

    def open(self, module_id: int) -> None:
        self._open.append(len(self.starts))
        self.starts.append(_sequence_nr())
        self.ends.append(self.OPEN)
        self.modules.append(module_id)

    def close(self) -> None:
        if self._open:
            self.ends[self._open.pop()] = _sequence_nr()

    def module_of(self, seq: int, limit: int = 4096) -> int:
        """The innermost module call that made node ``seq`` (0: none, or not found within
        ``limit`` windows)."""
        found = self._found.get(seq)
        if found is not None:
            return found
        i = bisect.bisect_right(self.starts, seq) - 1
        module = 0
        for j in range(i, max(i - limit, -1), -1):
            if self.ends[j] > seq:
                module = self.modules[j]
                break
        self._found[seq] = module
        return module


class ProfilerSession:
    """The profiler (on or off), its current chunk's mode, and the module ranges open now.

    A module range is a USER_SCOPE record function named ``jv.module:<id>``, so it is kept in
    every mode; :meth:`restart` closes the open ones before the profiler stops and opens them
    again after it starts, so each chunk's ranges are whole.
    """

    def __init__(self) -> None:
        self.on = False
        self.stacks = False
        self.mode = FULL
        self.started_ns = 0  # monotonic clock, when the current chunk began
        self.ranges: list[tuple[int, Any]] = []  # (module id, handle), outermost first
        self.windows = SeqWindows()
        self._names: dict[int, str] = {}
        self._config: Any = None
        self._activities: Any = None

    def start(self, *, stacks: bool, mode: str = FULL) -> None:
        """Start a chunk (``stacks``: the profiler's Python tracer, every Python call)."""
        from torch.autograd.profiler import profile

        if self._config is None or stacks != self.stacks:
            template: Any = profile(use_kineto=True, profile_memory=True, with_stack=stacks)
            self._config, self._activities = template.config(), template.kineto_activities
        self.stacks, self.mode = stacks, mode
        with _quiet_stderr():
            _AUTOGRAD._prepare_profiler(self._config, self._activities)
            _AUTOGRAD._enable_profiler(self._config, self._activities, _scopes(mode))
        _PROFILER._run_on_profiler_start()  # what profiler_busy() reads
        self.on = True
        self.started_ns = time.monotonic_ns()

    def taken_over(self) -> bool:
        """A profiler the cell ran took over this one (ended it, or took its reports)."""
        return self.on and not profiler_busy()

    def stop(self) -> Sequence[Any]:
        """Close our ranges, stop the profiler and return its event tree (empty if it cannot
        be read, or if something else stopped it: a profiler the cell ran took it over)."""
        self.close_ranges()
        if not self.on:
            return ()
        self.on = False
        if not profiler_busy():
            return ()
        _PROFILER._run_on_profiler_stop()
        with _quiet_stderr(), contextlib.suppress(Exception):
            result = _AUTOGRAD._disable_profiler()
            return result.experimental_event_tree()  # type: ignore[no-any-return]
        return ()

    def restart(self, *, mode: str) -> Sequence[Any]:
        """End this chunk and begin the next (Python stacks only ever in the first)."""
        open_modules = [module for module, _ in self.ranges]
        events = self.stop()
        self.start(stacks=False, mode=mode)
        for module in open_modules:
            self._open_range(module)
        return events

    def enter(self, module_id: int) -> None:
        """A module call begins: open its range (about 1 us: a C++ record function)."""
        self.windows.open(module_id)
        self._open_range(module_id)

    def _open_range(self, module_id: int) -> None:
        name = self._names.get(module_id)
        if name is None:
            name = self._names[module_id] = f"{MODULE_RANGE}{module_id}"
        self.ranges.append((module_id, _enter_range(name)))

    def exit(self) -> None:
        self.windows.close()
        if self.ranges:
            _exit_range(self.ranges.pop()[1])

    def close_ranges(self) -> None:
        """Module calls still open (a chunk ends, or an interrupt left them)."""
        while self.ranges:
            with contextlib.suppress(Exception):
                _exit_range(self.ranges.pop()[1])


class LogLevel:
    """c10's minimum log level, raised to errors while recording (the CPU allocator logs a
    warning for frees of memory allocated before profiling started)."""

    def __init__(self, flag: ctypes.c_int | None) -> None:
        self._flag = flag
        self._saved = flag.value if flag is not None else 0

    @classmethod
    def quiet(cls) -> LogLevel:
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
