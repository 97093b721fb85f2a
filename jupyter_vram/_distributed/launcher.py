"""`jv.launch(fn, nproc=N)`: run ``fn`` on N local ranks under torch.distributed, recorded.

Each rank is a fresh Python process (``python -m jupyter_vram._distributed.worker``), started
in its own session so that it and everything it starts can be ended together. ``fn`` and its
arguments travel by cloudpickle, so functions and classes defined in a notebook go by value.
The ranks meet on 127.0.0.1 at a free port; each records ``fn(*args)`` with the same recorder
as ``%%vram`` and writes its profile to a private temporary folder, which this process reads
back and removes.

Errors: a rank that raises still writes the profile of its run up to the error. When any rank
fails or the launch times out, :class:`LaunchError` is raised carrying every rank's
:class:`RankResult` (profile or None, error, exit code, the end of its output). Waiting in a
collective for a rank that died ends by itself under gloo (the peer's socket closes); a hung
collective ends at the process group's timeout (three quarters of ``timeout``, so the rank
still writes its partial profile); at ``timeout`` every rank's process group is killed. No
process outlives the call.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .._capture import stack_mode
from .._model import ProfileFileError
from .._profile import Profile
from .files import rank_path

#: After the first rank fails, the others get this long to notice and write their profiles.
FAILURE_GRACE_S = 10.0
_POLL_S = 0.05
_LOG_TAIL = 4000


@dataclass(frozen=True)
class RankResult:
    """What one rank left: its profile (None if it wrote none), error text, exit code."""

    rank: int
    profile: Profile | None
    error: str | None
    exitcode: int | None  # None: killed by us at the timeout or after another rank failed
    output: str  # the end of the rank's stdout + stderr
    pid: int  # the rank's process (gone when launch returns)


class LaunchError(RuntimeError):
    """Some rank raised, crashed or timed out. ``results`` has every rank (rank order);
    ``profiles`` the profiles that were written (None for ranks that wrote none)."""

    def __init__(self, message: str, results: Sequence[RankResult]) -> None:
        super().__init__(message)
        self.results = list(results)

    @property
    def profiles(self) -> list[Profile | None]:
        return [r.profile for r in self.results]

    @property
    def errors(self) -> dict[int, str]:
        return {r.rank: r.error for r in self.results if r.error is not None}


#: The longest ``timeout`` taken (30 days): past it a hung rank is better ended by hand.
MAX_TIMEOUT_S = 30 * 24 * 3600.0


def max_local_ranks() -> int:
    """How many ranks this machine runs at once: one per CPU this process may use, or one
    per GPU where there are more GPUs (each rank is a whole Python process)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return max(cpus, gpus, 1)


def launch_problem(
    nproc: object, timeout: object, *, nproc_name: str = "nproc", timeout_name: str = "timeout"
) -> str | None:
    """What is wrong with a launch's rank count or timeout (None: nothing), in one line,
    before any process starts: a count past :func:`max_local_ranks` would start processes
    until the machine stalls."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        return f"{nproc_name} must be a whole number of ranks, at least 1, not {nproc!r:.40}"
    most = max_local_ranks()
    if nproc > most:
        digits = str(nproc)
        shown = digits if len(digits) <= 24 else f"{digits[:12]}... ({len(digits)} digits)"
        return (
            f"{nproc_name} {shown} is more ranks than this machine can run at once: at most "
            f"{most} (one per CPU, or per GPU)"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        return f"{timeout_name} must be a number of seconds, not {timeout!r:.40}"
    if not 0 < timeout <= MAX_TIMEOUT_S:  # NaN fails this too
        return (
            f"{timeout_name} must be more than 0 seconds and at most {MAX_TIMEOUT_S:,.0f} "
            f"(30 days), not {timeout!r:.40}"
        )
    return None


def default_backend(nproc: int) -> str:
    """NCCL when there is a GPU for every rank, gloo otherwise."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= nproc:
        return "nccl"
    return "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def launch(
    fn: Callable[..., Any],
    nproc: int = 2,
    backend: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    timeout: float = 300.0,
    device: str | None = None,
    stacks: bool | str = "sampled",
) -> list[Profile]:
    """Run ``fn(*args, **kwargs)`` on ``nproc`` local ranks, each recorded; one Profile per
    rank, in rank order (``profile.meta`` holds ``rank``, ``world_size``, ``backend``).

    ``backend``: None picks NCCL (one GPU per rank) when there are enough GPUs, else gloo.
    ``device``: what each rank records (default ``cuda:<local rank>`` under NCCL, else the
    recorder's default). ``timeout``: seconds for the whole launch, start-up included.
    ``stacks``: as :func:`jupyter_vram.record` takes it.
    Raises :class:`LaunchError` (with every rank's partial profile and error) when a rank
    raises, crashes or runs past the timeout.
    """
    import cloudpickle

    problem = launch_problem(nproc, timeout)
    if problem is not None:
        raise ValueError(f"jv.launch: {problem}")
    backend = backend or default_backend(nproc)
    try:
        payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    except Exception as exc:
        raise TypeError(f"jv.launch: cannot send the function to the ranks ({exc})") from exc
    folder = Path(tempfile.mkdtemp(prefix="jv-launch-"))
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[BinaryIO] = []
    try:
        (folder / "payload.pkl").write_bytes(payload)
        port = free_port()
        settings = [str(folder), backend, device or "", repr(timeout * 0.75), stack_mode(stacks)]
        for rank in range(nproc):
            log: BinaryIO = (folder / f"rank{rank}.log").open("wb")
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "jupyter_vram._distributed.worker", *settings],
                    env=_rank_env(rank, nproc, port),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: killed as a whole
                )
            )
        killed = _wait(procs, time.monotonic() + timeout)
        return _collect(folder, procs, killed, timeout, port)
    finally:
        _kill(procs)
        for log in logs:
            log.close()
        shutil.rmtree(folder, ignore_errors=True)


