"""JupyterLab starts, and an ordinary notebook opens and runs, without fetching BokehJS: the
jupyter-vram extension loads it only when a jupyter_vram output shows its app."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page

from .lab import Lab, PageLog, assert_all_local, open_notebook, run_all_cells, write_notebook

pytestmark = pytest.mark.browser

PLUGINS = ["jupyter-vram:renderer", "jupyter-vram:plugin"]


def test_lab_starts_without_bokehjs(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "ordinary.ipynb"
    write_notebook(lab.root_dir, name, ["x = 6 * 7\nx"])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name), "a cell raised"
    page.wait_for_selector(".jp-OutputArea-output:has-text('42')")

    # The extension is there and active: the absence of requests is its doing, not its absence.
    active = page.evaluate(
        "(ids) => ids.map(id => window.jupyterapp.isPluginActivated(id))", PLUGINS
    )
    assert active == [True, True]
    extension_js = [u for u in page_log.requests if "/lab/extensions/jupyter-vram/" in u]
    assert extension_js, "the jupyter-vram lab extension was not loaded"

    bokeh = [u for u in page_log.requests if "bokeh" in u.lower() and "jupyter_bokeh" not in u]
    assert bokeh == [], bokeh
    assert page.evaluate("() => [typeof window.Bokeh, typeof window.jupyterVramBokehJS]") == [
        "undefined",
        "undefined",
    ]
    assert page.locator("script[data-jupyter-vram]").count() == 0
    assert page_log.console_errors == []
    assert_all_local(page_log.requests)
