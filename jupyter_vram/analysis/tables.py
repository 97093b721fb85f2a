"""pandas views of a profile: one row per allocation, and top allocation sites."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..model import CATEGORIES, PHASES

if TYPE_CHECKING:
    from ..model import Profile


def allocations_frame(profile: Profile) -> pd.DataFrame:
    """One row per allocation, with names resolved and a live-at-peak flag."""
    a = profile.allocations
    timeline = profile.timeline
    site = [_site(profile, int(s)) for s in range(len(profile.stacks))]
    stack_ids = a.stack
    return pd.DataFrame(
        {
            "op": pd.Categorical.from_codes(a.op, categories=_unique(profile.ops)),
            "module": pd.Categorical.from_codes(a.module, categories=_unique(profile.modules)),
            "phase": pd.Categorical.from_codes(a.phase, categories=list(PHASES)),
            "category": pd.Categorical.from_codes(a.category, categories=list(CATEGORIES)),
            "bytes": a.size,
            "device": pd.Categorical.from_codes(a.device, categories=_unique(profile.devices)),
            "alloc_seq": a.alloc_seq,
            "free_seq": a.free_seq,
            "alloc_ms": np.where(a.alloc_seq >= 0, a.alloc_ns / 1e6, np.nan),
            "free_ms": np.where(a.free_seq >= 0, a.free_ns / 1e6, np.nan),
            "live_at_peak": timeline.live_mask(timeline.peak_index),
            "site": [site[s] if s >= 0 else "" for s in stack_ids],
            "stack_id": stack_ids,
        }
    )


def _unique(names: tuple[str, ...]) -> list[str]:
    """pandas categories must be unique; tables already are, but guard loaded files."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        n = seen.get(name, 0)
        seen[name] = n + 1
        out.append(name if n == 0 else f"{name} #{n}")
    return out


def _site(profile: Profile, stack_id: int) -> str:
    frames = profile.stack_of(stack_id)
    return str(frames[-1]) if frames else ""


def top_sites(profile: Profile, limit: int = 20, *, by: str = "peak") -> pd.DataFrame:
    """Allocation sites (innermost user frame + op), ranked by bytes live at the peak or allocated.

    Only allocations made during the run count: the baseline has no site.

    Columns: site, op, live_at_peak_bytes, allocated_bytes, allocations, largest_bytes,
    category (the category holding most of the site's bytes), stack.
    """
    df = allocations_frame(profile)
    df = df[(df["alloc_seq"] >= 0) & (df["device"] == profile.device)]
    if df.empty:
        return pd.DataFrame(
            columns=["site", "op", "live_at_peak_bytes", "allocated_bytes", "allocations",
                     "largest_bytes", "category", "stack"]
        )  # fmt: skip
    df = df.assign(
        peak_part=np.where(df["live_at_peak"], df["bytes"], 0),
        run_part=np.where(df["alloc_seq"] >= 0, df["bytes"], 0),
    )
    grouped = df.groupby(["stack_id", "op"], observed=True, sort=False)
    out = grouped.agg(
        live_at_peak_bytes=("peak_part", "sum"),
        allocated_bytes=("run_part", "sum"),
        allocations=("bytes", "size"),
        largest_bytes=("bytes", "max"),
    ).reset_index()
    cat = (
        df.groupby(["stack_id", "op", "category"], observed=True)["bytes"].sum().reset_index()
        .sort_values("bytes", ascending=False).drop_duplicates(["stack_id", "op"])
    )  # fmt: skip
    out = out.merge(cat[["stack_id", "op", "category"]], on=["stack_id", "op"], how="left")
    out["site"] = [_site(profile, int(s)) or "(no Python stack)" for s in out["stack_id"]]
    out["stack"] = [
        " > ".join(str(f) for f in profile.stack_of(int(s))) for s in out["stack_id"]
    ]
    sort_key = "live_at_peak_bytes" if by == "peak" else "allocated_bytes"
    out = out.sort_values([sort_key, "allocated_bytes"], ascending=False).head(limit)
    cols = ["site", "op", "live_at_peak_bytes", "allocated_bytes", "allocations",
            "largest_bytes", "category", "stack"]  # fmt: skip
    return out[cols].reset_index(drop=True)
