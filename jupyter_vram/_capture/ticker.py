"""A helper thread beside a CPU recording: it samples the recording thread's Python stack
every few milliseconds and tells that thread when the profiler's events are due to be read.

Sampling replaces the profiler's Python tracer, which records every Python call (a cell of
two million small calls ran 49x slower under it). A sample is the chain of frames from the
recorded block down to the line running now. torch releases the GIL inside its ops, so a
sample taken while an op runs names the exact line that called it; :class:`StackSamples`
places each allocation at such a sample where one exists. The thread reads the stack with
``faulthandler.dump_traceback`` (about 80 us), which reads the frames where they are and makes
no frame object: frame objects made from another thread's frames (``sys._current_frames``)
can outlive those frames on Python 3.11, and a later garbage collection crashed the process.
Module calls add samples of their own (``sys._getframe`` on the recording thread itself).

Reading the profiler's events must happen on the recording thread, at a moment when no op is
running. A cell that calls no module (``for i in range(10**6): t = torch.ones(1)``) gives our
hooks no such moment, so when a chunk is due the thread simulates a signal
(``_thread.interrupt_main``: no real signal is sent, nothing blocking is interrupted) whose
Python handler runs on the recording thread between two bytecodes and reads the chunk there.
The handler is ours only while recording, only on the main thread, and only when the signal
has no handler of the user's; otherwise chunks are read at module calls alone.
"""

from __future__ import annotations

import _thread
import contextlib
import faulthandler
import os
import re
import signal
import sys
import threading
import time
from array import array
from collections.abc import Callable
from types import FrameType
from typing import Any

import numpy as np

from .stacks import FrameFilter

#: the signal whose handler reads chunks (its default action is to ignore it; not on Windows)
CHUNK_SIGNAL: int | None = getattr(signal, "SIGURG", None)
#: how often the thread samples and checks for a due chunk (each sample holds the GIL ~0.1 ms
#: in a kernel's deep stack; every 2 ms cost a GPT-2 step 16 % in a kernel, every 5 ms ~5 %)
INTERVAL_S = 0.005
#: the share of the recording thread's time samples may take: a sample holds the GIL for as
#: long as faulthandler takes to print every thread (in a kernel ~0.1-0.2 ms: its threads'
#: stacks are deep), and the interval grows to keep the share
SAMPLE_SHARE = 0.02
#: samples kept; past it the interval doubles and every other sample is dropped
MAX_SAMPLES = 200_000

#: a frame of a sample: (file, line, function)
Site = tuple[str, int, str]
#: a sample: its frames from the outermost recorded one inward
Chain = tuple[Site, ...]
_FRAME_LINE = re.compile(rb'^  File "(.*)", line (\d+) in (.*)$')


