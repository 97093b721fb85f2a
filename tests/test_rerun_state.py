"""A rerun leaves the notebook as the first run left it: parameters, buffers, gradients,
optimizer and scheduler state, random streams, modes and names, compared bit for bit with
copies the test takes itself, also when the rerun's cell raises or is interrupted."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._rerun import NOT_A_CELL, RerunError, rerun, rerun_unavailable
from jupyter_vram._session import run_code

TRAIN_STEP = """\
opt.zero_grad()
out = model(x)
loss = out.square().mean() + torch.rand(()) * 0 + random.random() * 0 + np.random.rand() * 0
loss.backward()
opt.step()
sched.step()
step += 1
"""


@pytest.fixture(autouse=True)
def forget_cells() -> Any:
    """The kernel's latest profile keeps its cell's namespace: let go of this test's models."""
    yield
    from jupyter_vram import _session as session

    session._last_profile = None


class ConvNet(nn.Module):
    """Three same-typed conv blocks with BatchNorm (running statistics) and dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(
            *[
                nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
                for _ in range(3)
            ]
        )
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.stem(x))
        return self.head(self.drop(h.mean((2, 3))))


def notebook() -> dict[str, Any]:
    torch.manual_seed(0)
    model = ConvNet()
    model.blocks[1].eval()  # a mixed train/eval tree must come back mixed
    model.stem.bias.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return {
        "torch": torch,
        "np": np,
        "random": random,
        "model": model,
        "opt": opt,
        "sched": sched,
        "x": torch.randn(4, 3, 16, 16),
        "step": 0,
        "scaler": torch.amp.GradScaler("cpu", enabled=False),  # state_dict() is {}
    }


def snapshot(ns: dict[str, Any]) -> dict[str, Any]:
    """The test's own copies of everything a rerun must not change."""
    model: nn.Module = ns["model"]
    opt: torch.optim.Optimizer = ns["opt"]
    return {
        "params": [(p, p.detach().clone(), p.requires_grad) for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "buffers": [(b, b.clone()) for b in model.buffers()],
        "modes": [m.training for m in model.modules()],
        "opt": {
            id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for p, s in opt.state.items()
        },
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "sched": dict(ns["sched"].state_dict()),
        "torch_rng": torch.get_rng_state(),
        "py_rng": random.getstate(),
        "np_rng": np.random.get_state()[1].copy(),
        "names": dict(ns),
    }


def assert_unchanged(ns: dict[str, Any], before: dict[str, Any]) -> None:
    model: nn.Module = ns["model"]
    now = list(model.parameters())
    assert len(now) == len(before["params"])
    for p, (orig, values, requires_grad) in zip(now, before["params"], strict=True):
        assert p is orig
        assert torch.equal(p, values)
        assert p.requires_grad == requires_grad
    for p, grad in zip(now, before["grads"], strict=True):
        assert (p.grad is None) == (grad is None)
        if grad is not None:
            assert torch.equal(p.grad, grad)
    for b, (orig, values) in zip(model.buffers(), before["buffers"], strict=True):
        assert b is orig and torch.equal(b, values)
    assert [m.training for m in model.modules()] == before["modes"]
    opt = ns["opt"]
    assert {id(p) for p in opt.state} == set(before["opt"])
    for p, state in opt.state.items():
        saved = before["opt"][id(p)]
        assert set(state) == set(saved)
        for key, value in state.items():
            assert torch.equal(value, saved[key]) if torch.is_tensor(value) else value == saved[key]
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == before[
        "groups"
    ]
    assert ns["sched"].state_dict() == before["sched"]
    assert torch.equal(torch.get_rng_state(), before["torch_rng"])
    assert random.getstate() == before["py_rng"]
    assert np.array_equal(np.random.get_state()[1], before["np_rng"])
    assert ns.keys() == before["names"].keys()
    for name, value in before["names"].items():
        assert ns[name] is value, name
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.fixture
def trained() -> tuple[dict[str, Any], jv.Profile]:
    ns = notebook()
    run_code(TRAIN_STEP, ns)  # state and optimizer exist, as after a first step
    baseline = run_code(TRAIN_STEP, ns).profile
    assert baseline is not None
    return ns, baseline


@pytest.mark.parametrize(
    "options",
    [{}, {"checkpoint": "auto"}, {"amp": "bf16"}, {"checkpoint": "auto", "amp": "bf16"}],
    ids=["plain", "checkpoint", "bf16", "both"],
)
def test_state_is_bit_identical_after_a_rerun(
    trained: tuple[dict[str, Any], jv.Profile], options: dict[str, Any]
) -> None:
    ns, baseline = trained
    before = snapshot(ns)
    messages: list[str] = []
    variant = rerun(baseline, **options, progress=messages.append)
    assert messages == ["saving state", "running", "restoring"]
    assert_unchanged(ns, before)
    assert ns["step"] == 2  # `step += 1` in the rerun stayed in its copy of the namespace
    assert variant.variant is not None
    assert variant.variant.amp == options.get("amp")
    assert variant.meta["rerun_cost"]["state_bytes"] > 0
    # the rerun really ran the step: its profile has the optimizer's phase
    assert (variant.allocations.phase == 3).any()


def test_a_rerun_whose_cell_raises_leaves_state_intact(
    trained: tuple[dict[str, Any], jv.Profile],
) -> None:
    ns, baseline = trained
    before = snapshot(ns)
    from jupyter_vram import _session as session

    cell = session.cell_of(baseline)
    assert cell is not None
    broken = (
        TRAIN_STEP
        + "model.train()\nmodel.blocks[0][1].running_mean.fill_(7)\nraise ValueError('boom')\n"
    )
    session._cells[baseline] = session.Cell(
        broken, cell.filename, cell.namespace, cell.device, cell.stacks, cell.label, cell.start
    )
    with pytest.raises(ValueError, match="boom"):
        rerun(baseline, checkpoint="auto")
    assert_unchanged(ns, before)


def test_an_interrupted_rerun_leaves_state_intact(
    trained: tuple[dict[str, Any], jv.Profile],
) -> None:
    ns, baseline = trained
    before = snapshot(ns)
    from jupyter_vram import _session as session

    cell = session.cell_of(baseline)
    assert cell is not None
    interrupted = TRAIN_STEP + "x.mul_(0)\nraise KeyboardInterrupt\n"
    session._cells[baseline] = session.Cell(
        interrupted, cell.filename, cell.namespace, cell.device, cell.stacks, None, cell.start
    )
    x_before = ns["x"].clone()
    with pytest.raises(KeyboardInterrupt):
        rerun(baseline, amp="bf16")
    assert_unchanged(ns, before)
    assert torch.equal(ns["x"], x_before)  # a tensor the cell names is protected too


def test_the_rerun_starts_where_the_first_run_did() -> None:
    """First run: no .grad, no optimizer state before it. The rerun drops the ones it made
    (and restores them after), and draws the same random numbers."""
    ns = notebook()
    ns["draws"] = []
    baseline = run_code(TRAIN_STEP + "draws.append(torch.rand(3))\n", ns).profile
    assert baseline is not None
    before = snapshot(ns)
    variant = rerun(baseline)
    assert_unchanged(ns, before)
    assert torch.equal(ns["draws"][0], ns["draws"][1])  # same random stream as the first run
    frame = baseline.compare(variant)
    for category in ("parameter", "gradient", "optimizer_state", "buffer", "input"):
        assert frame.loc[category, "change_bytes"] == 0, category
    assert frame.attrs["notes"] == []
    assert variant.variant is not None
    assert any("without the .grad of 15 parameters" in n for n in variant.variant.notes)
    assert any("changes a notebook container (draws.append" in n for n in variant.variant.notes)


def test_refusals_are_one_line_and_touch_nothing(
    trained: tuple[dict[str, Any], jv.Profile],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ns, baseline = trained
    before = snapshot(ns)
    loaded = jv.Profile.load(baseline.save(tmp_path / "p.json"))
    assert rerun_unavailable(loaded, checkpoint="auto") == NOT_A_CELL
    with jv.record(namespace={}) as rec:
        torch.ones(8).mul(2)
    with pytest.raises(RerunError, match="rerun needs a profile made by %%vram"):
        rerun(rec.profile)
    assert "host memory (CPU)" in str(rerun_unavailable(baseline, offload=True))
    variant = rerun(baseline, amp="bf16")
    assert rerun_unavailable(variant) == (
        "this profile is a rerun (bf16 autocast): rerun the profile of <vram-cell>"
    )
    with pytest.raises(RerunError, match="AMP dtype"):
        rerun(baseline, amp="int8")
    with pytest.raises(RerunError, match="no module 'nope'"):
        rerun(baseline, checkpoint=["nope.blocks.0"])
    with pytest.raises(RerunError, match=r"has no submodule 'blocks\.9'"):
        rerun(baseline, checkpoint=["model.blocks.9"])
    from jupyter_vram._transforms import state

    monkeypatch.setattr(state, "available_host_bytes", lambda: 1000)
    reason = rerun_unavailable(baseline, amp="bf16")
    assert reason is not None and reason.startswith("not enough host memory")
    assert "1000 B is available" in reason
    assert_unchanged(ns, before)


def test_cells_without_a_module_autograd_or_with_autocast_say_why() -> None:
    ns: dict[str, Any] = {"torch": torch, "a": torch.randn(64, 64, requires_grad=True)}
    plain = run_code("b = (a @ a).sum()\nb.backward()\n", ns).profile
    assert plain is not None
    assert rerun_unavailable(plain, checkpoint="auto") == (
        "checkpointing needs an nn.Module: the cell called none from the notebook"
    )
    assert rerun_unavailable(plain, amp="bf16") is None  # autocast needs no module
    ns["model"] = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    inference = run_code("with torch.no_grad():\n    y = model(a)\n", ns).profile
    assert inference is not None
    assert rerun_unavailable(inference, checkpoint="auto") == (
        "the cell saved nothing for backward (no autograd): nothing to checkpoint"
    )
    amp = run_code(
        "with torch.autocast('cpu', dtype=torch.bfloat16):\n    model(a).sum().backward()\n", ns
    ).profile
    assert amp is not None
    assert rerun_unavailable(amp, amp="bf16") == (
        "the cell already runs under autocast (line 1): AMP is on"
    )
    ns["net"] = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))  # mixed types
    mixed = run_code("net(a).sum().backward()\n", ns).profile
    assert mixed is not None
    assert str(rerun_unavailable(mixed, checkpoint="auto")).startswith("no repeated blocks")


