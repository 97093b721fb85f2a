"""A loop's repeated steps are recorded as the allocator's reports alone, and show what every
step recorded in detail shows.

Tests for ``_capture/steady.py``, its part of ``native_reports.cpp`` (``jv_mark``,
``jv_steady``) and of ``profiler_chunks.py`` / ``tagging.py`` (the watch for a step that no
longer repeats). The truth is the same loop recorded with ``ops="all"``, which records every
step in detail, and the CPU allocator's own reports under ``torch.profiler``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._capture import native, profiler_chunks
from jupyter_vram._capture.tagging import _top_saved_hooks

from .test_observer_effect import _case, train_step, true_peak
from .test_profiler_chunks import _differences, rows

pytestmark = pytest.mark.skipif(
    native.library() is None, reason=f"the light recorder is not built here: {native.why_not()}"
)

STEPS = 8


def _loop(name: str, steps: int = STEPS) -> Callable[[], None]:
    model, batch = _case(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = train_step(model, opt, batch)
    step()  # the optimizer's state exists: every step of the loop is the same

    def loop() -> None:
        for _ in range(steps):
            step()

    return loop


def _both(cell: Callable[[], None]) -> tuple[jv.Profile, jv.Profile]:
    """The cell recorded in detail (every step), then with the defaults."""
    with jv.record("cpu", ops="all") as detail:
        cell()
    with jv.record("cpu") as light:
        cell()
    return detail.profile, light.profile


def _global_hooks() -> list[int]:
    module = nn.modules.module
    optim = sys.modules["torch.optim.optimizer"]
    return [
        len(module._global_forward_pre_hooks),
        len(module._global_forward_hooks),
        len(optim._global_optimizer_pre_hooks),
        len(optim._global_optimizer_post_hooks),
    ]


@pytest.mark.parametrize("name", ["resnet", "checkpointed", "three_heads"])
def test_repeated_steps_show_what_every_step_recorded_in_detail_shows(name: str) -> None:
    """Every row (bytes, order, op, module, phase, role) equals the detail recording's; the
    peak is the allocator's; the profile says which steps were repeated."""
    loop = _loop(name)
    hooks = _global_hooks()
    detail, light = _both(loop)
    assert _global_hooks() == hooks  # the watch went with the recording
    assert "steady_steps" not in detail.meta
    # the first two steps set the pattern; from the third on, each repeats the one before
    assert light.meta["steady_steps"] == STEPS - 2
    assert "unlabelled_allocations" not in light.meta
    assert any("recorded as the allocator's reports alone" in w for w in light.meta["warnings"])
    frames = [rows(detail), rows(light)]
    assert frames[0].equals(frames[1]), _differences(frames, [detail.meta, light.meta])
    assert light.peak_bytes - light.timeline.baseline_bytes == true_peak(loop)
    assert {"forward", "backward", "optimizer"} <= set(frames[1]["phase"])


