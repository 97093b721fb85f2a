"""Byte sizes and counts in words, for every layer (capture's and analysis' messages, the
renderers).

It sits at the bottom of the package and imports nothing from it, so a message written in
capture/ or analysis/ needs no arrow up to render/.
"""

from __future__ import annotations

#: Byte units by lower-case name, decimal (kb, gb) and binary (kib, gib), as sizes are
#: written in options (``--capacity 6GiB``) and read from messages (CUDA's ``Tried to
#: allocate 20.00 MiB``): the one table every parser uses.
BYTE_UNITS = {
    "bytes": 1,
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "p": 1000**5,
    "pb": 1000**5,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "pib": 1 << 50,
}


#: The units sizes are shown in, largest first (binary: what the allocators count in).
_UNITS = tuple((name, BYTE_UNITS[name.lower()]) for name in ("TiB", "GiB", "MiB", "KiB", "B"))


def format_bytes(n: float) -> str:
    """Human-readable binary size: 1536 -> '1.5 KiB'."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    name, size = next((u for u in _UNITS if n >= u[1]), _UNITS[-1])
    return f"{sign}{n:.0f} {name}" if size == 1 else f"{sign}{n / size:.1f} {name}"


def format_column(values: list[int]) -> list[str]:
    """Byte counts of one table column, in one unit: the unit of the largest, or the next
    smaller one where that would show different counts alike (a small model's what-ifs all
    read 0.23 GiB; in MiB they differ)."""
    if not values:
        return []
    top = max(abs(v) for v in values)
    at = next(i for i, (_, size) in enumerate(_UNITS) if top >= size or size == 1)
    texts = _in_unit(values, *_UNITS[at])
    if len(set(texts)) < len(set(values)) and at + 1 < len(_UNITS):
        texts = _in_unit(values, *_UNITS[at + 1])
    return texts


def _in_unit(values: list[int], name: str, size: int) -> list[str]:
    return [f"{v:,} B" if size == 1 else f"{v / size:,.2f} {name}" for v in values]


def format_change(base: float, new: float, *, decimals: int = 1, space: str = " ") -> str:
    """A change that stays readable: '+12.5 %', '-41.0 %'; from ten times on a factor,
    '63,616x' (a percentage such as '+6361500.0 %' says less); 'new' from nothing."""
    if not base:
        return "new" if new else f"{0:+.{decimals}f}{space}%"
    ratio = new / base
    if base > 0 and ratio >= 10:
        return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.1f}x"
    return f"{100 * (ratio - 1):+.{decimals}f}{space}%"


def format_count(n: int) -> str:
    """1234 -> '1.2K', 124_439_808 -> '124.4M', 6_738_415_616 -> '6.74B'."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return str(n)