class StackSamples:
    """Python stacks of the recording thread at known times (``time.time_ns``).

    Placing an allocation made at ``t`` by the op that ran from ``start`` to ``end``:

    * a sample taken while that op ran: its stack, exactly;
    * otherwise the samples just before and just after the op: where both show the same
      functions from the outermost inward the op ran inside them, so their common part is
      kept, and the innermost common frame's line only if both samples were on it (else line
      0: somewhere in that function);
    * no sample on one side: no stack.

    A sample taken as a top-level module call returns is a way out: its caller goes on past
    that line (to the loss, backward, the optimizer step, and round a loop to the same line
    again), so an allocation after it is placed at no line of the caller's function unless a
    sample fell while its op ran.
    """

    def __init__(self) -> None:
        self.times = array("q")
        self.chains = array("i")
        self.leaving = array("b")  # 1: taken as a top-level module call returned
        self._chains: list[Chain] = []
        self._index: dict[Chain, int] = {}
        #: the helper thread's samples, as faulthandler printed them (parsed by ``settle``)
        self.raw_times = array("q")
        self.raw: list[bytes] = []

    def __len__(self) -> int:
        return len(self.times) + len(self.raw_times)

    def add(self, t: int, chain: Chain) -> int:
        """Add a sample; its chain's id (for :meth:`again`)."""
        cid = self._index.get(chain)
        if cid is None:
            cid = self._index[chain] = len(self._chains)
            self._chains.append(chain)
        self.times.append(t)
        self.chains.append(cid)
        self.leaving.append(0)
        return cid

    def chain(self, cid: int) -> Chain:
        """The frames of chain ``cid`` (outermost first)."""
        return self._chains[cid]

    def again(self, t: int, cid: int, *, leaving: bool = False) -> None:
        """A sample at ``t`` of a stack already added (id ``cid``); ``leaving``: taken as a
        top-level module call returns (see the class)."""
        self.times.append(t)
        self.chains.append(cid)
        self.leaving.append(int(leaving))

    def add_raw(self, t: int, text: bytes) -> None:
        """A sample as printed (the helper thread adds these: bytes and ints only, which the
        garbage collector does not track, so this thread never sets off a collection)."""
        self.raw_times.append(t)
        self.raw.append(text)

    def thin(self) -> None:
        """Drop every other raw sample, in place (the thread samples half as often now)."""
        del self.raw_times[::2]
        del self.raw[::2]

    def settle(self, boundary: tuple[str, str] | None) -> None:
        """Parse the raw samples into stacks (on the recording thread, once it is done)."""
        parsed: dict[bytes, Chain | None] = {}
        for t, text in zip(self.raw_times, self.raw, strict=True):
            chain = parsed.get(text, ())
            if chain == ():
                chain = parsed[text] = recorded_part(_sites(text), boundary)
            if chain is not None:
                self.add(t, chain)
        self.raw_times, self.raw = array("q"), []

    def place(
        self,
        times: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        keep: Callable[[str], bool],
    ) -> tuple[list[Chain], np.ndarray, np.ndarray]:
        """Each allocation's frames (see the class): the distinct stacks found, outermost
        frame first, for each allocation the index of its stack, and whether its stack is
        exact (a sample fell while its op ran)."""
        n = len(self.times)
        if not n or not len(times):
            return [()], np.zeros(len(times), np.int64), np.zeros(len(times), bool)
        order = np.argsort(np.frombuffer(self.times, np.int64), kind="stable")
        at = np.frombuffer(self.times, np.int64)[order]  # two threads add: nearly in order
        chains = np.frombuffer(self.chains, np.int32).astype(np.int64)[order]
        leaving = np.frombuffer(self.leaving, np.int8).astype(np.int64)[order]
        starts = np.where(starts > 0, np.minimum(starts, times), times)  # 0: no op around it
        ends = np.maximum(ends, times)
        first = np.searchsorted(at, starts, "left")  # the first sample at or after the start
        after = np.searchsorted(at, ends, "right")  # the first sample after the end
        inside = after > first  # some sample fell while the op ran
        both = ~inside & (first > 0) & (after < n)
        # per allocation: (exact chain, -1), (before, after) or (-1, -1), and whether the
        # sample before is a way out of a module call
        a = np.full(len(times), -1, np.int64)
        b = np.full(len(times), -1, np.int64)
        out = np.zeros(len(times), np.int64)
        a[inside] = chains[first[inside]]
        a[both] = chains[first[both] - 1]
        b[both] = chains[after[both]]
        out[both] = leaving[first[both] - 1]
        width = len(self._chains) + 1
        keys, which = np.unique((a * width + (b + 1)) * 2 + out, return_inverse=True)
        found = []
        for key in keys.tolist():
            pair, left = divmod(key, 2)
            one, other = divmod(pair, width)
            found.append(self._frames(one, other - 1, keep if left else None) if one >= 0 else ())
        return found, which.reshape(-1), inside

    def _frames(self, a: int, b: int, keep: Callable[[str], bool] | None = None) -> Chain:
        """What samples ``a`` (before) and ``b`` (after; -1: ``a`` fell inside the op) agree
        on. ``keep``: ``a`` is a way out of a module call, so the frame that made the call
        (the innermost that ``keep`` keeps: torch's own frames lie below it) is not on the
        call's line any more."""
        one = self._chains[a]
        common: list[Site] = list(one)
        if b >= 0:
            common = []
            for site, (file, line, function) in zip(one, self._chains[b], strict=False):
                if (site[0], site[2]) != (file, function):
                    break
                common.append(site)
                if site[1] != line:
                    common[-1] = (file, 0, function)
                    break
        if keep is not None:
            caller = max((i for i, site in enumerate(one) if keep(site[0])), default=-1)
            if 0 <= caller < len(common) and common[caller] == one[caller]:
                common[caller + 1 :] = []
                common[caller] = (one[caller][0], 0, one[caller][2])
        return tuple(common)


