"""`%%vram` in real JupyterLab: the app renders, the flame graph answers hover and click, the
breakdown draws, nothing fails, nothing leaves 127.0.0.1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from .lab import (
    Lab,
    PageLog,
    assert_all_local,
    open_notebook,
    output_errors,
    read_notebook,
    run_all_cells,
    save_notebook,
    widget_errors,
    write_notebook,
)

pytestmark = pytest.mark.browser

DOCS = Path(__file__).resolve().parents[2] / "docs"

SETUP = """\
%load_ext jupyter_vram
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                      nn.Linear(1024, 10))
opt = torch.optim.AdamW(model.parameters())
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

def step():
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()

step()
"""

RECORD = """\
%%vram
step()
"""


def hover_until_tooltip(page: Page, canvas: Locator, text: str) -> tuple[float, float]:
    """Move over the canvas, top rows first, until a bokeh tooltip containing ``text`` shows."""
    box = canvas.bounding_box()
    assert box is not None
    for dy in range(8, int(box["height"]), 6):
        x, y = box["x"] + box["width"] * 0.05, box["y"] + dy
        page.mouse.move(x, y)
        tip = page.locator(".bk-Tooltip", has_text=text)
        if tip.count() and tip.first.is_visible():
            return x, y
    raise AssertionError(f"no tooltip containing {text!r} over the flame graph")


def test_vram_app_in_jupyterlab(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "vram_app.ipynb"
    write_notebook(lab.root_dir, name, [SETUP, RECORD])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name), "a cell raised"

    app = page.locator(".jv-app")
    expect(app).to_be_visible(timeout=30_000)
    expect(app.locator(".jv-header-box")).to_contain_text("peak allocated")

    # Flame graph: drawn, hover names a block with its bytes, a click zooms into it.
    canvas = app.locator(".jv-flame canvas").first
    expect(canvas).to_be_visible(timeout=20_000)
    x, y = hover_until_tooltip(page, canvas, "Sequential")
    tooltip = page.locator(".bk-Tooltip", has_text="Sequential").first
    expect(tooltip).to_contain_text("bytes")
    expect(tooltip).to_contain_text("of peak")
    crumbs = app.locator(".jv-crumbs")
    expect(crumbs).to_contain_text("all:")
    page.mouse.click(x, y)
    expect(crumbs).to_contain_text("all \u203a Sequential", timeout=10_000)
    app.locator(".jv-flame-reset").click()
    expect(crumbs).not_to_contain_text("\u203a", timeout=10_000)

    if os.environ.get("JV_SCREENSHOT"):
        DOCS.mkdir(exist_ok=True)
        app.screenshot(path=str(DOCS / "app-flame.png"))

    # Breakdown tab: the stacked bar at the peak draws and the tables name the categories.
    app.locator(".jv-tabs .lm-TabBar-tab", has_text="Breakdown").click()
    expect(app.locator(".jv-breakdown canvas").first).to_be_visible(timeout=20_000)
    expect(app.locator(".jv-breakdown-view")).to_contain_text("optimizer_state")

    # Timeline tab: areas draw and the panel shows what was live at the peak.
    app.locator(".jv-tabs .lm-TabBar-tab", has_text="Timeline").click()
    expect(app.locator(".jv-timeline canvas").first).to_be_visible(timeout=20_000)
    expect(app.locator(".jv-moment")).to_contain_text("Live at the peak")
    if os.environ.get("JV_SCREENSHOT"):
        app.screenshot(path=str(DOCS / "app-timeline.png"))

    assert widget_errors(page) == []
    assert page_log.console_errors == []
    assert_all_local(page_log.requests)

    save_notebook(page, name)
    assert output_errors(read_notebook(lab.root_dir, name)) == []
