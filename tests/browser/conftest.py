"""Fixtures for tests against a real JupyterLab: the server, a headless chromium, a page.

One JupyterLab server and one browser serve the whole session (starting them is most of a
browser test's time); each test gets its own browser context, so cookies, storage and the
request log start empty. Browser tests skip, with the reason, where /usr/bin/chromium is missing
(scripts/test.sh installs it, so CI runs them).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .lab import CHROMIUM, CHROMIUM_ARGS, Lab, PageLog, running_lab

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "browser"
"""Screenshots of failed browser tests land here (git-ignored)."""


def _missing_for_browser() -> str | None:
    """Why browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not installed (apt-get install -y chromium; scripts/test.sh does it)"
    if importlib.util.find_spec("playwright") is None:
        return "python package playwright not installed (pip install playwright)"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = _missing_for_browser()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so the page fixture can screenshot failures."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A JupyterLab server on 127.0.0.1 with a token and a temporary root dir."""
    if importlib.util.find_spec("jupyterlab") is None:
        pytest.skip("jupyterlab not installed (pip install -e '.[test]')")
    with running_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless, driven by Playwright (never a downloaded browser)."""
    reason = _missing_for_browser()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page_log() -> PageLog:
    """Requests, failed requests and console errors of the test's page."""
    return PageLog()


@pytest.fixture
def page(browser: Browser, page_log: PageLog, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh page (own context) with ``page_log`` attached; screenshot kept if the test fails."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page_log.attach(page)
    yield page
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()
