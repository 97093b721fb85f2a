"""The app's rerun row and Compare tab, driven in Python with the real engine: toggles,
Rerun, cancel (a real SIGINT), greyed toggles, and the comparison's numbers."""

from __future__ import annotations

import html
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import jupyter_vram as jv
from jupyter_vram._analysis.compare import verdict
from jupyter_vram._app import ProfileApp
from jupyter_vram._app.compare_view import TITLE, CompareView, compare_app
from jupyter_vram._app.flame_view import FlameView
from jupyter_vram._app.rerun_view import AUTO, RerunBar
from jupyter_vram._model import CATEGORIES
from jupyter_vram._render.compare_figures import GROW, SAME
from jupyter_vram._rerun import rerun_unavailable
from jupyter_vram._units import format_bytes

from .conftest import interrupts_raise, ipython_shell

SETUP = """\
import torch
from torch import nn

class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(4)
        )

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x

torch.manual_seed(0)
rr_model = Blocks()
rr_x = torch.randn(512, 64)
"""
STEP = "%%vram -q\nrr_loss = rr_model(rr_x).square().mean()\nrr_loss.backward()\n"
NO_GRAD = "%%vram -q\nwith torch.no_grad():\n    rr_out = rr_model(rr_x)\n"


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    ip = ipython_shell()
    ip.run_line_magic("load_ext", "jupyter_vram")
    assert ip.run_cell(SETUP).success
    yield ip
    ip.run_cell("del rr_model, rr_x, Blocks")
    for name in ("rr_loss", "rr_out", "_vram"):
        ip.user_ns.pop(name, None)


def record_cell(shell: InteractiveShell, cell: str) -> jv.Profile:
    shell.user_ns.pop("_vram", None)
    assert shell.run_cell(cell).success
    profile = shell.user_ns["_vram"]
    assert isinstance(profile, jv.Profile)
    return profile


def state(shell: InteractiveShell) -> dict[str, Any]:
    """Copies of what the cell touched: parameters, grads, the names it bound."""
    model = shell.user_ns["rr_model"]
    return {
        "params": {k: v.detach().clone() for k, v in model.named_parameters()},
        "grads": {k: v.grad.clone() for k, v in model.named_parameters() if v.grad is not None},
        "loss": shell.user_ns.get("rr_loss"),
        "rng": torch.get_rng_state(),
    }


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a["params"].keys() == b["params"].keys()
        and all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
        and a["grads"].keys() == b["grads"].keys()
        and all(torch.equal(a["grads"][k], b["grads"][k]) for k in a["grads"])
        and a["loss"] is b["loss"]
        and torch.equal(a["rng"], b["rng"])
    )


def most_activations(profile: jv.Profile) -> int:
    """The most activation bytes live after any event of the run."""
    t = profile.timeline
    live = t.by_category(np.arange(-1, len(t)))[:, CATEGORIES.index("activation")]
    return int(live.max())


def bar_of(app: ProfileApp) -> RerunBar:
    assert isinstance(app.reruns, RerunBar), app.reruns
    return app.reruns


