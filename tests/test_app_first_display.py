"""What the app's first display builds: each widget sent once, in its final state; one
placeholder for every unopened tab (closed once the last one opens); the module tree computed
once for the flame graph and the saved profile; and the static report's click-to-zoom aimed
at the blocks."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from bokeh.models import ColumnDataSource, Quad, TapTool

import jupyter_vram as jv
from jupyter_vram._analysis import flame as flame_module
from jupyter_vram._app import ProfileApp
from jupyter_vram._render.figures import flame_figure, flame_layout, flame_tap_zoom

from .conftest import MLP, ipython_shell


def record_step() -> jv.Profile:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.Adam(model.parameters())
    with jv.record() as rec:
        model(torch.randn(16, 256)).sum().backward()
        opt.step()
    return rec.profile


@pytest.fixture(scope="module")
def profile() -> jv.Profile:
    return record_step()


def test_unopened_tabs_share_one_placeholder_closed_with_the_last(profile: jv.Profile) -> None:
    app = ProfileApp(profile)
    tabs = list(app.tabs.children)
    placeholder = tabs[1]
    assert len(tabs) >= 5
    assert all(tab is placeholder for tab in tabs[1:])  # the flame graph (tab 0) is built
    for index in range(1, len(tabs)):
        assert placeholder.comm is not None, f"closed while tab {index} still shows it"
        opened = app.open_tab(index)
        assert opened is not placeholder and app.tabs.children[index] is opened
    assert placeholder not in app.tabs.children
    assert placeholder.comm is None  # closed: ipywidgets would keep it for the kernel's life
    assert placeholder.layout.comm is not None  # the kernel's shared one: other apps show it


def test_display_computes_the_module_tree_once(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = record_step()  # fresh: no tree computed for it yet
    calls: list[tuple[Any, ...]] = []
    real = flame_module.flame_tree

    def counted(*args: Any, **kwargs: Any) -> flame_module.FlameNode:
        calls.append(args[1:])
        return real(*args, **kwargs)

    monkeypatch.setattr(flame_module, "flame_tree", counted)
    app = ProfileApp(profile)
    bundle = app._repr_mimebundle_()
    assert bundle is not None
    assert calls == [("module", "peak")]  # the flame graph's, reused by the saved profile


def test_report_click_selects_the_blocks(profile: jv.Profile) -> None:
    tree = flame_module.flame_tree(profile, "module", "peak")
    layout = flame_layout(tree, profile.peak_bytes)
    source = ColumnDataSource(layout.data)
    fig = flame_figure(source, layout.depth, title="t", legend=True)
    flame_tap_zoom(source, fig)
    taps = [tool for tool in fig.toolbar.tools if isinstance(tool, TapTool)]
    assert len(taps) == 1
    (renderer,) = taps[0].renderers
    assert isinstance(renderer.glyph, Quad)  # not the labels, not a legend swatch
    assert renderer.data_source is source


def test_first_display_sends_each_widget_once(
    profile: jv.Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every widget opens with its final state (classes, titles, text, the first tab):
    no update message follows while the app is made, and no widget is made to be thrown
    away."""
    import ipywidgets as w

    opened: list[int] = []
    updates: list[Any] = []
    open_comm, send = w.Widget.open, w.Widget._send

    def record_open(self: Any) -> None:
        if self.comm is None:
            opened.append(id(self))
        open_comm(self)

    def record_send(self: Any, msg: Any, buffers: Any = None) -> None:
        updates.append(msg)
        send(self, msg, buffers)

    ProfileApp(profile)  # the kernel's shared styles and layouts are made by the first app
    monkeypatch.setattr(w.Widget, "open", record_open)
    monkeypatch.setattr(w.Widget, "_send", record_send)
    already_open = {id(one) for one in w.widgets.widget._instances.values()}
    app = ProfileApp(profile)
    assert updates == []
    assert set(opened) == reachable_widgets(app) - already_open
    assert len(opened) == len(set(opened))


def reachable_widgets(root: Any) -> set[int]:
    """Ids of the widgets ``root`` shows: itself, children, layouts, styles, recursively."""
    return set(tree(root))


