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
