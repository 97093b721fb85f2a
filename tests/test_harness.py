"""The test harness itself: it passes wherever it is started, and fails where it must.

Each test runs pytest in a child process on one small test, in the situation at hand.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import STARTED_SIGINT

ROOT = Path(__file__).resolve().parents[1]


def child_pytest(
    args: list[str], *, code: str = "", env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """``pytest args`` in a fresh interpreter, after running ``code`` there."""
    script = f"import sys, pytest\n{code}\nsys.exit(pytest.main({args!r}))\n"
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_session_keeps_the_sigint_handler_it_started_with() -> None:
    assert signal.getsignal(signal.SIGINT) == STARTED_SIGINT


@pytest.mark.slow
def test_tests_pass_with_sigint_ignored() -> None:
    """Started with SIGINT ignored (a background job, nohup, some CI runners), a test that
    records passes: the clean state is the one the session started with."""
    ignored = (
        "import signal\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "import tests.conftest as c\n"
        "print('session SIGINT ignored:', c.STARTED_SIGINT == signal.SIG_IGN)\n"
    )
    tests = [
        "tests/test_harness.py::test_the_session_keeps_the_sigint_handler_it_started_with",
        "tests/test_oom.py::test_capacity_counts_frees",
    ]
    done = child_pytest(["-q", "-p", "no:cacheprovider", *tests], code=ignored)
    assert "session SIGINT ignored: True" in done.stdout
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


NO_CHROMIUM = """\
from pathlib import Path
import tests.browser.lab as lab
lab.CHROMIUM = Path(__file__).with_name("no-chromium-here")
"""


@pytest.mark.slow
@pytest.mark.parametrize("ci", ["true", ""])
def test_browser_tests_fail_in_ci_without_chromium(tmp_path: Path, ci: str) -> None:
    """Without chromium a browser test skips, with the reason; under ``CI=true`` it fails."""
    (tmp_path / "no_chromium.py").write_text(NO_CHROMIUM)
    test = "tests/browser/test_lab_startup.py::test_lab_starts_without_bokehjs"
    done = child_pytest(
        ["-rA", "-p", "no:cacheprovider", "-p", "no_chromium", test],
        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "CI": ci},
    )
    out = done.stdout
    assert "no-chromium-here not installed" in out, out[-3000:]
    if ci:
        assert done.returncode == 1 and "1 error" in out, out[-3000:]  # failed at setup
        assert "CI=true, and browser tests cannot run" in out
    else:
        assert done.returncode == 0 and "1 skipped" in out, out[-3000:]
