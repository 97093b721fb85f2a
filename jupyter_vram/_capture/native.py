"""The light CPU recorder's native part: ``native_reports.cpp``, built on first use.

torch.profiler costs 2-3x a small training step while it runs (it records every op as an
event and post-processes each one) before any of its events is read. The allocator's reports
it gets come from a hook any library can install: a thread's memory-reporting debug info.
``native_reports.cpp`` installs its own, plus a RecordFunction callback that keeps the op and
ranges open on each thread, and writes each report as a row of six integers: about 20 %
on the same step.

The library is compiled once per torch build with the system's C++ compiler (a few seconds,
no Python headers) into the user's cache directory, and loaded with ctypes. Where it cannot be
built (no compiler), or ``JUPYTER_VRAM_NATIVE=0``, the recorder reads torch.profiler as before
(``profiler_session``), and the profile says why.

Private torch APIs used here (in C++): c10's ThreadLocalDebugInfo memory reporter and ATen's
global RecordFunction callbacks.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .profiler_session import FULL, ProfilerSession

SOURCE = Path(__file__).with_name("native_reports.cpp")
#: columns of one report (time, ptr, size, op, backward seq, span), one point (time, kind,
#: value, end) and one span (start, end), as native_reports.cpp writes them
REPORT_COLUMNS, POINT_COLUMNS, SPAN_COLUMNS = 6, 4, 2
#: building takes a few seconds; a build that takes this long has hung
BUILD_TIMEOUT_S = 300

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_why_not = ""


def disabled() -> str:
    """Why the light recorder is not to be used here ("" if it may be)."""
    if os.environ.get("JUPYTER_VRAM_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return "JUPYTER_VRAM_NATIVE=0"
    return ""


def library() -> ctypes.CDLL | None:
    """The loaded library, built first if needed (None if it cannot be: see :func:`why_not`)."""
    global _library, _why_not
    if _library is not None or _why_not:
        return _library
    with _lock:
        if _library is None and not _why_not:
            try:
                _library = _load_or_rebuild(_built())
            except Exception as error:  # noqa: BLE001 - any failure means "use the profiler"
                _why_not = f"the light recorder could not be built ({error})"
    return _library


def recording() -> bool:
    """Whether the light recorder is on now (False where it was never loaded)."""
    return _library is not None and bool(_library.jv_recording())


def links(ptr: np.ndarray, size: np.ndarray) -> np.ndarray | None:
    """The library's pairing of reports (see ``jv_links`` in native_reports.cpp), or None
    when it is not loaded (never built here: this does not wait for a build)."""
    lib = _library
    if lib is None:
        return None
    ptr = np.ascontiguousarray(ptr, np.int64)
    size = np.ascontiguousarray(size, np.int64)
    link = np.empty(len(ptr), np.int64)
    lib.jv_links(len(ptr), ptr.ctypes.data, size.ctypes.data, link.ctypes.data)
    return link


def why_not() -> str:
    """Why :func:`library` gave None ("" before it was asked, or when it loaded)."""
    return _why_not


def build_in_background() -> None:
    """Build (or load) the library on a helper thread, so the first recording need not wait:
    ``%load_ext jupyter_vram`` calls this."""
    if disabled() or _library is not None or _why_not:
        return
    threading.Thread(target=library, name="jupyter_vram-build", daemon=True).start()


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "jupyter_vram"


def _flags() -> list[str]:
    from torch.utils import cpp_extension

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    includes = [f"-I{path}" for path in cpp_extension.include_paths()]
    return [
        "-O2", "-std=c++17", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *includes, str(SOURCE), f"-L{torch_lib}", "-lc10", "-ltorch_cpu",
        f"-Wl,-rpath,{torch_lib}",
    ]  # fmt: skip


def _built() -> Path:
    """The library for this source and torch build: from the cache, or compiled into it."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (c++ or g++) on PATH")
    flags = _flags()
    key = hashlib.sha256(
        "\0".join(
            [SOURCE.read_text(), torch.__version__, torch.__file__, compiler, *flags]
        ).encode()
    ).hexdigest()[:16]
    target = _cache_dir() / f"native_reports-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *flags, "-o", partial],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            raise RuntimeError(f"{os.path.basename(compiler)} failed: {last}")
        os.replace(partial, target)  # atomic: another kernel may build the same at once
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def _load_or_rebuild(path: Path) -> ctypes.CDLL:
    """Load the cached library; one that does not load (a truncated file, an interrupted copy)
    is built again once."""
    try:
        return _load(path)
    except OSError:
        path.unlink(missing_ok=True)
        return _load(_built())


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    i64p = ctypes.POINTER(ctypes.c_int64)
    lib.jv_start.restype = ctypes.c_int
    lib.jv_stop.restype = None
    lib.jv_reporting.restype = ctypes.c_int
    lib.jv_recording.restype = ctypes.c_int
    lib.jv_pause.restype = ctypes.c_int
    lib.jv_resume.restype = ctypes.c_int
    lib.jv_counts.argtypes = [i64p]
    lib.jv_counts.restype = None
    lib.jv_take.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3
    lib.jv_take.restype = None
    lib.jv_module_enter.argtypes = [ctypes.c_int64]
    lib.jv_module_enter.restype = None
    lib.jv_module_exit.argtypes = []
    lib.jv_module_exit.restype = None
    lib.jv_links.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 3
    lib.jv_links.restype = None
    lib.jv_mark.argtypes = [ctypes.c_int64, ctypes.c_int64, i64p]
    lib.jv_mark.restype = None
    lib.jv_steady.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    lib.jv_steady.restype = ctypes.c_int64
    lib.jv_diverged.restype = ctypes.c_int64
    lib.jv_raises.restype = ctypes.c_int
    lib.jv_name_count.restype = ctypes.c_int32
    lib.jv_name.argtypes = [ctypes.c_int32]
    lib.jv_name.restype = ctypes.c_char_p
    return lib


