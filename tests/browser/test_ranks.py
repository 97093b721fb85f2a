"""`%%vram --nproc 2` in real JupyterLab: two real ranks (gloo), the imbalance line, the
peaks side by side, and the rank selector switching the profile app below."""

from __future__ import annotations

import contextlib

import pytest
from playwright.sync_api import Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from .lab import (
    Lab,
    PageLog,
    assert_all_local,
    open_notebook,
    read_notebook,
    run_all_cells,
    save_notebook,
    widget_errors,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # two real ranks start in the kernel

SETUP = "%load_ext jupyter_vram\n"

# rank 0 holds 1 MiB, rank 1 holds 4 MiB (262,144 and 1,048,576 float32 elements)
RANKS = """\
%%vram --nproc 2 --no-stacks
import torch, torch.distributed as dist

def main():
    x = torch.ones(262_144 * (1 + 3 * dist.get_rank()))
    dist.all_reduce(x[:1000])
"""


def test_rank_selector_and_side_by_side_peaks(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "ranks.ipynb"
    page.set_viewport_size({"width": 1024, "height": 900})
    write_notebook(lab.root_dir, name, [SETUP, RANKS])
    open_notebook(page, lab, name)
    ran = run_all_cells(page, name, timeout_ms=120_000)
    if ran:  # the app appears once the lab extension has loaded BokehJS for it
        with contextlib.suppress(PlaywrightTimeout):
            page.locator(".jv-ranks-app").first.wait_for(timeout=60_000)
    if not ran or page.locator(".jv-ranks-app").count() == 0:
        save_notebook(page, name)
        cells = read_notebook(lab.root_dir, name).cells
        outputs = [o for c in cells for o in c.get("outputs", [])]
        raise AssertionError(f"the cells did not show the ranks app: {outputs}")

    app = page.locator(".jv-ranks-app")
    expect(app).to_be_visible(timeout=30_000)
    expect(app.locator(".jv-ranks-summary")).to_contain_text(
        "rank 1 peaks 3.0 MiB above the others"
    )
    bars = app.locator(".jv-rank-peak")
    expect(bars).to_have_count(2)
    expect(bars.nth(0)).to_contain_text("rank 0")
    expect(bars.nth(0)).to_contain_text("1.0 MiB")
    expect(bars.nth(1)).to_contain_text("rank 1")
    expect(bars.nth(1)).to_contain_text("4.0 MiB")
    # side by side: the two bars are drawn 1 : 4
    widths = [bars.nth(i).locator(".jv-rank-bar").bounding_box() for i in (0, 1)]
    assert widths[0] and widths[1]
    assert widths[1]["width"] / widths[0]["width"] == pytest.approx(4.0, rel=0.05)
    # the highest rank is marked
    expect(app.locator(".jv-rank-peak.jv-rank-top")).to_have_attribute("data-rank", "1")

    # the selector shows rank 0's app first, then rank 1's
    header = app.locator(".jv-rank-detail .jv-header-box")
    expect(header).to_contain_text("1.0 MiB", timeout=20_000)
    app.locator(".jv-rank-select button", has_text="rank 1").click()
    expect(header).to_contain_text("4.0 MiB", timeout=20_000)
    expect(app.locator(".jv-rank-diff")).to_contain_text("3.0 MiB")

    assert widget_errors(page) == [], page_log.console_errors
    assert_all_local(page_log.requests)