def compiled_anything() -> bool:
    """torch.compile has compiled something in this process. The thread then samples no more:
    while compiled code runs (or dynamo compiles), a garbage collection our thread sets off
    can walk the recording thread's frames in a state only dynamo expects, and crash the
    process (seen on Python 3.11). Module calls still take samples of their own."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    try:  # .get: the helper thread makes no object the garbage collector tracks
        frames = counters.get("frames") if counters is not None else None
        return bool(frames is not None and frames.get("total", 0))
    except Exception:  # noqa: BLE001 - another torch: assume the worst
        return True


class Ticker:
    """The helper thread of one recording (see the module doc).

    ``boundary``: (file, function) of the frame that asked for recording; samples stop at
    it. ``on_due(frame)`` runs on the recording thread when ``due_ns`` (monotonic) has passed;
    it reads a chunk or, at a bad moment, sets a later ``due_ns``.
    """

    def __init__(
        self,
        boundary: tuple[str, str] | None,
        on_due: Callable[[Any], None],
        *,
        sample: bool,
        from_thread: bool = True,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.samples = StackSamples()
        self.due_ns = 0  # 0: nothing due
        self.signals = False  # chunks can be read between bytecodes (our handler is on)
        self.sampling = sample
        #: a loop's steps repeat (see ``steady``): no samples (a repeated step takes the
        #: stacks of the step it repeats), and a signal that comes before ``due_ns`` is the
        #: light recorder's own (a step stopped repeating), handled at once
        self.steady = False
        self._boundary = boundary
        self._on_due = on_due
        self._interval = interval_s
        self._target = threading.get_ident()
        self._running = True
        self._thread: threading.Thread | None = None
        self._previous: Any = None
        self._asked = False
        self._pipe: tuple[int, int] | None = None
        self._from_thread = from_thread
        #: held while the thread runs: it waits on it between ticks, and stopping releases it
        self._wake = _thread.allocate_lock()
        self._seen: dict[tuple[int, ...], int] = {}  # a stack's frames -> its chain id
        self._keep = FrameFilter().keep
        self._codes: list[Any] = []

    def start(self) -> None:
        self.signals = self._take_signal()
        if self.sampling and self._from_thread:
            self._pipe = _sample_pipe()
        if not (self.signals or self._pipe):
            return
        self._wake.acquire()
        self._thread = threading.Thread(target=self._run, name="jupyter_vram-ticker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then give the signal back (a request already made is dropped)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._running = False
            self._wake.release()  # ends its wait now, not when its interval is up
            thread.join()
        pipe, self._pipe = self._pipe, None
        for fd in pipe or ():
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.signals:
            self.signals = False
            with contextlib.suppress(ValueError, OSError):
                signal.signal(CHUNK_SIGNAL, self._previous)  # type: ignore[arg-type]

    def _take_signal(self) -> bool:
        if CHUNK_SIGNAL is None or threading.current_thread() is not threading.main_thread():
            return False
        try:
            previous = signal.getsignal(CHUNK_SIGNAL)
            if previous not in (signal.SIG_DFL, signal.SIG_IGN, None):
                return False  # the user's own handler: leave it alone
            self._previous = signal.signal(CHUNK_SIGNAL, self._handle)
        except (ValueError, OSError):
            return False
        return True

    def _handle(self, signum: int, frame: Any) -> None:
        self._asked = False
        if self.due_ns and (self.steady or time.monotonic_ns() >= self.due_ns):
            self._on_due(frame)

    def _run(self) -> None:
        """Every tick: a sample, and a request when a chunk is due. Nothing here makes an
        object the garbage collector tracks (no ``Event.wait``, no exception caught), so no
        collection ever starts on this thread: one would walk the recording thread's frames
        while it is inside an op with the GIL released, which crashed the process."""
        base = interval = self._interval
        header = f"Thread 0x{self._target:016x} ".encode()
        samples = self._pipe is not None
        while self._running:
            if self._wake.acquire(timeout=interval):  # released: recording stops
                break
            if samples and compiled_anything():
                samples = False
            if samples and not self.steady:
                began = time.perf_counter()
                self._take_sample(header)
                # the recording thread waits while a sample is taken: at most SAMPLE_SHARE
                interval = max(base, (time.perf_counter() - began) / SAMPLE_SHARE)
                if len(self.samples) >= MAX_SAMPLES:
                    self.samples.thin()
                    base *= 2
            due = self.due_ns
            if self.signals and due and not self._asked and time.monotonic_ns() >= due:
                self._asked = True
                with contextlib.suppress(Exception):
                    _thread.interrupt_main(CHUNK_SIGNAL)  # type: ignore[arg-type]

    def _take_sample(self, header: bytes) -> None:
        """The recording thread's stack as faulthandler prints it, kept as printed: only
        bytes and ints here (see ``StackSamples.add_raw``)."""
        assert self._pipe is not None
        t = time.time_ns()
        read, write = self._pipe
        try:
            faulthandler.dump_traceback(write, all_threads=True)
            text = os.read(read, _PIPE_BYTES)  # all of it: written before the call returned
        except (OSError, ValueError):
            return
        start = text.find(header)
        if start >= 0:
            end = text.find(b"\n\n", start)
            self.samples.add_raw(t, text[start : end if end >= 0 else len(text)])

    def sample(self, frame: FrameType | None) -> int:
        """Add the stack from ``frame`` (on the recording thread itself: module calls take one
        too, so a short cell gets stacks where the thread had no time to sample); its chain's
        id, -1 for none."""
        t = time.time_ns()
        key: list[int] = []  # (code id, line) of each frame: a stack seen before is looked up
        codes = []
        file, function = self._boundary or ("", "")
        while frame is not None:  # inward-out, up to the frame that asked for recording
            code = frame.f_code
            codes.append(code)
            key.append(id(code))
            key.append(frame.f_lineno or 0)
            if code.co_name == function and code.co_filename == file:
                break  # the kernel's own frames above it are not walked
            frame = frame.f_back
        seen = tuple(key)
        cid = self._seen.get(seen)
        if cid is None:
            lines = key[1::2]
            sites = [(c.co_filename, n, c.co_name) for c, n in zip(codes, lines, strict=True)]
            chain = recorded_part(sites, self._boundary)
            cid = self._seen[seen] = self.samples.add(t, chain) if chain is not None else -1
            self._codes.extend(codes)  # held, so no other code object takes one of their ids
        elif cid >= 0:
            self.samples.again(t, cid)
        return cid

    def sample_end(self, frame: FrameType | None) -> None:
        """The recorded block's end. Where its code still runs (``jv.record``'s with
        statement), a sample from ``frame``. Where it has returned (a ``%%vram`` cell's code,
        before its recording stops), the last sample down to the block's first frame of
        user code, on no line: what the block made after that sample is placed in it."""
        file, function = self._boundary or ("", "")
        here = frame
        while here is not None:
            code = here.f_code
            if self._keep(code.co_filename):
                self.sample(frame)  # the block's own code is on the stack
                return
            if code.co_name == function and code.co_filename == file:
                break
            here = here.f_back
        samples = self.samples
        last = samples.chain(samples.chains[-1]) if samples.chains else ()
        for i, (site_file, _, site_function) in enumerate(last):
            if self._keep(site_file):
                samples.add(time.time_ns(), (*last[:i], (site_file, 0, site_function)))
                return

    def settle(self) -> None:
        """Parse the thread's samples (after ``stop``, on the recording thread)."""
        self.samples.settle(self._boundary)


