"""The kernel is sacred: each class of failure found by trying to break `%%vram`, with a test.

Every test runs cells in a real IPython shell (the kernel's own machinery, in process) and
checks that the next ``%%vram`` still works, that recording is off afterwards, and that the
user's objects and hooks are as the cell left them.
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

import jupyter_vram as jv
from jupyter_vram._capture.builder import Interner
from jupyter_vram._capture.tagging import Tagger

from .conftest import CLEAN, ipython_shell, recording_state


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    ip = ipython_shell()
    assert ip is not None
    ip.run_line_magic("load_ext", "jupyter_vram")
    ip.run_cell("import torch\nfrom torch import nn\nimport jupyter_vram as jv")
    yield ip
    ip.run_cell("%reset -f")


def run(shell: InteractiveShell, cell: str) -> object:
    result = shell.run_cell(cell)
    assert result.error_before_exec is None and result.error_in_exec is None, result
    return result.result


def still_works(shell: InteractiveShell) -> None:
    """The next %%vram records: a 4 KiB tensor is seen, and recording is off afterwards."""
    run(shell, "%%vram -q\n_probe = torch.ones(1024)")
    prof = shell.user_ns["_vram"]
    assert prof.error is None
    assert 4096 in set(prof.to_dataframe()["bytes"])
    assert recording_state() == CLEAN


# -- objects alive in the kernel that our scans used to trip on ---------------------------


def test_script_and_traced_modules_alive(shell: InteractiveShell) -> None:
    run(
        shell,
        "scripted = torch.jit.script(nn.Linear(4, 4))\n"
        "traced = torch.jit.trace(nn.Linear(4, 4), torch.randn(2, 4))",
    )
    still_works(shell)
    run(shell, "%%vram -q\ny = scripted(torch.randn(2, 4)) + traced(torch.randn(2, 4))")
    assert shell.user_ns["_vram"].error is None
    run(shell, "del scripted, traced")


def test_half_constructed_module_alive(shell: InteractiveShell) -> None:
    cell = (
        "class Broken(nn.Module):\n"
        "    def __init__(self):\n"
        "        self.w = 1\n"
        "        raise ValueError('before super().__init__()')\n"
        "try:\n"
        "    Broken()\n"
        "except ValueError as e:\n"
        "    broken_error = e\n"
    )
    run(shell, cell)  # the traceback keeps the half-built module alive
    still_works(shell)
    # the same object handed straight to the role scan is skipped, never raised on
    broken = shell.user_ns["broken_error"].__traceback__.tb_next.tb_frame.f_locals["self"]
    Tagger(lambda *a: None, Interner("")).adopt([broken], [])
    run(shell, "del broken_error")


# -- what a cell does with its model while recording ---------------------------------------


@pytest.mark.parametrize(
    "action",
    [
        "copy.deepcopy(model)",
        "pickle.dumps(model)",
        "torch.save(model, io.BytesIO())",
        "torch.jit.script(model)",
    ],
)
def test_copying_or_scripting_the_model_in_the_cell(shell: InteractiveShell, action: str) -> None:
    shell.user_ns.update(copy=copy, pickle=pickle, io=io)
    run(shell, "model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())")
    run(shell, f"%%vram -q\nout = model(torch.randn(2, 8)).sum()\nout.backward()\nthing = {action}")
    assert shell.user_ns["_vram"].error is None
    assert not shell.user_ns["model"]._forward_pre_hooks  # nothing of ours on the model
    still_works(shell)


def test_torch_func_transforms_in_the_cell(shell: InteractiveShell) -> None:
    run(shell, "model = nn.Linear(8, 1)\nx = torch.randn(4, 8)")
    cell = (
        "%%vram -q\n"
        "params = dict(model.named_parameters())\n"
        "def loss(p, x):\n"
        "    return torch.func.functional_call(model, p, (x,)).sum()\n"
        "grads = torch.func.grad(loss)(params, x)\n"
        "per_sample = torch.func.vmap(lambda row: (row * 2).sum())(x)\n"
        "model(x).sum().backward()\n"  # and a plain step after, in the same cell
    )
    run(shell, cell)
    assert shell.user_ns["_vram"].error is None
    assert set(shell.user_ns["grads"]) == {"weight", "bias"}
    still_works(shell)


def test_noting_model_state_never_raises_on_a_transformed_tensor() -> None:
    """Inside ``torch.func.vmap`` a plain-looking tensor has no data pointer (it raises): the
    tagger's model-state note still notes it once, and says it did, without raising (its
    callers include the recording's stop, which must not fail)."""
    notes: list[int] = []
    tagger = Tagger(lambda tensor, role, module: notes.append(role), Interner(""))
    said: list[bool] = []

    def note_twice(row: torch.Tensor) -> torch.Tensor:
        said.append(tagger._report_state(row, 4, 0))
        said.append(tagger._report_state(row, 4, 0))
        return row * 2

    torch.func.vmap(note_twice)(torch.ones(3, 2))
    assert notes == [4, 4] and said == [True, True]  # not remembered: noted each time
    plain = torch.ones(2)
    assert [tagger._report_state(plain, 4, 0) for _ in range(2)] == [True, False]


