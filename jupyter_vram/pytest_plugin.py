"""pytest plugin (registered by the ``pytest11`` entry point): memory budgets for tests.

``@pytest.mark.vram(max="2GiB")`` records the test's call (CUDA when available, else the CPU
tracker; ``device=`` to choose) and fails it when its peak passes ``max``, naming the top
sites at the peak. ``--vram-report`` prints each marked test's peak at the end of the run.
Fixtures' setup and teardown are not recorded: only the test function's own run.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

_PEAKS = pytest.StashKey[list[tuple[str, int, int]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--vram-report",
        action="store_true",
        help="jupyter_vram: print the peak memory of each test marked vram",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "vram(max, device=None): record the test's memory (jupyter_vram) and fail it when "
        "its peak passes max (2GiB, 512MiB, bytes)",
    )
    config.stash[_PEAKS] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """Run a marked test under recording; fail it past its limit (after it ran)."""
    marker = item.get_closest_marker("vram")
    if marker is None:
        return (yield)
    from ._capture.capacity import parse_capacity
    from ._recording import record

    limit_text = marker.kwargs.get("max", marker.args[0] if marker.args else None)
    if limit_text is None:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.vram needs max=SIZE")
    limit = parse_capacity(limit_text)
    recording = record(marker.kwargs.get("device"), stacks="sampled")
    with recording:
        result = yield
    _check(item, recording.profile, limit)
    return result


def _check(item: pytest.Item, profile: Any, limit: int) -> None:
    from ._analysis.limits import over_limit

    item.config.stash[_PEAKS].append((item.nodeid, profile.peak_bytes, limit))
    message = over_limit(profile, limit)
    if message is not None:
        pytest.fail(f"vram: {message}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not config.getoption("--vram-report"):
        return
    from ._units import format_bytes

    peaks = config.stash.get(_PEAKS, [])
    terminalreporter.section("vram peaks")
    for nodeid, peak, limit in peaks:
        mark = "over" if peak > limit else "ok"
        terminalreporter.write_line(
            f"{mark:4s} {format_bytes(peak):>10s} of {format_bytes(limit):>10s}  {nodeid}"
        )
    if not peaks:
        terminalreporter.write_line("no test marked vram ran")
