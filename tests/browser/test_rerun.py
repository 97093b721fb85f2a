"""Reruns in real JupyterLab: the checkpointing toggle, Rerun, progress, the Compare tab with
the kernel's own verdict; then Cancel on a long rerun interrupts it and the notebook's state
is untouched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from .lab import (
    Lab,
    PageLog,
    assert_all_local,
    open_notebook,
    run_all_cells,
    widget_errors,
    write_notebook,
)

pytestmark = pytest.mark.browser

DOCS = Path(__file__).resolve().parents[2] / "docs"

SETUP = """\
%load_ext jupyter_vram
import time
import torch
from torch import nn

class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(4)
        )

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x

torch.manual_seed(0)
model = Blocks()
x = torch.randn(512, 64)
pause = 0.0  # seconds the cell keeps busy after its step (for ever: a rerun to cancel)
"""

# Recorded with Python stacks (the default): reruns record without them, so the Cancel below
# reaches a rerun that stops at once (with stacks torch's profiler post-processes every Python
# call of the busy loop when it stops: 8 s for a 1 s loop on a loaded machine).
RECORD = """\
%%vram
loss = model(x).square().mean()
loss.backward()
until = time.perf_counter() + pause
while time.perf_counter() < until:  # busy, like a long training step
    pass
"""

# Run code in the notebook's kernel (as a cell would) and return what it printed.
KERNEL_PRINT = """
async ([path, code]) => {
  const app = window.jupyterapp;
  const panel = [...app.shell.widgets('main')].find(
    (w) => w.context && w.context.path === path && w.sessionContext);
  const future = panel.sessionContext.session.kernel.requestExecute({code});
  let out = '';
  future.onIOPub = (msg) => {
    if (msg.header.msg_type === 'stream') out += msg.content.text;
    if (msg.header.msg_type === 'error') out += `${msg.content.ename}: ${msg.content.evalue}`;
  };
  await future.done;
  return out;
}
"""

# Keep every text the rerun status line shows (progress can be quicker than a poll).
WATCH_STATUS = """
() => {
  window.__jvStatus = [];
  const el = document.querySelector('.jv-rerun-status');
  new MutationObserver(() => window.__jvStatus.push(el.innerText.trim()))
    .observe(el, {subtree: true, childList: true, characterData: true});
}
"""

STATE = "print(sum(p.double().sum().item() for p in model.parameters()), loss.item())"


def kernel_print(page: Page, name: str, code: str) -> str:
    return str(page.evaluate(KERNEL_PRINT, [name, code])).strip()


def test_checkpointing_rerun_in_jupyterlab(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "rerun.ipynb"
    write_notebook(lab.root_dir, name, [SETUP, RECORD])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name), "a cell raised"
    app = page.locator(".jv-app")
    expect(app.locator(".jv-header-box")).to_contain_text("peak allocated", timeout=30_000)
    row = app.locator(".jv-rerun")
    expect(row).to_be_visible()
    bar, tabs = row.bounding_box(), app.locator(".jv-tabs").bounding_box()
    assert bar and tabs and bar["y"] + bar["height"] <= tabs["y"] + 1  # above the tabs
    before = kernel_print(page, name, STATE)

    # checkpointing on: the block picker opens with "auto" chosen, Rerun turns on
    rerun = app.locator(".jv-rerun-button")
    expect(rerun).to_be_disabled()
    # greyed, not only faded: a faded blue still reads as a button to press in a dark theme
    assert "grayscale" in rerun.evaluate("e => getComputedStyle(e).filter")
    app.locator(".jv-rerun-checkpoint").click()
    blocks = app.locator(".jv-rerun-blocks select option")
    expect(blocks).to_have_count(5)  # auto + the model's four blocks
    expect(blocks.first).to_contain_text("auto")
    expect(rerun).to_be_enabled()
    assert rerun.evaluate("e => getComputedStyle(e).filter") == "none"
    page.evaluate(WATCH_STATUS)
    rerun.click()

    verdict = app.locator(".jv-verdict")
    expect(verdict).to_be_visible(timeout=30_000)
    expect(app.locator(".jv-tabs .lm-TabBar-tab.lm-mod-current")).to_have_text("Compare")
    seen = page.evaluate("() => window.__jvStatus")
    assert any(s.startswith("running (") for s in seen), seen  # progress showed the stage
    expect(app.locator(".jv-rerun-status")).to_contain_text("see the Compare tab")
    # the verdict on the page is the one the kernel computes for the two profiles
    expected = kernel_print(
        page,
        name,
        "from jupyter_vram._analysis.compare import verdict\n"
        "from jupyter_vram._app.compare_view import latest_variant\n"
        "print(verdict(_vram, latest_variant()))",
    )
    assert expected.startswith("checkpointing 4 blocks: activations"), expected
    assert verdict.inner_text().strip() == expected
    expect(app.locator(".jv-compare-summary .jv-row-peak")).to_be_visible()
    expect(app.locator(".jv-diff-flame canvas").first).to_be_visible(timeout=20_000)
    assert kernel_print(page, name, STATE) == before  # the rerun left the notebook as it was
    if os.environ.get("JV_SCREENSHOT"):
        DOCS.mkdir(exist_ok=True)
        page.set_viewport_size({"width": 1200, "height": 1700})
        page.mouse.move(0, 0)
        page.wait_for_timeout(500)
        app.screenshot(path=str(DOCS / "app-compare.png"))

    # a rerun that never ends by itself (the cell now keeps busy for ever) is cancelled from its
    # Cancel button: the page asks the server to interrupt the kernel, the rerun restores state
    # and says so. Only the interrupt can end it, so 'cancelled' proves the Cancel worked, on a
    # machine of any speed (the waits below are limits on a hang, not on speed)
    kernel_print(page, name, "pause = float('inf')")
    rerun.click()
    cancel = app.locator(".jv-cancel-btn")
    expect(cancel).to_be_visible(timeout=120_000)
    expect(app.locator(".jv-rerun-status")).to_contain_text("running (", timeout=120_000)
    cancel.click()
    expect(app.locator(".jv-rerun-status")).to_contain_text("cancelled", timeout=300_000)
    expect(cancel).to_be_hidden()
    assert kernel_print(page, name, STATE) == before
    expect(app.locator(".jv-verdict")).to_have_count(1)  # no second column from it
    assert widget_errors(page) == []
    assert_all_local(page_log.requests)
