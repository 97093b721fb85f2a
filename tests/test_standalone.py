"""Nothing in the repository points outside it: no file cites notes or paths that exist only
on a developer's machine (comments cite docs/ or the upstream documentation instead)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The developers' sibling folder of notes (spelled in parts, so this file does not itself
#: name the path it looks for).
_NOTES = "sha" + "red"
#: References to places outside the checkout: that folder, design notes that are not in the
#: repository, the developers' workspace and scratch folders.
OUTSIDE = re.compile(
    rf"\.\./{_NOTES}\b|\b{_NOTES}/design\b|\bFACTS\.md\b|\bARCHITECTURE\.md\b"
    r"|(?<![\w.])/work/|/tmp/jv\b|\.library/"
)
#: Data recorded on other machines: the file names inside are where it ran, not references.
RECORDED = ("tests/fixtures/",)


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in out.decode().split("\0") if name]


def test_nothing_points_outside_the_repository() -> None:
    this = Path(__file__).resolve().relative_to(ROOT).as_posix()
    found = []
    for name in _tracked_files():
        path = ROOT / name
        if name == this or name.startswith(RECORDED) or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not found, "files that point outside the repository:\n" + "\n".join(found)


def test_the_check_finds_what_it_looks_for() -> None:
    assert OUTSIDE.search(f"see ../{_NOTES}/design/FACTS.md")
    assert OUTSIDE.search(f"read ../{_NOTES}/notes.md")
    assert OUTSIDE.search("cd /work/main && make")
    assert not OUTSIDE.search("http://127.0.0.1:8888/lab/workspaces/auto-x")
    assert not OUTSIDE.search('tmp_path / "work/out"')
