"""``jv.Profile``: the profile a user holds, the data plus the conveniences that need the layers
above it.

The data model (:class:`jupyter_vram._model.Profile`) sits at the bottom of the package:
recorders, snapshot readers and the estimator build it, and it computes only what its columns
give (``timeline``, ``peak_bytes``, ``peak_breakdown()``, ``variant``, ``save`` / ``load``).
This subclass, above analysis, render, leaks and the snapshot and per-rank files, adds what
needs them, each a one-line delegate to the function that does the work (imported when called,
so ``import jupyter_vram`` loads no pandas, torch or bokeh). Every place that hands a profile to
the user gives this class: :meth:`Profile.of` rebinds a data profile's class, in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from ._model import Profile as ProfileData

if TYPE_CHECKING:
    import pandas as pd

    from ._model.oom import OomReport


class Profile(ProfileData):
    """A recorded (or simulated) run: allocations plus the tables their ids point into, with
    the tables, reports and files made from them.

    Treat it as immutable; analysis results are computed on first use and cached.
    """

    @classmethod
    def of(cls, profile: ProfileData) -> Profile:
        """``profile`` itself, now of this class (its class is rebound in place: nothing is
        copied or checked again, and what is keyed by the object, such as the addresses a
        recorder noted, its leak state or its cell, still finds it)."""
        if not isinstance(profile, cls):
            profile.__class__ = cls
        return cast(Profile, profile)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per allocation: op, module, phase, category, bytes, device, times, stack."""
        from ._analysis.tables import allocations_frame

        return allocations_frame(self)

    def top_sites(
        self, limit: int = 20, *, by: Literal["peak", "allocated"] = "peak"
    ) -> pd.DataFrame:
        """Allocation sites (Python line + op) ranked by bytes live at the peak or allocated."""
        from ._analysis.tables import top_sites

        return top_sites(self, limit, by=by)

    @property
    def oom(self) -> OomReport | None:
        """None, or the post-mortem of the ``torch.OutOfMemoryError`` that ended the run: the
        request, what was live by category and module, the allocator's state (CUDA) and
        suggestions ranked by the bytes they save. Saved with the profile (``meta``)."""
        from ._analysis.oom import oom_report

        return oom_report(self)

    def leaks(self) -> pd.DataFrame:
        """Memory this run made that is still alive, with what holds it (variables, ``Out[n]``,
        the last traceback, closures, cycles); release with ``jv.release_leaks(profile)``."""
        from ._leaks import find_leaks

        return find_leaks(self)

    def to_html(self, path: str | Path, *, resources: Literal["inline", "cdn"] = "inline") -> Path:
        """Write a standalone interactive report (flame graphs, breakdown, timeline, sites).

        With the default inline resources the file works offline.
        """
        from ._render.html import write_report

        return write_report(self, path, resources=resources)

    def compare(
        self, other: ProfileData, by: Literal["category", "module", "op"] = "category"
    ) -> pd.DataFrame:
        """This profile (the baseline) against ``other`` (a variant): bytes held at most per
        category and the peak (``by="category"``), or the modules / ops that moved most;
        columns baseline_bytes, variant_bytes, change_bytes, change_pct."""
        from ._analysis.compare import compare

        return compare(self, other, by)

    @classmethod
    def from_snapshot(
        cls, source: str | Path | Mapping[str, Any], *, device: int | str | None = None
    ) -> Profile:
        """A PyTorch allocator snapshot (a ``torch.cuda.memory._dump_snapshot`` pickle, or a
        ``_snapshot()`` dict) as the Profile of one device. Nothing in the file is run: a
        pickle that names any class or function is refused (:class:`ProfileFileError`).

        ``device`` (an index or ``"cuda:N"``) picks one device of a multi-device snapshot;
        ``None`` takes the only device that holds memory. Phases, modules and categories are
        recovered from the snapshot's frames, annotations and user metadata where it has them
        (``meta["categories_inferred"]``).
        """
        from ._snapshots.file import profile_from_snapshot_source

        return cls.of(profile_from_snapshot_source(source, device=device))

    def to_snapshot(self, path: str | Path) -> Path:
        """Write a pickle in ``_dump_snapshot``'s format that PyTorch's memory viewer and
        ``torch.cuda._memory_viz`` read, and :meth:`from_snapshot` reads back to the same
        peak and categories (addresses are synthesized: see ``_snapshots/file.py``)."""
        from ._snapshots.file import write_snapshot

        return write_snapshot(self, path)

    @classmethod
    def load_ranks(cls, folder: str | Path) -> list[Profile]:
        """The per-rank profiles a distributed recording wrote into ``folder``
        (``rank<N>.json.gz``, from ``torchrun -m jupyter_vram.run``), in rank order."""
        from ._distributed.files import load_ranks

        return [cls.of(p) for p in load_ranks(folder)]
