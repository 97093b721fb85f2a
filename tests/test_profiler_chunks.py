"""The CPU recorder reads the profiler in chunks, wherever the cell is: the rows are the same.

Tests for ``_capture/profiler_chunks.py`` (chunks, the cost budget, the cap),
``_capture/cpu_recorder.py``, ``_capture/ticker.py`` (the helper thread, sampled stacks) and
``_capture/profiler_session.py`` (module ranges across chunks, sequence-number windows).
The truth is a recording read in one chunk (every op, the tracer off), or the CPU allocator's
own reports under ``torch.profiler``; line numbers are read off this file's source.
"""

from __future__ import annotations

import _thread
import inspect
import random
import time
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._capture import profiler_chunks
from jupyter_vram._capture.cpu_rows import SortedInts
from jupyter_vram._capture.profiler_read import LEAN_OP
from jupyter_vram._capture.profiler_session import SeqWindows
from jupyter_vram._capture.stacks import FrameFilter
from jupyter_vram._capture.ticker import CHUNK_SIGNAL, StackSamples
from jupyter_vram._model import PHASE_INDEX

from .test_observer_effect import _case, train_step, true_peak

COLUMNS = ["op", "module", "phase", "category", "bytes", "alloc_seq", "free_seq"]


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Count chunks read, and how many of them the helper thread asked for between two
    bytecodes (the rest were read at module calls)."""
    counts = {"chunks": 0, "between_bytecodes": 0}
    real_flush = profiler_chunks.ChunkedProfiler.flush
    real_due = profiler_chunks.ChunkedProfiler.on_due

    def flush(self: profiler_chunks.ChunkedProfiler) -> None:
        counts["chunks"] += 1
        real_flush(self)

    def due(self: profiler_chunks.ChunkedProfiler, frame: object) -> None:
        before = counts["chunks"]
        real_due(self, frame)
        counts["between_bytecodes"] += counts["chunks"] - before

    monkeypatch.setattr(profiler_chunks.ChunkedProfiler, "flush", flush)
    monkeypatch.setattr(profiler_chunks.ChunkedProfiler, "on_due", due)
    yield counts


def chunks(monkeypatch: pytest.MonkeyPatch, every: bool) -> None:
    """A chunk at every chance (a due time always past) or never (one far away)."""
    ns = 0 if every else 10**15
    for name in ("FIRST_CHUNK_NS", "FLUSH_AFTER_NS", "MIN_CHUNK_NS", "MAX_CHUNK_NS", "RETRY_NS"):
        monkeypatch.setattr(profiler_chunks, name, ns)


def rows(profile: jv.Profile) -> pd.DataFrame:
    return profile.to_dataframe()[COLUMNS].astype(str).reset_index(drop=True)


def _differences(frames: list[pd.DataFrame], metas: list[dict[str, object]]) -> str:
    """What two recordings that should be equal differ in (for the failure message)."""
    if len(frames[0]) != len(frames[1]):
        return f"{len(frames[0])} rows against {len(frames[1])}; meta {metas}"
    return f"{frames[0].compare(frames[1]).head(12)}\nmeta {metas}"


def resnet_loop(steps: int = 3) -> tuple[object, object]:
    model, batch = _case("resnet")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = train_step(model, opt, batch)
    step()

    def loop() -> None:
        for _ in range(steps):
            step()

    return loop, model


def test_chunks_at_module_calls_and_between_bytecodes_change_no_row(
    monkeypatch: pytest.MonkeyPatch, flushes: dict[str, int]
) -> None:
    """A training loop (the loss outside the model: forward until backward) read in one
    chunk, and read at every module call and every tick of the helper thread: the same rows."""
    loop, _ = resnet_loop()
    frames = []
    metas = []
    for every in (False, True):
        chunks(monkeypatch, every)
        with jv.record("cpu", ops="all") as rec:
            loop()  # type: ignore[operator]
        frames.append(rows(rec.profile))
        metas.append({k: v for k, v in rec.profile.meta.items() if k != "module_types"})
        assert "reports_without_ops" not in rec.profile.meta
    assert flushes["chunks"] >= 40  # about every module call of three steps
    assert frames[0].equals(frames[1]), _differences(frames, metas)
    assert {"forward", "backward", "optimizer"} <= set(frames[1]["phase"])


def test_a_cell_without_module_calls_is_read_between_bytecodes(
    monkeypatch: pytest.MonkeyPatch, flushes: dict[str, int]
) -> None:
    """No module call gives the hooks a chance: the helper thread asks the cell's thread to
    read chunks between two bytecodes. The rows match one chunk's, the peak the allocator's.
    The cell asks as the thread would (``interrupt_main``), so the test does not depend on
    when the thread gets the CPU."""

    def cell() -> None:
        keep = []
        for i in range(4000):
            t = torch.ones(256)  # 1 KiB, freed at the next iteration
            if i % 100 == 0:
                keep.append(t)  # 40 KiB kept until the end
            if i % 500 == 0:
                _thread.interrupt_main(CHUNK_SIGNAL)  # what the helper thread does
        del keep

    frames = []
    for every in (False, True):
        chunks(monkeypatch, every)
        with jv.record("cpu", ops="all") as rec:
            cell()
        frames.append(rows(rec.profile))
    assert flushes["between_bytecodes"] >= 8
    assert frames[0].equals(frames[1])
    profile = rec.profile
    assert profile.peak_bytes - profile.timeline.baseline_bytes == true_peak(cell)


def test_lean_chunks_keep_every_byte_and_drop_only_op_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the budget, chunks record the allocator's reports without op events: sizes,
    lifetimes, modules, phases and categories stay exactly as with every op (but backward's
    seed, the loss's 4-byte gradient, which only its op tells apart); forward ops are not
    named, backward ones by their autograd node; the profile says so. (Only a recording read
    through torch.profiler goes lean: the light recorder names every op at no extra cost.)"""
    monkeypatch.setenv("JUPYTER_VRAM_NATIVE", "0")
    loop, _ = resnet_loop()
    chunks(monkeypatch, every=True)
    with jv.record("cpu", ops="all") as rec:
        loop()  # type: ignore[operator]
    full = rows(rec.profile)
    monkeypatch.setattr(profiler_chunks, "OPS_BUDGET", -1.0)  # over budget from the first chunk
    monkeypatch.setattr(profiler_chunks, "OPS_BUDGET_AFTER_NS", -1)
    with jv.record("cpu") as rec:
        loop()  # type: ignore[operator]
    lean = rows(rec.profile)
    seeds = full["op"] == "ones_like"
    assert list(full.loc[seeds, "bytes"]) == ["4"] * 3  # one a step
    assert set(lean.loc[seeds, "phase"]) == {"forward"}
    lean.loc[seeds, "phase"] = "backward"
    same = [c for c in COLUMNS if c != "op"]
    assert lean[same].equals(full[same])
    meta = rec.profile.meta
    assert 0 < meta["reports_without_ops"] <= meta["reports"]
    assert any("op names left out" in w for w in meta["warnings"])
    forward = lean[(lean["phase"] == "forward") & (lean["alloc_seq"] != "-1")]
    assert (forward["op"] == LEAN_OP).mean() > 0.9  # all but the first chunk's
    backward_ops = set(lean.loc[lean["phase"] == "backward", "op"])
    assert any(op.endswith("Backward0") for op in backward_ops)


