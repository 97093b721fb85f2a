"""When the kernel behind a live app goes (it dies and restarts, or is shut down), the app's
buttons would do nothing: the output says "Kernel gone — showing the saved profile" and draws
the saved profile instead, without reloading the page."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from .lab import Lab, PageLog, assert_all_local, open_notebook, run_all_cells, write_notebook
from .test_saved_profile import RECORD, SETUP, shut_down_kernels_of

pytestmark = pytest.mark.browser

KERNEL_GONE = (
    "Kernel gone \u2014 showing the saved profile (the buttons of the live app need its "
    "kernel; run the cell again for it)."
)
OUTPUT = ".jp-VramOutput"

# Ask the kernel to kill its own process (no reply comes: do not wait for one).
KILL = """
(path) => {
  const app = window.jupyterapp;
  const panel = [...app.shell.widgets('main')].find(
    (w) => w.context && w.context.path === path && w.sessionContext);
  panel.sessionContext.session.kernel.requestExecute(
    {code: 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'});
  return true;
}
"""


def live_app(page: Page, lab: Lab, name: str) -> None:
    write_notebook(lab.root_dir, name, [SETUP, RECORD])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name), "a cell raised"
    output = page.locator(OUTPUT)
    expect(output).to_have_attribute("data-vram-view", "widget", timeout=30_000)
    expect(output.locator(".jv-app")).to_have_count(1)
    expect(output.locator(".jp-VramProfile-note")).to_have_count(0)


def assert_saved_profile_with_the_reason(page: Page) -> None:
    output = page.locator(OUTPUT)
    expect(output).to_have_attribute("data-vram-view", "saved", timeout=30_000)
    expect(output.locator(".jp-VramProfile-note")).to_have_text(KERNEL_GONE)
    expect(output.locator(".jv-app")).to_have_count(0)  # the dead app is gone, buttons too
    expect(output.locator(".jp-VramProfile-title")).to_contain_text("jupyter_vram")
    expect(output.locator(".jp-VramProfile svg").first).to_be_visible()


def test_a_kernel_that_dies_leaves_the_saved_profile(
    lab: Lab, page: Page, page_log: PageLog
) -> None:
    name = "kernel_dies.ipynb"
    live_app(page, lab, name)
    page.evaluate(KILL, name)
    assert_saved_profile_with_the_reason(page)
    assert_all_local(page_log.requests)


def test_a_kernel_shut_down_leaves_the_saved_profile(lab: Lab, page: Page) -> None:
    name = "kernel_shut_down.ipynb"
    live_app(page, lab, name)
    assert shut_down_kernels_of(lab, name) == 1
    assert_saved_profile_with_the_reason(page)