def test_model_state_remembered_forgets_dead_tensors() -> None:
    """The tagger remembers the model state it noted (to skip noting it again); a long run
    makes new gradients every step, so past a bound it forgets the tensors that died."""
    tagger = Tagger(lambda tensor, role, module: None, Interner(""))
    tagger._prune_at = 10
    held = [torch.ones(2) for _ in range(20)]
    for t in held[:10]:
        tagger._report_state(t, 4, 0)
    del held[:8]  # 2 of the 10 noted are alive
    for t in held[2:]:  # 10 more: past the bound on the first
        tagger._report_state(t, 4, 0)
    assert len(tagger._reported) == 2 + 10  # by hand: the first ten's 2 alive, the next 10


def test_a_large_list_of_tensors_is_walked_as_item_by_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A notebook's long list of tensors is taken whole (no visit per item) only where that
    finds what the item-by-item walk finds, in its order and under its names: lists with a
    repeated tensor, one seen before, a module or a non-tensor among them, nested lists, and
    more tensors than the walk's budget."""
    from jupyter_vram._capture import tagging

    shared = torch.ones(3)
    big = [torch.ones(1) for _ in range(5000)]
    namespaces: list[dict[str, object]] = [
        {"a": big, "b": torch.zeros(2)},
        {"a": [*big[:4500], big[7], *big[4500:]]},  # one tensor twice
        {"s": shared, "a": [shared, *big]},  # seen before the list
        {"a": [*big, nn.Linear(2, 2)], "b": [*big[:10], 5, *big[10:]]},  # a module, a number
        {"outer": [big, (torch.ones(4),) * 2, tuple(big[:4200])]},  # nested
        {"x": [torch.ones(1) for _ in range(6000)], "y": big},  # past a budget of 8000
    ]

    def walk(namespace: dict[str, object], max_objects: int) -> tuple[list[int], ...]:
        names: dict[int, str] = {}
        found = tagging.reachable_objects(namespace, names=names, max_objects=max_objects)
        ids = [[id(o) for o in kind] for kind in found]
        return ids[0], ids[1], ids[2], [names[i] for i in ids[0]]

    budgets = [200_000] * 5 + [8000]
    visits = [0]  # objects whose kind the walk asked for
    kind_of = tagging._KindCache.__call__

    def counted(self: Any, cls: type) -> int:
        visits[0] += 1
        return kind_of(self, cls)

    monkeypatch.setattr(tagging._KindCache, "__call__", counted)
    whole = [walk(ns, b) for ns, b in zip(namespaces, budgets, strict=True)]
    visits_whole, visits[0] = visits[0], 0
    monkeypatch.setattr(tagging, "_new_tensors", lambda *a: None)  # item by item
    by_item = [walk(ns, b) for ns, b in zip(namespaces, budgets, strict=True)]
    assert whole == by_item
    # by hand: 5000 + 1 tensors; a budget of 8000 objects, two of them the lists themselves
    assert len(by_item[0][0]) == 5001 and len(by_item[5][0]) == 8000 - 2
    assert visits_whole < visits[0] // 2  # lists were taken whole: no visit per tensor
    # a long list of numbers costs a sample: never a pass over every item
    asked: list[int] = []
    monkeypatch.setattr(tagging, "_new_tensors", lambda items, *a: asked.append(len(items)))
    numbers = {"n": list(range(100_000)), "m": [*big[:2], *range(10_000)]}
    assert walk(numbers, 200_000)[0] == [id(big[1]), id(big[0])] and asked == []


