"""The services behind :class:`~jupyter_vram._model.Profile`'s conveniences.

The data model declares ``peak_bytes``, ``to_dataframe()``, ``to_html()``, ``compare()`` ...
but imports nothing above it (see ``_model/profile.py``); this module, part of the public API layer,
provides them from analysis/, render/, leaks, rerun, capture's snapshot files and the
distributed files, and ``jupyter_vram/__init__.py`` installs it when the package is imported
(with :func:`estimate_text`, the text view an Estimate shows in IPython: ``_display.py``).

Why a registry rather than a Profile subclass in the API layer: capture/ builds ``Profile``
objects in many places (recorders, snapshot readers, the estimator's worker) and must not
depend on the API layer either, so one class has to carry the methods. Every import here is
lazy, as the methods' own imports were, so ``import jupyter_vram`` stays light (no torch,
pandas or bokeh until a method needs them).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import pandas as pd

    from ._model import Profile
    from ._model.oom import OomReport


class Services:
    """:class:`~jupyter_vram._model.ProfileServices`, each method one call to its layer."""

    def allocations_frame(self, profile: Profile) -> pd.DataFrame:
        from ._analysis.tables import allocations_frame

        return allocations_frame(profile)

    def top_sites(
        self, profile: Profile, limit: int, by: Literal["peak", "allocated"]
    ) -> pd.DataFrame:
        from ._analysis.tables import top_sites

        return top_sites(profile, limit, by=by)

    def oom_report(self, profile: Profile) -> OomReport | None:
        from ._analysis.oom import oom_report

        return oom_report(profile)

    def find_leaks(self, profile: Profile) -> pd.DataFrame:
        from ._leaks import find_leaks

        return find_leaks(profile)

    def write_report(
        self, profile: Profile, path: str | Path, resources: Literal["inline", "cdn"]
    ) -> Path:
        from ._render.html import write_report

        return write_report(profile, path, resources=resources)

    def compare(
        self, baseline: Profile, other: Profile, by: Literal["category", "module", "op"]
    ) -> pd.DataFrame:
        from ._analysis.compare import compare

        return compare(baseline, other, by)

    def from_snapshot(
        self, source: str | Path | Mapping[str, Any], device: int | str | None
    ) -> Profile:
        from ._snapshots.file import profile_from_snapshot_source

        return profile_from_snapshot_source(source, device=device)

    def to_snapshot(self, profile: Profile, path: str | Path) -> Path:
        from ._snapshots.file import write_snapshot

        return write_snapshot(profile, path)

    def load_ranks(self, folder: str | Path) -> list[Profile]:
        from ._distributed.files import load_ranks

        return load_ranks(folder)


def estimate_text(estimate: Any) -> str:
    """An Estimate as IPython prints it (see ``_display.py``): the renderer's summary."""
    from ._render.estimate_text import estimate_summary

    return str(estimate_summary(estimate))