def test_warnings_for_files_iterators_and_containers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    batches = iter([torch.randn(8, 16), torch.randn(12, 16)])
    ns: dict[str, Any] = {
        "torch": torch,
        "model": nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)),
        "batches": batches,
        "log": [],
        "path": str(tmp_path / "log.txt"),
    }
    source = (
        "x = next(batches)\nloss = model(x).sum()\nloss.backward()\nlog.append(1)\n"
        "with open(path, 'w') as fh:\n    fh.write('x')\n"
    )
    baseline = run_code(source, ns).profile
    assert baseline is not None
    variant = rerun(baseline, checkpoint=["model.0"])
    assert variant.variant is not None
    notes = variant.variant.notes
    assert (
        notes[0] == "the cell writes files (open(..., write) on line 5): the rerun wrote them again"
    )
    assert notes[1].startswith("the cell draws from an iterator (next(...) on line 1)")
    assert notes[2].startswith("the cell changes a notebook container (log.append(...))")
    assert variant.variant.checkpointed == ("Sequential.0",)
    assert ns["log"] == [1, 1]  # warned, not undone
    assert "inputs differ (512 B -> 768 B)" in jv.verdict(baseline, variant)


def test_gradients_the_first_run_started_with_are_there_for_the_rerun() -> None:
    """The first run starts with .grad and ends with zero_grad(): the rerun gets zero
    gradients of the same sizes, so both start from the same memory."""
    ns = notebook()
    run_code(TRAIN_STEP, ns)  # .grad and optimizer state exist
    baseline = run_code("model(x).square().mean().backward()\nopt.step()\nopt.zero_grad()\n", ns)
    assert baseline.profile is not None
    assert all(p.grad is None for p in ns["model"].parameters())
    before = snapshot(ns)
    variant = rerun(baseline.profile)
    assert_unchanged(ns, before)
    assert variant.variant is not None
    assert any(
        "with a zero .grad for 15 parameters that had one" in n for n in variant.variant.notes
    )
    frame = baseline.profile.compare(variant)
    assert frame.attrs["notes"] == []
    assert frame.loc["gradient", "change_bytes"] == 0


