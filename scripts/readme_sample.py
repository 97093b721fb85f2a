"""Write the README's sample report from a real run: `python scripts/readme_sample.py`.

Runs `python -m jupyter_vram demo` (a training step of the built-in small GPT, recorded on the
CPU when there is no GPU) and puts its report into the README block that follows the
`<!-- sample: python -m jupyter_vram demo -->` marker, so the sample never goes stale
(tests/test_readme.py checks that it still matches what the report prints).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = "<!-- sample: python -m jupyter_vram demo -->"


def demo_report() -> str:
    out = subprocess.run(
        [sys.executable, "-m", "jupyter_vram", "demo", "--device", "cpu", "--save",
         str(ROOT / "build" / "readme_sample.json.gz")],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.split("\n\nprofile saved to", 1)[0].strip()


def readme_sample(text: str) -> str:
    """The report block after the marker."""
    match = re.search(re.escape(MARKER) + r"\n```\n(.*?)\n```", text, re.S)
    if match is None:
        raise SystemExit(f"README.md has no {MARKER} block")
    return match.group(1)


def main() -> None:
    text = README.read_text()
    old = readme_sample(text)
    README.write_text(
        text.replace(f"{MARKER}\n```\n{old}\n```", f"{MARKER}\n```\n{demo_report()}\n```")
    )
    print(readme_sample(README.read_text()))


if __name__ == "__main__":
    main()