def recorded_part(sites: list[Site], boundary: tuple[str, str] | None) -> Chain | None:
    """The frames (innermost first) from the one that asked for recording inward, outermost
    first (None if it is not among them: recording is starting or stopping)."""
    if boundary is not None:
        for i, (file, _, function) in enumerate(sites):
            if (file, function) == boundary:
                del sites[i + 1 :]
                break
        else:
            return None
    sites.reverse()
    return tuple(sites)


def _sites(text: bytes) -> list[Site]:
    """A thread's frames from faulthandler's print of them (innermost first)."""
    sites = []
    for line in text.splitlines()[1:]:
        match = _FRAME_LINE.match(line)
        if match is not None:
            file, number, function = match.groups()
            sites.append((file.decode(errors="replace"), int(number), function.decode()))
    return sites


#: what one print of every thread's stack may take (a larger one is cut, not blocked on)
_PIPE_BYTES = 1 << 20


def _sample_pipe() -> tuple[int, int] | None:
    """A pipe for faulthandler's prints: non-blocking both ways (a print that does not fit is
    cut short rather than blocking the thread that reads it), as large as Linux allows."""
    try:
        read, write = os.pipe()
    except OSError:
        return None
    for fd in (read, write):
        os.set_blocking(fd, False)
    with contextlib.suppress(Exception):
        import fcntl

        fcntl.fcntl(write, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
    return read, write