def test_past_the_cap_the_cell_runs_to_its_end_unrecorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More reports than a profile keeps: recording stops, the cell goes on, and the profile
    says which part it covers."""
    monkeypatch.setattr(profiler_chunks, "MAX_REPORTS", 600)
    chunks(monkeypatch, every=True)
    out = []
    with jv.record("cpu") as rec:
        for i in range(3000):
            out.append(torch.ones(8))  # 3000 allocations, all kept
            if i % 500 == 0:
                time.sleep(0.003)
    assert len(out) == 3000
    meta = rec.profile.meta
    assert 600 <= meta["reports"] < 3000
    assert meta["recorded_ns"] < meta["cell_ns"]
    assert any("ran unrecorded" in w and "most a profile keeps" in w for w in meta["warnings"])


def test_a_cell_that_costs_too_much_to_record_is_recorded_in_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(profiler_chunks, "PAUSE_SHARE", -1.0)
    monkeypatch.setattr(profiler_chunks, "PAUSE_AFTER_NS", -1)
    chunks(monkeypatch, every=True)
    with jv.record("cpu") as rec:
        for i in range(2000):
            torch.ones(8)
            if i % 500 == 0:
                time.sleep(0.003)
    meta = rec.profile.meta
    assert meta["recorded_ns"] < meta["cell_ns"]
    assert any("cost over" in w for w in meta["warnings"])


# -- sampled stacks ----------------------------------------------------------------------------


def _line_of(marker: str) -> int:
    """The line of this file that holds ``marker`` (what a stack must name)."""
    lines, _ = inspect.getsourcelines(inspect.getmodule(_line_of))  # type: ignore[arg-type]
    hits = [i + 1 for i, text in enumerate(lines) if marker in text and "_line_of" not in text]
    assert len(hits) == 1
    return hits[0]


def _slow_matmul() -> torch.Tensor:
    a = torch.randn(1500, 1500)
    return a @ a @ a @ a  # LONG-OP: three 1500^3 products, tens of ms


def test_a_sampled_stack_names_the_line_of_a_long_op() -> None:
    """An op long enough to be sampled while it runs gets the exact line that called it."""
    with jv.record("cpu") as rec:
        product = _slow_matmul()
    del product
    profile = rec.profile
    assert profile.meta["stacks"] == "sampled"
    a = profile.allocations
    big = [i for i in range(len(a)) if a.size[i] == 1500 * 1500 * 4 and a.alloc_seq[i] >= 0]
    lines = {profile.frames[profile.stacks[a.stack[i]][-1]].line for i in big if a.stack[i] >= 0}
    assert _line_of("LONG-OP") in lines


def test_a_short_module_call_gets_its_call_line() -> None:
    """A cell too short for the helper thread still names the line of each module call (a
    sample is taken as the call starts)."""
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
    x = torch.randn(8, 64)
    with jv.record("cpu") as rec:
        y = model(x)  # MODULE-CALL
    del y
    profile = rec.profile
    a = profile.allocations
    inside = [i for i in range(len(a)) if a.module[i] and a.alloc_seq[i] >= 0]
    assert inside
    for i in inside:
        frames = [profile.frames[f] for f in profile.stacks[a.stack[i]]]
        assert any(f.line == _line_of("MODULE-CALL") for f in frames), frames


def test_a_short_block_names_itself_for_backward_and_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block that ends before the helper thread samples: what backward and the optimizer
    step allocate after the last module call is still placed in the block (the block's end
    takes a sample), with line 0 where the two samples' lines differ."""
    from jupyter_vram._capture import ticker

    monkeypatch.setattr(ticker.Ticker, "_take_sample", lambda self, header: None)  # no thread
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(8, 64)
    with jv.record("cpu") as rec:
        model(x).sum().backward()
        opt.step()
    for frames in _backward_and_step_stacks(rec.profile):
        assert (frames[0].filename, frames[0].name) == (
            __file__,
            "test_a_short_block_names_itself_for_backward_and_the_step",
        )


