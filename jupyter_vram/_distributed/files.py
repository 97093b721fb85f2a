"""Per-rank profile files: one ``rank{r}.json.gz`` per rank in a folder (no torch here)."""

from __future__ import annotations

import re
from pathlib import Path

from .._model import Profile, ProfileFileError

_NAME = re.compile(r"^rank(\d+)\.json(\.gz)?$")


def rank_path(folder: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes its profile."""
    return Path(folder) / f"rank{rank}.json.gz"


def load_ranks(folder: str | Path) -> list[Profile]:
    """The per-rank profiles a distributed recording wrote into ``folder``, in rank order.

    Raises :class:`ProfileFileError` when the folder holds none, or when ranks are missing
    (a world of 4 with rank 2's file absent): a silent gap would shift every rank after it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ProfileFileError(f"{folder}: no such folder")
    found: dict[int, Path] = {}
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match:
            rank = int(match.group(1))
            if rank in found:
                raise ProfileFileError(f"{folder}: two files for rank {rank}")
            found[rank] = path
    if not found:
        raise ProfileFileError(f"{folder}: no rank<N>.json.gz profiles")
    profiles = [Profile.load(found[r]) for r in sorted(found)]
    worlds = [p.meta.get("world_size") for p in profiles]
    expected = max([w for w in worlds if isinstance(w, int)], default=len(found))
    missing = sorted(set(range(expected)) - set(found))
    if missing:
        raise ProfileFileError(
            f"{folder}: world of {expected} ranks, but no profile for rank(s) {missing}"
        )
    return profiles
