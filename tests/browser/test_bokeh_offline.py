"""Bokeh figures in ipywidgets render in real JupyterLab with no internet and no inline BokehJS.

BokehJS must come, once per page, from the jupyter_vram server extension, not from a CDN and
not inlined into the notebook's outputs. The jupyter-vram lab extension loads it lazily, when
the first jupyter_vram output shows its app; from then on any jupyter_bokeh widget renders.
Another BokehJS already on the page is not replaced: a different minor version is reported.
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
    wait_for_kernel_idle,
    widget_errors,
    write_notebook,
)

pytestmark = pytest.mark.browser

PROFILE = """\
%load_ext jupyter_vram
import torch
"""

RECORD = """\
%%vram
t = torch.ones(1000)
"""

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

APPEND_AND_RUN = """
async ([path, source]) => {
  const app = window.jupyterapp;
  const w = [...app.shell.widgets('main')].find(w => w.context && w.context.path === path);
  app.shell.activateById(w.id);
  const nb = w.content;
  nb.activeCellIndex = nb.widgets.length - 1;
  await app.commands.execute('notebook:insert-cell-below');
  nb.activeCell.model.sharedModel.setSource(source);
  await app.commands.execute('notebook:run-cell');
}
"""

SCRIPTS = ["bokeh.min.js", "bokeh-gl.min.js", "bokeh-widgets.min.js", "bokeh-tables.min.js"]

MAX_OUTPUT_BYTES = 100_000
"""Inline BokehJS would be ~2 MB per output; a widget view reference is a few hundred bytes."""


def test_bokeh_model_renders_offline(lab: Lab, page: Page, page_log: PageLog) -> None:
    name = "bokeh_offline.ipynb"
    write_notebook(lab.root_dir, name, [PROFILE, RECORD])
    open_notebook(page, lab, name)
    assert run_all_cells(page, name), "a cell raised"
    expect(page.locator(".jp-VramOutput")).to_have_attribute("data-vram-view", "widget")
    # Once the app has loaded BokehJS, any jupyter_bokeh widget renders.
    page.evaluate(APPEND_AND_RUN, [name, FIGURE_AND_TABLE])
    wait_for_kernel_idle(page, name)

    figure_canvas = page.locator(".vram-test-figure canvas").first
    figure_canvas.scroll_into_view_if_needed(timeout=20_000)
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
    assert info["conflict"] is None
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
    size = output_size(nb.cells[2])
    assert 0 < size < MAX_OUTPUT_BYTES, size


CONFLICT_SETUP = """\
%load_ext jupyter_vram
from IPython.display import Javascript
Javascript("window.Bokeh = {version: '2.4.3'}")
"""


def test_other_bokehjs_on_the_page_is_kept_and_reported(
    lab: Lab, page: Page, page_log: PageLog
) -> None:
    """A BokehJS of another minor version (as panel or output_notebook() would load) stays;
    the output says what conflicts, and the console warns with both versions."""
    name = "bokeh_conflict.ipynb"
    write_notebook(lab.root_dir, name, [CONFLICT_SETUP, RECORD])
    open_notebook(page, lab, name)
    run_all_cells(page, name)
    note = page.locator(".jp-VramOutput-conflict")
    expect(note).to_contain_text("BokehJS 2.4.3 is already on this page")
    expect(note).to_contain_text(f"the kernel's bokeh is {bokeh.__version__}")
    assert page.evaluate("() => window.Bokeh.version") == "2.4.3"
    info = page.evaluate("async () => await window.jupyterVramBokehJS")
    assert info["source"] == "page"
    scripts = [u for u in page_log.requests if "/jupyter-vram/bokehjs/" in u]
    assert [urlsplit(u).path.rsplit("/", 1)[-1] for u in scripts] == ["manifest.json"]
    assert any("BokehJS 2.4.3" in w for w in page_log.console_warnings)


INJECT_BOKEHJS = """
async () => {
  const base = new URL('jupyter-vram/bokehjs/', document.baseURI.replace(/lab.*$/, ''));
  const manifest = await (await fetch(new URL('manifest.json', base))).json();
  await Promise.all(manifest.files.map(f => new Promise((ok, fail) => {
    const s = document.createElement('script');
    s.src = new URL(f.name + '?v=' + f.hash, base).href;
    s.async = false; s.onload = ok; s.onerror = fail;
    document.head.appendChild(s);
  })));
  return window.Bokeh.version;
}
"""


@pytest.mark.slow
def test_same_version_bokehjs_on_the_page_is_used(lab: Lab, page: Page, page_log: PageLog) -> None:
    """A BokehJS of the same version already in the page (as another library would load it)
    is used as it is: no second copy, no note, and the app's figures draw with it."""
    name = "bokeh_shared.ipynb"
    write_notebook(lab.root_dir, name, [PROFILE, RECORD])
    open_notebook(page, lab, name)
    assert page.evaluate(INJECT_BOKEHJS) == bokeh.__version__
    assert run_all_cells(page, name), "a cell raised"
    output = page.locator(".jp-VramOutput")
    expect(output).to_have_attribute("data-vram-view", "widget", timeout=30_000)
    expect(output.locator("canvas").first).to_be_visible(timeout=20_000)
    info = page.evaluate("async () => await window.jupyterVramBokehJS")
    assert info == {"version": bokeh.__version__, "source": "page", "urls": [], "conflict": None}
    expect(page.locator(".jp-VramOutput-conflict")).to_have_count(0)
    scripts = [
        urlsplit(u).path.rsplit("/", 1)[-1]
        for u in page_log.requests
        if "/jupyter-vram/bokehjs/" in u and not u.split("?")[0].endswith("manifest.json")
    ]
    assert sorted(scripts) == sorted(SCRIPTS)  # each once: the page's copy only
    assert widget_errors(page) == []
