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
    for name in ("refs", "leak_var", "old", "new", "g", "make", "f", "Node", "_vram", *SAME):
        shell.user_ns.pop(name, None)
    # no output's tensor is left to later test modules (their baselines would count it):
    # Out, _n (IPython keeps them in user_ns_hidden too), _ / __ / ___; nor a cycle's
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


#: names the same-size tests leave in the shell
SAME = ("lin", "x", "mk", "a", "b", "c", "d", "e", "kept", "other", "freed_at", "olds", "news")


def run(shell: Any, cell: str) -> Any:
    """Run a %%vram cell with exact (traced) stacks: these tests read each leak's line."""
    result = shell.run_cell("%%vram --quiet --stacks full\n" + cell, store_history=True)
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


def test_note_when_the_end_of_run_search_stops_at_its_bound(
    shell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The garbage collector's tensors are searched as the run ends up to a number of them; a
    search cut short says leaks may be missing (in the frame and in the app)."""
    from jupyter_vram._app.leaks_view import leaks_html
    from jupyter_vram._capture import leaks as capture_leaks

    real = capture_leaks.made_by_run
    monkeypatch.setattr(
        capture_leaks, "made_by_run", lambda ns, kind, old, rows: real(ns, kind, old, rows, 0)
    )
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
    assert "stopped at its bound" in leaks.attrs["note"]
    assert "stopped at its bound" in leaks_html(leaks)


def test_a_cell_keeping_more_tensors_than_the_names_bound_says_leaks_may_be_missing(
    shell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the run ends, the notebook's names are walked as recording's start walks them: every
    module's and optimizer's state, and the first so many bare tensors (a cell keeping 300,000
    tiny tensors in a list paid seconds for noting each). Past that bound the frame says
    leaks may be missing; the tensors looked at are found."""
    from jupyter_vram._capture import leaks as capture_leaks

    real = capture_leaks.made_by_run
    monkeypatch.setattr(
        capture_leaks,
        "made_by_run",
        lambda ns, kind, old, rows: real(ns, kind, old, rows, max_named=5),
    )
    run(shell, "kept = [torch.ones(1000 + i) for i in range(12)]\n")
    leaks = shell.user_ns["_vram"].leaks()
    shell.user_ns.pop("kept")
    sizes = list(leaks["bytes"])
    assert len(sizes) == len(set(sizes)) == 5  # five of the twelve, each once
    assert set(sizes) <= {4 * (1000 + i) for i in range(12)}
    assert "the first 50,000 tensors the notebook's names reach" in leaks.attrs["note"]
    assert "some leaks may be missing" in leaks.attrs["note"]


def test_a_cell_keeping_tensors_under_the_bound_finds_them_all(shell: Any) -> None:
    run(shell, "kept = [torch.ones(1000 + i) for i in range(12)]\n")
    leaks = shell.user_ns["_vram"].leaks()
    shell.user_ns.pop("kept")
    assert sorted(leaks["bytes"]) == [4 * (1000 + i) for i in range(12)]
    assert "note" not in leaks.attrs


def test_leak_search_does_not_depend_on_the_clock(
    shell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine so loaded that each clock read is ten seconds after the last finds the same
    leaks, held by the same things (the search used to run to 0.5 / 1 s budgets, and named a
    reference cycle 'not found within the time limit' under load)."""
    import time

    ticks = iter(range(0, 10**15, 10**10))
    monkeypatch.setattr(time, "monotonic", lambda: next(ticks) / 1e9)
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) / 1e9)
    cell = (
        "class Node:\n"
        "    pass\n"
        "n1 = Node()\n"
        "n1.me = n1\n"
        "n1.t = torch.ones(64, 1000)\n"
        "del n1\n"
        "leak_var = torch.ones(300, 300)\n"
    )
    gc.disable()  # the cycle must still be there when leaks are looked for
    try:
        run(shell, cell)
        leaks = shell.user_ns["_vram"].leaks()
    finally:
        gc.enable()
    gc.collect()
    assert sorted(zip(leaks["holder_kind"], leaks["bytes"], strict=True)) == [
        ("cycle", 64 * 1000 * 4),
        ("variable", 300 * 300 * 4),
    ]
    assert "note" not in leaks.attrs


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


def test_a_later_error_does_not_make_the_notebook_a_holder(shell: Any) -> None:
    """After another cell raised, the last error's frames hold the shell and the namespace
    (IPython's ``run_code`` local ``self``, our magic's ``shell``): a leak a variable holds is
    held by that variable, not by every frame that reaches the notebook."""
    assert run(shell, "kept = torch.ones(64, 1024)\n").error_in_exec is None
    profile = shell.user_ns["_vram"]
    failed = shell.run_cell("%%vram --quiet\nraise ValueError('later')\n", store_history=True)
    assert isinstance(failed.error_in_exec, ValueError)
    leaks = profile.leaks()
    assert list(leaks["holders"]) == ["kept"]
    assert list(leaks["holder_kind"]) == ["variable"] and bool(leaks.iloc[0]["releasable"])


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


# -- which allocation made each leak ---------------------------------------------------------

#: one cell, five leaked storages of one size (64 x 64 float32: 16 KiB) made by different
#: ops, modules and lines; what made each is read off the source, not off the profile
SAME_SIZE_CELL = (
    "a = torch.ones(64, 64)\n"  # line 1
    "b = torch.zeros(64, 64)\n"  # line 2: a different op
    "c = lin(x)\n"  # line 3: addmm, inside the Linear module (its input x is from before)
    "d = mk()\n"  # line 4: made in mk, defined in another cell
    "e = torch.randn(64, 64).exp()\n"  # line 5: randn's storage is freed, exp's kept
)
SAME_SIZE_SETUP = (
    "lin = torch.nn.Linear(8, 64)\n"
    "x = torch.ones(64, 8)\n"
    "def mk():\n"
    "    return torch.full((64, 64), 2.0)\n"  # line 4 of this cell
)


def test_same_size_leaks_each_name_the_allocation_that_made_it(shell: Any) -> None:
    setup = shell.run_cell(SAME_SIZE_SETUP, store_history=True).execution_count
    cell = run(shell, SAME_SIZE_CELL).execution_count
    leaks = shell.user_ns["_vram"].leaks().set_index("holders")
    assert sorted(leaks.index) == ["a", "b", "c", "d", "e"]
    assert set(leaks["bytes"]) == {64 * 64 * 4}  # the size alone cannot tell them apart
    assert set(leaks["matched_by"]) == {"address"}
    expected = {  # name: (op, module, site)
        "a": ("ones", "", f"<module> (In[{cell}]:1)"),
        "b": ("zeros", "", f"<module> (In[{cell}]:2)"),
        "c": ("addmm", "Linear", f"<module> (In[{cell}]:3)"),
        "d": ("full", "", f"mk (In[{setup}]:4)"),
        "e": ("exp", "", f"<module> (In[{cell}]:5)"),
    }
    for name, (op, module, site) in expected.items():
        row = leaks.loc[name]
        assert (row["op"], row["module"], row["site"]) == (op, module, site), name
        assert "one of" not in row["category"] and "by size" not in row["category"]
    assert "note" not in leaks.attrs
    # each row's storage is the very storage of the variable it names
    for name in expected:
        storage = shell.user_ns[name].untyped_storage()
        assert int(leaks.loc[name, "storage"]) == storage._cdata


def test_storage_at_a_freed_allocations_address_is_tied_to_the_live_one(shell: Any) -> None:
    """A tensor made at the address (and of the size) of one the cell freed before: the leak
    is the live allocation there (zeros, line 6), never a freed one (ones, line 2), and a
    same-size leak elsewhere (full, line 10) keeps its own."""
    cell = (
        "olds = []\n"
        "for _ in range(50): olds.append(torch.ones(1000))\n"  # line 2
        "freed_at = {t.data_ptr() for t in olds}\n"
        "del olds\n"  # freed: the allocator hands their addresses to the next of their size
        "news = []\n"
        "for _ in range(50): news.append(torch.zeros(1000))\n"  # line 6
        "kept = [n for n in news if n.data_ptr() in freed_at][:1]\n"
        "del news\n"
        "kept = kept[0] if kept else None\n"
        "other = torch.full((1000,), 2.0)\n"  # line 10
    )
    number = run(shell, cell).execution_count
    if shell.user_ns["kept"] is None:
        pytest.skip("the allocator handed no freed address back")
    assert shell.user_ns["kept"].data_ptr() in shell.user_ns["freed_at"]
    leaks = shell.user_ns["_vram"].leaks().set_index("holders")
    assert sorted(leaks.index) == ["kept", "other"]
    assert leaks.loc["kept", "op"] == "zeros"
    assert leaks.loc["kept", "site"] == f"<module> (In[{number}]:6)"
    assert leaks.loc["other", "op"] == "full"
    assert leaks.loc["other", "site"] == f"<module> (In[{number}]:10)"
    assert set(leaks["matched_by"]) == {"address"}


def test_without_addresses_leaks_are_matched_by_size_and_say_so(
    shell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture that noted no addresses: each storage is matched by size only, its row says
    so (matched_by, a 'by size:' prefix, every candidate named) and the frame's note too."""
    from jupyter_vram._capture import cpu_recorder

    monkeypatch.setattr(cpu_recorder, "note_addresses", lambda *args: None)
    cell = "a = torch.ones(64, 64)\nb = torch.zeros(64, 64)\nc = torch.full((10,), 1.0)\n"
    run(shell, cell)
    leaks = shell.user_ns["_vram"].leaks().set_index("holders")
    assert sorted(leaks.index) == ["a", "b", "c"]
    assert set(leaks["matched_by"]) == {"size"}
    for name in ("a", "b"):  # two of one size: either could be either
        assert leaks.loc[name, "op"] == "by size: one of: ones | zeros"
        assert leaks.loc[name, "site"].startswith("by size: one of: <module> (In[")
    assert leaks.loc["c", "op"] == "by size: full"  # one of its size: still only by size
    assert "by size" in leaks.attrs["note"]


def test_cuda_recorder_notes_the_address_of_each_live_block() -> None:
    """The CUDA path (a fake allocator history; no GPU needed): the converted profile's live
    rows carry their block addresses beside it, and a storage at an address is the block
    allocated there last (not the freed one before it), its bytes rounded up to the block."""
    from jupyter_vram._capture.leaks import RowMatcher, SizeMatcher
    from jupyter_vram._capture.row_addresses import take_addresses
    from jupyter_vram._leaks import _addresses

    from .test_cuda_snapshot import MIB, FakeApi, entry, fake_recorder

    base = 0x7000_0000_0000
    a, b = base, base + 1024
    trace = [
        entry("segment_alloc", base, 2 * MIB, 1),
        entry("alloc", a, 1000, 2),  # a 1024-byte block, freed
        entry("free_requested", a, 1000, 3),
        entry("free_completed", a, 1000, 4),
        entry("alloc", a, 1000, 5),  # the same address and size again: kept
        entry("alloc", b, 1000, 6),  # kept
    ]
    blocks = [
        {"address": a, "size": 1024, "requested_size": 1000, "state": "active_allocated"},
        {"address": b, "size": 1024, "requested_size": 1000, "state": "active_allocated"},
        {"address": b + 1024, "size": 2 * MIB - 2048, "requested_size": 0, "state": "inactive"},
    ]
    segment = {"device": 0, "address": base, "total_size": 2 * MIB, "segment_type": "small",
               "blocks": blocks}  # fmt: skip

    class Api(FakeApi):
        def snapshot(self) -> dict[str, Any]:
            if self.history:
                return {"segments": [segment], "device_traces": [trace]}
            return super().snapshot()

    rec = fake_recorder(Api())
    rec.start()
    prof = rec.stop()
    al = prof.allocations
    order = sorted(range(len(al.size)), key=lambda r: int(al.alloc_seq[r]))
    freed, live_a, live_b = order
    assert al.free_seq[freed] >= 0 and al.free_seq[live_a] < 0 and al.free_seq[live_b] < 0
    noted = take_addresses(prof)
    assert noted is not None
    at = _addresses(prof, noted)
    assert at == {a: (live_a, 1024), b: (live_b, 1024)}
    rows = RowMatcher(at, SizeMatcher({}, cuda=True))
    assert rows.claim(a, 1000) == live_a  # a storage's bytes fit its (rounded) block
    assert rows.claim(a, 1000) is None  # claimed once
    assert rows.claim(b, 2000) is None  # too big for the block there
    assert rows.claim(b + 1024, 1000) is None  # no block allocated there
    assert take_addresses(prof) is None  # taken once (leak finding forgets them)
