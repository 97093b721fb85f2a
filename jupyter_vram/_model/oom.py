"""The facts of an OOM post-mortem (``Profile.oom``): the failed request, what was live, the
suggestions ranked by the bytes they save. Plain data, beside the Profile that carries them;
``jupyter_vram/_analysis/oom.py`` computes them from the profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

#: Where the facts captured with the error sit in ``Profile.meta``.
META_KEY = "oom_report"


@dataclass(frozen=True)
class Suggestion:
    """One change, the bytes it would free at the moment of failure, and why.

    ``toggle``: the rerun toggle that applies it ("checkpointing", "AMP", "offload"), if any.
    ``enough``: it alone frees at least the shortfall.
    """

    action: str
    bytes_saved: int
    reason: str
    toggle: str | None = None
    enough: bool = False


@dataclass(frozen=True)
class OomReport:
    """A failed allocation and the memory around it (see the module docstring)."""

    requested_bytes: int | None  # the request, rounded to 512 B (CUDA: the trace's oom entry)
    capacity_bytes: int | None
    live_bytes: int  # live when the request failed (the profile's own count)
    shortfall_bytes: int | None  # bytes missing for the request to succeed
    op: str | None
    module: str | None
    phase: str | None
    site: str | None
    source: str  # "capacity" (a --capacity run), "cuda" (the allocator), "error message"
    message: str
    live_by_category: dict[str, int]
    top_modules: list[tuple[str, int]]
    allocator: dict[str, int] | None
    expandable_would_serve: bool | None
    batch_size: int | None
    optimizers: list[str]  # class names of the optimizers the notebook held
    moment_index: int = field(repr=False)
    suggestions: list[Suggestion] = field(default_factory=list)
    # CUDA: the segment the allocator tried to get for it ("Tried to allocate"): 2 MiB for a
    # request up to 1 MiB, 20 MiB below 10 MiB, else the request rounded up to 2 MiB
    segment_bytes: int | None = None

    def suggestions_frame(self) -> pd.DataFrame:
        """The suggestions as a table, most bytes saved first."""
        import pandas as pd

        return pd.DataFrame(
            [(s.action, s.bytes_saved, s.enough, s.toggle, s.reason) for s in self.suggestions],
            columns=["action", "bytes_saved", "enough", "toggle", "reason"],
        )
