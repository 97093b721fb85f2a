"""Exact accounting on real training steps, checked against independent arithmetic."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jupyter_vram as jv
from jupyter_vram._model import CATEGORY_INDEX, PHASES

from .conftest import MLP, owned_breakdown


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    """One step that frees what it allocates (zero_grad last), so a profiler that cannot see
    frees of older memory still measures it completely."""
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def bytes_saved_by_autograd(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Distinct storages autograd saves in one forward, minus parameters and the data."""
    keep: dict[int, torch.UntypedStorage] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        keep[t.untyped_storage()._cdata] = t.untyped_storage()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.mse_loss(model(x), y)
    exclude = {p.untyped_storage()._cdata for p in model.parameters()}
    exclude |= {x.untyped_storage()._cdata, y.untyped_storage()._cdata}
    return sum(s.nbytes() for k, s in keep.items() if k not in exclude)


def profiler_peak_delta(step: object) -> int:
    """Peak of CPU bytes allocated during `step`, from torch.profiler's allocation events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()  # type: ignore[operator]
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    running = np.cumsum([e.nbytes() for e in events])
    return int(max(0, running.max()))


@pytest.fixture
def second_step(mlp: MLP) -> tuple[MLP, torch.optim.Adam, torch.Tensor, torch.Tensor, jv.Profile]:
    opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)
    x, y = torch.randn(16, 256), torch.randn(16, 256)
    train_step(mlp, opt, x, y)  # step 1 creates the optimizer state
    with jv.record() as rec:
        train_step(mlp, opt, x, y)
    return mlp, opt, x, y, rec.profile


def test_mlp_adam_breakdown_at_peak_is_exact(second_step) -> None:  # type: ignore[no-untyped-def]
    model, _, _, _, prof = second_step
    params = list(model.parameters())
    param_bytes = 4 * sum(p.numel() for p in params)
    step_scalar_bytes = len(params) * torch.tensor(0.0).element_size()

    breakdown = prof.peak_breakdown()
    assert sum(breakdown.values()) == prof.peak_bytes
    assert set(breakdown) == set(jv.CATEGORIES)
    owned = owned_breakdown(prof, prof.timeline.peak_index, "MLP")
    assert owned["parameter"] == param_bytes
    assert owned["gradient"] == param_bytes
    assert owned["optimizer_state"] == 2 * param_bytes + step_scalar_bytes
    # nothing else holds parameters, gradients or optimizer state in this test
    for category in ("parameter", "gradient", "optimizer_state"):
        assert breakdown[category] == owned[category]
    peak_row = prof.timeline.alloc_index[prof.timeline.peak_index]
    assert PHASES[prof.allocations.phase[peak_row]] == "optimizer"


@pytest.mark.parametrize("change", ["unfreeze", "move", "replace state"])
def test_model_state_changed_between_steps_is_noted_again(change: str) -> None:
    """An optimizer step does not note again the parameters and state it noted already (the
    same tensors at the same addresses in the same roles); what changed between two steps
    of one recorded block is noted again: a frozen layer made trainable, weights moved to
    new memory (``model.to()`` keeps the Parameter objects), state tensors replaced."""
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    model[2].weight.requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(4, 32)

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # Adam's state exists before recording (none for the frozen weight)
    if change != "unfreeze":
        model[2].weight.requires_grad_(True)
        step()
    with jv.record() as rec:
        step()
        if change == "unfreeze":
            model[2].weight.requires_grad_(True)
        elif change == "move":
            with torch.no_grad():
                for p in model.parameters():
                    p.data = p.data.clone()  # new memory under the same Parameter objects
        else:
            for state in opt.state.values():
                state["exp_avg"] = state["exp_avg"].clone()  # new state tensors
        step()
    live = dict(zip(jv.CATEGORIES, rec.profile.timeline.by_category()[-1].tolist(), strict=True))
    every = 4 * (32 * 64 + 64 + 64 * 8 + 8)
    assert live["parameter"] == every
    assert live["frozen_parameter"] == 0
    assert live["optimizer_state"] == 2 * every + 4 * 4  # two moments, four float steps


def test_activation_bytes_are_what_autograd_saved(second_step) -> None:  # type: ignore[no-untyped-def]
    model, _, x, y, prof = second_step
    expected = bytes_saved_by_autograd(model, x, y)
    activation = prof.timeline.by_category()[:, CATEGORY_INDEX["activation"]]
    assert expected > 0
    assert activation.max() == expected
    assert activation[-1] == 0  # all freed by backward


def test_input_and_baseline_categories(second_step) -> None:  # type: ignore[no-untyped-def]
    _, _, x, _, prof = second_step
    df = prof.to_dataframe()
    inputs = df[df["category"] == "input"]
    # x went into the model; y was saved by mse_loss: both existed before the cell
    assert sorted(inputs["bytes"]) == [x.nbytes, x.nbytes]
    assert (inputs["alloc_seq"] == -1).all()


def test_peak_agrees_with_torch_profiler(second_step) -> None:  # type: ignore[no-untyped-def]
    model, opt, x, y, prof = second_step
    independent = profiler_peak_delta(lambda: train_step(model, opt, x, y))
    ours = prof.peak_bytes - prof.timeline.baseline_bytes
    assert independent > 0
    assert abs(ours - independent) <= 0.01 * independent, (ours, independent)


def test_frees_follow_storage_not_views() -> None:
    with jv.record() as rec:
        a = torch.empty(1000)
        view = a[10:]
        del a
        b = torch.empty(10)
        del view
        del b
    df = rec.profile.to_dataframe()
    big = df[df["bytes"] == 4000].iloc[0]
    small = df[df["bytes"] == 40].iloc[0]
    assert big["alloc_seq"] < small["alloc_seq"] < big["free_seq"] < small["free_seq"]
    assert rec.profile.peak_bytes - rec.profile.timeline.baseline_bytes == 4040


def test_out_argument_resize_is_an_allocation() -> None:
    a, b = torch.ones(256), torch.ones(256)
    out = torch.empty(0)
    with jv.record() as rec:
        torch.add(a, b, out=out)
    df = rec.profile.to_dataframe()
    assert list(df[df["alloc_seq"] >= 0]["bytes"]) == [1024]
    assert rec.profile.peak_bytes - rec.profile.timeline.baseline_bytes == 1024


def test_baseline_is_categorised(mlp: MLP) -> None:
    """Memory held before the block, reachable from the namespace (a notebook's variables),
    is categorised even when the block never touches it."""
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 256)
    mlp(x).sum().backward()
    opt.step()
    with jv.record(namespace={"model": [mlp], "state": {"opt": opt}}) as rec:
        pass
    b = rec.profile.timeline.breakdown_at(-1)
    param_bytes = 4 * sum(p.numel() for p in mlp.parameters())
    assert b["parameter"] == param_bytes
    assert b["gradient"] == param_bytes
    assert b["optimizer_state"] == param_bytes  # one momentum buffer per parameter
    assert rec.profile.event_count == 0
    modules = set(rec.profile.to_dataframe().query("category == 'parameter'")["module"])
    assert modules == {"MLP.fc1", "MLP.fc2"}


def test_backward_seed_is_backward_phase() -> None:
    model = nn.Linear(8, 8)
    with jv.record() as rec:
        model(torch.randn(2, 8)).sum().backward()
    df = rec.profile.to_dataframe()
    run = df[df["alloc_seq"] >= 0]
    phases = {op: set(run[run["op"] == op]["phase"]) for op in ("addmm", "ones_like", "mm")}
    assert phases == {"addmm": {"forward"}, "ones_like": {"backward"}, "mm": {"backward"}}
    assert set(run[run["op"] == "mm"]["module"]) == {"Linear"}  # backward charged to the module


class KeywordModel(nn.Module):
    """Called like a transformers model: tensors by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        out = self.fc(x)
        return out if target is None else (out - target).pow(2).mean()


def test_keyword_inputs_are_inputs_and_their_hooks_go_away() -> None:
    model = KeywordModel()
    x, target = torch.randn(32, 16), torch.randn(32, 16)
    with jv.record("cpu") as rec:
        model(x=x, target=target).backward()
    assert rec.profile.peak_breakdown()["input"] == 2 * 32 * 16 * 4
    assert not model._forward_pre_hooks  # the per-module hook left with the recording


def test_checkpointed_block_inputs_are_activations() -> None:
    """Checkpointing keeps each block's input for the recompute: activations, not inputs."""
    from jupyter_vram._transforms.checkpointing import enable_checkpointing

    blocks = nn.Sequential(*(nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(4)))
    undo = enable_checkpointing(blocks)
    x = torch.randn(64, 256, requires_grad=True)
    with jv.record("cpu") as rec:
        blocks(x).sum().backward()
    undo()
    timeline = rec.profile.timeline
    activation = timeline.by_category()[:, CATEGORY_INDEX["activation"]]
    block_input = 64 * 256 * 4
    # blocks 2..4 keep their inputs (block 1's is x, the cell's own); the recompute in backward
    # adds the recomputed block's saved tensors on top
    assert activation.max() >= 3 * block_input
    assert rec.profile.peak_breakdown()["input"] == block_input  # x alone
    assert all("forward" not in vars(b) for b in blocks)  # undo removed the wrappers


def test_module_classes_are_kept_for_display() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 2))
    with jv.record("cpu") as rec:
        model(torch.randn(1, 3, 8, 8)).sum().backward()
    types = rec.profile.meta["module_types"]
    assert types["Sequential"] == "Sequential"
    assert types["Sequential.0"] == "Conv2d" and types["Sequential.3"] == "Linear"


