"""Leaks between cells, in a real IPython shell: memory a %%vram cell left alive, what holds
it, and releasing it on request (the tensor's weakref dies: the memory is actually freed)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import jupyter_vram as jv

from .conftest import CLEAN, ipython_shell, recording_state


@pytest.fixture
def shell() -> Iterator[Any]:
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    shell.user_ns.update({"torch": torch, "weakref": weakref, "refs": []})
    yield shell
    for name in ("refs", "leak_var", "old", "new", "g", "make", "f", "Node", "_vram"):
        shell.user_ns.pop(name, None)


def run(shell: Any, cell: str) -> Any:
    result = shell.run_cell("%%vram --quiet\n" + cell, store_history=True)
    assert recording_state() == CLEAN
    return result


def test_variable(shell: Any) -> None:
    assert run(shell, "leak_var = torch.ones(256, 1024)\nsmall = 1\n").error_in_exec is None
    profile = shell.user_ns["_vram"]
    leaks = profile.leaks()
    assert list(leaks["holders"]) == ["leak_var"]
    row = leaks.iloc[0]
    assert row["bytes"] == 256 * 1024 * 4
    assert row["holder_kind"] == "variable" and row["releasable"]
    assert row["op"] == "ones" and row["site"].startswith("<module> (In[")
    ref = weakref.ref(shell.user_ns["leak_var"])
    done = jv.release_leaks(profile, leaks)
    assert done == ["deleted variable leak_var"]
    assert "leak_var" not in shell.user_ns
    assert ref() is None  # nothing else (the leak table included) kept it
    assert profile.leaks().empty  # nothing else is listed in its place


def test_same_size_storage_made_later_is_not_a_leak(shell: Any) -> None:
    run(shell, "leak_var = torch.ones(256, 1024)\n")
    profile = shell.user_ns["_vram"]
    # other code, after the cell, makes storages of the same size: one named, one only in a
    # reference cycle (found by the garbage-collector scan), one as an output
    shell.run_cell("old = torch.zeros(256, 1024)")
    shell.run_cell("new = [torch.zeros(256 * 1024)]\nnew.append(new)")
    shell.run_cell("torch.zeros(1024, 256)", store_history=True)
    gc.disable()  # keep the cycle's tensor alive while leaks are looked for
    try:
        leaks = profile.leaks()
        assert list(leaks["holders"]) == ["leak_var"]
        assert list(leaks["bytes"]) == [256 * 1024 * 4]
        ref = weakref.ref(shell.user_ns["leak_var"])
        assert jv.release_leaks(profile) == ["deleted variable leak_var"]
        assert ref() is None and "old" in shell.user_ns
        # a same-size storage made after the release (often at the freed address) either
        shell.run_cell("g = torch.ones(256, 1024)")
        assert profile.leaks().empty
    finally:
        gc.enable()


def test_note_when_the_end_of_run_search_runs_out_of_time(
    shell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The garbage collector's tensors are searched as the run ends within a budget; a
    search cut short says leaks may be missing (in the frame and in the app)."""
    from jupyter_vram._app.leaks_view import leaks_html
    from jupyter_vram._capture import leaks as capture_leaks

    real = capture_leaks.made_by_run
    monkeypatch.setattr(capture_leaks, "made_by_run", lambda *args: real(*args, budget_s=-1.0))
    cell = (
        "leak_var = torch.ones(300, 300)\nold = [torch.ones(100, 100)]\nold.append(old)\ndel old\n"
    )
    gc.disable()
    try:
        run(shell, cell)
        leaks = shell.user_ns["_vram"].leaks()
    finally:
        gc.enable()
    assert list(leaks["holders"]) == ["leak_var"]  # the names were walked; the scan was not
    assert "ran out of time" in leaks.attrs["note"]
    assert "ran out of time" in leaks_html(leaks)


def test_output(shell: Any) -> None:
    result = run(shell, "torch.full((300, 700), 2.0)\n")
    number = result.execution_count
    out = shell.user_ns["Out"]
    assert number in out
    ref = weakref.ref(out[number])
    leaks = shell.user_ns["_vram"].leaks()
    assert len(leaks) == 1
    assert leaks.iloc[0]["bytes"] == 300 * 700 * 4
    assert leaks.iloc[0]["holder_kind"] == "output"
    assert f"Out[{number}]" in leaks.iloc[0]["holders"].split("; ")
    done = jv.release_leaks(shell.user_ns["_vram"])
    assert f"cleared Out[{number}]" in done
    assert number not in out and f"_{number}" not in shell.user_ns
    assert ref() is None


