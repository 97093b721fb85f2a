"""The static views in a browser: the HTML nbconvert makes of a profiled notebook shows the
static report's flame graph and breakdown in chromium with JavaScript disabled; in JupyterLab
with a live kernel the app still shows, not the static report.

``JV_SCREENSHOT=1`` also writes docs/nbconvert-report.png.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from ..test_nbconvert import (
    CELLS,
    HIDDEN_BYTES,
    LINEAR0_AT_PEAK,
    PEAK,
    executed_html,
    recorded_html,
)
from .lab import (
    Lab,
    open_notebook,
    read_notebook,
    run_all_cells,
    save_notebook,
    widget_errors,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_nbconvert_report_renders_without_javascript(browser: Browser, tmp_path: Path) -> None:
    # the docs' screenshot comes from a notebook run in a kernel (a minute here), as users
    # make it; otherwise the cell is recorded in this process (tests/test_nbconvert.py runs it
    # in a kernel and checks the numbers)
    screenshot = bool(os.environ.get("JV_SCREENSHOT"))
    html_path = (executed_html if screenshot else recorded_html)(tmp_path)
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
        if screenshot:
            DOCS.mkdir(exist_ok=True)
            report.screenshot(path=str(DOCS / "nbconvert-report.png"))
    finally:
        context.close()


LUMINANCE = """e => {
    const rgb = c => c.match(/[\\d.]+/g).slice(0, 3).map(Number);
    const lum = ([r, g, b]) => (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
    let bg = e;  // the first ancestor with a background of its own
    while (bg && getComputedStyle(bg).backgroundColor === 'rgba(0, 0, 0, 0)') bg = bg.parentElement;
    return [lum(rgb(getComputedStyle(e).color)),
            lum(rgb(getComputedStyle(bg || document.body).backgroundColor))];
}"""


def test_nbconvert_dark_theme_report_reads_light_on_dark(browser: Browser, tmp_path: Path) -> None:
    """The report's text takes the page's colour: light text on nbconvert's dark theme."""
    html_path = recorded_html(tmp_path, theme="dark")
    context = browser.new_context(
        viewport={"width": 1100, "height": 900}, java_script_enabled=False
    )
    try:
        page = context.new_page()
        page.goto(html_path.as_uri())
        report = page.locator(".jvs-report")
        for part in (".jvs-title", ".jvs-modules td", ".jvs-sites td"):
            text, background = report.locator(part).first.evaluate(LUMINANCE)
            assert text > 0.6 and background < 0.3, (part, text, background)
        box = report.locator("svg.jvs-flame").bounding_box()
        assert box is not None and box["height"] >= 60
    finally:
        context.close()


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PROFILE_MIME = "application/vnd.jupyter-vram.profile+json"


def test_a_live_kernel_still_shows_the_app(lab: Lab, page: Page) -> None:
    name = "static_views_live.ipynb"
    write_notebook(lab.root_dir, name, CELLS)
    open_notebook(page, lab, name)
    assert run_all_cells(page, name, timeout_ms=120_000), "a cell raised"
    expect(page.locator(".jv-app")).to_have_count(1, timeout=30_000)
    expect(page.locator(".jv-app .jv-flame canvas").first).to_be_visible(timeout=30_000)
    # the output shows the live app (directly, or inside the lab extension's renderer of the
    # saved profile), never the static report in its place or beside it
    assert page.locator(".jvs-report").count() == 0
    assert widget_errors(page) == []
    save_notebook(page, name)
    saved = read_notebook(lab.root_dir, name).cells[2].outputs
    assert [sorted(o.get("data", {})) for o in saved] == [
        sorted([WIDGET_VIEW, PROFILE_MIME, "text/html", "text/plain"])
    ]
