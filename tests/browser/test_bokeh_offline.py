"""Bokeh figures in ipywidgets render in real JupyterLab with no internet and no inline BokehJS.

BokehJS must come, once per page, from the jupyter_vram server extension (loaded by the
jupyter-vram lab extension), not from a CDN and not inlined into the notebook's outputs.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import bokeh
import pytest
from playwright.sync_api import Page, expect

from .lab import (
    Lab,
    PageLog,
    assert_all_local,
    open_notebook,
    output_errors,
    output_size,
    read_notebook,
    run_all_cells,
    save_notebook,
    widget_errors,
    write_notebook,
)

pytestmark = pytest.mark.browser

FIGURE_AND_TABLE = """\
from bokeh.models import ColumnDataSource, DataTable, HoverTool, TableColumn
from bokeh.plotting import figure
from ipywidgets import VBox
from jupyter_bokeh import BokehModel

data = dict(x=[1, 2, 3], y=[2, 2, 2], h=[4, 4, 4], name=["alpha", "beta", "gamma"])
fig = figure(width=420, height=300, tools="", toolbar_location=None)
fig.rect("x", "y", 0.9, "h", source=ColumnDataSource(data))
fig.add_tools(HoverTool(tooltips=[("name", "@name")]))
columns = [TableColumn(field="name", title="name"), TableColumn(field="h", title="MiB")]
table = DataTable(source=ColumnDataSource(data), columns=columns, width=420, height=140)

fig_widget = BokehModel(fig)
fig_widget.add_class("vram-test-figure")
table_widget = BokehModel(table)
table_widget.add_class("vram-test-table")
VBox([fig_widget, table_widget])
"""

SCRIPTS = ["bokeh.min.js", "bokeh-gl.min.js", "bokeh-widgets.min.js", "bokeh-tables.min.js"]

MAX_OUTPUT_BYTES = 100_000
"""Inline BokehJS would be ~2 MB per output; a widget view reference is a few hundred bytes."""


def test_bokeh_model_renders_offline(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "bokeh_offline.ipynb"
    write_notebook(lab.root_dir, name, [FIGURE_AND_TABLE])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name), "a cell raised"

    figure_canvas = page.locator(".vram-test-figure canvas").first
    expect(figure_canvas).to_be_visible(timeout=20_000)
    expect(page.locator(".vram-test-table .slick-cell", has_text="beta")).to_be_visible()

    # The hover tool answers: its tooltip (attached to the page body) names the middle rect.
    box = figure_canvas.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    expect(page.locator(".bk-Tooltip", has_text="beta").first).to_be_visible()

    assert widget_errors(page) == []
    assert page_log.console_errors == []

    # BokehJS came once from the server extension, at the Python bokeh's version.
    info = page.evaluate("async () => await window.jupyterVramBokehJS")
    assert info["source"] == "server"
    assert info["version"] == bokeh.__version__
    served = [
        urlsplit(u).path.rsplit("/", 1)[-1]
        for u in page_log.requests
        if "/jupyter-vram/bokehjs/" in u
    ]
    assert sorted(served) == sorted(["manifest.json", *SCRIPTS])
    other_bokehjs = [
        u
        for u in page_log.requests
        if "/jupyter-vram/bokehjs/" not in u
        and re.fullmatch(r"bokeh.*\.js", urlsplit(u).path.rsplit("/", 1)[-1])
    ]
    assert other_bokehjs == [], "BokehJS loaded from somewhere else too"
    assert_all_local(page_log.requests)
    assert page_log.failed_requests == []

    # The saved output is a widget reference, not megabytes of inline JavaScript.
    save_notebook(page, name)
    nb = read_notebook(lab.root_dir, name)
    assert output_errors(nb) == []
    size = output_size(nb.cells[0])
    assert 0 < size < MAX_OUTPUT_BYTES, size