def fresh_namespace(shell: InteractiveShell) -> None:
    run(shell, "%reset -f")
    run(shell, "import torch\nfrom torch import nn")


def test_model_and_optimizer_built_inside_the_cell(shell: InteractiveShell) -> None:
    fresh_namespace(shell)
    cell = (
        "%%vram -q\n"
        "fresh = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))\n"
        "fresh_opt = torch.optim.Adam(fresh.parameters())\n"
        "fresh(torch.randn(16, 64)).sum().backward()\n"
        "fresh_opt.step()\n"
    )
    run(shell, cell)
    prof = shell.user_ns["_vram"]
    numel = (64 * 128 + 128) + (128 * 10 + 10)
    end = prof.timeline.breakdown_at(len(prof.timeline) - 1)
    assert end["parameter"] == 4 * numel  # by hand: fp32 weights and biases
    assert end["gradient"] == 4 * numel
    df = prof.to_dataframe()
    params = df[df["category"] == "parameter"]
    assert set(params["module"]) == {"Sequential.0", "Sequential.2"}
    assert set(params["op"]) == {"empty"}  # nn.Linear's torch.empty, not "(unknown)"


def test_lbfgs_history_is_optimizer_state(shell: InteractiveShell) -> None:
    fresh_namespace(shell)
    cell = (
        "lb_model = nn.Linear(32, 1)\n"
        "lb_opt = torch.optim.LBFGS(lb_model.parameters(), history_size=5, max_iter=4)\n"
        "lb_x, lb_y = torch.randn(64, 32), torch.randn(64, 1)\n"
        "def closure():\n"
        "    lb_opt.zero_grad()\n"
        "    loss = ((lb_model(lb_x) - lb_y) ** 2).mean()\n"
        "    loss.backward()\n"
        "    return loss\n"
    )
    run(shell, cell)
    run(shell, "%%vram -q\nlb_opt.step(closure)\nlb_opt.step(closure)")
    prof = shell.user_ns["_vram"]
    state = shell.user_ns["lb_opt"].state[shell.user_ns["lb_opt"].param_groups[0]["params"][0]]
    history = sum(t.untyped_storage().nbytes() for t in state["old_dirs"] + state["old_stps"])
    assert history > 0
    end = prof.timeline.breakdown_at(len(prof.timeline) - 1)
    assert end["optimizer_state"] >= history
    assert end["other"] == 4 * 64  # lb_y alone: the one tensor no module or optimizer holds


# -- the user's own modes and hooks ----------------------------------------------------------


def test_user_hooks_left_open_stay_exactly_as_the_cell_left_them(shell: InteractiveShell) -> None:
    run(shell, "model = nn.Linear(8, 8)\nuser_pack = lambda t: t\nuser_unpack = lambda t: t")
    cell = (
        "%%vram -q\n"
        "model(torch.randn(2, 8)).sum().backward()\n"  # our per-call hooks were on here
        "ctx = torch.autograd.graph.saved_tensors_hooks(user_pack, user_unpack)\n"
        "ctx.__enter__()\n"
        "model(torch.randn(2, 8)).sum()\n"
    )
    try:
        run(shell, cell)
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        assert top is not None and top[0] is shell.user_ns["user_pack"]
    finally:
        run(shell, "ctx.__exit__(None, None, None)")
    assert recording_state() == CLEAN
    still_works(shell)


def test_user_saved_tensor_hooks_win_inside_the_cell(shell: InteractiveShell) -> None:
    """A user's save_on_cpu / custom hooks keep working: we never push ours over theirs."""
    run(shell, "model = nn.Linear(8, 8)\nseen = []")
    cell = (
        "%%vram -q\n"
        "with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(1) or t, "
        "lambda t: t):\n"
        "    model(torch.randn(2, 8)).sum().backward()\n"
    )
    run(shell, cell)
    assert shell.user_ns["seen"], "the user's pack hook never ran"


# -- devices ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "message"),
    [("banana", "unknown device 'banana'"), ("cpu:1", "the CPU has one memory")],
)
def test_bad_device_is_one_message_and_the_cell_does_not_run(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], device: str, message: str
) -> None:
    shell.user_ns.pop("ran", None)
    result = shell.run_cell(f"%%vram --device {device}\nran = True")
    assert result.error_in_exec is None
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert "ran" not in shell.user_ns
    still_works(shell)


