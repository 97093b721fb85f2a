"""Memory limits that hold: the one message `%%vram --max`, the pytest marker and
`jv.assert_fits` give when a run's peak passes its limit, with the sites that made the peak."""

from __future__ import annotations

from .._model import Profile
from .._units import format_bytes


def over_limit(profile: Profile, limit: int, *, what: str = "peak") -> str | None:
    """None when ``profile``'s peak is at most ``limit`` bytes; else one paragraph: the peak,
    the limit, by how much, and the top three allocation sites live at the peak (so the
    failure says where to look without opening the profile)."""
    peak = profile.peak_bytes
    if peak <= limit:
        return None
    lines = [
        f"{what} {format_bytes(peak)} exceeded the limit {format_bytes(limit)} by "
        f"{format_bytes(peak - limit)} ({peak:,} > {limit:,} bytes)"
    ]
    from .tables import site_rows

    for number, row in enumerate(site_rows(profile, 3), start=1):
        if row.live_at_peak_bytes <= 0:
            break
        where = f"{row.site} [{row.op}, {row.category}]"
        lines.append(f"  {number}. {where}: {format_bytes(row.live_at_peak_bytes)}")
    return "\n".join(lines)