def _rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The environment torchrun would give a rank on one node, plus our import path (a
    notebook's working folder and added paths, for modules ``fn`` imports by name)."""
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        JUPYTER_VRAM_SYS_PATH=os.pathsep.join([os.getcwd(), *sys.path]),
    )
    return env


def _wait(procs: Sequence[subprocess.Popen[bytes]], deadline: float) -> set[int]:
    """Wait for every rank; kill all at the deadline, and the rest some seconds after the
    first one fails. Returns the ranks this killed."""
    failed_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return set()
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if now >= deadline or (failed_at is not None and now - failed_at > FAILURE_GRACE_S):
            alive = {r for r, c in enumerate(codes) if c is None}
            _kill(procs)
            return alive
        time.sleep(_POLL_S)


def _kill(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGKILL each rank's whole process group (the rank and anything it started), then reap."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(timeout=30)


def _collect(
    folder: Path,
    procs: Sequence[subprocess.Popen[bytes]],
    killed: set[int],
    timeout: float,
    port: int,
) -> list[Profile]:
    results: list[RankResult] = []
    for rank, proc in enumerate(procs):
        output = _tail(folder / f"rank{rank}.log")
        profile: Profile | None = None
        error: str | None = None
        path = rank_path(folder, rank)
        if path.exists():
            try:
                profile = Profile.load(path)
            except ProfileFileError as exc:
                error = f"its profile could not be read: {exc}"
        error_file = folder / f"rank{rank}.error"
        if error_file.exists():
            error = error_file.read_text(errors="replace").strip() or error
        if rank in killed:
            why = (
                f"ran past the {timeout:g} s timeout"
                if not _others_failed(procs, killed)
                else (f"was still running {FAILURE_GRACE_S:g} s after another rank failed")
            )
            error = f"killed: {why}" + (f" ({error})" if error else "")
        elif proc.returncode != 0 and error is None:
            error = f"exited with code {proc.returncode}: {output[-500:].strip()}"
        elif profile is None and error is None:
            error = "wrote no profile"
        if profile is not None:
            profile = profile.replace(meta={**profile.meta, "master_port": port, "pid": proc.pid})
        exitcode = None if rank in killed else proc.returncode
        results.append(RankResult(rank, profile, error, exitcode, output, proc.pid))
    failures = [r for r in results if r.error is not None]
    if failures:
        lines = "; ".join(f"rank {r.rank}: {r.error.splitlines()[-1]}" for r in failures if r.error)
        message = f"jv.launch: {len(failures)} of {len(procs)} ranks failed: {lines}"
        raise LaunchError(message, results)
    return [r.profile for r in results if r.profile is not None]


def _others_failed(procs: Sequence[subprocess.Popen[bytes]], killed: set[int]) -> bool:
    return any(r not in killed and p.returncode not in (None, 0) for r, p in enumerate(procs))


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-_LOG_TAIL:].decode(errors="replace")