@dataclass
class NativeChunk:
    """What one chunk recorded: reports, points and spans as row-major int64 arrays, and the
    library's names (``names[i]`` for id ``i``, grown as the recording learns new ones)."""

    reports: np.ndarray
    points: np.ndarray
    spans: np.ndarray
    span_base: int
    names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.reports)


def _take(lib: ctypes.CDLL, names: list[str]) -> NativeChunk:
    counts = (ctypes.c_int64 * 4)()
    lib.jv_counts(counts)
    reports = np.empty((counts[0], REPORT_COLUMNS), np.int64)
    points = np.empty((counts[1], POINT_COLUMNS), np.int64)
    spans = np.empty((counts[2], SPAN_COLUMNS), np.int64)
    lib.jv_take(
        counts[0], counts[1], counts[2],
        reports.ctypes.data, points.ctypes.data, spans.ctypes.data,
    )  # fmt: skip
    for i in range(len(names), lib.jv_name_count()):
        names.append(lib.jv_name(i).decode("utf-8", "replace"))
    return NativeChunk(reports, points, spans, counts[3], names)


class NativeSession(ProfilerSession):
    """A :class:`ProfilerSession` whose chunks come from the light recorder, not torch's
    profiler: the same module ranges (record functions the library's callback sees), the same
    restart at a chunk's end (ranges open now are closed and opened again).

    A torch profiler the cell starts needs the thread's memory-reporting slot (it refuses to
    start while one is set): torch calls ``_run_on_profiler_start`` just before enabling a
    profiler and ``_run_on_profiler_stop`` just after disabling it, so while recording those
    two hand the slot over and take it back. Reports made meanwhile go to that profiler.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        super().__init__()
        self._lib = lib
        self._op_names: list[str] = []
        self._saved: tuple[Any, Any] | None = None
        self.shadowed = False  # a profiler started in the cell took the reports for a while

    def start(self, *, stacks: bool = False, mode: str = FULL) -> None:
        if self._lib.jv_start() != 0:
            from ._common import RecordingError

            raise RecordingError("the light recorder is already recording")
        self._hand_over()
        self.stacks, self.mode = False, FULL
        self.on = True
        self.started_ns = time.monotonic_ns()

    def _hand_over(self) -> None:
        profiler: Any = torch.autograd.profiler
        on_start, on_stop = profiler._run_on_profiler_start, profiler._run_on_profiler_stop
        lib = self._lib

        def starting() -> None:
            if lib.jv_pause():
                self.shadowed = True
            on_start()

        def stopped() -> None:
            on_stop()
            lib.jv_resume()

        self._saved = (on_start, on_stop)
        profiler._run_on_profiler_start, profiler._run_on_profiler_stop = starting, stopped

    def _take_back(self) -> None:
        if self._saved is not None:
            profiler: Any = torch.autograd.profiler
            profiler._run_on_profiler_start, profiler._run_on_profiler_stop = self._saved
            self._saved = None

    def taken_over(self) -> bool:
        return self.shadowed

    # Module calls go to the library directly: no record function, and no sequence-number
    # windows (the library notes the module of every forward op, in every chunk).

    def enter(self, module_id: int) -> None:
        self._open_range(module_id)

    def _open_range(self, module_id: int) -> None:
        self.ranges.append((module_id, None))
        self._lib.jv_module_enter(module_id)

    def exit(self) -> None:
        if self.ranges:
            self.ranges.pop()
            self._lib.jv_module_exit()

    def close_ranges(self) -> None:
        while self.ranges:
            self.ranges.pop()
            self._lib.jv_module_exit()

    # Steady steps (see native_reports.cpp and ``steady``): report indices count from the
    # recording's first report.

    def mark(self, module_id: int, shortest: int = 1) -> tuple[int, int]:
        """A top-level module call begins a step: its first report's index, and P when the
        steps that just ended repeat a pattern of P steps (P >= ``shortest``; 0: none)."""
        out = (ctypes.c_int64 * 2)()
        self._lib.jv_mark(module_id, shortest, out)
        return out[0], int(out[1])

    def steady(self, on: bool, signum: int = 0, period: int = 1) -> int:
        """Reports only from now on, checked against the pattern of the last ``period``
        steps (``on``; the first report that differs raises ``signum`` in Python), or detail
        again; the next report's index."""
        return int(self._lib.jv_steady(int(on), signum, period))

    def diverged(self) -> int:
        """The index of the first report that did not repeat the step (-1: none)."""
        return int(self._lib.jv_diverged())

    def raises(self) -> bool:
        """Whether the first report that does not repeat the step raises the signal itself
        (else only the ticker's requests find it)."""
        return bool(self._lib.jv_raises())

    def stop(self) -> Any:
        self.close_ranges()
        if not self.on:
            return ()
        self.on = False
        self._lib.jv_stop()
        self._take_back()
        return _take(self._lib, self._op_names)

    def restart(self, *, mode: str) -> Any:
        open_modules = [module for module, _ in self.ranges]
        self.close_ranges()
        chunk = _take(self._lib, self._op_names)
        self.started_ns = time.monotonic_ns()
        for module in open_modules:
            self._open_range(module)
        return chunk