def test_a_cell_that_swaps_modules_and_converts_the_model_is_undone(
    trained: tuple[dict[str, Any], jv.Profile],
) -> None:
    """Replaced submodules and buffers, a dtype conversion, eval mode and frozen weights
    all come back: the same objects, float32, the same values."""
    ns, baseline = trained
    before = snapshot(ns)
    head = ns["model"].head
    from jupyter_vram import _session as session

    cell = session.cell_of(baseline)
    assert cell is not None
    rewiring = (
        "model.head = torch.nn.Linear(8, 4)\n"
        "model.blocks[0][1].running_var = torch.zeros(8)\n"
        "model.stem.weight.requires_grad_(False)\n"
        "model.double()\n"
        "model.eval()\n"
        "model(x.double()).sum().backward()\n"
    )
    session._cells[baseline] = session.Cell(
        rewiring, cell.filename, cell.namespace, cell.device, cell.stacks, None, cell.start
    )
    rerun(baseline)
    assert ns["model"].head is head
    assert {p.dtype for p in ns["model"].parameters()} == {torch.float32}
    assert_unchanged(ns, before)


def test_a_rerun_inside_a_recording_is_refused_before_anything_runs(
    trained: tuple[dict[str, Any], jv.Profile],
) -> None:
    ns, baseline = trained
    before = snapshot(ns)
    with jv.record(namespace={}), pytest.raises(RerunError, match="inside another recording"):
        rerun(baseline)
    assert_unchanged(ns, before)