# -- threads and compiled code ----------------------------------------------------------------


def test_other_threads_are_named_not_misfiled(shell: InteractiveShell) -> None:
    cell = (
        "%%vram -q\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "with ThreadPoolExecutor(2, thread_name_prefix='loader') as pool:\n"
        "    batches = list(pool.map(lambda i: torch.randn(256, 256), range(4)))\n"
        "mine = torch.ones(1024)\n"
        "fed = nn.Linear(256, 2)(batches[0])\n"
    )
    run(shell, cell)
    prof = shell.user_ns["_vram"]
    threads = prof.meta.get("other_threads", [])
    assert any(name.startswith("loader") for name in threads)
    from jupyter_vram._render.text import summary

    assert "other threads ran meanwhile" in summary(prof)
    assert prof.timeline.baseline_bytes < 256 * 256 * 4  # the workers' batches are not baseline
    df = prof.to_dataframe()
    made_there = df[df["op"] == "(another thread)"]
    assert list(made_there["bytes"]) == [256 * 256 * 4]  # the batch the cell fed to a module
    assert set(made_there["category"]) == {"input"} and (made_there["alloc_seq"] >= 0).all()


def test_torch_compile_runs_compiled(shell: InteractiveShell) -> None:
    """No dispatch mode: torch.compile inside %%vram compiles and runs the graph."""
    run(
        shell,
        "import torch._dynamo\ntorch._dynamo.reset()\nfrom torch._dynamo.utils import counters",
    )
    cell = (
        "%%vram -q --stacks full\n"
        "f = torch.compile(lambda a: (a * 2).sin().sum(), backend='aot_eager')\n"
        "res = f(torch.randn(512, 512))\n"
    )
    run(shell, cell)
    counters = shell.user_ns["counters"]
    assert counters["stats"]["unique_graphs"] >= 1
    prof = shell.user_ns["_vram"]
    assert prof.error is None and prof.peak_bytes - prof.timeline.baseline_bytes >= 512 * 512 * 4
    # the profiler's Python tracer and compiled code crash a later garbage collection: stacks
    # are sampled, never traced, for a cell that compiles, and for every cell once compiled
    # code exists (sampled stacks, the default, never trace it either)
    assert prof.meta["stacks"] == "sampled"
    assert any("torch.compile" in w for w in prof.meta["warnings"])
    run(shell, "%%vram -q --stacks full\nres = f(torch.randn(512, 512))")
    assert any("torch.compile" in w for w in shell.user_ns["_vram"].meta["warnings"])
    run(shell, "%%vram -q\nres = f(torch.randn(512, 512))")
    assert shell.user_ns["_vram"].error is None
    import gc

    gc.collect()
    still_works(shell)


# -- interrupts ------------------------------------------------------------------------------


def test_interrupt_during_stop_keeps_the_profile() -> None:
    """A Ctrl-C while the recorder stops is held until the profile is built, then raised."""
    import os
    import signal

    from jupyter_vram._capture import cpu_recorder

    original = cpu_recorder.build_rows

    def slow_build(*args: object, **kwargs: object) -> object:
        os.kill(os.getpid(), signal.SIGINT)  # arrives in the middle of building
        return original(*args, **kwargs)  # type: ignore[arg-type]

    cpu_recorder.build_rows = slow_build  # type: ignore[assignment]
    rec = jv.record("cpu")
    try:
        with pytest.raises(KeyboardInterrupt), rec:
            torch.ones(256)
    finally:
        cpu_recorder.build_rows = original
    assert rec.profile.event_count == 2  # built whole (alloc + free), then the interrupt went on
    assert recording_state() == CLEAN


