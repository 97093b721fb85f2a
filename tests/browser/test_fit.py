"""The Make-it-fit tab in real JupyterLab: a budget typed in, the ranked options drawn against
the budget line, one option verified (a rerun), measured beside predicted, and the notebook's
state as it was."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from .lab import Lab, PageLog, open_notebook, run_all_cells, widget_errors, write_notebook
from .test_rerun import KERNEL_PRINT, SETUP, STATE

pytestmark = pytest.mark.browser

RECORD = "%%vram\nloss = model(x).square().mean()\nloss.backward()\n"


def test_make_it_fit_tab_verifies_an_option(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "fit.ipynb"
    write_notebook(lab.root_dir, name, [SETUP, RECORD])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name), "a cell raised"
    app = page.locator(".jv-app")
    expect(app.locator(".jv-header-box")).to_contain_text("peak", timeout=30_000)
    budget = str(page.evaluate(KERNEL_PRINT, [name, "print(int(0.7 * _vram.peak_bytes))"]))
    before = str(page.evaluate(KERNEL_PRINT, [name, STATE])).strip()

    app.locator(".jv-tabs .lm-TabBar-tab", has_text="Make it fit").click()
    box = app.locator(".jv-fit-budget input")
    expect(box).to_be_visible(timeout=20_000)
    box.fill(budget.strip())
    box.press("Enter")
    expect(app.locator(".jv-fit-summary")).to_contain_text("cheapest that fits", timeout=30_000)
    options = app.locator(".jv-fit-option")
    expect(options.first).to_be_visible()
    assert options.count() >= 2
    expect(options.first.locator(".jv-fit-line")).to_have_count(1)  # the budget line

    row = options.filter(has=page.locator(".jv-fit-verify:enabled")).first
    row.locator(".jv-fit-verify").click()
    measured = row.locator(".jv-fit-measured-text")
    expect(measured).to_be_visible(timeout=60_000)
    text = row.locator(".jv-fit-num").inner_text()
    assert text.startswith("predicted ") and "measured " in text, text
    assert str(page.evaluate(KERNEL_PRINT, [name, STATE])).strip() == before
    assert not widget_errors(page)
