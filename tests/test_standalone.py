"""Nothing in the repository points outside it: no file cites notes or paths that exist only
on a developer's machine (comments cite docs/ or the upstream documentation instead)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The names this check looks for are spelled in parts, so this file does not itself contain
#: the references it forbids: the developers' sibling folder of notes, its design notes, their
#: workspace, scratch and tool folders.
_NOTES = "sha" + "red"
_DESIGN = "de" + "sign"
_NOTE_FILES = ("FA" + "CTS", "ARCHI" + "TECTURE")
_WORKSPACE = "wo" + "rk"
_SCRATCH = "tm" + "p/jv"
_TOOLS = "lib" + "rary"
OUTSIDE = re.compile(
    rf"\.\./{_NOTES}\b|\b{_NOTES}/{_DESIGN}\b|\b(?:{'|'.join(_NOTE_FILES)})\.md\b"
    rf"|(?<![\w.])/{_WORKSPACE}/|/{_SCRATCH}\b|\.{_TOOLS}/"
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
    found = []
    for name in _tracked_files():
        path = ROOT / name
        if name.startswith(RECORDED) or not path.is_file():
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
    assert OUTSIDE.search(f"see ../{_NOTES}/{_DESIGN}/{_NOTE_FILES[0]}.md")
    assert OUTSIDE.search(f"as {_NOTE_FILES[1]}.md says")
    assert OUTSIDE.search(f"read ../{_NOTES}/notes.md")
    assert OUTSIDE.search(f"cd /{_WORKSPACE}/main && make")
    assert OUTSIDE.search(f"/{_SCRATCH}/note.md")
    assert OUTSIDE.search(f"~/.{_TOOLS}/search/README.md")
    assert not OUTSIDE.search("http://127.0.0.1:8888/lab/workspaces/auto-x")
    assert not OUTSIDE.search('tmp_path / "work/out"')
