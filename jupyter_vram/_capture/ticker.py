"""A helper thread beside a CPU recording: it samples the recording thread's Python stack and
tells that thread when the profiler's events are due to be read.

Sampling replaces the profiler's Python tracer, which records every Python call (a cell of
two million small calls ran 49x slower under it). A sample is the chain of frames from the
recorded block down to the line running now, read from another thread; torch releases the
GIL inside its ops, so a sample taken while an op runs names the exact line that called it.
:class:`StackSamples` places each allocation at such a sample where one exists (see there).

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
import signal
import sys
import threading
import time
from array import array
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import numpy as np

#: the signal whose handler reads chunks (its default action is to ignore it; not on Windows)
CHUNK_SIGNAL: int | None = getattr(signal, "SIGURG", None)
#: how often the thread samples and checks for a due chunk
INTERVAL_S = 0.002
#: samples kept; past it the interval doubles and every other sample is dropped
MAX_SAMPLES = 200_000

#: (frame id, code, line) from the outermost recorded frame inward
Chain = tuple[tuple[int, CodeType, int], ...]


class StackSamples:
    """Python stacks of the recording thread at known times (``time.time_ns``).

    Placing an allocation made at ``t`` by the op that ran from ``start`` to ``end``:

    * a sample taken while that op ran: its stack, exactly;
    * otherwise the samples just before and just after the op: where both show the same
      frames (the same calls, not only the same functions) the op ran inside those calls,
      so their common part is kept, and the innermost common frame's line only if both
      samples were on it (else line 0: somewhere in that function);
    * no sample on one side: no stack.
    """

    def __init__(self) -> None:
        self.times = array("q")
        self.chains = array("i")
        self._chains: list[Chain] = []
        self._index: dict[Chain, int] = {}
        self._lock = threading.Lock()  # the helper thread and the recording thread both add

    def __len__(self) -> int:
        return len(self.times)

    def add(self, t: int, chain: Chain) -> None:
        with self._lock:
            cid = self._index.get(chain)
            if cid is None:
                cid = self._index[chain] = len(self._chains)
                self._chains.append(chain)
            self.times.append(t)
            self.chains.append(cid)

    def thin(self) -> None:
        """Drop every other sample (the thread samples half as often from now on)."""
        with self._lock:
            self.times = self.times[::2]
            self.chains = self.chains[::2]

    def place(
        self, times: np.ndarray, starts: np.ndarray, ends: np.ndarray
    ) -> tuple[list[tuple[tuple[CodeType, int], ...]], np.ndarray]:
        """Each allocation's frames (see the class): the distinct stacks found, as (code,
        line) pairs outermost first, and for each allocation the index of its stack."""
        n = len(self.times)
        if not n or not len(times):
            return [()], np.zeros(len(times), np.int64)
        order = np.argsort(np.frombuffer(self.times, np.int64), kind="stable")
        at = np.frombuffer(self.times, np.int64)[order]  # two threads add: nearly in order
        chains = np.frombuffer(self.chains, np.int32).astype(np.int64)[order]
        starts = np.minimum(starts, times)
        ends = np.maximum(ends, times)
        first = np.searchsorted(at, starts, "left")  # the first sample at or after the start
        after = np.searchsorted(at, ends, "right")  # the first sample after the end
        inside = after > first  # some sample fell while the op ran
        both = ~inside & (first > 0) & (after < n)
        # a pair of chain ids per allocation: (exact chain, -1), (before, after) or (-1, -1)
        a = np.full(len(times), -1, np.int64)
        b = np.full(len(times), -1, np.int64)
        a[inside] = chains[first[inside]]
        a[both] = chains[first[both] - 1]
        b[both] = chains[after[both]]
        keys, which = np.unique(a * (len(self._chains) + 1) + (b + 1), return_inverse=True)
        found = []
        for key in keys.tolist():
            one, other = divmod(key, len(self._chains) + 1)
            found.append(self._frames(one, other - 1) if one >= 0 else ())
        return found, which.reshape(-1)

    def _frames(self, a: int, b: int) -> tuple[tuple[CodeType, int], ...]:
        one = self._chains[a]
        if b < 0 or a == b:
            return tuple((code, line) for _, code, line in one)
        other = self._chains[b]
        common: list[tuple[CodeType, int]] = []
        for (fid, code, line), (fid2, _, line2) in zip(one, other, strict=False):
            if fid != fid2:
                break
            common.append((code, line))
            if line != line2:
                common[-1] = (code, 0)
                break
        return tuple(common)


class Ticker:
    """The helper thread of one recording (see the module doc).

    ``boundary``: (file, function) of the frame that asked for recording; samples stop
    above it. ``on_due(frame)`` runs on the recording thread when ``due_ns`` (monotonic) has
    passed; it reads a chunk or, at a bad moment, sets a later ``due_ns``.
    """

    def __init__(
        self,
        boundary: tuple[str, str] | None,
        on_due: Callable[[Any], None],
        *,
        sample: bool,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.samples = StackSamples()
        self.due_ns = 0  # 0: nothing due
        self.signals = False  # chunks can be read between bytecodes (our handler is on)
        self._boundary = boundary
        self._on_due = on_due
        self._sample = sample
        self._interval = interval_s
        self._target = threading.get_ident()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: Any = None
        self._asked = False

    def start(self) -> None:
        self.signals = self._take_signal()
        if not (self.signals or self._sample):
            return
        self._thread = threading.Thread(target=self._run, name="jupyter_vram-ticker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then give the signal back (a request already made is dropped)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
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
        if self.due_ns and time.monotonic_ns() >= self.due_ns:
            self._on_due(frame)

    def _run(self) -> None:
        wait = self._stop.wait
        interval = self._interval
        while not wait(interval):
            if self._sample:
                self._take_sample()
                if len(self.samples) >= MAX_SAMPLES:
                    self.samples.thin()
                    interval *= 2
            due = self.due_ns
            if self.signals and due and not self._asked and time.monotonic_ns() >= due:
                self._asked = True
                with contextlib.suppress(Exception):
                    _thread.interrupt_main(CHUNK_SIGNAL)  # type: ignore[arg-type]

    def _take_sample(self) -> None:
        t = time.time_ns()
        frames = sys._current_frames()
        frame: FrameType | None = frames.get(self._target)
        frames.clear()
        del frames
        self.sample(frame, t)

    def sample(self, frame: FrameType | None, t: int) -> None:
        """Add the stack from ``frame`` up to the frame that asked for recording (none if it is
        not inside the recorded block:
        recording is starting or stopping). The recording thread calls this too, at module
        calls: a short cell gets stacks where the thread had no time to sample."""
        chain: list[tuple[int, CodeType, int]] = []
        boundary = self._boundary
        while frame is not None:
            code = frame.f_code
            chain.append((id(frame), code, frame.f_lineno or 0))
            if boundary is not None and (code.co_filename, code.co_name) == boundary:
                break  # the frame that asked for recording is the outermost one kept
            frame = frame.f_back
        else:
            if boundary is not None:
                return
        del frame
        chain.reverse()
        self.samples.add(t, tuple(chain))
