"""The HTML `jupyter nbconvert --to html` makes of an executed notebook shows the static
report's flame graph and breakdown in chromium with JavaScript disabled.

``JV_SCREENSHOT=1`` also writes docs/nbconvert-report.png.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from ..test_nbconvert import HIDDEN_BYTES, LINEAR0_AT_PEAK, PEAK, executed_html

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_nbconvert_report_renders_without_javascript(browser: Browser, tmp_path: Path) -> None:
    html_path = executed_html(tmp_path)
    context = browser.new_context(
        viewport={"width": 1100, "height": 900}, java_script_enabled=False
    )
    try:
        page = context.new_page()
        page.goto(html_path.as_uri())
        # a script the page adds does not run: JavaScript is off (Playwright's evaluation is
        # not the page's)
        ran = page.evaluate(
            "() => { const s = document.createElement('script');"
            " s.textContent = 'window.jvRan = 1'; document.head.appendChild(s);"
            " return window.jvRan === 1; }"
        )
        assert ran is False
        report = page.locator(".jvs-report")
        assert report.count() == 1
        flame = report.locator("svg.jvs-flame")
        box = flame.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] >= 60
        # the widest module block: Linear 0, as wide as its share of the peak
        block = flame.locator("svg.jvs-block", has_text="0: Linear").first
        inner = block.bounding_box()
        assert inner is not None and inner["height"] > 10
        assert inner["width"] / box["width"] == pytest.approx(LINEAR0_AT_PEAK / PEAK, abs=0.01)
        relu = flame.locator("svg.jvs-block", has_text="1: ReLU").first.bounding_box()
        assert relu is not None
        assert relu["width"] / box["width"] == pytest.approx(HIDDEN_BYTES / PEAK, abs=0.01)
        bar = report.locator("svg.jvs-bar").bounding_box()
        assert bar is not None and bar["width"] > 300 and bar["height"] > 10
        assert report.get_by_text("Top allocation sites").is_visible()
        if os.environ.get("JV_SCREENSHOT"):
            DOCS.mkdir(exist_ok=True)
            report.screenshot(path=str(DOCS / "nbconvert-report.png"))
    finally:
        context.close()
