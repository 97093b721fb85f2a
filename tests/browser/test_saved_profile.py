"""A saved notebook reopened after its kernel shut down shows the saved profile (drawn by the
lab extension from `application/vnd.jupyter-vram.profile+json`), in JupyterLab and Notebook 7:
flame graph with hover and zoom, breakdown and timeline; never "Error displaying widget", never
an endless "Loading widget" / "loading…"; and no BokehJS fetched for it."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

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

pytestmark = pytest.mark.browser

DOCS = Path(__file__).resolve().parents[2] / "docs"
PROFILE_MIME = "application/vnd.jupyter-vram.profile+json"
SEP = " \u203a "

SETUP = """\
%load_ext jupyter_vram
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 10))
x = torch.randn(32, 128)
"""

RECORD = """\
%%vram
loss = model(x).square().mean()
loss.backward()
"""

OUTPUT = ".jp-VramOutput"


def api(lab: Lab, method: str, path: str) -> Any:
    """Call the server's REST API with the token."""
    request = urllib.request.Request(
        f"{lab.url}{path}", method=method, headers={"Authorization": f"token {lab.token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


def shut_down_kernels_of(lab: Lab, name: str) -> int:
    """Shut down the kernels of every session on notebook ``name``; how many there were."""
    sessions = [s for s in api(lab, "GET", "api/sessions") if s["path"].endswith(name)]
    for s in sessions:
        api(lab, "DELETE", f"api/sessions/{s['id']}")
    return len(sessions)


def saved_payload(lab: Lab, name: str) -> dict[str, Any]:
    nb = read_notebook(lab.root_dir, name)
    assert output_errors(nb) == []
    bundles = [o["data"] for o in nb.cells[1].outputs if o.get("output_type") == "display_data"]
    assert len(bundles) == 1, bundles
    assert "application/vnd.jupyter.widget-view+json" in bundles[0]
    payload: dict[str, Any] = bundles[0][PROFILE_MIME]
    return payload


def record_and_close(lab: Lab, page: Page, page_log: PageLog, name: str) -> dict[str, Any]:
    """Run the profiled cell (the live app shows), save, shut the kernel down."""
    write_notebook(lab.root_dir, name, [SETUP, RECORD])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name), "a cell raised"
    output = page.locator(OUTPUT)
    expect(output).to_have_attribute("data-vram-view", "widget", timeout=30_000)
    assert any("/jupyter-vram/bokehjs/" in u for u in page_log.requests), "app without BokehJS"
    save_notebook(page, name)
    assert shut_down_kernels_of(lab, name) == 1
    return saved_payload(lab, name)


def check_saved_view(page: Page, payload: dict[str, Any]) -> None:
    """The saved profile is drawn, answers hover and click, and nothing is broken or pending."""
    output = page.locator(OUTPUT)
    expect(output).to_have_attribute("data-vram-view", "saved", timeout=30_000)
    flame = output.locator(".jp-VramProfile-flame")
    expect(flame).to_be_visible()
    flame_data = payload["flame"]
    peak = flame_data["bytes"][0]
    # Blocks at least 0.1 % of the peak wide are drawn: count them from the saved columns.
    drawn = sum(1 for b in flame_data["bytes"] if b / peak >= 0.001)
    expect(flame.locator(".jp-VramProfile-block")).to_have_count(drawn)

    # The largest block below the root: its tooltip names it and its share of the peak.
    first = flame_data["name"][1]
    block = flame.locator(f".jp-VramProfile-block[data-path='{first}']")
    block.hover()
    tip = flame.locator(".jp-VramProfile-tooltip")
    expect(tip).to_be_visible()
    share = f"{100 * flame_data['bytes'][1] / peak:.1f} % of the peak"
    expect(tip).to_contain_text(share)
    expect(tip.locator(".jp-VramProfile-tipPath")).to_have_text(first)

    # Click zooms: the clicked node spans the whole width, the crumbs lead back.
    if os.environ.get("JV_SCREENSHOT") and page.url.split("?")[0].count("/lab/"):
        output.screenshot(path=str(DOCS / "saved-profile.png"))
    block.click()
    expect(flame).to_have_attribute("data-zoom", first)
    box = flame.locator(".jp-VramProfile-flameCanvas").bounding_box()
    zoomed = flame.locator(f".jp-VramProfile-block[data-path='{first}']").bounding_box()
    assert box is not None and zoomed is not None
    assert abs(zoomed["width"] - box["width"]) <= 2
    flame.locator(".jp-VramProfile-crumb", has_text="all").click()
    expect(flame).to_have_attribute("data-zoom", "")

    # Breakdown: one bar part per non-empty category, in the saved order.
    cats = [c for c, b in zip(payload["categories"], payload["breakdown"], strict=True) if b]
    parts = output.locator(".jp-VramProfile-barPart")
    assert parts.evaluate_all("ps => ps.map(p => p.dataset.category)") == cats
    # Timeline: one area per category that was ever non-zero.
    areas = output.locator(".jp-VramProfile-timelineChart path[data-category]")
    assert sorted(areas.evaluate_all("ps => ps.map(p => p.dataset.category)")) == sorted(
        payload["timeline"]["by_category"]
    )
    text = output.inner_text()
    assert "loading" not in text.lower()
    assert widget_errors(page) == []


def test_saved_profile_in_jupyterlab_and_notebook7(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "saved.ipynb"
    payload = record_and_close(lab, page, page_log, name)
    log_start = len(page_log.requests)
    # Reopen: JupyterLab starts a new kernel, which does not hold the app's widgets.
    open_notebook(page, lab, name)
    check_saved_view(page, payload)
    reopened = page_log.requests[log_start:]
    assert [u for u in reopened if "/jupyter-vram/bokehjs/" in u] == []
    # The same file in Notebook 7 (in the test extra; served by the same server).
    page.goto(lab.lab_url(f"notebooks/{name}"), wait_until="domcontentloaded")
    check_saved_view(page, payload)
    assert page.evaluate("() => document.body.dataset.notebook") == "notebooks"
    assert_all_local(page_log.requests)


@pytest.mark.slow
def test_reload_with_live_kernel_shows_the_app_again(
    lab: Lab, page: Page, page_log: PageLog
) -> None:
    """A page reloaded while the kernel still runs gets the live app back (the kernel still
    holds its widgets; ipywidgets restores them), not the saved profile."""
    name = "reload_live.ipynb"
    write_notebook(lab.root_dir, name, [SETUP, RECORD])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name), "a cell raised"
    output = page.locator(OUTPUT)
    expect(output).to_have_attribute("data-vram-view", "widget", timeout=30_000)
    save_notebook(page, name)
    page.goto(lab.lab_url(f"lab/tree/{name}"), wait_until="domcontentloaded")
    expect(output).to_have_attribute("data-vram-view", "widget", timeout=30_000)
    expect(output.locator(".jp-VramProfile")).to_have_count(0)
    assert widget_errors(page) == []
    assert shut_down_kernels_of(lab, name) == 1


def test_notebook_from_elsewhere_shows_the_saved_profile(
    lab: Lab, page: Page, page_log: PageLog
) -> None:
    """A notebook made elsewhere (unsigned, so untrusted; its widget unknown to any kernel
    here), as one downloaded from GitHub: the saved profile, with a kernel running."""
    import nbformat
    import torch

    import jupyter_vram as jv
    from jupyter_vram._render.mime import profile_payload

    with jv.record(device="cpu") as rec:
        kept = torch.ones(256, 256)
    payload = profile_payload(rec.profile)
    del kept
    name = "from_elsewhere.ipynb"
    path = write_notebook(lab.root_dir, name, ["%%vram\nkept = torch.ones(256, 256)"])
    nb = read_notebook(lab.root_dir, name)
    widget = {"model_id": "0123456789abcdef", "version_major": 2, "version_minor": 0}
    nb.cells[0].outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={
                "application/vnd.jupyter.widget-view+json": widget,
                PROFILE_MIME: payload,
                "text/plain": "jupyter_vram profile",
            },
        )
    ]
    nbformat.write(nb, path)
    open_notebook(page, lab, name)
    check_saved_view(page, payload)
    # 4 x 65536 bytes, the one tensor the cell made: the header says so
    expect(page.locator(".jp-VramProfile-facts")).to_contain_text("256.0 KiB")
    assert [u for u in page_log.requests if "/jupyter-vram/bokehjs/" in u] == []