def tree(root: Any) -> dict[int, Any]:
    """The widgets ``root`` shows (itself, children, layouts, styles, recursively), by id."""
    import ipywidgets as w

    seen: dict[int, Any] = {}
    todo = [root]
    while todo:
        widget = todo.pop()
        if not isinstance(widget, w.Widget) or id(widget) in seen:
            continue
        seen[id(widget)] = widget
        for name in widget.keys:
            value = getattr(widget, name)
            todo.extend(value if isinstance(value, (list, tuple)) else [value])
    return seen


def test_apps_share_the_styles_and_layouts_that_never_change() -> None:
    """Each style and layout is a widget: a message when an app opens and another when a
    re-run closes it. Look-alike ones are one widget for the whole kernel; the rerun bar's
    rows that show and hide (with layouts of their own) are made only when a click needs
    them. Closing an app leaves the shared ones open for the other apps, and one closed by
    someone else is made again."""
    import ipywidgets as w
    from ipywidgets.widgets.widget_style import Style

    from jupyter_vram._app.holder import close_tree
    from jupyter_vram._app.rerun_view import RerunBar

    ip = ipython_shell()
    ip.run_line_magic("load_ext", "jupyter_vram")
    cell = "%%vram -q\nshare_model = torch.nn.Linear(8, 8)\nshare_y = share_model(torch.ones(2, 8))"
    assert ip.run_cell("import torch").success and ip.run_cell(cell).success
    profile = ip.user_ns["_vram"]
    # the shell is the test session's: leave no tensor in it (a later test's recording would
    # count it as held before its cell)
    ip.run_cell("del share_model, share_y")
    first, second = ProfileApp(profile), ProfileApp(profile)
    bar = first.reruns
    assert isinstance(bar, RerunBar)  # the full first view: flame graph and rerun bar
    shown = {c for widget in tree(first).values() for c in getattr(widget, "_dom_classes", ())}
    assert "jv-rerun-button" in shown and "jv-flame" in shown
    # the rows under the toggles (whose layouts change) wait for a click that needs them
    assert not shown & {"jv-rerun-pick", "jv-rerun-blocks", "jv-rerun-cancel"}
    own = {id(first.layout)}  # the app's own: one a user may change
    looks: dict[tuple[str, str], set[int]] = {}
    for key, widget in tree(first).items():
        if isinstance(widget, (w.Layout, Style)) and key not in own:
            state = {k: v for k, v in widget.get_state().items() if not k.startswith("_")}
            looks.setdefault((type(widget).__name__, repr(sorted(state.items()))), set()).add(key)
    assert len(looks) >= 8
    assert [look for look, ids in looks.items() if len(ids) > 1] == []
    looks_ids = set().union(*looks.values())
    assert looks_ids <= set(tree(second))  # the second app shows the same widgets
    close_tree(first)
    assert all(widget.comm is not None for widget in tree(second).values())
    for key in looks_ids:  # closed as Widget.close_all() would
        widget = tree(second)[key]
        with contextlib.suppress(KeyError):  # a comm made under an earlier test's manager
            widget.close()
        widget.comm = None
    third = ProfileApp(profile)
    assert all(widget.comm is not None for widget in tree(third).values())
    for app in (second, third):
        close_tree(app)


def test_flame_numbers_go_to_the_page_as_arrays(profile: jv.Profile) -> None:
    """The flame graph's numeric columns reach the page as one binary array each, not as
    lists encoded item by item (that was a third of the figure's serialisation on GPT-2);
    the names stay text."""
    from jupyter_vram._app.flame_view import FlameView

    view = FlameView(profile)
    (doc,) = view.plot.render_bundle["docs_json"].values()

    def sources(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("name") == "ColumnDataSource":
                yield node
            for value in node.values():
                yield from sources(value)
        elif isinstance(node, list):
            for value in node:
                yield from sources(value)

    (source,) = sources(doc)
    columns = dict(source["attributes"]["data"]["entries"])
    for name in ("left", "right", "top", "bottom", "bytes", "count"):
        assert columns[name]["type"] == "ndarray", name
        assert columns[name]["shape"] == [len(view.source.data["name"])]
    assert isinstance(columns["name"], list) and isinstance(columns["full"], list)
