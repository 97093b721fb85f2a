"""OOM post-mortem and leaks in real JupyterLab: a cell past its --capacity shows the error and
opens on the "Out of memory" tab; a cell that keeps a tensor lists it under "Leaks", and
Release deletes the variable in the kernel."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from .lab import Lab, PageLog, open_notebook, run_all_cells, widget_errors, write_notebook
from .test_rerun import kernel_print

pytestmark = pytest.mark.browser

SETUP = "%load_ext jupyter_vram\nimport torch\n"
#: two leaks of one size from two ops: each row names its own op (tied by address)
LEAK = "%%vram --no-stacks\nkept = torch.ones(512, 512)\nalso = torch.zeros(512, 512)\n"
OOM = "%%vram --no-stacks --capacity 1MiB\nbig = torch.ones(1024, 1024)\n"


def test_oom_and_leaks_in_jupyterlab(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "oom.ipynb"
    write_notebook(lab.root_dir, name, [SETUP, LEAK, OOM])
    open_notebook(page, lab, name)
    assert not run_all_cells(page, name), "the capacity cell should raise"
    apps = page.locator(".jv-app")
    expect(apps).to_have_count(2, timeout=30_000)
    leak_app, oom_app = apps.nth(0), apps.nth(1)

    # the OOM: the notebook shows the error, the app its post-mortem, opened first
    error = page.locator(".jp-OutputArea-output", has_text="Traceback (most recent call last)")
    expect(error).to_have_count(1)
    expect(error).to_contain_text("OutOfMemoryError")
    expect(oom_app.locator(".jv-oom-line")).to_contain_text("Out of memory: 4.0 MiB requested")
    expect(oom_app.locator(".jv-oom")).to_contain_text("Tried to allocate 4.0 MiB")
    expect(oom_app.locator(".jv-oom-suggestions")).to_be_visible()
    # the kernel's last error is still the cell's: nothing the apps did raised there since
    last = "import sys; print(type(sys.last_value).__name__)"
    assert kernel_print(page, name, last) == "OutOfMemoryError"

    # the leak: listed, kept until Release is clicked, then gone from the kernel
    leak_app.locator(".jv-tabs .lm-TabBar-tab", has_text="Leaks").click()
    table = leak_app.locator(".jv-leaks-table")
    # columns: bytes, storages, held by, names, release, op, module, site
    for variable, op in (("kept", "ones"), ("also", "zeros")):
        row = table.locator("tr", has=page.locator("td:nth-child(4)", has_text=variable))
        expect(row).to_have_count(1)
        expect(row.locator("td").nth(0)).to_have_text("1.0 MiB")
        expect(row.locator("td").nth(1)).to_have_text("1")
        expect(row.locator("td").nth(3)).to_have_text(variable)
        expect(row.locator("td").nth(5)).to_have_text(op)
    assert kernel_print(page, name, "print('kept' in globals() and 'also' in globals())") == "True"
    leak_app.locator(".jv-leaks-release").click()
    status = leak_app.locator(".jv-leaks-status")
    expect(status).to_contain_text("deleted variable kept")
    expect(status).to_contain_text("deleted variable also")
    expect(leak_app.locator(".jv-leaks")).to_contain_text("Nothing this cell made is still alive")
    assert kernel_print(page, name, "print('kept' in globals() or 'also' in globals())") == "False"
    assert widget_errors(page) == []
