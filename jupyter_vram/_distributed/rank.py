"""Record one rank of a distributed run and write its profile (used by the launch worker and
by the torchrun runner)."""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._model import Profile


def rank_meta() -> dict[str, Any]:
    """Rank, world and node as torchrun (or our launcher) put them in the environment."""
    env = os.environ

    def number(name: str, default: int) -> int:
        try:
            return int(env.get(name, default))
        except ValueError:
            return default

    return {
        "rank": number("RANK", 0),
        "world_size": number("WORLD_SIZE", 1),
        "local_rank": number("LOCAL_RANK", 0),
        "local_world_size": number("LOCAL_WORLD_SIZE", 1),
        "node_rank": number("GROUP_RANK", 0),
        "host": socket.gethostname(),
    }


def record_rank(
    call: Callable[[], Any],
    out: Path,
    *,
    device: str | None,
    stacks: bool | str,
    namespace: Mapping[str, Any],
    meta: Mapping[str, Any],
) -> BaseException | None:
    """Run ``call`` under the recorder, write the profile (also after an error) to ``out``
    atomically, and return the error it raised (None if it returned)."""
    from .._recording import record

    error: BaseException | None = None
    rec = record(device, stacks=stacks, namespace=namespace)
    try:
        with rec:
            call()
    except BaseException as exc:  # noqa: BLE001 - the rank's error travels in its profile
        error = exc
    try:
        profile: Profile = rec.profile
    except RuntimeError:  # recording never started: nothing to write
        return error
    backend = _backend()
    extra: dict[str, Any] = {**meta, **({"backend": backend} if backend else {})}
    profile = profile.replace(meta={**profile.meta, **extra})
    tmp = out.with_name(out.name + ".part")
    profile.save(tmp)
    tmp.replace(out)
    return error


def format_error(error: BaseException) -> str:
    """The traceback of a rank's error, its last line the exception itself."""
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))


def _backend() -> str | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return str(dist.get_backend())
    return None