def test_one_object_that_refuses_its_restore_does_not_stop_the_others() -> None:
    from jupyter_vram._transforms import state

    class Stubborn(torch.optim.lr_scheduler.StepLR):
        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            raise RuntimeError("refuses")

    plain = notebook()
    ns = {"stubborn": Stubborn(plain["opt"], step_size=1), **plain}  # restored before sched
    weight = ns["model"].head.weight
    values = weight.detach().clone()
    epoch = ns["sched"].last_epoch
    copy = state.take(ns)
    with torch.no_grad():
        weight.add_(1)
    ns["model"].eval()
    ns["opt"].step()  # no gradients: changes nothing but the order torch expects
    ns["sched"].step()
    with pytest.raises(RuntimeError, match="refuses"):
        copy.restore()
    assert torch.equal(weight, values)
    assert ns["model"].training
    assert ns["sched"].last_epoch == epoch  # the next object of the same kind, still restored


def test_a_rerun_names_the_object_it_could_not_put_back() -> None:
    class Stubborn(torch.optim.lr_scheduler.StepLR):
        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            raise RuntimeError("refuses")

    ns = notebook()
    baseline = run_code(TRAIN_STEP, ns).profile
    assert baseline is not None
    ns["stubborn"] = Stubborn(ns["opt"], step_size=1)
    weight = ns["model"].head.weight
    values = weight.detach().clone()
    with pytest.raises(RerunError) as error:
        rerun(baseline)
    assert str(error.value) == (
        "the rerun could not put one object back (RuntimeError: refuses); "
        "everything else is as before"
    )
    assert torch.equal(weight, values)