def test_top_site_category_is_that_of_its_bytes_at_the_peak() -> None:
    """Line 2 makes three 4 MB temporaries (each freed when ``t`` is rebound) and then a
    4000 B tensor that becomes ``lin.weight.grad``; the peak is line 5's 8 MB block beside
    it, so line 2's row holds 4000 B of gradient then, and says gradient."""
    from jupyter_vram._session import run_code

    source = (
        "for n in [1_000_000, 1_000_000, 1_000_000, 1_000]:\n"
        "    t = torch.zeros(n)\n"
        "lin.weight.grad = t.view(1, 1_000)\n"
        "del t\n"
        "big = torch.ones(2_000_000)\n"
        "del big\n"
    )
    ns = {"torch": torch, "lin": nn.Linear(1000, 1, bias=False)}
    prof = run_code(source, ns, stacks="full").profile  # the test reads each row's line
    assert prof is not None
    assert prof.peak_bytes == 4000 + 4000 + 8_000_000  # weight, its new grad, big
    rows = {
        r["site"]: (r["op"], r["live_at_peak_bytes"], r["allocated_bytes"], r["category"])
        for r in prof.top_sites(5).to_dict("records")
    }
    assert rows == {
        "<module> (<vram-cell>:5)": ("ones", 8_000_000, 8_000_000, "temporary"),
        "<module> (<vram-cell>:2)": ("zeros", 4000, 3 * 4_000_000 + 4000, "gradient"),
    }


