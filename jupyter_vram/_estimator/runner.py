"""The kernel's side of the estimator process: start it, ask for runs, survive its failures.

Whatever happens in the estimator — an exception, an abort inside fake-tensor code, a model
that never finishes — the kernel gets an :class:`EstimateError` with a clear message and the
process is gone; the user's model and data are only read (pickled as shapes), never changed.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from .._model import Profile
from .job import Job
from .step import StepSettings
from .transport import dumps

DEFAULT_TIMEOUT_S = 300.0
#: the least a new estimator process is given to start (import torch and what the model
#: needs), whatever ``timeout_s`` says: on a busy machine that alone took minutes, and
#: ``timeout_s`` is about the model, which the user chose
STARTUP_TIMEOUT_S = 900.0
JOB_FOLDER_PREFIX = "jupyter_vram_estimate_"  # the estimator process deletes only these


class EstimateError(RuntimeError):
    """The estimate could not be made; the message says why and what to change."""


def pack_job(job: Job) -> bytes:
    """The job as the estimator process reads it: the model's code and shapes, no data.

    Only these bytes are kept afterwards, so an estimate never keeps the user's model (or its
    GPU memory) alive.
    """
    try:
        return dumps(job)
    except Exception as error:  # noqa: BLE001 - anything unpicklable, said plainly
        raise EstimateError(
            f"could not send the model to the estimator ({type(error).__name__}: {error}); "
            "pass a function that builds the model instead (model=lambda: MyModel(...))"
        ) from None


class _Worker:
    """One estimator process and its pipes; it starts empty and is then given one model."""

    def __init__(self, also_preload: tuple[str, ...] = ()) -> None:
        """``also_preload``: libraries to import ahead besides those of :data:`PRELOADED` the
        kernel has imported."""
        self.dir = Path(tempfile.mkdtemp(prefix=JOB_FOLDER_PREFIX))
        self.stderr_path = self.dir / "stderr.txt"
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.key = ""  # the job it holds (a digest of its payload), "" while empty
        self.ready: dict[str, Any] = {}
        self.results: OrderedDict[str, Path] = OrderedDict()  # request -> its saved profile
        self.runs = 0
        stderr = self.stderr_path.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        preload = [name for name in PRELOADED if name in sys.modules or name in also_preload]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_vram._estimator.worker", "--spare",
             str(os.getpid()), str(self.dir), *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=os.getcwd(),
            env=env,
        )  # fmt: skip
        stderr.close()
        assert self.process.stdout is not None
        self.spoke = threading.Event()  # its first line came: its imports are done
        pump_args = (self.process.stdout, self.lines, self.spoke)
        threading.Thread(target=_pump, args=pump_args, daemon=True).start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()

    def close(self, *, wait: bool = True) -> None:
        """Stop the process (politely, then by force) and delete its files; ``wait=False``
        does it in the background (the process has nothing left to do)."""
        if not wait:
            threading.Thread(target=self.close, name="jupyter_vram-estimator-close").start()
            return
        self.ask_to_end()
        self.wait_for_end()

    def ask_to_end(self) -> None:
        """Tell the process to end (it deletes its folder as it goes), without waiting."""
        if self.process.poll() is None:
            try:
                if self.spoke.is_set():
                    self.send({"quit": True})
                else:  # still importing, not reading: SIGTERM ends it at once (no wait)
                    self.process.terminate()
            except OSError:
                _kill(self.process)

    def wait_for_end(self) -> None:
        """Wait for the process to end (by force after 5 s) and delete its files."""
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill(self.process)
        shutil.rmtree(self.dir, ignore_errors=True)


class WarmWorkers:
    """Estimator processes kept between estimates, so the next one does not wait for imports.

    Two at most: a *spare* that has imported torch and the estimator (started when an estimate
    ends, ready for the next model), and the process of the latest estimate, which keeps its
    model and the profiles it made (so follow-up runs — another optimizer, the largest-batch
    search, the same estimate again — start at once). Each watches the kernel and ends with it;
    a process that crashed or timed out is never reused.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: _Worker | None = None
        self._loaded: _Worker | None = None
        atexit.register(self.close)

    def take(self, key: str) -> _Worker:
        """The process holding job ``key`` if there is one, else an empty one."""
        with self._lock:
            loaded, self._loaded = self._loaded, None
            if loaded is not None and loaded.key == key and loaded.alive():
                return loaded
            if loaded is not None:
                loaded.close(wait=False)
            spare, self._spare = self._spare, None
            if spare is not None and spare.alive():
                return spare
            if spare is not None:
                spare.close(wait=False)
        return _Worker()

    def give_back(self, worker: _Worker) -> None:
        """Keep a healthy worker that holds a model; start a spare for the next model."""
        with self._lock:
            if self._loaded is not None:
                self._loaded.close(wait=False)
            self._loaded = worker
            if self._spare is None:
                self._spare = _Worker()

    def start_spare(self) -> None:
        """Start a spare now if there is none, importing transformers ahead when it is
        installed (at ``%load_ext``: the first estimate, of a config-built model too, then
        finds the imports done)."""
        with self._lock:
            if self._spare is None or not self._spare.alive():
                installed = tuple(name for name in EARLY_PRELOADED if _installed(name))
                self._spare = _Worker(installed)

    def close(self) -> None:
        """End every kept process (at exit, or to free their memory)."""
        with self._lock:
            kept = [w for w in (self._spare, self._loaded) if w is not None]
            self._spare = self._loaded = None
        for worker in kept:  # all at once: a kernel's exit may be cut short after a few s
            worker.ask_to_end()
        for worker in kept:
            worker.wait_for_end()

    def pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in (self._spare, self._loaded) if w is not None]