def test_a_discarded_interrupted_recording_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose caller throws its profile away when it raises (a rerun: Cancel is an
    interrupt) stops without reading the profiler's events, which takes seconds with Python
    stacks; elsewhere an interrupted run keeps its partial profile."""
    from jupyter_vram._capture import cpu_recorder, profiler_chunks

    read: list[int] = []  # events read as the recording stops (either reading)
    stopping: list[bool] = []
    real, real_native = profiler_chunks.read_events, profiler_chunks.read_native
    real_stop = cpu_recorder.ProfilerRecorder.stop

    def spy(roots: Any, *args: Any, **kwargs: Any) -> Any:
        if stopping:
            read.append(len(roots))
        return real(roots, *args, **kwargs)

    def spy_native(chunk: Any, *args: Any, **kwargs: Any) -> Any:
        if stopping:
            read.append(len(chunk))
        return real_native(chunk, *args, **kwargs)

    def stop(self: Any, error: str | None = None) -> jv.Profile:
        stopping.append(True)
        try:
            return real_stop(self, error)
        finally:
            stopping.clear()

    monkeypatch.setattr(profiler_chunks, "read_events", spy)
    monkeypatch.setattr(profiler_chunks, "read_native", spy_native)
    monkeypatch.setattr(cpu_recorder.ProfilerRecorder, "stop", stop)
    monkeypatch.setattr(profiler_chunks, "FIRST_CHUNK_NS", 10**15)  # one chunk: read at the end
    ns = notebook()
    cell = TRAIN_STEP + "raise KeyboardInterrupt\n"
    kept: list[jv.Profile] = []
    with pytest.raises(KeyboardInterrupt):
        run_code(cell, ns, device="cpu", keep=False, on_profile=kept.append)
    assert sum(read) > 0 and len(kept[0].allocations) > 0  # the partial profile, read
    read.clear()
    with pytest.raises(KeyboardInterrupt), cpu_recorder.discarded_on_error():
        run_code(cell, ns, device="cpu", keep=False, on_profile=kept.append)
    assert sum(read) == 0
    assert len(kept[1].allocations) == 0
    assert kept[1].meta["warnings"] == [cpu_recorder.NOT_READ]
    assert kept[1].error == "KeyboardInterrupt: "
    # a run that ends normally inside is read as always
    profile = run_code(TRAIN_STEP, ns, device="cpu", keep=False).profile
    assert sum(read) > 0 and profile is not None and len(profile.allocations) > 0


def test_an_interrupted_rerun_reads_no_events(
    trained: tuple[dict[str, Any], jv.Profile], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks read while the cell ran are read; what the profiler holds when it is
    interrupted is not (nobody will look at it)."""
    _, baseline = trained
    from jupyter_vram import _session as session
    from jupyter_vram._capture import cpu_recorder, profiler_chunks

    read_at_stop: list[int] = []  # either reading
    stopping: list[bool] = []
    real, real_native = profiler_chunks.read_events, profiler_chunks.read_native
    real_stop = cpu_recorder.ProfilerRecorder.stop

    def spy(roots: Any, *args: Any, **kwargs: Any) -> Any:
        if stopping:
            read_at_stop.append(len(roots))
        return real(roots, *args, **kwargs)

    def spy_native(chunk: Any, *args: Any, **kwargs: Any) -> Any:
        if stopping:
            read_at_stop.append(len(chunk))
        return real_native(chunk, *args, **kwargs)

    def stop(self: Any, error: str | None = None) -> jv.Profile:
        stopping.append(True)
        return real_stop(self, error)

    monkeypatch.setattr(profiler_chunks, "read_events", spy)
    monkeypatch.setattr(profiler_chunks, "read_native", spy_native)
    monkeypatch.setattr(cpu_recorder.ProfilerRecorder, "stop", stop)
    cell = session.cell_of(baseline)
    assert cell is not None
    session._cells[baseline] = session.Cell(
        TRAIN_STEP + "raise KeyboardInterrupt\n",
        cell.filename,
        cell.namespace,
        cell.device,
        cell.stacks,
        None,
        cell.start,
    )
    with pytest.raises(KeyboardInterrupt):
        rerun(baseline, amp="bf16")
    assert stopping and sum(read_at_stop) == 0