def test_every_tensor_the_notebook_holds_counts_once_before_the_cell() -> None:
    """The namespace's tensors are noted together as recording starts: memory held before
    the cell is each distinct storage once (by hand: 4 bytes an element; a view of a held
    tensor adds nothing; a sparse tensor its indices and values; an empty tensor and one on
    the meta device nothing), in the role of memory held, not made here."""
    plain = torch.ones(1000)
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 3, 7]]), torch.ones(3), (10,))
    held = {
        "a": [plain, plain[10:20], torch.zeros(0), torch.ones(5, device="meta")],
        "b": (torch.ones(3, 7), sparse),
        "c": {"d": torch.arange(50, dtype=torch.int64)},
    }
    with jv.record(namespace=held) as rec:
        pass
    expected = 4 * 1000 + 4 * 21 + (8 * 3 + 4 * 3) + 8 * 50
    assert rec.profile.timeline.baseline_bytes == expected
    assert rec.profile.event_count == 0
    df = rec.profile.to_dataframe()
    assert sorted(df["bytes"]) == sorted([4000, 84, 24, 12, 400])
    assert set(df["category"]) == {"other"} and (df["alloc_seq"] == -1).all()


@pytest.mark.parametrize("odd_one", [False, True], ids=["all-plain", "one-on-meta"])
def test_a_long_list_of_tensors_is_read_once_as_recording_starts(
    odd_one: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook's list of 5,000 tensors (longer than a list the walk samples): memory held
    before the cell is each distinct storage once, by hand (4 bytes an element; a view adds
    nothing; a tensor on the meta device nothing), the variables holding it are named with
    their bytes, and each tensor's storage is asked for once while recording starts (the
    baseline, the leak baseline and the variables' sizes share that read; a list with a
    tensor elsewhere is read one by one, still once)."""
    sizes = [1 + i % 7 for i in range(5000)]
    batch = [torch.ones(n) for n in sizes]
    batch.append(batch[0][:1])  # a view of the first: its storage, counted once
    if odd_one:
        batch.insert(100, torch.ones(9, device="meta"))
    held = {"batch": batch, "one": torch.ones(300)}
    ours = {id(t) for t in (*batch, held["one"])}
    asked: list[int] = []
    original = torch.Tensor.untyped_storage

    def counted(self: torch.Tensor) -> torch.UntypedStorage:
        if id(self) in ours:
            asked.append(id(self))
        return original(self)

    rec = jv.record(namespace=held)
    monkeypatch.setattr(torch.Tensor, "untyped_storage", counted)
    rec.__enter__()
    monkeypatch.undo()
    rec.__exit__(None, None, None)
    cpu_tensors = len(batch) + 1 - odd_one
    assert len(asked) == len(set(asked)) == cpu_tensors
    assert rec.profile.timeline.baseline_bytes == 4 * (sum(sizes) + 300)
    assert dict(rec.profile.meta["held_before"]) == {"batch": 4 * sum(sizes), "one": 1200}
    assert rec.profile.event_count == 0 and rec.profile.leaks().empty


def test_the_storages_a_namespace_holds_take_one_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """``held_storages`` (the capacity guard's and the leak check's reading of a namespace)
    walks it once, also outside a recording's start, and counts each storage once: by hand,
    5,000 tensors of 2 floats and a Linear(2, 2)'s weight and bias."""
    from jupyter_vram._capture import tagging
    from jupyter_vram._capture.capacity import held_storages

    walks: list[int] = []
    walk = tagging._walk_namespace

    def counted(*args: Any) -> None:
        walks.append(1)
        walk(*args)

    monkeypatch.setattr(tagging, "_walk_namespace", counted)
    namespace = {"batch": [torch.ones(2) for _ in range(5000)], "layer": nn.Linear(2, 2)}
    storages = held_storages(namespace, "cpu")
    assert len(walks) == 1
    assert sum(s.nbytes() for s in storages) == 4 * 2 * 5000 + 4 * (2 * 2 + 2)


