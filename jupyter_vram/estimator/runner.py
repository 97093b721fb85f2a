"""The kernel's side of the estimator process: start it, ask for runs, survive its failures.

Whatever happens in the estimator — an exception, an abort inside fake-tensor code, a model
that never finishes — the kernel gets an :class:`EstimateError` with a clear message and the
process is gone; the user's model and data are only read (pickled as shapes), never changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ..model import Profile
from .job import Job
from .step import StepSettings
from .transport import dumps

DEFAULT_TIMEOUT_S = 300.0
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


class EstimatorProcess:
    """One estimator process holding one model; ``run`` may be called many times."""

    def __init__(self, payload: bytes, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.model_name = ""
        self.parameters = 0
        self.input = ""
        self._dir = Path(tempfile.mkdtemp(prefix=JOB_FOLDER_PREFIX))
        self._runs = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._stderr_path = self._dir / "stderr.txt"
        (self._dir / "job.pkl").write_bytes(payload)
        (self._dir / "job.json").write_text(json.dumps({"sys_path": [p for p in sys.path if p]}))

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
        stderr = self._stderr_path.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter_vram.estimator.worker",
                str(self._dir / "job.pkl"),
                str(os.getpid()),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=os.getcwd(),
            env=env,
        )
        stderr.close()
        assert self._process.stdout is not None
        threading.Thread(
            target=_pump, args=(self._process.stdout, self._lines), daemon=True
        ).start()
        try:
            ready = self._receive("loading the model")
        except BaseException:
            self.close()
            raise
        self.model_name = str(ready.get("model", ""))
        self.parameters = int(ready.get("parameters", 0))
        self.input = str(ready.get("input", ""))

    def close(self) -> None:
        """Stop the process (politely, then by force) and delete its files."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            try:
                assert process.stdin is not None
                process.stdin.write(b'{"quit": true}\n')
                process.stdin.flush()
                process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                _kill(process)
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- runs --------------------------------------------------------------------------------

    def run(self, settings: StepSettings, batch_size: int | None = None) -> Profile:
        """Simulate one step with ``settings`` (and ``batch_size``, if given)."""
        process = self._process
        if process is None or process.stdin is None:
            raise EstimateError("the estimator process is not running")
        self._runs += 1
        out = self._dir / f"run{self._runs}.json"
        request = {"settings": settings.to_dict(), "batch_size": batch_size, "out": str(out)}
        try:
            process.stdin.write((json.dumps(request) + "\n").encode())
            process.stdin.flush()
        except OSError:
            raise self._died("before the run started") from None
        what = f"running the step at batch size {batch_size}" if batch_size else "running the step"
        self._receive(what)
        profile = Profile.load(out)
        out.unlink(missing_ok=True)
        return profile

    def _receive(self, what: str) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=self.timeout_s)
        except queue.Empty:
            self.close()
            raise EstimateError(
                f"the estimate timed out after {self.timeout_s:g} s while {what}; "
                "the process was stopped (raise timeout_s for very large models)"
            ) from None
        except BaseException:  # KeyboardInterrupt: never leave the process behind
            self.close()
            raise
        if not line:
            raise self._died(f"while {what}")
        message: dict[str, Any] = json.loads(line)
        if not message.get("ok"):
            raise EstimateError(str(message.get("error", "the estimator failed")))
        return message

    def _died(self, when: str) -> EstimateError:
        process = self._process
        code = process.wait(timeout=10) if process is not None else None
        tail = _tail(self._stderr_path)
        self.close()
        how = f"exit code {code}"
        if code is not None and code < 0:
            how = f"signal {signal.Signals(-code).name}"
        elif code == 134:
            how = "exit code 134 (abort)"
        return EstimateError(
            f"the estimator process crashed {when} ({how}); your kernel and data are fine."
            + (f"\nIts last output:\n{tail}" if tail else "")
        )


def _pump(stream: IO[bytes], lines: queue.Queue[bytes]) -> None:
    """Move protocol lines to a queue so the kernel can wait with a timeout."""
    for line in iter(stream.readline, b""):
        lines.put(line)
    lines.put(b"")


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
