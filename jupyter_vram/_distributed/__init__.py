"""Past one GPU: record every rank of a torch.distributed run, one Profile per rank.

``launch`` starts N local processes from a notebook; ``run`` (``torchrun -m
jupyter_vram.run``) records the ranks of a script; ``files.load_ranks`` reads the
per-rank profiles back. Importing this package imports no torch: the parent of a launch only
pickles, waits and reads files.

Where each module here is tested: tests/INDEX.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["LaunchError", "RankResult", "launch", "load_ranks"]

if TYPE_CHECKING:
    from .files import load_ranks
    from .launcher import LaunchError, RankResult, launch
else:

    def __getattr__(name: str) -> Any:
        if name in ("launch", "LaunchError", "RankResult"):
            from . import launcher as module

            return getattr(module, name)
        if name == "load_ranks":
            from .files import load_ranks

            return load_ranks
        raise AttributeError(f"module 'jupyter_vram._distributed' has no attribute {name!r}")
