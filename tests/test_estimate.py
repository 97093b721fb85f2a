"""The estimator: transport, input specs, batch search, what-if arithmetic, and the process.

End-to-end runs start a real estimator process; how close models come to measured runs of
transformers models is in test_estimate_models.py.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from torch import nn

from jupyter_vram._estimator import Estimate, EstimateError, InputError, estimate, find_gpu
from jupyter_vram._estimator.inputs import (
    BatchSpec,
    TensorInput,
    make_batch_spec,
    parse_shape,
    with_default_labels,
)
from jupyter_vram._estimator.search import MAX_BATCH, largest_fitting
from jupyter_vram._estimator.step import StepError, StepSettings, check_optimizer
from jupyter_vram._estimator.transport import TensorSlots, dumps, loads
from jupyter_vram._estimator.whatif import SHARDINGS, eight_bit_state, sharded_peak
from jupyter_vram._model import CATEGORY_INDEX, PHASE_INDEX, Allocations, Profile

MLP_SIZES = (64, 256, 10)


class TwoLayer(nn.Module):
    def __init__(self, d_in: int = 64, d_hidden: int = 256, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.head = nn.Linear(32, 100, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(32))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids) * self.scale)


class Attention(nn.Module):
    """Self-attention with dropout: the CPU runs it on the math path, CUDA on a fused kernel."""

    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).unbind(2)
        out = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=0.1, is_causal=True
        )
        return out


class CallsCuda(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.cuda())


class Aborts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        os.abort()


class Sleeps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(120)
        return self.fc(x)


class ReadsValues(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)[: int(x.sum().item()) % 3 + 1]


def parameter_numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture
def no_leftover_processes() -> Iterator[None]:
    """Every estimator process a test starts is gone when it ends (but for the ones kept
    warm on purpose, which are ended first)."""
    from jupyter_vram._estimator.runner import close_warm_workers

    close_warm_workers()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    close_warm_workers()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}
        alive = [pid for pid in now - before if psutil.Process(pid).status() != "zombie"]
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"estimator processes left running: {alive}")


# -- transport ----------------------------------------------------------------------------------


def test_transport_sends_shapes_not_data_and_keeps_ties() -> None:
    big = nn.Linear(2048, 2048)  # 16 MiB of weights
    data = dumps(big)
    assert len(data) < 20_000
    model = loads(dumps(Tied()))
    assert model.head.weight is model.embed.weight
    assert model.embed.weight.device.type == "meta"
    assert isinstance(model.embed.weight, nn.Parameter)
    assert model.scale.shape == (32,)


def test_tensor_slots_fill_each_tensor_once_and_clear() -> None:
    model = loads(dumps(Tied()))
    slots = TensorSlots(model)
    assert model.embed.weight is None  # taking the slots drops the meta tensors
    made: list[tuple[int, ...]] = []

    def make(descriptor: object) -> torch.Tensor:
        shape = descriptor.shape  # type: ignore[attr-defined]
        made.append(shape)
        tensor = torch.zeros(shape)
        return nn.Parameter(tensor) if descriptor.parameter else tensor  # type: ignore[attr-defined]

    slots.fill(make)
    assert sorted(made) == [(32,), (100, 32)]  # the tied weight is made once
    assert model.head.weight is model.embed.weight
    slots.clear()
    assert model.embed.weight is None and model.scale is None


def test_unpicklable_model_gets_a_clear_message() -> None:
    model = TwoLayer()
    model.lock = __import__("threading").Lock()  # type: ignore[assignment]
    with pytest.raises(EstimateError, match="could not send the model"):
        estimate(model, "4x64")


# -- input specs --------------------------------------------------------------------------------


def test_parse_shape_forms() -> None:
    assert parse_shape("8x3x224x224") == (8, 3, 224, 224)
    assert parse_shape("(8, 512)") == (8, 512)
    assert parse_shape("8 x 512") == (8, 512)
    for bad in ("", "8xa", "8x0", "eight"):
        with pytest.raises(InputError):
            parse_shape(bad)


def test_input_specs_float_and_token_ids() -> None:
    spec = make_batch_spec(TwoLayer(), "32x64")
    assert spec.args == (TensorInput((32, 64)),) and spec.batch_size == 32
    tokens = make_batch_spec(Tied(), "8x16")  # first leaf is an Embedding: token ids
    assert tokens.args[0].dtype == torch.int64 and tokens.args[0].high == 100
    named = make_batch_spec(Tied(), "ids=4x16, attention_mask=4x16")
    assert named.kwargs["attention_mask"].high == 2
    assert named.with_batch_size(9).kwargs["ids"].shape == (9, 16)
    typed = make_batch_spec(TwoLayer(), "x=2x64:bf16")
    assert typed.kwargs["x"].dtype == torch.bfloat16
    with pytest.raises(InputError, match="name them"):
        make_batch_spec(TwoLayer(), "2x64, 2x64")


def test_input_specs_from_tensors_dicts_and_builders() -> None:
    spec = make_batch_spec(TwoLayer(), torch.zeros(5, 64), batch_size=7)
    assert spec.args[0].shape == (7, 64)
    spec = make_batch_spec(Tied(), {"ids": torch.zeros(3, 10, dtype=torch.long)})
    assert spec.kwargs["ids"].dtype == torch.int64 and spec.batch_size == 3

    def builder(batch_size: int) -> torch.Tensor:
        return torch.zeros(batch_size, 64)

    spec = make_batch_spec(TwoLayer(), builder, batch_size=6)
    args, _ = spec.build("cpu", torch.float32)
    assert args[0].shape == (6, 64)
    with pytest.raises(InputError, match="cannot use"):
        make_batch_spec(TwoLayer(), 3.5)
    with pytest.raises(InputError, match="say what the model takes"):
        make_batch_spec(TwoLayer(), None)


def test_transformers_defaults_and_labels() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        gpt = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64))
    spec = with_default_labels(gpt, make_batch_spec(gpt, None))
    assert spec.kwargs["input_ids"].shape == (1, 64)
    assert spec.kwargs["labels"].shape == (1, 64)
    spec = with_default_labels(gpt, make_batch_spec(gpt, "4x32"))
    assert spec.args[0].dtype == torch.int64 and spec.kwargs["labels"].shape == (4, 32)


# -- batch search -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "curve",
    [
        lambda b: 1000 + 37 * b,  # linear
        lambda b: max(5000, 1200 + 90 * b),  # flat, then linear (optimizer-bound at first)
        lambda b: 300 + 64 * b + (b // 7) * 512,  # staircase (allocator segments)
        lambda b: 10_000,  # does not grow
    ],
)
def test_largest_fitting_matches_brute_force(curve: object) -> None:
    calls: list[int] = []

    def used(b: int) -> int:
        calls.append(b)
        return curve(b)  # type: ignore[operator,no-any-return]

    for limit in (900, 5000, 20_000, 123_456):
        expected = max((b for b in range(1, 4000) if curve(b) <= limit), default=0)  # type: ignore[operator]
        got = largest_fitting(used, limit, start=8)
        if expected == 3999:
            assert got == MAX_BATCH  # fits everything: capped
        else:
            assert got == expected
    assert len(set(calls)) < 80  # a search, not a scan


# -- what-if arithmetic --------------------------------------------------------------------------


def synthetic_training_profile() -> Profile:
    """params 400, state 800 (before recording); grads 400 in backward; temps in optimizer."""
    names = ("parameter", "gradient", "optimizer_state", "activation", "temporary")
    p, g, s, a, t = (CATEGORY_INDEX[c] for c in names)
    fwd, bwd, opt = PHASE_INDEX["forward"], PHASE_INDEX["backward"], PHASE_INDEX["optimizer"]
    rows = [  # size, alloc, free, category, phase
        (400, -1, -1, p, 0),
        (800, -1, -1, s, 0),
        (1000, 0, 3, a, fwd),
        (400, 2, 6, g, bwd),
        (200, 4, 5, t, opt),
    ]
    n = len(rows)
    columns = {
        "size": [r[0] for r in rows],
        "alloc_seq": [r[1] for r in rows],
        "free_seq": [r[2] for r in rows],
        "alloc_ns": [max(r[1], 0) for r in rows],
        "free_ns": [max(r[2], 0) for r in rows],
        "device": [0] * n,
        "op": [0] * n,
        "module": [0] * n,
        "stack": [-1] * n,
        "phase": [r[4] for r in rows],
        "category": [r[3] for r in rows],
    }
    return Profile(Allocations.from_columns(columns), device="cuda", source="estimate",
                   devices=["cuda"], ops=["op"], modules=[""], frames=[], stacks=[])  # fmt: skip


def test_sharded_peaks_follow_the_arithmetic() -> None:
    profile = synthetic_training_profile()
    # unsharded: after seq 2 -> 400 + 800 + 1000 + 400 = 2600; in the optimizer 400+800+400+200
    assert profile.peak_bytes == 2600
    schemes = {s.name.split()[0]: s for s in SHARDINGS}
    n, unit = 4, 100
    # DDP: everything replicated + a flat copy of the gradients (400)
    assert sharded_peak(profile, schemes["DDP"], n, unit) == 2600 + 400
    # ZeRO-1: state/4 and the optimizer's temporaries/4; the backward peak is
    # 400 + 200 + 1000 + 400 = 2000
    assert sharded_peak(profile, schemes["ZeRO-1"], n, unit) == 2000
    # ZeRO-2: + grads/4 and one unit's full gradients: 400 + 200 + 1000 + 100 + 100
    assert sharded_peak(profile, schemes["ZeRO-2"], n, unit) == 1800
    # ZeRO-3: params/4 too, + two gathered units: 100 + 200 + 1000 + 100 + 100 + 200
    assert sharded_peak(profile, schemes["ZeRO-3"], n, unit) == 1700


def test_eight_bit_state_sizes() -> None:
    profile = synthetic_training_profile()
    a = profile.allocations
    columns = {name: getattr(a, name).copy() for name in a.to_columns()}
    columns["size"][1] = 4 * 10_000  # a 10k-element fp32 state tensor
    big = profile.replace(allocations=Allocations.from_columns(columns))
    sizes = eight_bit_state(big).allocations.size
    assert sizes[1] == 10_000 + 4 * math.ceil(10_000 / 256)  # uint8 + one absmax per block
    assert sizes[4] == 0  # the optimizer's temporaries: fused kernel
    small = eight_bit_state(profile).allocations.size
    assert small[1] == 800  # under 4096 elements: stays 32-bit


# -- end to end -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp_estimate() -> Estimate:
    return estimate(TwoLayer(), "32x64", device="cpu")


def test_estimate_breakdown_is_exact_arithmetic(mlp_estimate: Estimate) -> None:
    params = parameter_numel(TwoLayer())
    breakdown = mlp_estimate.peak_breakdown()
    assert breakdown["parameter"] == 4 * params
    # AdamW: exp_avg + exp_avg_sq per parameter, plus a float32 step count per tensor (4)
    assert breakdown["optimizer_state"] == 2 * 4 * params + 4 * 4
    assert sum(breakdown.values()) == mlp_estimate.peak_bytes
    assert breakdown["input"] == 32 * 64 * 4
    assert mlp_estimate.profile.source == "estimate"
    info = mlp_estimate.profile.meta["estimate"]
    assert info["parameters"] == params and info["batch_size"] == 32


def test_cuda_estimate_rounds_blocks_and_predicts_reserved() -> None:
    cpu = estimate(TwoLayer(), "32x64", device="cpu", optimizer="sgd")
    cuda = estimate(TwoLayer(), "32x64", optimizer="sgd")
    sizes = cuda.profile.allocations.size
    assert np.all(sizes[sizes > 0] % 512 == 0)
    assert cuda.peak_bytes >= cpu.peak_bytes
    assert cuda.reserved_bytes >= cuda.peak_bytes
    assert cuda.reserved_bytes % (2 << 20) == 0  # whole segments
    assert cuda.predicted_device_bytes > cuda.reserved_bytes
    assert cuda.fits("T4") and cuda.fits(find_gpu("gtx 1060"))


def test_cuda_estimate_runs_attention_through_cuda_kernels() -> None:
    cpu = estimate(Attention(), "4x256x64", device="cpu")
    cuda = estimate(Attention(), "4x256x64")
    assert "_scaled_dot_product_efficient_attention" in cuda.profile.ops
    assert "_scaled_dot_product_efficient_attention" not in cpu.profile.ops
    # the CPU's math path keeps the (batch, heads, seq, seq) probabilities for backward
    probabilities = 4 * 4 * 256 * 256 * 4
    # (the CUDA side also holds cuBLAS workspaces, which the CPU has no counterpart of)
    assert cpu.peak_bytes - (cuda.peak_bytes - cuda.cublas_workspace_total) > probabilities


def test_batch_size_scales_input_and_activations() -> None:
    small = estimate(TwoLayer(), "8x64", device="cpu")
    big = estimate(TwoLayer(), "8x64", device="cpu", batch_size=64)
    assert big.batch_size == 64
    assert big.peak_breakdown()["input"] == 8 * small.peak_breakdown()["input"]
    assert big.peak_breakdown()["parameter"] == small.peak_breakdown()["parameter"]


def test_options_change_the_right_categories() -> None:
    params = parameter_numel(TwoLayer())
    sgd = estimate(TwoLayer(), "32x64", optimizer="sgd", device="cpu")
    assert sgd.peak_breakdown()["optimizer_state"] == 4 * params  # momentum buffer
    bf16 = estimate(TwoLayer(), "32x64", dtype="bf16", device="cpu")
    assert bf16.peak_breakdown()["parameter"] == 2 * params
    inference = estimate(TwoLayer(), "32x64", inference=True, device="cpu")
    assert inference.peak_breakdown()["gradient"] == 0
    assert inference.peak_breakdown()["optimizer_state"] == 0
    adafactor = estimate(TwoLayer(), "32x64", optimizer="adafactor", device="cpu")
    assert adafactor.peak_breakdown()["optimizer_state"] < 4 * params  # factored state


def test_largest_batch_fits_and_the_next_does_not(no_leftover_processes: None) -> None:
    model = nn.Sequential(nn.Linear(256, 16384), nn.ReLU(), nn.Linear(16384, 256))
    est = estimate(model, "16x256")
    gpu = find_gpu("GTX 1060 6GB")
    largest = est.max_batch_size(gpu)
    assert 0 < largest < MAX_BATCH
    # the search keeps the headroom the runtime takes: usable = NVML total less 819 MiB
    assert gpu.usable_bytes == gpu.memory_bytes - 819 * 2**20
    # ... with that card's attention kernel and cuBLAS workspaces (Estimate.used_on)
    assert est.used_on(gpu, largest) <= gpu.usable_bytes
    assert est.used_on(gpu, largest + 1) > gpu.usable_bytes


def test_what_if_table_rows(mlp_estimate: Estimate) -> None:
    table = mlp_estimate.what_ifs(gpus=4)
    names = list(table["what_if"])
    assert names[0].startswith("as estimated")
    assert {"AMP bf16", "activation checkpointing", "SGD with momentum", "Adafactor"} <= set(names)
    assert any(name.startswith("ZeRO-3") for name in names)
    assert table.loc[0, "change"] == 0
    checkpointing = table[table["what_if"] == "activation checkpointing"].iloc[0]
    assert "no repeated blocks" in checkpointing["note"]  # a row that says why, not a failure
    assert math.isnan(checkpointing["peak_bytes"])
    sgd = table[table["what_if"] == "SGD with momentum"].iloc[0]
    assert sgd["peak_bytes"] < table.loc[0, "peak_bytes"]  # one state buffer instead of two


# -- bad input: clear messages, and the kernel (this process) lives ----------------------------


def test_not_a_module() -> None:
    with pytest.raises(EstimateError, match=r"must be a torch\.nn\.Module"):
        estimate(42, "2x4")  # type: ignore[arg-type]


def test_wrong_input_shape(no_leftover_processes: None) -> None:
    with pytest.raises(EstimateError, match="rejected the input"):
        estimate(TwoLayer(), "32x65")


def test_gpu_only_op(no_leftover_processes: None) -> None:
    with pytest.raises(EstimateError, match="GPU-only operation"):
        estimate(CallsCuda(), "2x4")


def test_value_dependent_model(no_leftover_processes: None) -> None:
    with pytest.raises(EstimateError, match="tensor values"):
        estimate(ReadsValues(), "2x4")


def test_crash_in_the_estimator(no_leftover_processes: None) -> None:
    with pytest.raises(EstimateError, match=r"crashed .*SIGABRT"):
        estimate(Aborts(), "2x4")


def test_timeout(no_leftover_processes: None) -> None:
    started = time.monotonic()
    with pytest.raises(EstimateError, match="timed out after 6 s"):
        estimate(Sleeps(), "2x4", timeout_s=6)
    assert time.monotonic() - started < 120  # ended by the timeout, not by the 120 s sleep


def test_bad_options() -> None:
    with pytest.raises(StepError, match="unknown optimizer"):
        check_optimizer("adamax9000")
    with pytest.raises(EstimateError, match="device must be"):
        estimate(TwoLayer(), "2x64", device="tpu")
    with pytest.raises(ValueError, match="AMP dtype"):
        estimate(TwoLayer(), "2x64", amp="int8")
    with pytest.raises(ValueError, match="unknown GPU"):
        find_gpu("quantum 9000")


def test_model_is_untouched_by_an_estimate() -> None:
    model = TwoLayer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    estimate(model, "4x64", device="cpu")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.device.type == "cpu" and p.grad is None for p in model.parameters())


def test_estimate_keeps_no_reference_to_the_model() -> None:
    import gc
    import weakref

    from jupyter_vram._session import remember_estimate

    model = TwoLayer()
    ref = weakref.ref(model)
    est = estimate(model, "4x64", device="cpu", loss_fn=lambda out, batch: out.sum())
    remember_estimate(est)  # what %vram_estimate does
    del model
    gc.collect()
    assert ref() is None
    assert est.run(batch_size=8).batch_size == 8  # later runs use the packed copy


def test_settings_and_spec_pickle() -> None:
    settings = StepSettings(device="cpu", amp="bf16")
    assert pickle.loads(pickle.dumps(settings)) == settings
    spec = BatchSpec((TensorInput((2, 3)),))
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_command_line_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    from jupyter_vram.__main__ import main

    assert main(["estimate", "--batch-size", "2", "--gpu", "GTX 1060 6GB"]) == 0
    out = capsys.readouterr().out
    assert "jupyter_vram estimate · TinyGPT" in out and "input 2x128" in out
    assert "largest batch that fits GTX 1060 6GB:" in out and "ZeRO-3" in out
    assert main(["estimate", "--gpu", "quantum9000"]) == 2


def test_frozen_parameters_get_no_gradient_or_state() -> None:
    """Fine-tuning with a frozen base: only trainable parameters get gradients and state."""
    model = TwoLayer()
    model.fc1.requires_grad_(False)
    est = estimate(model, "32x64", device="cpu")
    trainable = sum(p.numel() for p in model.fc2.parameters())
    breakdown = est.peak_breakdown()
    frozen = sum(p.numel() for p in model.fc1.parameters())
    assert breakdown["parameter"] == 4 * trainable
    assert breakdown["frozen_parameter"] == 4 * frozen
    assert frozen + trainable == parameter_numel(model)
    assert breakdown["optimizer_state"] == 2 * 4 * trainable + 4 * 2
    info = est.profile.meta["estimate"]
    assert info["trainable_parameters"] == trainable
    assert max(est.profile.timeline.by_category()[:, CATEGORY_INDEX["gradient"]]) == 4 * trainable


@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_eight_bit_adamw_state_does_not_depend_on_the_weight_dtype(dtype: str | None) -> None:
    """bitsandbytes sizes its state by element count: uint8 moments (+ a float32 absmax per
    256 elements, bitsandbytes 0.50) from 4096 elements on, float32 below, a Python int for
    the step, and two 256-entry float32 quantisation maps shared by all parameters."""
    est = estimate(TwoLayer(), "32x64", device="cpu", optimizer="adamw8bit", dtype=dtype)
    # two moments per tensor; fc1.weight 64x256 = 16384 elements: 16384 + 4 * 64 absmax;
    # fc1.bias 256, fc2.weight 2560 and fc2.bias 10 elements stay float32
    expected = 2 * ((16384 + 4 * 64) + 4 * 256 + 4 * 2560 + 4 * 10) + 2 * 4 * 256
    assert expected == 57936
    assert est.peak_breakdown()["optimizer_state"] == expected


@pytest.mark.parametrize("gpus", [0, -2])
def test_data_parallel_gpus_must_be_positive(
    mlp_estimate: Estimate, gpus: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(EstimateError, match=f"at least 1, not {gpus}"):
        mlp_estimate.what_ifs(gpus=gpus)
    with pytest.raises(EstimateError, match="at least 1"):
        sharded_peak(mlp_estimate.profile, SHARDINGS[0], gpus, 0)
    # the magic says so in one line, before any estimator process starts
    from IPython.core.magic_arguments import parse_argstring

    from jupyter_vram._magics import VramMagics
    from jupyter_vram._magics_estimate import run_estimate_magic

    args = parse_argstring(VramMagics.vram_estimate, f"m --input 2x64 --what-if --gpus {gpus}")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert run_estimate_magic(args, {"m": TwoLayer()}) is None
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == (
        "%vram_estimate: the number of GPUs for the data-parallel what-ifs must be a whole "
        f"number of at least 1, not {gpus}"
    )


def test_quoted_magic_arguments_lose_their_quotes() -> None:
    from IPython.core.magic_arguments import parse_argstring

    from jupyter_vram._magics import VramMagics
    from jupyter_vram._magics_estimate import resolve_inputs, unquote

    line = "m --input \"a=4x128,b=4x128\" --gpu 'A100 80GB' --optimizer 'sgd'"
    args = parse_argstring(VramMagics.vram_estimate, line)
    assert resolve_inputs(args.input, {}) == "a=4x128,b=4x128"
    assert find_gpu(unquote(args.gpu)).name == find_gpu("A100 80GB").name
    assert unquote(args.optimizer) == "sgd"
    assert resolve_inputs("'x'", {"x": 5}) == 5  # a quoted variable name is the variable
    assert unquote("'a\"") == "'a\""  # quotes that do not match stay
    spec = make_batch_spec(TwoLayer(), resolve_inputs(args.input, {}), None)
    assert spec.describe() == "a=4x128, b=4x128"


class Embeds(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids))


def test_example_tensors_keep_their_kind_of_dtype() -> None:
    model = Embeds()
    ids = torch.randint(0, 100, (2, 8))
    assert make_batch_spec(model, ids).args[0] == TensorInput((2, 8), torch.int64, 100)
    # a float tensor stays float (the model's float dtype), never token ids
    assert make_batch_spec(model, torch.randn(2, 8)).args[0] == TensorInput((2, 8), None)
    spec = make_batch_spec(model, {"ids": ids, "mask": torch.rand(2, 8)})
    assert spec.kwargs["mask"].dtype is None and spec.kwargs["ids"].dtype == torch.int64
    # a shape string still means token ids for a model that starts with an embedding
    assert make_batch_spec(model, "2x8").args[0].dtype == torch.int64


def test_float_tensor_into_an_embedding_fails_like_the_real_model(
    no_leftover_processes: None,
) -> None:
    model = Embeds()
    with pytest.raises(RuntimeError, match="'indices'"):
        model(torch.randn(2, 8))  # the real model refuses float ids
    with pytest.raises(EstimateError, match="embedding takes integer token ids") as info:
        estimate(model, torch.randn(2, 8), device="cpu")
    assert "but got torch.float32" in str(info.value)
    est = estimate(model, torch.randint(0, 100, (2, 8)), device="cpu")
    assert est.peak_breakdown()["input"] == 2 * 8 * 8  # int64 ids


class _SlowStartingWorker:
    """Stands in for an estimator process whose imports take ``delay_s`` (a busy machine):
    its hello, then its answer to the job, arrive from another thread."""

    def __init__(self, folder: Path, delay_s: float) -> None:
        import queue
        import threading

        self.dir = folder
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.closed = False
        self.key = ""
        self.ready: dict[str, object] = {}

        def speak() -> None:
            time.sleep(delay_s)
            self.lines.put(b'{"ok": true}\n')
            self.lines.put(b'{"ok": true, "model": "Slow"}\n')

        threading.Thread(target=speak, daemon=True).start()

    def send(self, message: object) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_slow_start_is_not_charged_to_the_models_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_vram._estimator import runner

    process = runner.EstimatorProcess(b"job", timeout_s=0.2)
    worker = _SlowStartingWorker(tmp_path, delay_s=1.0)
    process._worker = worker  # type: ignore[assignment]
    process._load(worker)  # type: ignore[arg-type]
    assert worker.ready == {"ok": True, "model": "Slow"} and not worker.closed
    # the same start with no allowance beyond timeout_s: it times out, and says while doing what
    monkeypatch.setattr(runner, "STARTUP_TIMEOUT_S", 0.0)
    worker = _SlowStartingWorker(tmp_path, delay_s=1.0)
    process._worker = worker  # type: ignore[assignment]
    with pytest.raises(EstimateError, match=r"timed out after 0\.2 s while starting the estimator"):
        process._load(worker)  # type: ignore[arg-type]
    assert worker.closed