def _backward_and_step_stacks(profile: jv.Profile) -> list[list[jv.Frame]]:
    """The stack (outermost first) of each allocation backward and the optimizer step made
    while recording; each has one, and there are at least six (gradients, Adam's state and
    its temporaries)."""
    a = profile.allocations
    phases = (PHASE_INDEX["backward"], PHASE_INDEX["optimizer"])
    later = [i for i in range(len(a)) if a.alloc_seq[i] >= 0 and a.phase[i] in phases]
    assert len(later) >= 6
    for i in later:
        assert a.stack[i] >= 0, profile.ops[a.op[i]]
    return [[profile.frames[f] for f in profile.stacks[a.stack[i]]] for i in later]


def test_a_cell_that_returned_before_its_recording_stops_keeps_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``%%vram`` cell's code has returned when its recording stops: what its backward and
    optimizer step allocated after its last module call is still placed in the cell (on no
    line), not left without a stack."""
    from jupyter_vram._capture import ticker
    from jupyter_vram._session import run_code

    monkeypatch.setattr(ticker.Ticker, "_take_sample", lambda self, header: None)  # no thread
    ns: dict[str, object] = {}
    setup = "model = nn.Sequential(nn.Linear(64, 64), nn.ReLU())\nx = torch.randn(8, 64)\n"
    run_code("import torch\nfrom torch import nn\n" + setup, ns)
    run_code("opt = torch.optim.Adam(model.parameters())", ns)
    profile = run_code(
        "loss = model(x).sum()\nloss.backward()\nopt.step()", ns, filename="<cell-7>"
    ).profile
    assert profile is not None
    for frames in _backward_and_step_stacks(profile):
        assert [f.filename for f in frames] == ["<cell-7>"]


class _Inner(nn.Module):
    """A user module whose forward calls layers from its own lines, and a Sequential."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 32)
        self.seq = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))  # INNER-A
        return self.b(h) + self.seq(x)  # INNER-B


