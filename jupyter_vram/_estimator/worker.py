"""The estimator process: runs training steps on fake tensors and writes their profiles.

Started by :mod:`jupyter_vram._estimator.runner` as ``python -m jupyter_vram._estimator.worker
JOB``. Fake-tensor runs can abort a process, so they never run in the kernel. The
protocol is one JSON line per message on the process's original stdout (the model's own prints
are sent to stderr): a ``ready`` line once the job is loaded, then one reply per request read
from stdin (``{"settings": {...}, "batch_size": N, "out": PATH}``; ``{"quit": true}`` ends).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from .runner import JOB_FOLDER_PREFIX
from .simulator import Simulator, describe_error
from .step import StepSettings
from .transport import loads


def _send(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


#: How often the estimator process checks that the kernel that started it is alive.
PARENT_POLL_S = 0.25


def watch_parent(parent: int, folder: Path) -> threading.Thread:
    """End this process (and delete its job folder) as soon as ``parent`` is gone.

    A kernel that is killed cannot stop its estimator process, which would otherwise run its
    step to the end (minutes for a big model) and leave its folder behind. When the parent
    dies this process is re-parented, so ``os.getppid()`` changes; a thread polls it. (Linux's
    ``PR_SET_PDEATHSIG`` is not used: it fires when the *thread* that started the process
    ends, and an estimate may be started from a short-lived thread.)
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        with _REMOVING:  # a removal the main thread started ends before this process does
            if folder.name.startswith(JOB_FOLDER_PREFIX):
                shutil.rmtree(folder, ignore_errors=True)
            os._exit(3)

    thread = threading.Thread(target=watch, name="jupyter_vram-parent-watch", daemon=True)
    thread.start()
    return thread


#: What a preloaded library's models always import (transformers' own import is lazy).
PRELOADED_WITH = {"transformers": ("transformers.modeling_utils",)}


def wait_for_job(channel: IO[str], *, parent: int, folder: Path, argv: list[str]) -> Path | None:
    """A spare: do the imports an estimate needs now, say so, then wait for a job.

    ``argv[4:]`` names libraries the kernel has imported (a model's unpickling imports them).
    Returns the job's path, or None when told to quit first.
    """
    watch_parent(parent, folder)
    import importlib

    from .._capture import fake, stacks  # noqa: F401 - imported ahead, for the first run

    for name in argv[4:]:
        for module in (name, *PRELOADED_WITH.get(name, ())):
            with contextlib.suppress(Exception):
                importlib.import_module(module)
    _send(channel, {"ok": True, "spare": True})
    line = sys.stdin.readline()
    if not line.strip():  # the kernel is gone
        remove_job_folder(folder)
        return None
    request: dict[str, Any] = json.loads(line)
    if request.get("quit"):
        remove_job_folder(folder)
        return None
    return Path(str(request["job"]))


def remove_on_terminate(folder: Path) -> None:
    """On SIGTERM, delete the job folder and end: ipykernel sends it to a kernel's children
    when the kernel shuts down, before the kernel's own clean-up could end them. SIGINT is
    ignored."""

    def terminate(signum: int, frame: object) -> None:
        # a removal under way ends first
        if _REMOVING.acquire(timeout=5) and folder.name.startswith(JOB_FOLDER_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    # ipykernel forwards a notebook's interrupt (and its shutdown) to its process group as
    # SIGINT: a kept process is not the cell being interrupted, and the kernel ends the one
    # it was waiting for itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: list[str]) -> int:
    remove_on_terminate(_folder_of(argv))
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything the model prints goes to stderr, never into the protocol
    if argv[1] == "--spare":
        job_path = wait_for_job(channel, parent=int(argv[2]), folder=Path(argv[3]), argv=argv)
        if job_path is None:
            return 0
    else:
        job_path = Path(argv[1])
        if len(argv) > 2:
            watch_parent(int(argv[2]), job_path.parent)
    # What exists now (torch, the libraries, their constants) is never the model's: frozen,
    # the garbage collector stops walking it, and so does each recording's scan of live
    # objects (about 4 % of a 7B run) and each automatic full collection.
    gc.freeze()
    header = json.loads(job_path.with_suffix(".json").read_text())
    sys.path[:0] = [p for p in header.get("sys_path", []) if p not in sys.path]
    try:
        job = loads(job_path.read_bytes())
        simulator = Simulator(job)
    except BaseException as error:  # noqa: BLE001 - reported to the kernel, which raises
        message = "could not load the model: " + describe_error(error)
        _send(channel, {"ok": False, "fatal": True, "error": message})
        return 1
    _send(
        channel,
        {
            "ok": True,
            "ready": True,
            "model": type(simulator.model).__name__,
            "parameters": simulator.parameter_count,
            "input": simulator.batch.describe(),
        },
    )
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("quit"):  # its folder goes too: the kernel may be ending
            remove_job_folder(job_path.parent)
            break
        try:
            settings = StepSettings(**request["settings"])
            profile = simulator.run(settings, request.get("batch_size"))
            profile.save(request["out"])
            _send(channel, {"ok": True, "peak": profile.peak_bytes})
        except Exception as error:  # noqa: BLE001 - reported to the kernel, which raises
            _send(channel, {"ok": False, "error": describe_error(error)})
    else:  # the input ended without "quit": the kernel is gone
        remove_job_folder(job_path.parent)
    return 0


# Both the parent watch and the main thread remove the folder when the kernel dies; one
# removal at a time, so that the watch's os._exit never cuts the other one short half-way.
_REMOVING = threading.Lock()


def remove_job_folder(folder: Path) -> None:
    if folder.name.startswith(JOB_FOLDER_PREFIX):
        with _REMOVING:
            shutil.rmtree(folder, ignore_errors=True)


def _folder_of(argv: list[str]) -> Path:
    """The job folder this process owns (a spare is given it; a loaded worker's job is in it)."""
    return Path(argv[3]) if argv[1] == "--spare" else Path(argv[1]).parent


if __name__ == "__main__":
    try:
        code = main(sys.argv)
    except BrokenPipeError:  # the kernel went away as we answered it: nobody will read on
        remove_job_folder(_folder_of(sys.argv))
        code = 3
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the interpreter's shutdown: seconds of module teardown for nothing to clean up
    os._exit(code)
