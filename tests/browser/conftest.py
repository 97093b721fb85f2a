"""Fixtures for tests against a real JupyterLab: the server, a headless chromium, a page.

One JupyterLab server and one browser serve the whole session (starting them is most of a
browser test's time); each test gets its own browser context, so cookies, storage and the
request log start empty. Browser tests skip, with the reason, where /usr/bin/chromium or
playwright is missing, or jupyterlab for those that start it (scripts/test.sh installs them).
Under CI (``CI=true``, as CI services set it) they fail instead: a CI machine without a browser
must not pass green.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from . import lab as lab_module
from .lab import CHROMIUM_ARGS, Lab, PageLog, running_lab

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "browser"
"""Screenshots of failed browser tests land here (git-ignored)."""


def _missing_for_browser() -> str | None:
    """Why browser tests cannot run here, or None."""
    chromium = lab_module.CHROMIUM
    if not chromium.exists():
        return f"{chromium} not installed (apt-get install -y chromium; scripts/test.sh does it)"
    if importlib.util.find_spec("playwright") is None:
        return "python package playwright not installed (pip install playwright)"
    return None


def in_ci(environ: dict[str, str] | None = None) -> bool:
    """CI services set ``CI=true`` (GitHub Actions, GitLab, Travis, CircleCI...)."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = _missing_for_browser()
    if reason is None or in_ci():  # in CI: pytest_runtest_setup fails them instead
        return
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under CI a browser test that cannot run fails, before any fixture starts."""
    if item.get_closest_marker("browser") is None or not in_ci():
        return
    reason = _missing_for_browser()
    if reason is not None:
        pytest.fail(f"CI=true, and browser tests cannot run: {reason}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so the page fixture can screenshot failures."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _cannot_run(reason: str) -> None:
    """Skip (fail under CI) a test whose fixture cannot start."""
    if in_ci():
        pytest.fail(f"CI=true, and browser tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A JupyterLab server on 127.0.0.1 with a token and a temporary root dir."""
    if importlib.util.find_spec("jupyterlab") is None:
        _cannot_run("jupyterlab not installed (pip install -e '.[test]')")
    with running_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless, driven by Playwright (never a downloaded browser)."""
    reason = _missing_for_browser()
    if reason is not None:
        _cannot_run(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(lab_module.CHROMIUM), headless=True, args=CHROMIUM_ARGS
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
