"""Byte sizes in words, for every layer (capture's and analysis' messages, the renderers).

It sits at the bottom of the package and imports nothing from it, so a message written in
capture/ or analysis/ needs no arrow up to render/.
"""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """Human-readable binary size: 1536 -> '1.5 KiB'."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
