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
    change_theme,
    open_notebook,
    output_errors,
    read_notebook,
    run_all_cells,
    save_notebook,
    widget_errors,
    write_notebook,
)
from .test_rerun import kernel_print

pytestmark = pytest.mark.browser

DOCS = Path(__file__).resolve().parents[2] / "docs"
SEP = " \u203a "  # between the names of a path, in tooltips and the breadcrumb

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


TOOLTIP_ROWS = """
() => {
  for (const tip of document.querySelectorAll('.bk-Tooltip')) {
    if (!tip.shadowRoot || !tip.checkVisibility()) continue;
    const content = tip.shadowRoot.querySelector('.bk-tooltip-content');
    if (!content || !content.innerText.trim()) continue;
    const rows = {};
    for (const row of content.querySelectorAll('.bk-tooltip-row-label')) {
      rows[row.innerText.replace(/:\\s*$/, '').trim()] = row.nextElementSibling.innerText.trim();
    }
    for (const e of content.querySelectorAll('[class^="jv-tip-"]')) {
      rows[e.className.slice(7)] = e.innerText.trim();
    }
    for (const e of content.querySelectorAll('[class^="jv-cat-"]')) {
      rows['category ' + e.className.slice(7)] = e.innerText.split(': ').pop().trim();
    }
    return rows;
  }
  return null;
}
"""


def tooltip_at(page: Page, canvas: Locator, x: float, y: float) -> dict[str, str] | None:
    """Hover (x, y) of ``canvas`` and return the rows of the bokeh tooltip that shows there."""
    canvas.hover(position={"x": x, "y": y}, force=True)
    for _ in range(10):
        rows = page.evaluate(TOOLTIP_ROWS)
        if rows:
            return dict(rows)
        page.wait_for_timeout(30)
    return None


def collapse_sidebars(page: Page) -> None:
    """At 1024 px the notebook gets the whole width, as a user would arrange it."""
    page.evaluate("() => { window.jupyterapp.shell.collapseLeft(); "
                  "window.jupyterapp.shell.collapseRight(); }")  # fmt: skip


def flame_blocks(page: Page, canvas: Locator) -> dict[str, tuple[float, float]]:
    """The blocks of the flame graph as its tooltips name them (full path), each with a point
    inside it (relative to the canvas): hover a grid over the canvas."""
    box = canvas.bounding_box()
    assert box is not None
    found: dict[str, tuple[float, float]] = {}
    for fx in (0.02, 0.2, 0.4, 0.55, 0.7, 0.85, 0.97):
        for dy in range(10, int(box["height"]), 13):
            x, y = box["width"] * fx, float(dy)
            rows = tooltip_at(page, canvas, x, y)
            if rows and "block" in rows:
                found.setdefault(rows["block"], (x, y))
    return found


TIMELINE_DATA = """
() => {
  for (const doc of window.Bokeh.documents) {
    for (const m of doc.all_models) {
      const d = m.data;
      if (d !== undefined && d.x_end !== undefined) return [d.x[0], d.x_end[d.x_end.length - 1]];
    }
  }
  return null;
}
"""
# the drawn range [first x, last x_end] lies strictly inside the whole run's (zoomed in)
TIMELINE_REDRAWN = f"""(full) => {{
  const d = ({TIMELINE_DATA})();
  return d !== null && d[0] > full[0] + 1e-6 && d[1] < full[1] - 1e-6;
}}"""
TIMELINE_WHOLE = f"() => {{ const d = ({TIMELINE_DATA})(); return d !== null && d[0] < 1e-6; }}"


def click(canvas: Locator, at: tuple[float, float]) -> None:
    canvas.click(position={"x": at[0], "y": at[1]}, force=True)


def click_block(page: Page, canvas: Locator, at: tuple[float, float], path: str) -> None:
    """Click at ``at`` once the block drawn there is ``path`` (the figure may still be
    redrawing after the previous zoom)."""
    for _ in range(100):
        rows = tooltip_at(page, canvas, *at)
        if rows and rows.get("block") == path:
            click(canvas, at)
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"the block at {at} never showed as {path!r}")


