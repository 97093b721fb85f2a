"""The lab extension's status-bar memory item, the "Profile cell memory" command (toolbar
button and shortcut) and its settings, in real JupyterLab."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import Page, expect

from .lab import (
    Lab,
    PageLog,
    open_notebook,
    run_all_cells,
    wait_for_kernel_idle,
    widget_errors,
    write_notebook,
)

pytestmark = pytest.mark.browser

GIB = 2**30

# The item reads torch.cuda only through sys.modules: a stand-in module with fixed numbers
# checks the whole path (expression, reply, parsing, text) on a machine without a GPU.
FAKE_TORCH = """\
import sys, types
fake = types.ModuleType("torch")
fake.cuda = types.SimpleNamespace(
    is_initialized=lambda: True,
    current_device=lambda: 0,
    get_device_name=lambda d: "Fake GPU",
    memory_allocated=lambda d: alloc,
    memory_reserved=lambda d: 4 * 2**30,
    mem_get_info=lambda d: (10 * 2**30, 80 * 2**30),
)
alloc = 3 * 2**30
sys.modules["torch"] = fake
"""

STATUS = ".jp-VramStatus"


def test_status_bar_shows_kernel_memory(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "status.ipynb"
    write_notebook(lab.root_dir, name, ["n = 1"])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name)
    item = page.locator(STATUS)
    # No torch in the kernel: hidden.
    expect(item).to_have_attribute("data-state", "no-torch")
    expect(item).to_be_hidden()

    run_code(page, name, FAKE_TORCH)
    # 3 GiB allocated, 4 GiB reserved, 80 - 10 = 70 GiB of 80 used on the device.
    expect(item).to_have_text("GPU 0: 3.0 GiB alloc · 4.0 GiB reserved · 70.0 GiB / 80.0 GiB used")
    expect(item).to_be_visible()

    run_code(page, name, "alloc = 5 * 2**30 + 2**29")  # refreshed when the run ends
    expect(item).to_have_text("GPU 0: 5.5 GiB alloc · 4.0 GiB reserved · 70.0 GiB / 80.0 GiB used")

    # The readings never counted as executions nor entered the history (silent requests).
    page.wait_for_timeout(2500)  # at least one timed refresh (2 s) in between
    run_code(page, name, "print(get_ipython().execution_count - len(In), len(In))")
    out = page.locator(".jp-OutputArea-output").last
    # The count moves with the history only: In holds '' + the 4 cells run.
    expect(out).to_have_text("0 5")
    assert page_log.console_errors == []


def run_code(page: Page, name: str, source: str) -> None:
    """Append a cell with ``source`` and run it; returns when the kernel is idle again."""
    page.evaluate(APPEND_AND_RUN, [name, source, "notebook:run-cell"])
    wait_for_kernel_idle(page, name)


APPEND_AND_RUN = """
async ([path, source, command]) => {
  const app = window.jupyterapp;
  const w = [...app.shell.widgets('main')].find(w => w.context && w.context.path === path);
  app.shell.activateById(w.id);
  const nb = w.content;
  nb.activeCellIndex = nb.widgets.length - 1;
  await app.commands.execute('notebook:insert-cell-below');
  nb.activeCell.model.sharedModel.setSource(source);
  await app.commands.execute(command);
}
"""

PROFILED = "y = torch.ones(256, 256)"


@pytest.mark.slow
def test_profile_cell_command_toolbar_and_shortcut(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "command.ipynb"
    write_notebook(lab.root_dir, name, ["import torch"])  # jupyter_vram not loaded
    open_notebook(page, lab, name)
    assert run_all_cells(page, name)
    button = page.locator(".jp-NotebookPanel-toolbar [data-jp-item-name='jupyter-vram-profile']")
    expect(button).to_be_visible()

    # The command: the cell runs under %%vram, its text unchanged.
    page.evaluate(APPEND_AND_RUN, [name, PROFILED, "jupyter-vram:profile-cell"])
    wait_for_kernel_idle(page, name)
    output = page.locator(".jp-VramOutput")
    expect(output).to_have_count(1)
    expect(output).to_have_attribute("data-vram-view", "widget", timeout=30_000)
    run_code(page, name, "print(_vram.peak_bytes, In[-2].splitlines()[0])")
    # one float32 tensor of 256 x 256: 4 x 65536 bytes
    expect(page.locator(".jp-OutputArea-output").last).to_contain_text(str(4 * 256 * 256))
    source = page.evaluate(
        "(p) => [...window.jupyterapp.shell.widgets('main')].find(w => w.context && "
        "w.context.path === p).content.widgets[1].model.sharedModel.getSource()",
        name,
    )
    assert source == PROFILED

    # The toolbar button and the shortcut (Alt+Shift+V) do the same on the active cell.
    page.evaluate(APPEND_AND_RUN, [name, "z = torch.ones(128, 128)", "notebook:enter-command-mode"])
    button.click()
    wait_for_kernel_idle(page, name)
    expect(output).to_have_count(2)
    page.evaluate(APPEND_AND_RUN, [name, "w = torch.ones(64)", "notebook:enter-command-mode"])
    page.keyboard.press("Alt+Shift+V")
    expect(output).to_have_count(3, timeout=30_000)
    wait_for_kernel_idle(page, name)
    run_code(page, name, "print(_vram.peak_bytes, _vram.timeline.baseline_bytes)")
    # y, z alive before the cell (float32: 4 bytes each), w added by it
    held = 4 * 256 * 256 + 4 * 128 * 128
    expect(page.locator(".jp-OutputArea-output").last).to_have_text(f"{held + 4 * 64} {held}")
    assert widget_errors(page) == []


def test_settings_are_in_the_settings_editor(lab: Lab) -> None:
    status, _, body = lab.get(
        "lab/api/settings/jupyter-vram:plugin", headers={"Authorization": f"token {lab.token}"}
    )
    assert status == 200
    schema = json.loads(body)["schema"]
    props = schema["properties"]
    assert props["statusBar"]["default"] is True
    assert props["refreshInterval"]["default"] == 2000
    assert schema["jupyter.lab.shortcuts"][0]["command"] == "jupyter-vram:profile-cell"