def test_past_the_baseline_cap_the_profile_says_what_it_left_out() -> None:
    """Over 50,000 bare tensors: the first 50,000 the walk meets (the newest variable first)
    count as memory held before the cell, 4 bytes each by hand, and one warning line names
    the variables holding the others; a long list whose sample holds no tensor is not looked
    into, and another line says so. Both lines are in ``meta`` and in the summary."""
    from jupyter_vram._render.text import summary

    n = 30_000
    namespace = {
        "a": [torch.ones(1) for _ in range(n)],
        "b": [torch.ones(1) for _ in range(n)],
        "c": [torch.ones(1) for _ in range(n)],
        "numbers": list(range(100_000)),
    }  # walked: numbers (a sample), c (30,000), b (20,000 of its 30,000), then a (none)
    with jv.record(namespace=namespace) as rec:
        pass
    assert rec.profile.timeline.baseline_bytes == 4 * 50_000
    assert (rec.profile.to_dataframe()["alloc_seq"] == -1).sum() == 50_000
    capped = (
        "the notebook holds over 50,000 tensors outside modules and optimizers: 50,000 count "
        "as memory held before the cell, the others (in a, b) are not in this profile unless "
        "it uses them"
    )
    sampled = (
        "large containers with no tensor in a sample of their items were not looked into: numbers"
    )
    assert rec.profile.meta["warnings"] == [capped, sampled]
    text = summary(rec.profile)
    assert f"warning: {capped}" in text and f"warning: {sampled}" in text