def test_traceback(shell: Any) -> None:
    cell = (
        "def f():\n"
        "    h = torch.ones(300, 1000)\n"
        "    refs.append(weakref.ref(h))\n"
        "    raise ValueError('boom')\n"
        "f()\n"
    )
    assert isinstance(run(shell, cell).error_in_exec, ValueError)
    ref = shell.user_ns["refs"][0]
    assert ref() is not None  # the last error's traceback keeps f's locals
    leaks = shell.user_ns["_vram"].leaks()
    assert len(leaks) == 1
    row = leaks.iloc[0]
    assert row["bytes"] == 300 * 1000 * 4 and row["holder_kind"] == "traceback"
    assert "f (In[" in row["holders"] and "local 'h'" in row["holders"]
    assert "cleared the last error's traceback frames" in jv.release_leaks(shell.user_ns["_vram"])
    assert ref() is None


def test_closure_is_named_and_left_alone(shell: Any) -> None:
    cell = (
        "def make():\n"
        "    c = torch.ones(128, 128)\n"
        "    refs.append(weakref.ref(c))\n"
        "    return lambda: c.sum()\n"
        "g = make()\n"
    )
    run(shell, cell)
    leaks = shell.user_ns["_vram"].leaks()
    assert list(leaks["holders"]) == ["g (free variable 'c')"]
    assert leaks.iloc[0]["holder_kind"] == "closure" and not leaks.iloc[0]["releasable"]
    done = jv.release_leaks(shell.user_ns["_vram"])
    assert done == ["left g (free variable 'c'): delete or redefine it yourself"]
    assert shell.user_ns["refs"][0]() is not None


def test_reference_cycle(shell: Any) -> None:
    cell = (
        "class Node:\n"
        "    pass\n"
        "n1 = Node()\n"
        "n1.me = n1\n"
        "n1.t = torch.ones(64, 1000)\n"
        "refs.append(weakref.ref(n1.t))\n"
        "del n1\n"
    )
    gc.disable()  # the cycle must still be there when leaks are looked for
    try:
        run(shell, cell)
        leaks = shell.user_ns["_vram"].leaks()
        assert list(leaks["holder_kind"]) == ["cycle"]
        assert leaks.iloc[0]["bytes"] == 64 * 1000 * 4
        assert shell.user_ns["refs"][0]() is not None
        done = jv.release_leaks(shell.user_ns["_vram"])
    finally:
        gc.enable()
    assert done == ["collected reference cycles (gc.collect())"]
    assert shell.user_ns["refs"][0]() is None


def test_memory_from_before_the_cell_is_not_a_leak(shell: Any) -> None:
    shell.run_cell("old = torch.ones(4096)")
    run(shell, "new = torch.ones(4096)\nold.add_(1)\n")
    leaks = shell.user_ns["_vram"].leaks()
    assert list(leaks["holders"]) == ["new"]


def test_loaded_profile_has_no_runtime(shell: Any, tmp_path: Path) -> None:
    run(shell, "leak_var = torch.ones(16, 16)\n")
    loaded = jv.Profile.load(shell.user_ns["_vram"].save(tmp_path / "p.json"))
    leaks = loaded.leaks()
    assert leaks.empty and "kernel that recorded" in leaks.attrs["note"]
    assert jv.release_leaks(loaded) == []
    assert "leak_var" in shell.user_ns


def test_app_release_button(shell: Any) -> None:
    from jupyter_vram._app import ProfileApp

    run(shell, "leak_var = torch.ones(512, 256)\n")
    ref = weakref.ref(shell.user_ns["leak_var"])
    app = ProfileApp(shell.user_ns["_vram"])
    titles = [app.tabs.get_title(i) for i in range(len(app.tabs.children))]
    view = app.open_tab(titles.index("Leaks"))
    assert "leak_var" in view.table.value and "512.0 KiB" in view.table.value
    assert ref() is not None  # showing the list releases nothing
    view.release_button.click()
    assert "deleted variable leak_var" in view.status.value
    assert ref() is None
    assert "Nothing this cell made is still alive" in view.table.value
    assert view.release_button.disabled
