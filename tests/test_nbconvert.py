"""`jupyter nbconvert --to html` of an executed notebook shows the static report: the SVG
flame graph and the breakdown, with numbers checked by hand arithmetic.

The notebook runs in a real kernel (nbclient) and is saved the way JupyterLab saves it by
default: without widget state (JupyterLab's "Save widget state automatically" is off), so
nbconvert shows the output's text/html. tests/browser/test_nbconvert.py opens the same HTML
in chromium with JavaScript disabled.
"""

from __future__ import annotations

import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from jupyter_vram._render.figures import CRUMB_SEP
from jupyter_vram._units import format_bytes

IN, HIDDEN, OUT, BATCH, FP32 = 1024, 2048, 10, 256, 4
LINEAR0_PARAMS = FP32 * (IN * HIDDEN + HIDDEN)  # weight + bias, alive before the cell
LINEAR2_PARAMS = FP32 * (HIDDEN * OUT + OUT)
X_BYTES = FP32 * BATCH * IN
HIDDEN_BYTES = FP32 * BATCH * HIDDEN  # Linear 0's output, and ReLU's
# the peak: right after ReLU's output, while Linear 0's output is still alive (ReLU's
# backward keeps only its own result, so Linear 0's output goes when ReLU returns)
PEAK = LINEAR0_PARAMS + LINEAR2_PARAMS + X_BYTES + 2 * HIDDEN_BYTES
LINEAR0_AT_PEAK = LINEAR0_PARAMS + HIDDEN_BYTES  # its weights and its output

CELLS = [
    "%load_ext jupyter_vram",
    "import torch\n"
    "model = torch.nn.Sequential(\n"
    f"    torch.nn.Linear({IN}, {HIDDEN}), torch.nn.ReLU(), torch.nn.Linear({HIDDEN}, {OUT})\n"
    ")\n"
    f"x = torch.randn({BATCH}, {IN})",
    "%%vram\nout = model(x)",
]


def executed_html(
    folder: Path, *, store_widget_state: bool = False, cells: list[str] = CELLS
) -> Path:
    """Run the notebook in a kernel, save it (without widget state unless asked: nbclient's
    default stores it), convert it with the ``jupyter nbconvert --to html`` command; the
    HTML's path."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(
        nb, timeout=300, kernel_name="python3", store_widget_state=store_widget_state,
        resources={"metadata": {"path": str(folder)}},
    ).execute()  # fmt: skip
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    path = folder / "profiled.ipynb"
    nbformat.write(nb, path)
    done = subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "html", str(path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return path.with_suffix(".html")


def recorded_html(folder: Path, theme: str = "light") -> Path:
    """The same cell recorded in this process (no kernel: seconds, not a minute), its output
    bundle saved in a notebook without widget state and converted by nbconvert's HTML
    exporter (``theme``: its light or dark theme); the HTML's path. For the browser tests,
    which check the drawing, not the run."""
    import nbformat
    import torch
    from nbconvert import HTMLExporter

    import jupyter_vram as jv
    from jupyter_vram._app import ProfileApp

    model = torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT)
    )
    x = torch.randn(BATCH, IN)
    with jv.record(namespace={"model": model, "x": x}) as rec:
        model(x)
    bundle = ProfileApp(rec.profile)._repr_mimebundle_()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.cells[2].outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    page, _ = HTMLExporter(theme=theme).from_notebook_node(nb)
    path = folder / f"recorded-{theme}.html"
    path.write_text(page, encoding="utf-8")
    return path


class SvgParts(HTMLParser):
    """Every block of the flame graphs and every part of the category bars in a page: their
    attributes and <title> (nbconvert rewrites the HTML: quotes and attribute order change)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[dict[str, Any]] = []
        self._title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg" and a.get("class") in ("jvs-block", "jvs-part"):
            self.parts.append({**a, "title": ""})
        self._title = tag == "title" and bool(self.parts)

    def handle_endtag(self, tag: str) -> None:
        self._title = False

    def handle_data(self, data: str) -> None:
        if self._title and not self.parts[-1]["title"]:
            self.parts[-1]["title"] = data


def svg_parts(page: str, kind: str) -> list[dict[str, Any]]:
    parser = SvgParts()
    parser.feed(page)
    return [p for p in parser.parts if p["class"] == kind]


def fraction(percent: str) -> float:
    assert percent.endswith("%")
    return float(percent[:-1]) / 100


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> str:
    return executed_html(tmp_path_factory.mktemp("nbconvert")).read_text(encoding="utf-8")