def plain(html_text: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", html_text))


def test_checkpointing_toggle_and_rerun_make_the_compare_tab(shell: InteractiveShell) -> None:
    baseline = record_cell(shell, STEP)
    before = state(shell)
    app = ProfileApp(baseline)
    bar = bar_of(app)
    assert app.children[1] is bar  # the toggle row sits between the header and the tabs
    # the blocks offered are the model's four repeated blocks (and "auto")
    picked = [value for _, value in bar.blocks.options]
    assert picked[0] == AUTO and len(picked) == 1 + len(shell.user_ns["rr_model"].blocks)
    assert bar.button.disabled  # nothing switched on yet
    bar.checkpoint.value = True
    assert not bar.button.disabled and bar.blocks.layout.display == ""
    stages: list[str] = []
    bar.status.observe(lambda change: stages.append(change["new"]), "value")
    bar.button.click()

    view = app.compare_view
    assert isinstance(view, CompareView)
    assert app.tabs.selected_index == len(app.tabs.children) - 1
    assert app.tabs.get_title(app.tabs.selected_index) == TITLE
    assert any("fa-spin" in s for s in stages), stages  # progress was shown while it ran
    assert "Compare tab" in bar.status.value
    variant = view.variants[-1]
    assert isinstance(variant, jv.Profile) and variant.variant is not None
    assert len(variant.variant.checkpointed) >= 1
    # the tab names the blocks that were wrapped
    wrapped = "checkpointed: " + ", ".join(variant.variant.checkpointed)
    assert wrapped in plain(view.verdicts.value)
    # the verdict shown is the engine's, for these two profiles
    expected = verdict(baseline, variant)
    shown = re.findall(r"<div class='jv-verdict'>(.*?)</div>", view.verdicts.value)
    assert [html.unescape(v) for v in shown] == [expected]
    assert expected in app.text()  # the text fallback carries it too
    # the peak row shows each recorder's own peak; the peak change in the verdict is theirs
    peak_row = re.search(r"<tr class='jv-row-peak'>(.*?)</tr>", view.table.value)
    assert peak_row is not None
    cells = re.findall(r"<td class='jv-num[^']*'>(.*?)</td>", peak_row.group(1))
    assert cells[0] == format_bytes(baseline.peak_bytes)
    assert cells[1].startswith(format_bytes(variant.peak_bytes))
    change = 100 * (variant.peak_bytes - baseline.peak_bytes) / baseline.peak_bytes
    assert f"({change:+.0f} %)" in expected
    # checkpointing held fewer activations at once; the verdict's figures are each run's
    # most activation bytes live, read off its own timeline replay (not the comparison's code)
    most_b, most_v = most_activations(baseline), most_activations(variant)
    assert most_v < most_b
    assert f"activations {format_bytes(most_b)} -> {format_bytes(most_v)}" in expected
    # the diff flame graph: a block per module path, coloured; the root says both runs' bytes
    data = view.source.data
    assert data["name"][0] == "all" and len(data["name"]) > 5
    # the notebook is as the cell left it
    assert same_state(before, state(shell))

    # a second rerun (AMP) adds a column
    bar.checkpoint.value = False
    bar.amp.value = True
    bar.button.click()
    assert len(view.results) == 2 and len(view.pick.options) == 2
    assert view.table.value.count("<th>") == 4  # name, baseline, two variants
    assert same_state(before, state(shell))


def test_cancel_is_an_interrupt_and_leaves_state_intact(shell: InteractiveShell) -> None:
    baseline = record_cell(shell, STEP)
    before = state(shell)
    app = ProfileApp(baseline)
    bar = bar_of(app)
    bar.checkpoint.value = True
    shown = bar._progress

    def interrupting(started: float) -> Callable[[str], None]:
        show = shown(started)
        seen: list[str] = []

        def progress(stage: str) -> None:
            show(stage)
            assert bar.cancel.layout.display == ""  # Cancel is on screen while it runs
            assert "interrupt" in bar.cancel.value
            seen.append(stage)
            if len(seen) == 3:  # inside the engine: what the kernel does on an interrupt
                signal.raise_signal(signal.SIGINT)

        return progress

    bar._progress = interrupting  # type: ignore[method-assign]
    with interrupts_raise():  # a kernel handling the click: SIGINT raises
        assert bar.run() is None
    assert "cancelled" in bar.status.value
    assert bar.cancel.layout.display == "none" and not bar.running
    assert app.compare_view is None
    assert same_state(before, state(shell))
    bar._progress = shown  # type: ignore[method-assign]
    assert bar.run() is not None  # and it runs again afterwards


def test_a_cell_that_raises_in_the_rerun_is_reported_on_the_bar(
    shell: InteractiveShell,
) -> None:
    shell.user_ns["rr_fail"] = False
    baseline = record_cell(shell, STEP + "if rr_fail:\n    raise ValueError('boom')\n")
    shell.user_ns["rr_fail"] = True  # the rerun will raise where the first run did not
    before = state(shell)
    app = ProfileApp(baseline)
    bar = bar_of(app)
    bar.checkpoint.value = True
    bar.button.click()
    assert "ValueError: boom" in plain(bar.status.value), bar.status.value
    assert app.compare_view is None and not bar.running and not bar.button.disabled
    assert same_state(before, state(shell))
    del shell.user_ns["rr_fail"]


def test_a_toggle_that_cannot_apply_is_greyed_with_the_reason(shell: InteractiveShell) -> None:
    profile = record_cell(shell, NO_GRAD)
    bar = bar_of(ProfileApp(profile))
    reason = rerun_unavailable(profile, checkpoint=AUTO)
    assert reason, "a cell without autograd has nothing to checkpoint"
    assert bar.checkpoint.disabled and bar.checkpoint.tooltip == reason
    # switched on anyway (an old frontend): Rerun stays off and the bar says why
    bar.checkpoint.value = True
    assert bar.button.disabled and reason in plain(bar.status.value)
    assert bar.run() is None


def test_a_profile_that_cannot_rerun_gets_a_note(mlp: torch.nn.Module) -> None:
    with jv.record() as rec:
        mlp(torch.randn(4, 256)).sum().backward()
    app = ProfileApp(rec.profile)
    assert app.reruns is not None and not isinstance(app.reruns, RerunBar)
    reason = rerun_unavailable(rec.profile)
    assert reason and reason in plain(app.reruns.value)
    assert app.children[1] is app.reruns
    titles = [app.tabs.get_title(i) for i in range(len(app.tabs.children))]
    assert TITLE not in titles


def test_diff_of_two_profiles_by_hand() -> None:
    """Two runs that differ by one tensor: the diff tree and the colours say by how much."""
    with jv.record() as rec:
        a = torch.ones(1000)
    first = rec.profile
    with jv.record() as rec:
        b = torch.ones(3000)
    second = rec.profile
    view = compare_app(first, second)
    data = view.source.data
    rows = [i for i, full in enumerate(data["full"]) if full.endswith("ones")]
    assert len(rows) == 1, data["full"]
    i = rows[0]
    assert data["baseline_h"][i] == format_bytes(4 * 1000)
    assert data["variant_h"][i] == format_bytes(4 * 3000)
    assert data["change_h"][i] == f"+{format_bytes(4 * 2000)} (+200.0%)"
    red = [int(data["color"][i][k : k + 2], 16) for k in (1, 3, 5)]
    assert red[0] > SAME[0] and red[0] <= GROW[0] + 1  # toward the growth red, not grey
    assert len(view.results) == 1 and view.text().startswith("Reruns:")
    # any two profiles in an app: jv.show(first).add_variant(second)
    app = ProfileApp(first)
    tab = app.add_variant(second)
    assert app.tabs.get_title(app.tabs.selected_index) == TITLE
    assert [r.verdict for r in tab.results] == [verdict(first, second)]
    del a, b


def test_a_click_on_a_subshell_reruns_on_the_main_thread_interruptibly(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JupyterLab 4.6 sends widget messages to a kernel subshell (another thread): the click
    hands the rerun to the main thread's loop, where a kernel interrupt (SIGINT) reaches it."""
    baseline = record_cell(shell, STEP)
    bar = bar_of(ProfileApp(baseline))
    bar.checkpoint.value = True
    queued: list[Callable[[], object]] = []
    loop = type("Loop", (), {"add_callback": staticmethod(queued.append)})()
    monkeypatch.setattr(shell, "kernel", type("Kernel", (), {"io_loop": loop})(), raising=False)
    clicker = threading.Thread(target=bar.button.click)  # the subshell's thread
    clicker.start()
    clicker.join()
    assert len(queued) == 1 and bar.pending and bar.button.disabled
    assert "queued" in bar.status.value
    bar.button.click()  # a second click while it waits queues nothing more
    assert len(queued) == 1
    seen: list[tuple[object, bool]] = []
    shown = bar._progress

    def watching(started: float) -> Callable[[str], None]:
        show = shown(started)

        def progress(stage: str) -> None:
            seen.append((signal.getsignal(signal.SIGINT), threading.current_thread().name))
            show(stage)

        return progress

    bar._progress = watching  # type: ignore[method-assign]
    ignoring = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what an idle ipykernel has
    try:
        queued[0]()  # the main loop runs it
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # put back afterwards
    finally:
        signal.signal(signal.SIGINT, ignoring)
    assert seen and all(s == (signal.default_int_handler, "MainThread") for s in seen), seen
    assert not bar.pending and not bar.running and "Compare tab" in bar.status.value


def test_a_block_zoomed_to_in_the_flame_graph_can_be_checkpointed(
    shell: InteractiveShell,
) -> None:
    baseline = record_cell(shell, STEP)
    app = ProfileApp(baseline)
    bar = bar_of(app)
    flame = app.tabs.children[0]
    assert isinstance(flame, FlameView)
    assert bar.pick.layout.display == "none"
    tree = flame.tree
    assert tree is not None
    root = "Blocks"  # the model's class name, as the recording names its modules
    inside = (root, "blocks", "2", "0")  # a Linear inside the third block
    assert tree.find(list(inside)) is not None
    flame.zoom(inside)
    assert bar.pick.layout.display == "" and bar.pick.description == f"checkpoint {root}.blocks.2"
    bar.pick.click()
    assert bar.checkpoint.value and bar.blocks.value == (f"{root}.blocks.2",)
    assert bar.options()["checkpoint"] == [f"{root}.blocks.2"]
    flame.zoom((root,))  # not inside a block: nothing offered
    assert bar.pick.layout.display == "none"
    bar.button.click()
    view = app.compare_view
    assert view is not None
    variant = view.variants[-1]
    assert variant is not None and variant.variant is not None
    assert variant.variant.checkpointed == (f"{root}.blocks.2",)
    assert view.results[-1].title == "checkpointing 1 block"


# A step, then (in the rerun only) a kernel interrupt at a chosen moment, then busy for
# rr_busy_s seconds: "in a callback" makes the interrupt arrive while the interpreter runs a
# weakref callback (as the recorder's, run each time a storage it noted is freed), where the
# KeyboardInterrupt it raises is only printed ("Exception ignored in ..."), never propagated.
INTERRUPTED = """\
%%vram -q
rr_loss = rr_model(rr_x).square().mean()
rr_loss.backward()
if rr_interrupt is not None:
    import signal, time, weakref
    class Dying:
        pass
    dying = Dying()
    if rr_interrupt == "in a callback":
        watch = weakref.ref(dying, lambda _: signal.raise_signal(signal.SIGINT))
    else:
        signal.raise_signal(signal.SIGINT)
    del dying
    until = time.perf_counter() + rr_busy_s
    while time.perf_counter() < until:
        pass
"""


def interrupted_rerun(
    shell: InteractiveShell, when: str, busy_s: float
) -> tuple[ProfileApp, RerunBar]:
    """A baseline of INTERRUPTED recorded without the interrupt; the rerun will have it."""
    shell.user_ns.update(rr_interrupt=None, rr_busy_s=0.0)
    baseline = record_cell(shell, INTERRUPTED)
    shell.user_ns.update(rr_interrupt=when, rr_busy_s=busy_s)
    app = ProfileApp(baseline)
    bar = bar_of(app)
    bar.checkpoint.value = True
    return app, bar


def forget_interrupted(shell: InteractiveShell) -> None:
    for name in ("rr_interrupt", "rr_busy_s"):
        del shell.user_ns[name]


@pytest.mark.parametrize("busy_s", [20.0, 0.0], ids=["cell-keeps-running", "cell-ends"])
def test_a_cancel_the_interpreter_drops_in_a_callback_still_cancels(
    shell: InteractiveShell, busy_s: float
) -> None:
    """The interrupt lands in a weakref callback, which swallows its KeyboardInterrupt: the
    rerun still stops (long before the cell's 20 s), or, when the cell ends first, the bar
    still says cancelled and no variant is added (the browser test's flake: a Cancel lost,
    the bar stuck at 'running')."""
    app, bar = interrupted_rerun(shell, "in a callback", busy_s)
    before = state(shell)
    started = time.perf_counter()
    bar.button.click()
    took = time.perf_counter() - started
    assert "cancelled" in bar.status.value, (took, bar.status.value)
    assert took < 15.0, took  # stopped, not run to the end of the busy loop
    assert not bar.running and bar.cancel.layout.display == "none"
    assert app.compare_view is None
    assert same_state(before, state(shell))
    forget_interrupted(shell)


def test_a_click_handled_on_the_main_thread_is_cancellable_while_the_kernel_ignores_sigint(
    shell: InteractiveShell,
) -> None:
    """ipykernel dispatches a comm message that arrives while another request holds the main
    shell without its 'SIGINT raises' hook: the interrupt would be ignored (SIG_IGN, what an
    idle kernel has). A click handled on the main thread makes SIGINT raise itself."""
    app, bar = interrupted_rerun(shell, "now", 20.0)
    ignoring = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        started = time.perf_counter()
        bar.button.click()  # on the main thread: no subshell, no loop to hand it to
        took = time.perf_counter() - started
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # put back afterwards
    finally:
        signal.signal(signal.SIGINT, ignoring)
    assert "cancelled" in bar.status.value, (took, bar.status.value)
    assert took < 15.0, took
    assert app.compare_view is None and not bar.running
    forget_interrupted(shell)


def test_the_cells_end_walks_the_notebook_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a recorded cell's end asks of the notebook (the storages it left, whether a
    rerun's copies fit in host memory, asked again as its app is made) shares one walk of
    the namespace: a notebook holding many tensors paid each walk again."""
    from jupyter_vram._capture import tagging
    from jupyter_vram._session import run_code

    walked: list[int] = []
    walk = tagging._walk_namespace

    def counted(namespace: Any, *args: Any) -> None:
        walked.append(id(namespace))
        walk(namespace, *args)

    monkeypatch.setattr(tagging, "_walk_namespace", counted)
    ns: dict[str, Any] = {}
    run_code(SETUP + "model = Blocks()\nx = torch.randn(8, 64)\n", ns)
    apps: list[ProfileApp] = []

    def show(profile: jv.Profile) -> None:
        apps.append(ProfileApp(profile))

    walked.clear()
    run_code("keep = [torch.ones(2) for _ in range(50)]\nmodel(x).sum().backward()", ns,
             on_profile=show)  # fmt: skip
    assert isinstance(apps[0].reruns, RerunBar)  # its host-memory check ran
    assert walked.count(id(ns)) == 2  # one as the cell starts, one as it ends
    apps[0].close()
