"""Write one benchmark's section of bench/README.md, keeping the others."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"


def write_section(section: str, text: str, readme: Path = README) -> None:
    """Put ``text`` under the ``section`` heading (``## ...``), replacing what was there."""
    old = readme.read_text() if readme.exists() else "# Benchmarks\n"
    body = f"{section}\n\n{text.strip()}\n"
    if section in old:
        head, _, rest = old.partition(section)
        tail = rest.split("\n## ", 1)
        new = head + body + ("\n## " + tail[1] if len(tail) > 1 else "")
    else:
        new = old.rstrip() + "\n\n" + body
    readme.write_text(new)
