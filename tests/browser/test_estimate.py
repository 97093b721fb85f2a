"""`%vram_estimate` in real JupyterLab: the app says it is an estimate, the "Fit & what-ifs"
tab's buttons run the batch search and the what-ifs with progress shown as they go, and a
later `%%vram` of the same model shows its error against the estimate."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

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
from .test_app import collapse_sidebars

pytestmark = pytest.mark.browser

DOCS = Path(__file__).resolve().parents[2] / "docs"

SETUP = """\
%load_ext jupyter_vram
import torch
from torch import nn

torch.manual_seed(0)
def block(d_in, d_out):
    return nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU())

# an MLP of same-typed blocks (activation checkpointing wraps them), 34M parameters
model = nn.Sequential(block(64, 4096), block(4096, 4096), block(4096, 4096), block(4096, 10))
"""

ESTIMATE = "%vram_estimate model --input 32x64"

MEASURE = """\
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(32, 64)

def step():
    model(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

step()
"""

RECORD = """\
%%vram
step()
"""


def test_estimate_app_in_jupyterlab(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "vram_estimate.ipynb"
    page.set_viewport_size({"width": 1024, "height": 900})
    write_notebook(lab.root_dir, name, [SETUP, ESTIMATE, MEASURE, RECORD])
    open_notebook(page, lab, name)
    collapse_sidebars(page)
    assert run_all_cells(page, name, timeout_ms=120_000), "a cell raised"

    apps = page.locator(".jv-app")
    expect(apps).to_have_count(2, timeout=30_000)
    app = apps.nth(0)
    header = app.locator(".jv-header-box")
    expect(header).to_contain_text("Estimate · simulated on fake tensors, no GPU used")
    expect(header).to_contain_text("predicted device used")
    expect(app.locator(".jv-flame canvas").first).to_be_visible(timeout=20_000)

    # Fit & what-ifs: the GPU table is there at once, without any new run.
    app.locator(".jv-tabs .lm-TabBar-tab", has_text="Fit & what-ifs").click()
    view = app.locator(".jv-estimate-view")
    table = view.locator(".jv-fit-table")
    expect(table).to_contain_text("GTX 1060 6GB", timeout=20_000)
    expect(table).to_contain_text("H200")
    expect(table).not_to_contain_text("largest batch")

    # The batch search: progress shows while it runs, then the table has the largest batches.
    view.locator(".jv-batch-search").click()
    status = view.locator(".jv-batch-status")
    expect(status).to_contain_text("simulating batch", timeout=30_000)
    expect(status).to_contain_text("largest batch found", timeout=120_000)
    expect(table).to_contain_text("largest batch")
    first = table.locator("tr.jv-fit-yes, tr.jv-fit-no").first.locator("td").last
    expect(first).to_have_text(re.compile(r"^(>= )?[\d,]+$"))
    expect(view.locator(".jv-estimate-error")).to_have_text("")

    # What-ifs for 4 data-parallel GPUs.
    gpus = view.locator(".jv-whatif-gpus input")
    gpus.fill("4")
    gpus.press("Enter")
    view.locator(".jv-whatif-run").click()
    whatifs = view.locator(".jv-whatif-table")
    expect(view.locator(".jv-whatif-status")).to_contain_text("what-ifs (", timeout=120_000)
    expect(view.locator(".jv-estimate-error")).to_have_text("")
    expect(whatifs.locator("tr.jv-whatif-simulated").first).to_contain_text("as estimated")
    expect(whatifs).to_contain_text("ZeRO-3 / FSDP full shard on 4 GPUs (per GPU)")
    if os.environ.get("JV_SCREENSHOT"):
        DOCS.mkdir(exist_ok=True)
        page.set_viewport_size({"width": 1024, "height": 2400})  # the whole app on screen
        page.mouse.move(0, 0)
        app.scroll_into_view_if_needed()
        app.screenshot(path=str(DOCS / "app-estimate.png"))

    # at 1024 px the tables fit the page
    for table_css in (".jv-fit-table table", ".jv-whatif-table table"):
        right = view.locator(table_css).evaluate("t => t.getBoundingClientRect().right")
        assert right <= 1024, (table_css, right)

    # The measured step of the same model is compared with the estimate.
    measured = apps.nth(1)
    expect(measured.locator(".jv-header-box")).not_to_contain_text("Estimate ·")
    expect(measured.locator(".jv-comparison")).to_contain_text(
        re.compile(r"Estimated .* vs measured .*: difference [+-]\d+\.\d%")
    )

    assert widget_errors(page) == []
    assert page_log.console_errors == []
    assert_all_local(page_log.requests)

    save_notebook(page, name)
    assert output_errors(read_notebook(lab.root_dir, name)) == []