def test_a_module_call_inside_torchs_own_code_takes_its_callers_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A layer called by ``nn.Sequential`` reuses the sample of the call around it (only
    torch's frames, which no profile shows, lie between): every allocation's stack is the
    one a walk of the whole stack at each call gives, and fewer walks are made."""
    from jupyter_vram._capture import ticker

    monkeypatch.setattr(ticker.Ticker, "_take_sample", lambda self, header: None)  # no thread
    walks = [0]
    walk = ticker.Ticker.sample

    def counted(self: ticker.Ticker, frame: object) -> int:
        walks[0] += 1
        return walk(self, frame)  # type: ignore[arg-type]

    monkeypatch.setattr(ticker.Ticker, "sample", counted)
    model = nn.Sequential(_Inner(), nn.ReLU(), _Inner())
    x = torch.randn(4, 32)

    def stacks() -> list[tuple[tuple[str, int, str], ...]]:
        walks[0] = 0
        with jv.record("cpu") as rec:
            model(x).sum().backward()
        p, a = rec.profile, rec.profile.allocations
        return [
            tuple((p.frames[f].filename, p.frames[f].line, p.frames[f].name) for f in p.stacks[s])
            if s >= 0
            else ()
            for s in a.stack.tolist()
        ]

    stacks()  # first use: imports, the library
    reused = stacks()
    walks_reused = walks[0]
    monkeypatch.setattr(
        profiler_chunks.ChunkedProfiler,
        "_call_sample",
        lambda self, frame: self.ticker.sample(frame),
    )
    walked = stacks()
    assert reused == walked
    lines = {frame[1] for stack in reused for frame in stack}
    assert {_line_of("INNER-A"), _line_of("INNER-B")} <= lines  # user lines kept their own
    # the outer Sequential's three children and the inner Sequentials' three each reuse the
    # sample of the call around them; the layers _Inner calls from its own lines do not
    assert walks[0] - walks_reused == 3 + 2 * 3, (walks[0], walks_reused)


def test_stack_samples_place_exactly_by_common_calls_or_not_at_all() -> None:
    """Hand-made samples: one taken while the op ran wins; else the functions both
    neighbours are in, from the outermost inward; else nothing."""
    samples = StackSamples()
    cell = ("<cell>", 5, "<module>")
    samples.add(100, (cell, ("a.py", 10, "f")))
    samples.add(200, (cell, ("a.py", 12, "f")))
    samples.add(300, (cell, ("a.py", 12, "g")))
    samples.add(400, (("<cell>", 6, "<module>"),))
    times = np.array([190, 150, 250, 50, 450], np.int64)
    starts = np.array([180, 150, 250, 50, 450], np.int64)
    ends = np.array([210, 150, 250, 50, 450], np.int64)
    found, which, exact = samples.place(times, starts, ends, FrameFilter().keep)
    assert list(exact) == [True, False, False, False, False]
    placed = [found[k] for k in which]
    assert placed[0] == (cell, ("a.py", 12, "f"))  # sampled while the op ran: exact
    assert placed[1] == (cell, ("a.py", 0, "f"))  # in f both times, lines differ
    assert placed[2] == (cell,)  # f then g: only the cell line is sure
    assert placed[3] == ()  # no sample before
    assert placed[4] == ()  # no sample after


def test_after_a_way_out_of_a_module_call_its_line_is_not_kept() -> None:
    """A sample taken as a top-level module call returns is a way out: what is made after it
    is placed in the calling function on no line (the caller went on, maybe round a loop to
    the same line again), and torch's frames below the caller go with the line; what is made
    inside the call keeps the line. A report with no op around it (span 0) is placed by its
    own time, not as if its op had run since time 0."""
    samples = StackSamples()
    cell = ("<cell>", 5, "<module>")
    call = (cell, (torch.nn.modules.module.__file__, 1821, "inner"))
    entry = samples.add(100, call)
    samples.again(200, entry, leaving=True)  # the call returns
    samples.again(300, entry)  # the next iteration calls it again
    times = np.array([150, 250, 250], np.int64)
    starts = np.array([140, 240, 0], np.int64)
    ends = np.array([160, 260, 0], np.int64)
    found, which, exact = samples.place(times, starts, ends, FrameFilter().keep)
    placed = [found[k] for k in which]
    assert placed[0] == call  # inside the call: on its line
    assert placed[1] == (("<cell>", 0, "<module>"),)  # after it: somewhere in the cell
    assert placed[2] == (("<cell>", 0, "<module>"),)  # no op around it: by its own time
    assert not exact.any()


def test_sequence_windows_name_the_innermost_call() -> None:
    windows = SeqWindows()
    windows.starts.extend([0, 2, 5, 9])
    windows.ends.extend([12, 4, 8, 10])
    windows.modules.extend([1, 2, 3, 4])
    expected = {0: 1, 1: 1, 2: 2, 3: 2, 4: 1, 5: 3, 7: 3, 8: 1, 9: 4, 11: 1, 12: 0, 40: 0}
    assert {seq: windows.module_of(seq) for seq in expected} == expected


def test_sorted_ints_agree_with_a_sorted_list() -> None:
    rng = random.Random(7)
    ours = SortedInts(load=4)
    plain: list[int] = []
    for _ in range(3000):
        value = rng.randrange(500)
        if value in plain and rng.random() < 0.5:
            ours.remove(value)
            plain.remove(value)
        elif value not in plain:
            ours.add(value)
            plain.append(value)
            plain.sort()
        probe = rng.randrange(520)
        below = [v for v in plain if v < probe]
        assert ours.before(probe) == (below[-1] if below else None)


def test_the_helper_thread_never_sets_off_a_garbage_collection() -> None:
    """A collection the helper thread set off would walk the recording thread's frames while
    it is inside an op (GIL released): that crashed the process. What the thread does each
    tick (a sample as printed, the compile check) makes no object the collector tracks: with
    a collection due at every new tracked object, none starts on the thread."""
    import gc
    import threading

    from jupyter_vram._capture.ticker import Ticker

    started: list[str] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(threading.current_thread().name)

    ticker = Ticker(None, lambda frame: None, sample=True)
    thresholds = gc.get_threshold()
    gc.callbacks.append(note)
    gc.set_threshold(1, 1, 1)
    try:
        ticker.start()
        while len(ticker.samples.raw) < 100:  # this thread makes nothing meanwhile
            time.sleep(0.01)
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(note)
        ticker.stop()
    assert "jupyter_vram-ticker" not in started


def test_no_chunk_is_read_while_torch_compiles_or_runs_compiled_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Restarting the profiler inside dynamo, AOT autograd or an fx graph crashed the process
    at a later garbage collection (7 runs in 12). With a chunk due at every chance, the module
    calls torch.compile makes (its fx GraphModules) read none; the others still do."""
    import gc
    import sys

    import torch._dynamo

    def in_machinery() -> bool:
        frame = sys._getframe(1)
        while frame is not None:
            file = frame.f_code.co_filename
            if file.startswith(profiler_chunks._MACHINERY) or file.startswith("<eval_with_key"):
                return True
            frame = frame.f_back  # type: ignore[assignment]
        return False

    chunks(monkeypatch, every=True)
    where: list[bool] = []  # per chunk read: was compile machinery on the stack?
    real_flush = profiler_chunks.ChunkedProfiler.flush

    def flush(self: profiler_chunks.ChunkedProfiler) -> None:
        where.append(in_machinery())
        real_flush(self)

    calls: list[bool] = []  # per module call: was compile machinery on the stack?

    def called(module: nn.Module, args: object) -> None:
        calls.append(in_machinery())

    monkeypatch.setattr(profiler_chunks.ChunkedProfiler, "flush", flush)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: (a * 2).sin().sum(), backend="aot_eager")
    model = nn.Linear(8, 8)
    handle = nn.modules.module.register_module_forward_pre_hook(called)
    try:
        with jv.record("cpu", stacks=False):
            compiled(torch.randn(64, 64))
            model(torch.randn(2, 8))
    finally:
        handle.remove()
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()  # later tests of this process may trace stacks again (see compile_in_use)
    gc.collect()
    assert any(calls) and not all(calls)  # fx graphs compile ran and ran; and the Linear
    assert where and not any(where)  # chunks were read, none inside the machinery


def test_a_ctrl_c_while_a_chunk_is_read_waits_until_it_is_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An interrupt that arrives while a chunk's reports are being appended is raised once
    they all are: the columns stay the same length, and the profile up to it is whole."""
    import signal

    from jupyter_vram._capture import profiler_read

    chunks(monkeypatch, every=True)
    real_sweep = profiler_read._sweep
    interrupted: list[bool] = []

    def sweep(*args: object, **kwargs: object) -> None:
        real_sweep(*args, **kwargs)  # type: ignore[arg-type]
        if not interrupted:  # Ctrl-C just before this chunk's columns are extended
            interrupted.append(True)
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(profiler_read, "_sweep", sweep)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    kept = []
    with pytest.raises(KeyboardInterrupt), jv.record("cpu") as rec:
        for _ in range(50):
            kept.append(model(torch.randn(8, 64)))
    assert interrupted
    profile = rec.profile
    assert profile.error == "KeyboardInterrupt: "
    assert len(profile.to_dataframe()) > 0
