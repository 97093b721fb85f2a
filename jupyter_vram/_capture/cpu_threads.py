"""Other threads during a CPU recording: which ran user code, and the process's memory map.

The CPU allocator reports to the profiler only on the recording thread. What other threads do
is therefore not in the reports; this module gathers the evidence the rows use instead (see
``cpu_rows.build_rows``): which threads ran user code and from when, and snapshots of the
memory map (memory still allocated is always mapped, so a block unmapped in a later snapshot
was freed by then).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import re
import sys
import sysconfig
import threading
import time
from array import array
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any

import numpy as np
import torch

_MAP_EVERY_NS = 50_000_000
_MAX_MAPS = 2_000


class ThreadWatch:
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
        """Snapshot the memory map, at most every ``_MAP_EVERY_NS`` (or 100 times what the
        last one took: at most 1 % of the time) and ``_MAX_MAPS`` times a recording;
        ``last``: the first and the last one, always. Never raises."""
        began = time.monotonic_ns()
        if not last and (began < self.next_map or len(self.maps) >= _MAX_MAPS):
            return
        with contextlib.suppress(Exception):
            snapshot = MemoryMap.now()
            if snapshot is not None:
                self.maps.append(snapshot)
        self.next_map = began + max(_MAP_EVERY_NS, 100 * (time.monotonic_ns() - began))

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


@functools.lru_cache(maxsize=4096)
def _real_path(filename: str) -> str:
    """A code file's real path: each recording's start and stop look at every other thread's
    frames, the same few files each time (resolving them cost ~7 ms a cell in a kernel)."""
    return os.path.realpath(filename)


def _user_file(filename: str) -> bool:
    """Code of the user's (a notebook cell, a script, ``exec``'d text) or torch's, not the
    Python installation's libraries or jupyter_vram's own."""
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    path = _real_path(filename)
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
        if _real_path(filename).startswith(_OWN_DIR):
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

    def holds_each(self, ptrs: np.ndarray) -> np.ndarray:
        """:meth:`holds` of each address, as one boolean column."""
        lows = np.frombuffer(self.lows, np.uint64)
        highs = np.frombuffer(self.highs, np.uint64)
        at = ptrs.astype(np.uint64)
        i = np.searchsorted(lows, at, side="right") - 1
        return (i >= 0) & (at < highs[np.maximum(i, 0)]) if len(lows) else np.zeros(len(at), bool)