def test_vram_app_in_jupyterlab(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "vram_app.ipynb"
    page.set_viewport_size({"width": 1024, "height": 900})
    write_notebook(lab.root_dir, name, [SETUP, RECORD])
    open_notebook(page, lab, name)
    collapse_sidebars(page)
    assert run_all_cells(page, name), "a cell raised"

    app = page.locator(".jv-app")
    expect(app).to_be_visible(timeout=30_000)
    expect(app.locator(".jv-header-box")).to_contain_text("peak allocated")

    # Flame graph: every block's tooltip gives its full path; a click on a block zooms to
    # exactly that block (the breadcrumb ends at it), at several depths.
    canvas = app.locator(".jv-flame canvas").first
    expect(canvas).to_be_visible(timeout=20_000)
    app.locator(".jv-flame").scroll_into_view_if_needed()
    expect(app.locator(".jv-crumb-path")).to_have_text("all")
    blocks = flame_blocks(page, canvas)
    by_depth: dict[int, list[str]] = {}
    for path in blocks:
        by_depth.setdefault(path.count(SEP), []).append(path)
    assert "all" in blocks and len(by_depth.get(1, [])) >= 2, blocks
    assert by_depth.get(2) and by_depth.get(3), blocks
    targets = [
        *sorted(by_depth[1], key=lambda p: "[backward]" not in p)[:2],
        by_depth[2][0],
        by_depth[3][-1],
    ]
    reset = app.locator(".jv-flame-reset")

    for path in targets:
        reset.click()
        expect(app.locator(".jv-crumb-path")).to_have_text("all")
        click_block(page, canvas, blocks[path], path)
        expect(app.locator(".jv-crumb-path")).to_have_text(path, timeout=10_000)
    # a block clicked in a zoomed view: still exactly that block
    parent = targets[0]
    reset.click()
    click_block(page, canvas, blocks[parent], parent)
    expect(app.locator(".jv-crumb-path")).to_have_text(parent, timeout=10_000)
    inner = flame_blocks(page, canvas)
    deeper = sorted(p for p in inner if p.startswith(parent + SEP) and p.count(SEP) >= 2)
    assert deeper, inner
    click_block(page, canvas, inner[deeper[-1]], deeper[-1])
    expect(app.locator(".jv-crumb-path")).to_have_text(deeper[-1], timeout=10_000)
    app.locator(".jv-flame-up").click()
    expect(app.locator(".jv-crumb-path")).to_have_text(
        SEP.join(deeper[-1].split(SEP)[:-1]), timeout=10_000
    )
    reset.click()
    expect(app.locator(".jv-crumb-path")).to_have_text("all", timeout=10_000)
    legend = app.locator(".jv-flame-view .jv-legend").bounding_box()
    plot = canvas.bounding_box()
    assert legend and plot and legend["y"] >= plot["y"] + plot["height"] - 1  # not over it
    for button in (".jv-flame-up", ".jv-flame-reset"):  # labels not cut to "..."
        text = app.locator(button).inner_text().strip()
        assert text in ("up", "reset"), text
        assert app.locator(button).evaluate("e => e.scrollWidth <= e.clientWidth")

    if os.environ.get("JV_SCREENSHOT"):
        DOCS.mkdir(exist_ok=True)
        page.mouse.move(0, 0)
        page.evaluate("() => document.activeElement && document.activeElement.blur()")
        app.screenshot(path=str(DOCS / "app-flame.png"))

    # Breakdown tab: the stacked bar at the peak draws and the tables name the categories;
    # each table is as tall as its rows (not stretched to its neighbour's height)
    app.locator(".jv-tabs .lm-TabBar-tab", has_text="Breakdown").click()
    expect(app.locator(".jv-breakdown canvas").first).to_be_visible(timeout=20_000)
    expect(app.locator(".jv-breakdown-view")).to_contain_text("optimizer_state")
    stretched = app.locator(".jv-breakdown-view").evaluate(
        """v => [...v.querySelectorAll('table')].filter(t => {
             const rows = [...t.rows].reduce((h, r) => h + r.getBoundingClientRect().height, 0);
             const cap = t.caption ? t.caption.getBoundingClientRect().height : 0;
             return t.getBoundingClientRect().height > rows + cap + 4;
           }).map(t => t.innerText.slice(0, 30))"""
    )
    assert stretched == []

    # Timeline tab: a click anywhere inside the chart picks the moment its tooltip names.
    app.locator(".jv-tabs .lm-TabBar-tab", has_text="Timeline").click()
    chart = app.locator(".jv-timeline canvas").first
    expect(chart).to_be_visible(timeout=20_000)
    expect(app.locator(".jv-moment")).to_contain_text("Live at the peak")
    box = chart.bounding_box()
    assert box is not None
    picked = None
    for fx in (0.3, 0.45, 0.6):
        x, y = box["width"] * fx, box["height"] * 0.6
        picked = tooltip_at(page, chart, x, y)
        if picked and "when" in picked:
            break
    assert picked and "when" in picked and "live" in picked, picked
    click(chart, (x, y))
    moment = app.locator(".jv-moment")
    expect(moment.locator(".jv-moment-title")).to_contain_text("the selected moment")
    expect(moment.locator(".jv-when")).to_have_text(picked["when"])
    assert picked["live"] == "live: " + moment.locator(".jv-moment-total").inner_text()
    # the hover's categories are the moment's category table, byte for byte
    hovered = {k[len("category ") :]: v for k, v in picked.items() if k.startswith("category ")}
    table_rows = moment.locator("table").first.locator("tr").all_inner_texts()
    listed = {
        cells[0].strip(): cells[1].strip()
        for cells in (r.split("\t") for r in table_rows[1:])
        if cells[0].strip() != "total"
    }
    assert hovered and hovered == listed, (hovered, listed)
    # zooming in (the wheel, once its tool is on) redraws the visible range from the kernel:
    # the drawn steps start at the new left edge and end at the new right edge
    full = page.evaluate(TIMELINE_DATA)
    app.locator(".jv-timeline .bk-tool-icon-wheel-zoom").first.click()
    box = chart.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    for _ in range(3):
        page.mouse.wheel(0, -200)
        page.wait_for_timeout(100)
    page.wait_for_function(TIMELINE_REDRAWN, arg=full, timeout=10_000)

    if os.environ.get("JV_SCREENSHOT"):
        page.mouse.move(0, 0)
        page.evaluate("() => document.activeElement && document.activeElement.blur()")
        app.locator(".jv-timeline .bk-tool-icon-reset").first.click()  # the whole run again
        page.wait_for_function(TIMELINE_WHOLE, timeout=10_000)
        page.set_viewport_size({"width": 1024, "height": 1400})
        page.wait_for_timeout(500)
        app.screenshot(path=str(DOCS / "app-timeline.png"))
        page.set_viewport_size({"width": 1024, "height": 900})

    # Top sites: sizes in binary units, the share of the peak, nothing cut but long names.
    app.locator(".jv-tabs .lm-TabBar-tab", has_text="Top sites").click()
    table = app.locator(".jv-sites-table")
    expect(table).to_be_visible(timeout=20_000)
    first = table.locator("tr").nth(1).locator("td")
    assert first.nth(2).inner_text().endswith(("B", "KiB", "MiB", "GiB"))
    assert first.nth(3).inner_text().endswith("%")
    cut = table.evaluate(
        "t => [...t.querySelectorAll('td, td .jv-cut')]"
        ".filter(e => e.scrollWidth > e.clientWidth).map(e => e.innerText)"
    )
    assert cut == [], cut  # at 1024 px nothing is cut: long names wrap, numbers never
    assert table.evaluate("t => t.getBoundingClientRect().right") <= page.viewport_size["width"]

    assert widget_errors(page) == []
    assert page_log.console_errors == []
    assert [m for m in page_log.console_warnings if "jquery" in m.lower()] == []
    assert_all_local(page_log.requests)

    save_notebook(page, name)
    assert output_errors(read_notebook(lab.root_dir, name)) == []


CONTRAST = """
(root) => {
  const parse = (c) => {
    const p = c.match(/rgba?\\(([^)]+)\\)/)[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const background = (e) => {
    for (let n = e; n; n = n.parentElement) {
      const c = parse(getComputedStyle(n).backgroundColor);
      if (c[3] > 0.5) return c;
    }
    return [255, 255, 255, 1];
  };
  const lum = ([r, g, b]) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const out = [];
  for (const e of root.querySelectorAll('td, th, caption, .jv-fact, .jv-legend-item')) {
    const text = e.innerText.trim();
    if (!text || e.offsetParent === null) continue;
    const bg = background(e);
    const [r, g, b, a] = parse(getComputedStyle(e).color);
    const fg = [r * a + bg[0] * (1 - a), g * a + bg[1] * (1 - a), b * a + bg[2] * (1 - a)];
    const [l1, l2] = [lum(fg), lum(bg)];
    out.push([text.slice(0, 40), (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05)]);
  }
  return out;
}
"""

PAGE_BACKGROUND = """
(e) => {
  for (let n = e; n; n = n.parentElement) {
    const c = getComputedStyle(n).backgroundColor;
    const p = c.match(/rgba?\\(([^)]+)\\)/)[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    if (p.length < 4 || p[3] > 0.5) return p.slice(0, 3);
  }
  return [255, 255, 255];
}
"""

#: a CSS colour as a canvas spells it (the theme script writes colours so: the kernel's bokeh
#: refuses some CSS spellings, such as JupyterLab's own 'rgba(0,0,0,.54)')
CANVAS_COLOUR = """
(c) => { const x = document.createElement('canvas').getContext('2d'); x.fillStyle = c;
         return x.fillStyle; }
"""
TEXT2 = f"""
() => ({CANVAS_COLOUR})(getComputedStyle(document.body).getPropertyValue('--jp-ui-font-color2')
  .trim())
"""
FIGURE_COLOURS = """
() => {
  const out = [];
  for (const doc of window.Bokeh.documents) {
    for (const m of doc.all_models) {
      if (m.constructor.__name__ !== 'Figure' && !('below' in m && 'left' in m)) continue;
      for (const axis of [...m.below, ...m.left]) {
        if (axis.major_label_text_color !== undefined) out.push(axis.major_label_text_color);
      }
    }
  }
  return out;
}
"""


def dominant_colour(png: bytes) -> tuple[int, int, int]:
    """The most frequent pixel colour of a screenshot."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    counts = image.getcolors(maxcolors=image.width * image.height)
    assert counts
    return max(counts)[1]  # type: ignore[no-any-return]


def check_contrast(app: Locator, where: str, minimum: float = 4.5) -> None:
    ratios = app.evaluate(CONTRAST)
    assert ratios, f"no text found in {where}"
    poor = [(text, round(r, 2)) for text, r in ratios if r < minimum]
    assert poor == [], f"{where}: text below {minimum}:1 contrast: {poor[:10]}"


MANY_MODULES = """\
%%vram
deep = nn.Sequential(*[nn.Linear(64, 64) for _ in range(30)])  # 30 modules live at the peak
deep(torch.randn(8, 64)).sum().backward()
step()
"""


def test_app_follows_the_dark_theme(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "vram_dark.ipynb"
    page.set_viewport_size({"width": 1024, "height": 900})
    write_notebook(lab.root_dir, name, [SETUP, MANY_MODULES])
    open_notebook(page, lab, name)
    collapse_sidebars(page)
    change_theme(page, light=False)
    assert run_all_cells(page, name), "a cell raised"
    app = page.locator(".jv-app")
    expect(app.locator(".jv-flame canvas").first).to_be_visible(timeout=30_000)
    page_bg = tuple(app.evaluate(PAGE_BACKGROUND))
    assert sum(page_bg) < 3 * 80, page_bg  # a dark page
    check_contrast(app.locator(".jv-header-box"), "header")
    check_contrast(app.locator(".jv-flame-view"), "flame legend")

    for tab, figure in (("Breakdown", ".jv-breakdown"), ("Timeline", ".jv-timeline")):
        app.locator(".jv-tabs .lm-TabBar-tab", has_text=tab).click()
        canvas = app.locator(f"{figure} canvas").first
        expect(canvas).to_be_visible(timeout=20_000)
        page.mouse.move(0, 0)  # no tooltip over the figure
        view = app.locator(f"{figure}-view" if tab == "Breakdown" else ".jv-timeline-view")
        check_contrast(view, tab)
        # the figure is transparent: its most frequent colour is what is behind it (the dark
        # tab panel), not white
        behind = tuple(app.locator(figure).evaluate(PAGE_BACKGROUND))
        assert sum(behind) < 3 * 80, behind
        colour = dominant_colour(app.locator(figure).screenshot())
        assert max(abs(a - b) for a, b in zip(colour, behind, strict=True)) <= 3, (
            tab,
            colour,
            behind,
        )

    # "… N more" under a long table opens its N hidden rows, in the page
    app.locator(".jv-tabs .lm-TabBar-tab", has_text="Breakdown").click()
    modules = app.locator(".jv-group-table", has_text="modules at the peak")
    more = modules.locator("label.jv-more")
    hidden = int(more.inner_text().split()[1])
    assert hidden >= 20
    visible = "t => [...t.querySelectorAll('tr')].filter(r => r.offsetParent !== null).length"
    before = modules.evaluate(visible)
    more.click()
    expect(more).to_be_hidden()
    assert modules.evaluate(visible) == before - 1 + hidden

    # axis labels take the theme's text colour (set by the figures' theme script)
    text2 = page.evaluate(TEXT2)
    colours = page.evaluate(FIGURE_COLOURS)
    assert colours and all(c == text2 for c in colours), (colours, text2)

    # switching the theme while the app is shown re-colours the figures
    change_theme(page, light=True)
    page.wait_for_function(
        f"""() => {{
          const want = ({TEXT2})();
          const got = ({FIGURE_COLOURS})();
          return got.length > 0 && got.every(c => c === want);
        }}""",
        timeout=10_000,
    )
    assert page.evaluate(FIGURE_COLOURS)[0] != text2
    check_contrast(app.locator(".jv-breakdown-view"), "Breakdown, light again")
    change_theme(page, light=False)

    app.locator(".jv-tabs .lm-TabBar-tab", has_text="Top sites").click()
    expect(app.locator(".jv-sites-table")).to_be_visible(timeout=20_000)
    check_contrast(app.locator(".jv-sites-view"), "Top sites")
    app.locator(".jv-tabs .lm-TabBar-tab", has_text="Allocator").click()
    expect(app.locator(".jv-allocator")).to_be_visible(timeout=20_000)
    check_contrast(app.locator(".jv-allocator"), "Allocator")
    if os.environ.get("JV_SCREENSHOT"):
        app.locator(".jv-tabs .lm-TabBar-tab", has_text="Flame graph").click()
        page.mouse.move(0, 0)
        page.wait_for_timeout(500)
        app.screenshot(path=str(DOCS / "app-dark.png"))

    # the theme's colours reached the kernel's figures without an error there (bokeh
    # refused JupyterLab's 'rgba(0,0,0,.54)': a traceback in the kernel, its "last error")
    assert kernel_print(page, name, "import sys; print(hasattr(sys, 'last_value'))") == "False"
    assert widget_errors(page) == []
    assert page_log.console_errors == []
