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
    from .tables import top_sites

    sites = top_sites(profile, 3).to_dict("records")
    for number, row in enumerate(sites, start=1):
        live = int(row["live_at_peak_bytes"])
        if live <= 0:
            break
        where = f"{row['site']} [{row['op']}, {row['category']}]"
        lines.append(f"  {number}. {where}: {format_bytes(live)}")
    return "\n".join(lines)