def test_a_step_that_differs_turns_detail_back_on() -> None:
    """A step with a smaller batch, then a call after the loop with another shape: only the
    allocations where a step stopped repeating lack labels (one each time, the first that
    differed); the rest of that step and the call after the loop are recorded in detail."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(32, 64)

    def cell() -> None:
        for i in range(12):
            batch = x[:16].clone() if i == 7 else x  # the clone: a report no step made
            model(batch).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        model(torch.ones(3, 64))  # after the loop, another shape

    cell()
    detail, light = _both(cell)
    missing = light.meta["unlabelled_allocations"]
    assert 1 <= missing <= 2
    assert light.meta["steady_steps"] >= 5
    frames = [rows(detail), rows(light)]
    assert len(frames[0]) == len(frames[1])
    differ = (frames[0] != frames[1]).any(axis=1)
    assert differ.sum() == missing, _differences(frames, [detail.meta, light.meta])
    lost = frames[1][differ]
    assert set(lost["op"]) == {"(unknown)"}
    assert set(frames[0][differ]["op"]) <= {"clone", "ones"}  # where each stopped repeating
    same = ["bytes", "alloc_seq", "free_seq"]
    assert frames[0][same].equals(frames[1][same])
    # the call after the loop: its layers named, as in detail
    last = frames[1].iloc[-4:]
    assert {"Sequential.0", "Sequential.2"} <= set(last["module"])


def test_a_loop_interrupted_while_steps_repeat_leaves_nothing_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C (a KeyboardInterrupt from the cell) while steps repeat: every hook goes, the
    library stops, and the next recording goes steady again."""
    loop = _loop("three_heads", steps=50)
    hooks = _global_hooks()
    saved = _top_saved_hooks()
    calls = {"n": 0}
    real = nn.Linear.forward

    def interrupting(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 4 * 8:  # the 8th step: repeating by then
            raise KeyboardInterrupt
        return real(self, x)

    with monkeypatch.context() as patch:
        patch.setattr(nn.Linear, "forward", interrupting)
        with pytest.raises(KeyboardInterrupt), jv.record("cpu") as rec:
            loop()
    assert rec.profile.meta["steady_steps"] >= 4
    assert _global_hooks() == hooks
    assert _top_saved_hooks() == saved
    assert not native.recording()
    with jv.record("cpu") as again:
        _loop("three_heads")()
    assert again.profile.meta["steady_steps"] == STEPS - 2


def test_every_step_in_detail_when_asked() -> None:
    """``ops="all"`` (``%%vram --all-ops``) records every step in detail, and ``jv.record``
    passes it on (it once dropped the argument); a wrong value is refused."""
    loop = _loop("three_heads")
    with jv.record("cpu", ops="all") as rec:
        loop()
    assert "steady_steps" not in rec.profile.meta
    with pytest.raises(ValueError, match="ops must be"):
        jv.record("cpu", ops="some")


def test_steps_of_different_modules_are_not_taken_for_repeats() -> None:
    """Two models of the same shapes called in turn: each step allocates the same sizes as the
    one before, but was begun by another module, so a step never repeats the one before it:
    the loop repeats in pairs (the first four steps set the pattern), and every row is named by
    its own model."""

    class Twin(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)  # type: ignore[no-any-return]

    torch.manual_seed(0)
    a, b = nn.Sequential(nn.Linear(32, 32)), Twin()
    x = torch.randn(8, 32)

    def cell() -> None:
        for _ in range(10):
            a(x).sum().backward()
            b(x).sum().backward()

    cell()
    detail, light = _both(cell)
    assert light.meta["steady_period"] == 2
    assert light.meta["steady_steps"] == 20 - 4
    frames = [rows(detail), rows(light)]
    assert frames[0].equals(frames[1]), _differences(frames, [detail.meta, light.meta])
    assert {"Sequential.0", "Twin.layer"} <= set(frames[1]["module"])


def _classifier() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, torch.randn(32, 64), torch.randint(0, 10, (32,))


def test_a_loop_with_a_loss_module_repeats_in_pairs() -> None:
    """``criterion(model(x), y)``, the loss an ``nn.Module`` called at the top level: each
    iteration is two steps (the model's, then the loss module's, with backward and the
    optimizer), so the loop repeats in pairs. Every row as in detail; the peak is the
    allocator's; the header says how the steps repeat."""
    model, opt, x, y = _classifier()
    criterion = nn.CrossEntropyLoss()

    def loop() -> None:
        for _ in range(STEPS):
            criterion(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    loop()
    detail, light = _both(loop)
    assert light.meta["steady_period"] == 2
    assert light.meta["steady_steps"] == 2 * STEPS - 4  # two iterations set the pattern
    assert "unlabelled_allocations" not in light.meta
    assert any("repeat in groups of 2" in w for w in light.meta["warnings"])
    frames = [rows(detail), rows(light)]
    assert frames[0].equals(frames[1]), _differences(frames, [detail.meta, light.meta])
    assert light.peak_bytes - light.timeline.baseline_bytes == true_peak(loop)
    assert "CrossEntropyLoss" in set(frames[1]["module"])


@pytest.mark.parametrize("every", [4, 8])
def test_gradient_accumulation_repeats_with_its_optimizer_step(every: int) -> None:
    """The optimizer steps every ``every`` batches: steps of one batch repeat for a while,
    then the optimizer step does not; shorter patterns are not tried again, and the loop is
    found to repeat every ``every`` steps (for 8, the spacing of the first two stops says so).
    Only the allocations made between a stop and detail coming back lack labels: at most those
    of one optimizer step and the zeroing after it, each time a pattern stopped; every other
    row is as in detail."""
    model, opt, x, y = _classifier()
    batches = 8 * every

    def loop() -> None:
        for i in range(batches):
            (nn.functional.cross_entropy(model(x), y) / every).backward()
            if (i + 1) % every == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)

    loop()
    detail, light = _both(loop)
    assert light.meta["steady_period"] == every
    frames = [rows(detail), rows(light)]
    assert len(frames[0]) == len(frames[1])
    differ = (frames[0] != frames[1]).any(axis=1)
    missing = light.meta["unlabelled_allocations"]
    assert differ.sum() == missing, _differences(frames, [detail.meta, light.meta])
    assert set(frames[1][differ]["op"]) == {"(unknown)"}
    # an optimizer step's allocations, counted in the detail recording
    per_step = int((frames[0]["phase"] == "optimizer").sum()) // (batches // every)
    stops = 1 if every == 4 else 2  # one batch's pattern; for 8 also two batches'
    assert 0 < missing <= stops * (per_step + 2)
    # detail costs two rounds of the pattern after the last stop; the rest repeats
    assert light.meta["steady_steps"] >= batches - (stops + 2) * every
    same = ["bytes", "alloc_seq", "free_seq"]
    assert frames[0][same].equals(frames[1][same])


def test_after_a_long_repeat_the_shortest_pattern_is_tried_again() -> None:
    """A pattern that held for many steps and then stopped (here one odd batch) was right: the
    steps after are tried as one-step repeats again, not as longer patterns only. Steps 0-1
    set the pattern; 2-69 repeat (68); the odd batch (made before step 70's model call) stops
    it; 70 (the odd batch), 71 and 72 run in detail; 73-79 repeat (7)."""
    model, opt, x, y = _classifier()

    def cell() -> None:
        for i in range(80):
            batch = x[:16].clone() if i == 70 else x
            nn.functional.cross_entropy(model(batch), y[: len(batch)]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    cell()
    detail, light = _both(cell)
    assert light.meta["steady_steps"] == 68 + 7
    assert light.meta["steady_period"] == 1
    frames = [rows(detail), rows(light)]
    differ = (frames[0] != frames[1]).any(axis=1)
    assert differ.sum() == light.meta["unlabelled_allocations"] == 1  # the odd batch's clone


def test_a_step_that_differs_inside_a_module_call_resumes_at_the_next_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Detail never comes back in the middle of a module call (the call would be seen as a
    step of its own): a step that stops repeating inside one is left unlabelled from there,
    and the next step's call of the same module turns detail back on. (Here the helper
    thread's requests never find a moment outside a call, so the next step is the only way.)"""

    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(64, 64)
            self.extra = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.extra:
                torch.ones(5)  # a report no earlier step made, inside the call
            return self.layer(x)  # type: ignore[no-any-return]

    def never_now(self: profiler_chunks.ChunkedProfiler, frame: object) -> None:
        assert self._detail_back is not None
        self._detail_back(False)  # as inside a call: at the next module call

    monkeypatch.setattr(profiler_chunks.ChunkedProfiler, "_detail_again", never_now)
    torch.manual_seed(0)
    model = Odd()
    x = torch.randn(16, 64)

    def cell() -> None:
        for i in range(12):
            model.extra = i == 7
            model(x).sum().backward()

    cell()
    detail, light = _both(cell)
    frames = [rows(detail), rows(light)]
    differ = (frames[0] != frames[1]).any(axis=1)
    missing = light.meta["unlabelled_allocations"]
    assert differ.sum() == missing, _differences(frames, [detail.meta, light.meta])
    per_step = len(frames[0]) // 12  # about one step's allocations
    assert 1 <= missing <= per_step + 1  # the rest of step 8 (and its extra), no more
    assert not differ.iloc[-3 * per_step :].any()  # the last steps: labelled


def test_a_transformers_training_loop_and_generate() -> None:
    """A GPT-2 (from its config) trained for eight steps: every row as in detail, six steps
    repeated. Generating with a KV cache never repeats (the cache grows every token), so it
    is recorded in detail."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
        attn_implementation="eager",
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 500, (2, 32))

    def train() -> None:
        for _ in range(STEPS):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    def generate() -> None:
        with torch.no_grad():
            model.generate(ids[:1, :8], max_new_tokens=12, do_sample=False, pad_token_id=0)

    train()
    for cell, repeated in ((train, STEPS - 2), (generate, None)):
        detail, light = _both(cell)
        assert light.meta.get("steady_steps") == repeated
        frames = [rows(detail), rows(light)]
        assert frames[0].equals(frames[1]), _differences(frames, [detail.meta, light.meta])


def test_repeated_steps_take_the_stacks_of_the_steps_they_repeat() -> None:
    """A repeated step's allocations get their template's stacks, which samples and module
    calls placed while it ran in detail: every forward allocation of the model names the
    line that calls it, in every step. What runs after the model returns (backward, the
    optimizer step, round the loop to that line again) is never said to be on that line.
    While steps repeat the helper thread takes no sample (none would be used)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 64)
    calls_model = sys._getframe().f_lineno + 3  # the line of ``out = model(x)`` below

    def step() -> None:
        out = model(x)
        out.sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    recording = jv.record("cpu")
    with recording:
        recorder = recording.recorder
        for _ in range(150):
            step()
    profile = recording.profile
    assert profile.meta["steady_steps"] == 148
    frame = profile.to_dataframe()
    forward = frame[(frame["op"] == "addmm") & (frame["phase"] == "forward")]
    assert len(forward) == 2 * 150  # two Linear layers a step
    on_the_call = f"step ({os.path.basename(__file__)}:{calls_model})"
    assert set(forward["site"]) == {on_the_call}
    after = frame[frame["phase"].isin(["backward", "optimizer"])]
    assert len(after) and on_the_call not in set(after["site"])
    # no sample of the helper thread between the fourth step's model call (its steps repeat
    # from the third on) and the last step's
    assert recorder is not None
    t0 = recorder._t0  # type: ignore[attr-defined]  # the rows' times count from it
    first, last = (t0 + int(forward["alloc_ms"].iloc[i] * 1e6) for i in (6, -1))
    times = np.frombuffer(recorder._chunks.ticker.samples.times, np.int64)  # type: ignore[attr-defined]
    assert len(times) and not np.any((times > first) & (times < last))