@pytest.mark.slow
def test_nbconvert_html_shows_the_flame_graph_of_the_module_holding_most(page: str) -> None:
    blocks = svg_parts(page, "jvs-block")
    paths = [tuple(b["title"].split("\n")[0].split(CRUMB_SEP)) for b in blocks]
    # the root's width is the peak; the modules of the Sequential are its children
    root = blocks[paths.index(("all",))]
    assert fraction(root["width"]) == 1.0
    assert f"({PEAK:,} B)" in root["title"]
    modules = [(p, b) for p, b in zip(paths, blocks, strict=True) if p[:2] == ("all", "Sequential")]
    level = [(p, b) for p, b in modules if len(p) == 3]
    widest_path, widest = max(level, key=lambda pb: fraction(pb[1]["width"]))
    assert widest_path == ("all", "Sequential", "0: Linear")
    assert fraction(widest["width"]) == pytest.approx(LINEAR0_AT_PEAK / PEAK, abs=1e-5)
    assert f"{format_bytes(LINEAR0_AT_PEAK)} ({LINEAR0_AT_PEAK:,} B)" in widest["title"]
    relu = dict(level)[("all", "Sequential", "1: ReLU")]
    assert fraction(relu["width"]) == pytest.approx(HIDDEN_BYTES / PEAK, abs=1e-5)
    assert fraction(relu["x"]) == pytest.approx(LINEAR0_AT_PEAK / PEAK, abs=1e-5)


@pytest.mark.slow
def test_nbconvert_html_shows_the_breakdown(page: str) -> None:
    assert f"At the peak: {format_bytes(PEAK)}" in page
    bar = svg_parts(page, "jvs-part")
    assert bar[0]["x"] == "0%"  # the first part of the bar: parameters
    params = LINEAR0_PARAMS + LINEAR2_PARAMS
    assert fraction(bar[0]["width"]) == pytest.approx(params / PEAK, abs=1e-5)
    assert bar[0]["title"].startswith(f"parameter: {format_bytes(params)} ({params:,} B")
    assert sum(fraction(p["width"]) for p in bar) == pytest.approx(1.0, abs=1e-4)
    assert "Top allocation sites" in page and "Top modules at the peak" in page
    report = page[page.index("data-jupyter-vram-report") :]
    report = report[: report.index("Static view, saved with the notebook")]
    assert "<script" not in report


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


@pytest.mark.slow
def test_nbclient_with_widget_state_stored_then_nbconvert_shows_the_report(
    tmp_path: Path,
) -> None:
    """nbclient's default (papermill's too) saves widget state, and nbconvert draws the widget
    view of any output whose model is in it: for the app, a page that needs widget JavaScript
    from the internet. The app's model is not in the saved state, so the page holds the static
    report (the flame graph's SVG naming the model's modules), and a widget of the user's is
    still saved and drawn as a widget."""
    import json

    import nbformat

    cells = [*CELLS, "import ipywidgets\nipywidgets.IntSlider(value=3)"]
    html_path = executed_html(tmp_path, store_widget_state=True, cells=cells)
    nb = nbformat.read(html_path.with_suffix(".ipynb"), as_version=4)
    state = nb.metadata["widgets"][WIDGET_STATE]["state"]
    (app_output,) = [o for o in nb.cells[2].outputs if WIDGET_VIEW in o.get("data", {})]
    app_model = app_output["data"][WIDGET_VIEW]["model_id"]
    (slider_output,) = [o for o in nb.cells[3].outputs if WIDGET_VIEW in o.get("data", {})]
    slider_model = slider_output["data"][WIDGET_VIEW]["model_id"]
    assert state[slider_model]["model_name"] == "IntSliderModel"
    assert app_model not in state
    page = html_path.read_text(encoding="utf-8")
    blocks = svg_parts(page, "jvs-block")
    paths = {tuple(b["title"].split("\n")[0].split(CRUMB_SEP)) for b in blocks}
    for child in ("0: Linear", "1: ReLU", "2: Linear"):
        assert ("all", "Sequential", child) in paths
    root = next(b for b in blocks if b["title"].split("\n")[0] == "all")
    assert f"({PEAK:,} B)" in root["title"]
    # the page draws the slider as a widget, and nothing of the app needs JavaScript
    views = [json.loads(v) for v in _script_bodies(page, WIDGET_VIEW)]
    assert [v["model_id"] for v in views] == [slider_model]
    report = page[page.index("data-jupyter-vram-report") :]
    report = report[: report.index("Static view, saved with the notebook")]
    assert "<script" not in report


def _script_bodies(page: str, kind: str) -> list[str]:
    """The text of every ``<script type=kind>`` in a page."""
    bodies = []
    start = 0
    opening = f'<script type="{kind}">'
    while (at := page.find(opening, start)) >= 0:
        end = page.index("</script>", at)
        bodies.append(page[at + len(opening) : end].strip())
        start = end
    return bodies
