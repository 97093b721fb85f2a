"""What is a leak and what holds it, in a real IPython shell: state the notebook keeps in its
optimizers and modules is not a leak; holders never name the notebook's own machinery
(IPython's ``run_code`` ``self``, our magic's frames); every leak table refreshes after a
release; the app groups leaks by holder and exports them as CSV."""

from __future__ import annotations

import csv
import gc
import io
import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import jupyter_vram as jv

from .conftest import CLEAN, ipython_shell, recording_state

NAMES = ("model", "opt", "x", "loss", "kept", "other", "net", "y", "g", "boom", "_vram")


@pytest.fixture
def shell() -> Iterator[Any]:
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    shell.user_ns["torch"] = torch
    yield shell
    for name in NAMES:
        shell.user_ns.pop(name, None)
    outputs = shell.user_ns.get("Out")
    if isinstance(outputs, dict):
        outputs.clear()
    aliases = ("_", "__", "___")
    for names in (shell.user_ns, shell.user_ns_hidden):
        for name in [k for k in names if k in aliases or (k[:1] == "_" and k[1:].isdigit())]:
            del names[name]
    for alias in aliases:
        shell.user_ns[alias] = ""
        setattr(shell.displayhook, alias, "")
    gc.collect()


def run(shell: Any, cell: str) -> Any:
    # exact (traced) stacks: these tests read each leak's line
    result = shell.run_cell("%%vram --quiet --stacks full\n" + cell, store_history=True)
    assert recording_state() == CLEAN
    return result


def holders(profile: jv.Profile) -> dict[str, int]:
    leaks = profile.leaks()
    return {str(h): int(b) for h, b in zip(leaks["holders"], leaks["bytes"], strict=True)}


def test_optimizer_state_and_gradients_the_notebook_keeps_are_not_leaks(shell: Any) -> None:
    """A first Adam step makes 12 state tensors (exp_avg, exp_avg_sq and step for each of 4
    parameters) and 4 gradients, all kept by `opt` and `model`: not leaks, and Release never
    deletes the optimizer or the model. What the cell left in its own variables is."""
    torch.manual_seed(0)
    shell.run_cell(
        "model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), "
        "torch.nn.Linear(64, 8))\nx = torch.randn(16, 64)\n"
        "opt = torch.optim.Adam(model.parameters())\n"
    )
    run(shell, "loss = model(x).sum()\nloss.backward()\nopt.step()\nkept = torch.ones(100, 100)\n")
    profile = shell.user_ns["_vram"]
    assert holders(profile) == {"kept": 100 * 100 * 4, "loss": 4}
    done = jv.release_leaks(profile)
    assert sorted(done) == ["deleted variable kept", "deleted variable loss"]
    opt, model = shell.user_ns["opt"], shell.user_ns["model"]
    assert sum(len(s) for s in opt.state.values()) == 12
    assert all(p.grad is not None for p in model.parameters())
    # a model the cell builds is the notebook's model, not a leak; its output is
    run(shell, "net = torch.nn.Linear(32, 32)\ny = net(torch.ones(4, 32)).detach()\n")
    assert holders(shell.user_ns["_vram"]) == {"y": 4 * 32 * 4}


@pytest.mark.parametrize(
    "later",
    [
        "raise ValueError('later')",  # IPython's run_code frame: local 'self' is the shell
        "%%vram --quiet\nraise ValueError('later')",  # and our magic's frames
        "def g():\n    ns = globals()\n    sh = get_ipython()\n    raise ValueError('x')\ng()",
    ],
    ids=["plain", "vram", "user-frame-holds-the-shell"],
)
def test_an_output_is_held_by_its_names_only_after_a_later_error(shell: Any, later: str) -> None:
    result = run(shell, "kept = torch.ones(10, 10)\ntorch.full((30, 70), 2.0)\n")
    n = result.execution_count
    profile = shell.user_ns["_vram"]
    assert shell.run_cell(later, store_history=True).error_in_exec is not None
    assert holders(profile) == {f"Out[{n}]; _; _{n}": 30 * 70 * 4, "kept": 10 * 10 * 4}


def app_leaks(profile: jv.Profile) -> Any:
    from jupyter_vram._app import ProfileApp

    app = ProfileApp(profile)
    titles = [app.tabs.get_title(i) for i in range(len(app.tabs.children))]
    return app.open_tab(titles.index("Leaks"))


def table_rows(view: Any) -> list[list[str]]:
    body = view.table.value.split("</tr>")[1:-1]  # the header row first
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in body]


def test_every_leak_table_refreshes_after_a_release(shell: Any) -> None:
    run(shell, "kept = torch.ones(64, 64)\n")
    first = shell.user_ns["_vram"]
    run(shell, "other = torch.ones(32, 32)\n")
    second = shell.user_ns["_vram"]
    views = [app_leaks(first), app_leaks(first), app_leaks(second)]
    assert [len(table_rows(v)) for v in views] == [1, 1, 1]
    views[0].release_button.click()
    assert "deleted variable kept" in views[0].status.value
    gone = "Nothing this cell made is still alive."
    assert gone in views[0].table.value and gone in views[1].table.value
    assert table_rows(views[2])[0][3] == "other"
    jv.release_leaks(second)  # from Python: the app's table follows too
    assert gone in views[2].table.value
    assert views[2].release_button.disabled


def test_leaks_are_grouped_by_holder_and_exported_as_csv(shell: Any) -> None:
    cell = (
        "kept = []\nfor _ in range(100):\n    kept.append(torch.ones(16, 16))\n"
        "other = torch.zeros(8)\n"
    )
    result = run(shell, cell)
    n = result.execution_count
    profile = shell.user_ns["_vram"]
    assert len(profile.leaks()) == 101
    view = app_leaks(profile)
    site = f"&lt;module&gt; (In[{n}]:3)"
    # bytes, storages, held by, names, release, op, module, site
    assert table_rows(view) == [
        ["100.0 KiB", "100", "variable", "kept", "yes", "ones", "", site],
        ["32 B", "1", "variable", "other", "yes", "zeros", "", f"&lt;module&gt; (In[{n}]:4)"],
    ]
    link = re.search(
        r"download='leaks.csv' href='data:text/csv;charset=utf-8,([^']*)'", view.export.value
    )
    assert link is not None
    rows = list(csv.DictReader(io.StringIO(urllib.parse.unquote(link.group(1)))))
    assert [(r["holders"], r["bytes"], r["storages"]) for r in rows] == [
        ("kept", str(100 * 16 * 16 * 4), "100"),
        ("other", str(8 * 4), "1"),
    ]
