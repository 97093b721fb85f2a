"""Two profiles of the same cell side by side: what a change (AMP, checkpointing, offload) did.

Every figure is a *maximum held at once*: for a category, module or op, the most bytes its
allocations held together at any moment of the run (what decides whether a run fits), and for
the ``peak`` row the profile's peak. A category's maximum is taken over the whole run, so the
category rows do not sum to the peak row (their maxima fall at different moments).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from .._model import CATEGORIES, CATEGORY_INDEX
from .._units import format_bytes, format_change

if TYPE_CHECKING:
    import pandas as pd

    from .._model import Profile

CompareBy = Literal["category", "module", "op"]
COLUMNS = ("baseline_bytes", "variant_bytes", "change_bytes", "change_pct")


def max_held(profile: Profile, ids: npt.NDArray[Any], n: int) -> npt.NDArray[np.int64]:
    """For each of ``n`` groups (``ids``: a group id per allocation row), the most bytes the
    group's allocations on the profile's device held at once, from the state before the run
    through every alloc and free."""
    a = profile.allocations
    timeline = profile.timeline
    ids = np.asarray(ids, dtype=np.int64)
    start_rows = timeline.device_mask & (a.alloc_seq < 0)
    start = np.bincount(ids[start_rows], weights=a.size[start_rows], minlength=n)
    start = np.round(start).astype(np.int64)
    best = start.copy()
    if len(timeline):
        event_ids = ids[timeline.alloc_index]
        order = np.argsort(event_ids, kind="stable")  # per group, still in event order
        grouped = event_ids[order]
        running = np.cumsum(timeline.delta[order], dtype=np.int64)
        firsts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
        before = np.r_[0, running[:-1]][firsts]  # running total before each group's events
        offsets = np.repeat(before, np.diff(np.r_[firsts, len(grouped)]))
        within = running - offsets + start[grouped]
        np.maximum.at(best, grouped, within)
    return best


def activation_bytes_by_module(profile: Profile) -> dict[str, int]:
    """Module path -> bytes of the activations (tensors saved for backward) allocated in it,
    counting its submodules' (``...h.0`` includes ``...h.0.attn``)."""
    a = profile.allocations
    mask = (a.category == CATEGORY_INDEX["activation"]) & profile.timeline.device_mask
    own = np.bincount(a.module[mask], weights=a.size[mask], minlength=len(profile.modules))
    totals: dict[str, int] = {}
    for name, value in zip(profile.modules, own.tolist(), strict=True):
        if not name or value <= 0:
            continue
        nbytes = int(round(value))
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            totals[prefix] = totals.get(prefix, 0) + nbytes
    return totals


def _frame(labels: list[str], base: npt.ArrayLike, var: npt.ArrayLike) -> pd.DataFrame:
    import pandas as pd

    base_a = np.asarray(base, dtype=np.int64)
    var_a = np.asarray(var, dtype=np.int64)
    change = var_a - base_a
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(base_a > 0, 100.0 * change / np.maximum(base_a, 1), np.nan)
    return pd.DataFrame(
        {
            "baseline_bytes": base_a,
            "variant_bytes": var_a,
            "change_bytes": change,
            "change_pct": pct,
        },
        index=pd.Index(labels),
    )


def _by_name(profile: Profile, by: CompareBy) -> dict[str, int]:
    a = profile.allocations
    names = list(profile.modules if by == "module" else profile.ops)
    ids = a.module if by == "module" else a.op
    held = max_held(profile, ids, len(names))
    result: dict[str, int] = {}
    for name, value in zip(names, held, strict=True):
        label = name or "(no module)"
        result[label] = max(result.get(label, 0), int(value))
    return result


def compare(
    baseline: Profile, variant: Profile, by: CompareBy = "category", *, limit: int | None = 30
) -> pd.DataFrame:
    """Baseline vs variant: bytes held at most, change in bytes and % (see the module docstring).

    ``by="category"``: one row per category and a ``peak`` row. ``by="module"`` / ``"op"``: the
    movers, largest absolute change first (``limit`` rows; None for all). The frame's ``attrs``
    carry the wall times (``baseline_wall_ns``, ``variant_wall_ns``) and ``notes``: why the
    two runs may not be like for like.
    """
    if by == "category":
        n = len(CATEGORIES)
        base = max_held(baseline, baseline.allocations.category, n)
        var = max_held(variant, variant.allocations.category, n)
        labels = [*CATEGORIES, "peak"]
        frame = _frame(labels, np.r_[base, baseline.peak_bytes], np.r_[var, variant.peak_bytes])
        frame.index.name = "category"
    elif by in ("module", "op"):
        b, v = _by_name(baseline, by), _by_name(variant, by)
        labels = sorted(set(b) | set(v))
        frame = _frame(labels, [b.get(k, 0) for k in labels], [v.get(k, 0) for k in labels])
        frame = frame[frame["change_bytes"] != 0]
        order = np.argsort(-np.abs(frame["change_bytes"].to_numpy()), kind="stable")
        frame = frame.iloc[order]
        if limit is not None:
            frame = frame.iloc[:limit]
        frame.index.name = by
    else:
        raise ValueError(f"by must be 'category', 'module' or 'op', not {by!r}")
    frame.attrs["baseline_wall_ns"] = baseline.wall_ns
    frame.attrs["variant_wall_ns"] = variant.wall_ns
    frame.attrs["notes"] = like_for_like(baseline, variant)
    return frame


