"""The app's hover tooltips follow JupyterLab's theme: in the dark theme a tooltip is a dark
box with light text (bokeh draws its tooltips white on its own), in the light theme a light
one, and the text reads at 4.5:1 contrast in both."""

from __future__ import annotations

import pytest
from playwright.sync_api import Locator, Page, expect

from .lab import (
    Lab,
    PageLog,
    change_theme,
    open_notebook,
    run_all_cells,
    widget_errors,
    write_notebook,
)
from .test_app import RECORD, SETUP, collapse_sidebars

pytestmark = pytest.mark.browser

#: The visible bokeh tooltip's box colour, its text colour and the contrast between them.
TOOLTIP_COLOURS = """
() => {
  const parse = (c) => {
    const p = c.match(/rgba?\\(([^)]+)\\)/)[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const lum = ([r, g, b]) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  for (const tip of document.querySelectorAll('.bk-Tooltip')) {
    if (!tip.shadowRoot || !tip.checkVisibility()) continue;
    const value = tip.shadowRoot.querySelector('.bk-tooltip-content');
    if (!value || !value.innerText.trim()) continue;
    const bg = parse(getComputedStyle(tip).backgroundColor);
    const fg = parse(getComputedStyle(value).color);
    const [l1, l2] = [lum(fg), lum(bg)];
    const contrast = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
    return {background: bg, text: fg, contrast};
  }
  return null;
}
"""


def tooltip_colours(page: Page, canvas: Locator) -> dict[str, object]:
    """Hover the flame graph until a tooltip shows; its colours."""
    box = canvas.bounding_box()
    assert box is not None
    for fx in (0.5, 0.3, 0.7, 0.1, 0.9):
        canvas.hover(position={"x": box["width"] * fx, "y": 10}, force=True)
        for _ in range(20):
            found = page.evaluate(TOOLTIP_COLOURS)
            if found:
                return dict(found)
            page.wait_for_timeout(50)
    raise AssertionError("no tooltip showed over the flame graph")


def test_tooltips_follow_the_theme(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "vram_tooltips.ipynb"
    page.set_viewport_size({"width": 1024, "height": 900})
    write_notebook(lab.root_dir, name, [SETUP, RECORD])
    open_notebook(page, lab, name)
    collapse_sidebars(page)
    change_theme(page, light=False)
    assert run_all_cells(page, name), "a cell raised"
    canvas = page.locator(".jv-app .jv-flame canvas").first
    expect(canvas).to_be_visible(timeout=30_000)

    dark = tooltip_colours(page, canvas)
    background = dark["background"]
    assert isinstance(background, list) and sum(background[:3]) < 3 * 80, dark  # not white
    assert background[3] > 0.5, dark  # a box, not a see-through one
    assert float(dark["contrast"]) >= 4.5, dark  # type: ignore[arg-type]

    page.mouse.move(0, 0)
    change_theme(page, light=True)
    light = tooltip_colours(page, canvas)
    background = light["background"]
    assert isinstance(background, list) and sum(background[:3]) > 3 * 200, light
    assert float(light["contrast"]) >= 4.5, light  # type: ignore[arg-type]
    assert widget_errors(page) == []
    assert page_log.console_errors == []