def test_failing_cell_traceback_has_no_frames_of_ours(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's traceback looks as it does without %%vram: their cell, the op that failed."""
    run(shell, "lin = nn.Linear(8, 8)")
    capsys.readouterr()
    result = shell.run_cell("%%vram -q\nh = lin(torch.randn(2, 8))\nlin(torch.randn(2, 5))")
    assert isinstance(result.error_in_exec, RuntimeError)
    text = capsys.readouterr().out
    assert "mat1 and mat2 shapes cannot be multiplied" in text
    assert "jupyter_vram" not in text and "_dynamo" not in text and "profiler" not in text
    import re

    cells = re.findall(r"Cell In\[(\d+)\], line (\d+)", text)
    assert len(cells) == 2 and cells[0][0] == cells[1][0]  # the magic line and its body: one cell
    assert cells[1][1] == "2"  # the failing line of the body


def test_a_profiler_started_in_the_cell_is_reported(shell: InteractiveShell) -> None:
    cell = (
        "%%vram -q\n"
        "from torch.profiler import profile, ProfilerActivity\n"
        "with profile(activities=[ProfilerActivity.CPU]) as users_own:\n"
        "    torch.ones(10)\n"
    )
    run(shell, cell)
    assert len(shell.user_ns["users_own"].events()) > 0  # the user's profiler worked
    prof = shell.user_ns["_vram"]
    assert any("incomplete" in w for w in prof.meta["warnings"])
    from jupyter_vram._render.text import summary

    assert "this profile is incomplete" in summary(prof)
    still_works(shell)


def test_top_level_await_runs_as_ipython_runs_it(shell: InteractiveShell) -> None:
    """A %%vram cell that awaits is compiled and awaited by IPython itself: recorded, its last
    value displayed, its errors raised with the notebook's own line numbers."""
    import asyncio

    # IPython's terminal shell awaits with its own loop; an earlier test's library (the
    # browser tests' Playwright) can leave this thread marked as running one. A kernel has no
    # such leftover: tests/test_kernel_interrupts.py runs the same cell in a real one.
    leftover = asyncio.events._get_running_loop()
    asyncio.events._set_running_loop(None)
    try:
        _await_cells(shell)
    finally:
        asyncio.events._set_running_loop(leftover)


def _await_cells(shell: InteractiveShell) -> None:
    run(shell, "import asyncio")
    cell = (
        "%%vram -q\n"
        "first = torch.ones(1024)\n"
        "await asyncio.sleep(0.01)\n"
        "second = torch.ones(2048)\n"
        "first.sum() + second.sum()\n"
    )
    assert float(run(shell, cell)) == 3072.0  # type: ignore[arg-type]
    prof = shell.user_ns["_vram"]
    assert prof.error is None
    assert {4096, 8192} <= set(prof.to_dataframe()["bytes"])
    assert recording_state() == CLEAN
    result = shell.run_cell("%%vram -q\nlate = torch.ones(8)\nawait asyncio.sleep(0)\n1 / 0")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert shell.user_ns["_vram"].error == "ZeroDivisionError: division by zero"
    assert recording_state() == CLEAN
    still_works(shell)


def test_async_rewrite_leaves_other_cells_alone() -> None:
    from jupyter_vram._async_cells import has_top_level_await, rewrite_lines

    plain = ["%%vram -q\n", "x = 1\n"]
    assert rewrite_lines(plain) == plain
    assert rewrite_lines(["%%vramish\n", "await f()\n"]) == ["%%vramish\n", "await f()\n"]
    assert not has_top_level_await("async def f():\n    await g()\n")  # await inside a def
    assert has_top_level_await("async for x in agen():\n    pass\n")
    rewritten = rewrite_lines(["%%vram --text\n", "await g()\n"])
    assert rewritten[1:] == ["await g()\n"] and "'--text'" in rewritten[0]


def test_memory_held_before_the_cell_is_named(shell: InteractiveShell) -> None:
    """The variables holding the most memory before the cell, by hand: 4 x numel each."""
    fresh_namespace(shell)
    run(
        shell,
        "kept_logits = torch.ones(256, 1024)\nnet = nn.Linear(512, 256)\nsmall = torch.ones(4)",
    )
    run(shell, "%%vram -q\nout = net(torch.randn(8, 512))")
    held = dict(shell.user_ns["_vram"].meta["held_before"])
    assert held["kept_logits"] == 4 * 256 * 1024
    assert held["net"] == 4 * (512 * 256 + 256)
    assert next(iter(held)) == "kept_logits"  # largest first


def test_cell_numbers_in_stacks_are_the_cells_own(shell: InteractiveShell) -> None:
    import sys

    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is not None:  # an earlier test compiled: stacks would stay off (by design)
        dynamo.counters.clear()
    cell = "%%vram -q --stacks full\nnumbered = torch.ones(333)"  # exact lines: traced
    result = shell.run_cell(cell, store_history=True)
    sites = set(shell.user_ns["_vram"].to_dataframe()["site"].dropna().astype(str))
    assert any(f"In[{result.execution_count}]" in site for site in sites), sites
