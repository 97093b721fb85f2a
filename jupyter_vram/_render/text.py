"""Plain-text rendering."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

# re-exported (PEP 484's `as` form): the renderers and users import it from here
from .._units import format_bytes

if TYPE_CHECKING:
    from .._model import Profile
    from .._model.oom import OomReport


SOURCE_NAMES = {
    "dispatch": "tensor tracker",
    "allocator": "allocator events",
    "cuda_snapshot": "CUDA allocator",
    "estimate": "estimate: fake-tensor run",
}


def run_word(profile: Profile) -> str:
    """What the profile recorded, in a header's words: an estimate's fake run is a step,
    not a cell of the notebook."""
    return "step" if profile.source == "estimate" else "cell"


def format_moment(time_ns: float, index: int, *, timed: bool = True) -> str:
    """When timeline event ``index`` happened: '12.345 ms, event 7' (just 'event 7' when the
    run's clock means nothing, as in a fake-tensor run); index -1 is before the first event."""
    if index < 0:
        return "before the first event"
    if not timed:
        return f"event {index + 1:,}"
    return f"{time_ns / 1e6:.3f} ms, event {index + 1:,}"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "   - "


def summary(profile: Profile, *, top: int = 5) -> str:
    """The plain-text report: peak, breakdown at the peak, top modules and sites, device."""
    from .._analysis.groups import live_at_peak
    from .._analysis.oom import oom_report
    from .._analysis.tables import site_rows

    t = profile.timeline
    peak = profile.peak_bytes
    source = SOURCE_NAMES.get(profile.source, profile.source)
    lines = [
        f"jupyter_vram · {profile.device} ({source}) · {profile.wall_ns / 1e9:.3f} s · "
        f"{profile.event_count:,} events",
    ]
    run = run_word(profile)
    if profile.error:
        lines.append(f"the {run} raised {profile.error}; the profile covers the run up to it")
    oom = oom_report(profile)
    if oom is not None:
        lines.extend(oom_lines(oom))
    lines.extend(f"warning: {w}" for w in profile.meta.get("warnings", ()))
    threads = profile.meta.get("other_threads")
    if threads:
        lines.append(
            f"other threads ran meanwhile ({', '.join(map(str, threads))}): memory they "
            "allocated is not in this profile"
        )
    when = f"{t.time_ns[t.peak_index] / 1e6:.1f} ms in" if t.peak_index >= 0 else "before the run"
    lines.append(
        f"peak {format_bytes(peak)} ({when}, {t.peak_phase} phase); before the {run} "
        f"{format_bytes(t.baseline_bytes)}, after {format_bytes(t.total_at(len(t) - 1))}"
    )
    lines.append("at the peak:")
    for name, nbytes in profile.peak_breakdown().items():
        if nbytes:
            lines.append(f"  {name:<16}{format_bytes(nbytes):>12} {_pct(nbytes, peak)}")
    modules = [g for g in live_at_peak(profile, "module", limit=top) if g.bytes]
    if modules:
        lines.append("modules at the peak:")
        lines.extend(
            f"  {format_bytes(g.bytes):>12} {_pct(g.bytes, peak)}  {g.label}" for g in modules
        )
    sites = [s for s in site_rows(profile, limit=top) if s.live_at_peak_bytes]
    if sites:
        lines.append("top allocation sites (live at the peak):")
        width = max(20, *(len(s.op) for s in sites))  # a long op name keeps the sites aligned
        lines.extend(
            f"  {format_bytes(s.live_at_peak_bytes):>12}  {s.op:<{width}} {s.site}" for s in sites
        )
    lines.extend(device_lines(profile.device_info))
    made = profile.meta.get("blas_workspaces")
    if isinstance(made, list) and made:
        total = sum(int(w.get("bytes", 0)) for w in made if isinstance(w, dict))
        lines.append(
            f"cuBLAS / cuBLASLt workspaces made by this run's first matmuls: "
            f"{format_bytes(total)} (category other; PyTorch keeps them for the process's "
            "life, so later cells start with them)"
        )
    return "\n".join(lines)


def oom_lines(oom: OomReport, *, top: int = 5) -> list[str]:
    """The OOM post-mortem in a few lines: the request, what was live, the best suggestions."""
    asked = f"{format_bytes(oom.requested_bytes)}" if oom.requested_bytes is not None else "?"
    where = ", ".join(
        x
        for x in (
            f"op {oom.op}" if oom.op else "",
            f"module {oom.module}" if oom.module else "",
            f"at {oom.site}" if oom.site else "",
        )
        if x
    )
    cap = f" of {format_bytes(oom.capacity_bytes)}" if oom.capacity_bytes else ""
    segment = oom.segment_bytes
    if segment is not None and segment != oom.requested_bytes:
        asked += f" (a new {format_bytes(segment)} segment)"
    lines = [
        f"OUT OF MEMORY: a request for {asked}{f' ({where})' if where else ''} failed with "
        f"{format_bytes(oom.live_bytes)}{cap} live"
        + (f", {format_bytes(oom.shortfall_bytes)} short" if oom.shortfall_bytes else "")
    ]
    live = ", ".join(f"{k} {format_bytes(v)}" for k, v in oom.live_by_category.items() if v)
    lines.append(f"  live then: {live}")
    for s in oom.suggestions[:top]:
        mark = " (enough)" if s.enough else ""
        lines.append(f"  - {s.action}: saves {format_bytes(s.bytes_saved)}{mark}")
    return lines


def device_lines(info: Mapping[str, Any]) -> list[str]:
    """Allocator / device figures, when the recorder had them (CUDA)."""
    parts = []
    for key, label in (
        ("allocated", "allocated"),
        ("reserved", "reserved"),
        ("device_used", "device used"),
        ("total", "device total"),
    ):
        if info.get(key) is not None:
            parts.append(f"{label} {format_bytes(int(info[key]))}")
    return [f"device: {info.get('name', '')} " + ", ".join(parts)] if parts else []
