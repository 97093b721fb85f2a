"""Leaks and CSV export in real JupyterLab: a first optimizer step's state is not listed (the
notebook keeps it), leaks are one row per holder, a later error does not add the notebook's own
frames as holders, Release updates every leak table without Refresh and leaves the optimizer
alone; the top sites, the what-ifs and the leaks download as CSV with the kernel's numbers."""

from __future__ import annotations

import csv
import io

import pytest
from playwright.sync_api import Locator, Page, expect

from .lab import Lab, PageLog, assert_all_local, open_notebook, run_all_cells, write_notebook
from .test_rerun import kernel_print

pytestmark = pytest.mark.browser

SETUP = """\
%load_ext jupyter_vram
import torch
import jupyter_vram as jv
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.Adam(model.parameters())
x = torch.randn(16, 64)
"""
#: a first Adam step (12 state tensors, 4 gradients: the notebook's) and 50 tensors in a list
STEP = """\
%%vram --no-stacks
loss = model(x).sum()
loss.backward()
opt.step()
kept = []
for _ in range(50):
    kept.append(torch.ones(64, 64))
"""
SHOW = "shown = jv.show(_vram)"
ESTIMATE = "%vram_estimate model --input 16x64 --device cpu"
LATER = "raise ValueError('later')"

GONE = "Nothing this cell made is still alive."


def cells(table: Locator) -> list[list[str]]:
    rows = table.locator("tr").all()[1:]  # the header first
    return [[c.inner_text().strip() for c in row.locator("td").all()] for row in rows]


def download_csv(page: Page, link: Locator) -> list[dict[str, str]]:
    with page.expect_download() as info:
        link.click()
    path = info.value.path()
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def test_leaks_and_csv_exports_in_jupyterlab(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "leaks.ipynb"
    write_notebook(lab.root_dir, name, [SETUP, STEP, SHOW, ESTIMATE, LATER])
    open_notebook(page, lab, name)
    assert not run_all_cells(page, name, timeout_ms=120_000), "the last cell should raise"
    apps = page.locator(".jv-app")
    expect(apps).to_have_count(3, timeout=30_000)
    step_app, shown_app, estimate_app = apps.nth(0), apps.nth(1), apps.nth(2)

    # leaks: one row per holder, no optimizer state or gradient, no notebook frame as holder
    step_app.locator(".jv-tabs .lm-TabBar-tab", has_text="Leaks").click()
    table = step_app.locator(".jv-leaks-table")
    expect(table).to_be_visible()
    # bytes, storages, held by, names, release, op, module, site
    rows = cells(table)
    assert [r[:6] for r in rows] == [
        ["800.0 KiB", "50", "variable", "kept", "yes", "ones"],  # 50 x 64 x 64 x 4 B
        ["4 B", "1", "variable", "loss", "yes", "sum"],
    ]
    step_app.locator(".jv-leaks-refresh").click()  # after the later error: the same rows
    expect(table.locator("tr")).to_have_count(3)
    assert cells(table) == rows
    assert kernel_print(page, name, "import sys; print(type(sys.last_value).__name__)") == (
        "ValueError"
    )

    # leaks as CSV: the grouped table with exact bytes
    leaks = download_csv(page, step_app.locator(".jv-leaks-view a.jv-csv"))
    assert [(r["holders"], r["bytes"], r["storages"]) for r in leaks] == [
        ("kept", str(50 * 64 * 64 * 4), "50"),
        ("loss", "4", "1"),
    ]

    # top sites as CSV: the kernel's own top_sites, row for row
    step_app.locator(".jv-tabs .lm-TabBar-tab", has_text="Top sites").click()
    sites = download_csv(page, step_app.locator(".jv-sites-view a.jv-csv"))
    expected = kernel_print(
        page,
        name,
        "print(';'.join(f'{o}={b}' for o, b in zip(_vram.top_sites(200)['op'], "
        "_vram.top_sites(200)['live_at_peak_bytes'])))",
    )
    assert ";".join(f"{r['op']}={r['live_at_peak_bytes']}" for r in sites) == expected

    # what-ifs as CSV, once computed: the first row is the estimate itself, to the byte
    estimate_app.locator(".jv-tabs .lm-TabBar-tab", has_text="Fit & what-ifs").click()
    view = estimate_app.locator(".jv-estimate-view")
    view.locator(".jv-whatif-run").click()
    expect(view.locator(".jv-whatif-status")).to_contain_text("what-ifs (", timeout=120_000)
    what_ifs = download_csv(page, view.locator("a.jv-csv"))
    assert what_ifs[0]["what_if"].startswith("as estimated")
    peak = kernel_print(page, name, "print(_vram_estimate.peak_bytes)")
    assert what_ifs[0]["peak_bytes"] == peak

    # Release: both tables of this profile update at once, no Refresh; the optimizer stays
    shown_app.locator(".jv-tabs .lm-TabBar-tab", has_text="Leaks").click()
    expect(shown_app.locator(".jv-leaks-table tr")).to_have_count(3)
    step_app.locator(".jv-tabs .lm-TabBar-tab", has_text="Leaks").click()
    step_app.locator(".jv-leaks-release").click()
    status = step_app.locator(".jv-leaks-status")
    expect(status).to_contain_text("deleted variable kept")
    expect(status).to_contain_text("deleted variable loss")
    expect(step_app.locator(".jv-leaks")).to_have_text(GONE)
    expect(shown_app.locator(".jv-leaks")).to_have_text(GONE)
    state = "print(sum(len(s) for s in opt.state.values()), 'kept' in globals())"
    assert kernel_print(page, name, state) == "12 False"
    assert_all_local(page_log.requests)