def like_for_like(baseline: Profile, variant: Profile) -> list[str]:
    """Reasons the two runs did not start from the same place or see the same inputs."""
    notes: list[str] = []
    n = len(CATEGORIES)
    inputs = CATEGORY_INDEX["input"]
    base_in = max_held(baseline, baseline.allocations.category, n)[inputs]
    var_in = max_held(variant, variant.allocations.category, n)[inputs]
    warned = any("iterator" in w for w in _variant_notes(variant))
    if base_in != var_in or warned:
        detail = (
            f" ({format_bytes(base_in)} -> {format_bytes(var_in)})" if base_in != var_in else ""
        )
        notes.append(f"inputs differ{detail}: the rerun may not see the same batch")
    start_b = baseline.timeline.baseline_by_category()
    start_v = variant.timeline.baseline_by_category()
    for category in ("gradient", "optimizer_state"):
        i = CATEGORY_INDEX[category]
        if start_b[i] != start_v[i]:
            notes.append(
                f"{category.replace('_', ' ')} held before the cell differs "
                f"({format_bytes(int(start_b[i]))} before the first run, "
                f"{format_bytes(int(start_v[i]))} before the rerun)"
            )
    return notes


def _variant_notes(profile: Profile) -> tuple[str, ...]:
    info = profile.meta.get("variant")
    notes = info.get("notes") if isinstance(info, dict) else None
    return tuple(str(n) for n in notes) if isinstance(notes, list | tuple) else ()


def describe_change(profile: Profile) -> str:
    """What a variant applied, in words: ``checkpointing 4 blocks + bf16 autocast``."""
    info = profile.meta.get("variant")
    if not isinstance(info, dict):
        return "a plain run"
    parts: list[str] = []
    checkpointed = info.get("checkpointed") or []
    if checkpointed:
        count = len(checkpointed)
        parts.append(f"checkpointing {count} block{'s' if count != 1 else ''}")
    if info.get("amp"):
        parts.append(f"{info['amp']} autocast")
    if info.get("offload"):
        parts.append("activation offload")
    parts_of = info.get("micro_batch")
    if isinstance(parts_of, int) and parts_of > 1:
        parts.append(f"micro-batch 1/{parts_of}")
    return " + ".join(parts) or "a plain rerun"


def _pct(change: int | float, base: int | float) -> str:
    if not base:
        return "n/a"
    return format_change(base, base + change, decimals=0)


def verdict(baseline: Profile, variant: Profile) -> str:
    """One line in plain words: ``checkpointing 4 blocks: activations 3.1 GiB -> 0.4 GiB,
    peak -41 %, time +27 %`` (and why the runs may not be like for like)."""
    n = len(CATEGORIES)
    base = max_held(baseline, baseline.allocations.category, n)
    var = max_held(variant, variant.allocations.category, n)
    moved = np.abs(var - base)
    parts: list[str] = []
    if int(moved.max()) > 0:
        i = int(np.argmax(moved))
        name = CATEGORIES[i]
        label = "activations" if name == "activation" else name.replace("_", " ")
        parts.append(f"{label} {format_bytes(int(base[i]))} -> {format_bytes(int(var[i]))}")
    before, after = baseline.peak_bytes, variant.peak_bytes
    parts.append(
        f"peak {format_bytes(before)} -> {format_bytes(after)} ({_pct(after - before, before)})"
    )
    if baseline.wall_ns and variant.wall_ns:
        parts.append(f"time {_pct(variant.wall_ns - baseline.wall_ns, baseline.wall_ns)}")
    line = f"{describe_change(variant)}: " + ", ".join(parts)
    notes = like_for_like(baseline, variant)
    if notes:
        line += " (" + "; ".join(notes) + ")"
    return line