#: The kernel's warm estimator processes (one set per kernel; see WarmWorkers).
WARM = WarmWorkers()

#: Libraries a spare imports ahead when the kernel has them (a model's unpickling needs them).
PRELOADED = ("transformers", "torchvision", "timm", "diffusers", "peft")

#: Libraries an early spare (:meth:`WarmWorkers.start_spare`) imports ahead when installed,
#: before the kernel has imported them: a model sent as its transformers config needs it.
EARLY_PRELOADED = ("transformers",)

#: How long an estimate waits for a starting process before saying that it waits.
STARTUP_NOTICE_S = 1.0


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


#: Profiles a loaded worker keeps on disk (in its job folder), newest last; a largest-batch
#: search makes about ten.
KEPT_RESULTS = 16


def close_warm_workers() -> None:
    """End the estimator processes kept warm between estimates (they hold a few hundred MB)."""
    WARM.close()


class EstimatorProcess:
    """An estimator process holding one model; ``run`` may be called many times.

    The process comes from :data:`WARM` (warm, or holding this very model already) and goes
    back there when the caller is done with it, unless it failed.
    """

    def __init__(self, payload: bytes, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.model_name = ""
        self.parameters = 0
        self.input = ""
        self._payload = payload
        self._key = hashlib.sha256(payload).hexdigest()
        self._worker: _Worker | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> EstimatorProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        worker = self._worker = WARM.take(self._key)
        try:
            if worker.key != self._key:
                self._load(worker)
        except BaseException:
            self._close_failed()
            raise
        self.model_name = str(worker.ready.get("model", ""))
        self.parameters = int(worker.ready.get("parameters", 0))
        self.input = str(worker.ready.get("input", ""))

    def _load(self, worker: _Worker) -> None:
        # the spare's hello: its imports are done
        self._receive(
            "starting the estimator",
            max(self.timeout_s, STARTUP_TIMEOUT_S),
            notice="jupyter_vram: waiting for the estimator process to finish starting "
            "(importing torch) ...",
        )
        (worker.dir / "job.pkl").write_bytes(self._payload)
        sys_path = [p for p in sys.path if p]
        (worker.dir / "job.json").write_text(json.dumps({"sys_path": sys_path}))
        try:
            worker.send({"job": str(worker.dir / "job.pkl")})
        except OSError:
            raise self._died("before loading the model") from None
        worker.ready = self._receive("loading the model")
        worker.key = self._key

    def close(self) -> None:
        """Hand the process back to be kept warm (or end it, if it failed)."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        if worker.alive() and worker.key == self._key:
            WARM.give_back(worker)
        else:
            worker.close()

    def _close_failed(self, *, at_once: bool = False) -> None:
        """End a process that failed; ``at_once``: kill it (an interrupt: the worker ignores
        SIGINT, so it would run its step to the end)."""
        worker, self._worker = self._worker, None
        if worker is not None and at_once:
            _kill(worker.process)
        if worker is not None:
            worker.close()

    # -- runs --------------------------------------------------------------------------------

    def run(self, settings: StepSettings, batch_size: int | None = None) -> Profile:
        """Simulate one step with ``settings`` (and ``batch_size``, if given)."""
        worker = self._worker
        if worker is None or not worker.alive():
            raise EstimateError("the estimator process is not running")
        request_key = json.dumps([settings.to_dict(), batch_size], sort_keys=True)
        known = worker.results.get(request_key)
        if known is not None and known.exists():
            worker.results.move_to_end(request_key)
            return Profile.load(known)  # a new object: the caller may drop it
        worker.runs += 1
        out = worker.dir / f"run{worker.runs}.json"
        request = {"settings": settings.to_dict(), "batch_size": batch_size, "out": str(out)}
        try:
            worker.send(request)
        except OSError:
            raise self._died("before the run started") from None
        what = f"running the step at batch size {batch_size}" if batch_size else "running the step"
        self._receive(what)
        profile = Profile.load(out)
        worker.results[request_key] = out
        while len(worker.results) > KEPT_RESULTS:
            worker.results.popitem(last=False)[1].unlink(missing_ok=True)
        return profile

    def _receive(
        self, what: str, timeout_s: float | None = None, notice: str = ""
    ) -> dict[str, Any]:
        """The process's next message (``timeout_s``: how long to wait, ``self.timeout_s``
        by default; ``notice``: said once on stderr when it does not come at once)."""
        worker = self._worker
        assert worker is not None
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            line = _next_line(worker.lines, timeout_s, notice)
        except queue.Empty:
            self._close_failed()
            raise EstimateError(
                f"the estimate timed out after {timeout_s:g} s while {what}; "
                "the process was stopped (raise timeout_s for very large models)"
            ) from None
        except BaseException:  # KeyboardInterrupt: never leave the process behind
            self._close_failed(at_once=True)
            raise
        if not line:
            raise self._died(f"while {what}")
        message: dict[str, Any] = json.loads(line)
        if not message.get("ok"):
            if message.get("fatal"):
                self._close_failed()
            raise EstimateError(str(message.get("error", "the estimator failed")))
        return message

    def _died(self, when: str) -> EstimateError:
        worker, self._worker = self._worker, None
        code = None
        tail = ""
        if worker is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = worker.process.wait(timeout=10)
            tail = _tail(worker.stderr_path)
            worker.close()
        how = f"exit code {code}"
        if code is not None and code < 0:
            how = f"signal {signal.Signals(-code).name}"
        elif code == 134:
            how = "exit code 134 (abort)"
        return EstimateError(
            f"the estimator process crashed {when} ({how}); your kernel and data are fine."
            + (f"\nIts last output:\n{tail}" if tail else "")
        )


def _next_line(lines: queue.Queue[bytes], timeout_s: float, notice: str) -> bytes:
    """The next line within ``timeout_s``; ``notice`` goes to stderr once if it is not there
    within :data:`STARTUP_NOTICE_S` (a wait the user would otherwise see as silence)."""
    if notice and timeout_s > STARTUP_NOTICE_S:
        try:
            return lines.get(timeout=STARTUP_NOTICE_S)
        except queue.Empty:
            print(notice, file=sys.stderr, flush=True)
            timeout_s -= STARTUP_NOTICE_S
    return lines.get(timeout=timeout_s)


def _pump(stream: IO[bytes], lines: queue.Queue[bytes], spoke: threading.Event) -> None:
    """Move protocol lines to a queue so the kernel can wait with a timeout."""
    for line in iter(stream.readline, b""):
        lines.put(line)
        spoke.set()
    lines.put(b"")
    spoke.set()


def _kill(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])