def test_the_variables_past_the_cap_are_found_run_by_run() -> None:
    """``names_from`` looks up a few tensors a variable; it finds the same variables as
    looking up every tensor from the start index on, for runs of every length (1, 2, 3, ...
    and long ones) and start indices anywhere in a run."""
    import random

    from jupyter_vram._capture.tagging import names_from

    rng = random.Random(7)
    lengths = [1, 1, 2, 3, 1, 4, 5, 8, 9, 16, 17, 1, 100, 2, 1000, 1, 3]
    tensors: list[object] = []
    names: dict[int, str] = {}
    for number, length in enumerate(lengths):
        for _ in range(length):
            tensors.append(item := object())
            names[id(item)] = f"v{number}"
    starts = [0, 1, 2, len(tensors) - 1, len(tensors), *rng.sample(range(len(tensors)), 40)]
    for start in starts:
        every = {names[id(t)] for t in tensors[start:]}
        assert names_from(tensors, start, names) == every, start

    class Counted(dict[int, str]):
        asked = 0

        def get(self, key: int, default: str | None = None) -> str | None:  # type: ignore[override]
            Counted.asked += 1
            return super().get(key, default)

    # three variables of 100,000 tensors from the middle of the first: under 40 lookups
    # each (doubling, then halving, over 100,000: 2 x 17), not one a tensor
    many = [object() for _ in range(300_000)]
    counted = Counted({id(t): f"x{i // 100_000}" for i, t in enumerate(many)})
    assert names_from(many, 50_000, counted) == {"x0", "x1", "x2"}
    assert Counted.asked < 3 * 40


def test_the_storages_of_a_tensor_on_a_device() -> None:
    """What the recorder, the leak check and the memory-held list count for a tensor: its
    storages on the recorded device. By hand: a tensor, a parameter and a view each their
    own (the view its base's); a sparse COO tensor its indices and values; a CSR tensor its
    row offsets, columns and values; a meta tensor none on the CPU and one on meta."""
    from jupyter_vram._capture.tagging import device_test, storages_on

    def keys(tensor: torch.Tensor, device: str = "cpu") -> list[int]:
        return [s._cdata for s in storages_on(tensor, device, device_test(device))]

    base = torch.ones(8)
    param = nn.Parameter(torch.ones(3))
    coo = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.ones(2), (4,))
    csr = torch.ones(2, 2).to_sparse_csr()
    meta = torch.ones(4, device="meta")
    assert keys(base) == [base.untyped_storage()._cdata]
    assert keys(base[2:5]) == [base.untyped_storage()._cdata]
    assert keys(param) == [param.untyped_storage()._cdata]
    parts = (coo._indices(), coo._values())
    assert keys(coo) == [t.untyped_storage()._cdata for t in parts]
    parts = (csr.crow_indices(), csr.col_indices(), csr.values())
    assert keys(csr) == [t.untyped_storage()._cdata for t in parts]
    assert keys(meta) == [] and len(keys(meta, "meta")) == 1
    assert keys(base, "meta") == []
