"""In real JupyterLab, with the kernel left to choose (``JUPYTER_VRAM_FIRST_VIEW=auto``): once
the page has told the kernel that it draws saved profiles, a `%%vram` output is the saved
profile with an "Open the live app" button and no widget in the kernel; the button builds the
app, which replaces that output in place."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, expect

from .lab import (
    Lab,
    PageLog,
    open_notebook,
    run_all_cells,
    save_notebook,
    wait_for_kernel_idle,
    widget_errors,
    write_notebook,
)
from .test_app_per_cell import COUNT
from .test_rerun import kernel_print

pytestmark = pytest.mark.browser

SETUP = "%load_ext jupyter_vram\nimport os, torch\nos.environ['JUPYTER_VRAM_FIRST_VIEW'] = 'auto'"
CELL = "%%vram --no-stacks\nx = torch.ones(256, 256)\ny = x * 2\n"
TOLD = "from jupyter_vram import _session\nprint(_session._frontend_draws[0])"


def test_the_saved_view_comes_first_and_opens_the_live_app(
    lab: Lab, page: Page, page_log: PageLog
) -> None:
    name = "saved_first.ipynb"
    write_notebook(lab.root_dir, name, [SETUP, CELL])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name)
    # the page tells the kernel once it is idle (the status bar's reading, a drawn output)
    for _ in range(100):
        if kernel_print(page, name, TOLD) == "True":
            break
        time.sleep(0.2)
    assert kernel_print(page, name, TOLD) == "True"
    assert run_all_cells(page, name)  # now the output comes as the saved view
    output = page.locator(".jp-VramOutput")
    expect(output).to_have_attribute("data-vram-view", "saved", timeout=30_000)
    expect(output.locator(".jp-VramProfile")).to_contain_text("Flame graph")
    expect(output.locator(".jp-VramProfile-sites")).to_contain_text("mul")
    expect(output.locator(".jp-VramProfile-timelineLegend")).to_contain_text("top of the chart")
    expect(page.locator(".jv-app")).to_have_count(0)
    assert kernel_print(page, name, COUNT).split()[1] == "0"  # the first run's app is closed

    output.locator(".jp-VramOutput-open").click()
    expect(output).to_have_attribute("data-vram-view", "widget", timeout=30_000)
    app = page.locator(".jv-app")
    expect(app).to_have_count(1)
    expect(app.locator(".jv-header-box")).to_contain_text("peak allocated")
    expect(output.locator(".jp-VramOutput-open")).to_have_count(0)
    assert kernel_print(page, name, COUNT).split()[1] == "1"
    assert widget_errors(page) == []

    # a page loaded after the cell ran (saved, reloaded; same kernel): the button is back and
    # opens the app, though the kernel's update is addressed to the old page's request
    assert run_all_cells(page, name)
    expect(output).to_have_attribute("data-vram-view", "saved", timeout=30_000)
    save_notebook(page, name)
    page.reload()
    wait_for_kernel_idle(page, name)
    output = page.locator(".jp-VramOutput")
    expect(output.locator(".jp-VramOutput-open")).to_have_count(1, timeout=30_000)
    output.locator(".jp-VramOutput-open").click()
    expect(output).to_have_attribute("data-vram-view", "widget", timeout=30_000)
    expect(page.locator(".jv-app")).to_have_count(1)
    assert [e for e in page_log.console_errors if "vram" in e.lower()] == []
