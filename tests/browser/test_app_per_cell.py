"""In real JupyterLab: running the same %%vram cell again replaces its app in the page, and
the kernel closes the old one (JupyterLab sends each execution's cell id), so a long session
keeps one app per cell, not one per run."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from .lab import Lab, PageLog, open_notebook, run_all_cells, widget_errors, write_notebook
from .test_rerun import kernel_print

pytestmark = pytest.mark.browser

SETUP = "%load_ext jupyter_vram\nimport torch\n"
CELL = "%%vram --no-stacks\nx = torch.ones(256, 256)\ny = x * 2\n"
COUNT = (
    "import gc, ipywidgets\nfrom jupyter_vram._app import ProfileApp\ngc.collect()\n"
    "print(len(ipywidgets.widgets.widget._instances), "
    "sum(type(o) is ProfileApp for o in gc.get_objects()))"
)


def test_rerunning_a_cell_keeps_one_app_in_the_kernel(
    lab: Lab, page: Page, page_log: PageLog
) -> None:
    name = "apps.ipynb"
    write_notebook(lab.root_dir, name, [SETUP, CELL])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name)
    expect(page.locator(".jv-app")).to_have_count(1, timeout=30_000)
    widgets, apps = kernel_print(page, name, COUNT).split()
    assert apps == "1"
    for _ in range(4):
        assert run_all_cells(page, name)
        expect(page.locator(".jv-app")).to_have_count(1, timeout=30_000)
    # the old apps were closed once each: nothing raised at their garbage collection
    assert kernel_print(page, name, COUNT).split() == [widgets, "1"]
    assert widget_errors(page) == []
