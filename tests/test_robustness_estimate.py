"""Estimator robustness: runs the real model would refuse, kernels the real run would pick,
what a comparison counts, and processes and files left behind."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from jupyter_vram._estimator import EstimateError, estimate

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def tiny_gpt2(positions: int = 128) -> Any:
    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=positions
    )
    return transformers.GPT2LMHeadModel(config)


# -- sequences longer than the position table ----------------------------------------------


def test_sequence_longer_than_gpt2_positions_fails_like_the_real_model() -> None:
    model = tiny_gpt2(128)
    with pytest.raises(IndexError, match="index out of range"):
        model(torch.zeros(1, 129, dtype=torch.long))  # the real model
    with pytest.raises(EstimateError) as info:
        estimate(model, "1x4096", device="cpu")
    message = str(info.value)
    assert message.startswith("the sequence is 4096 positions long, but the model's position")
    assert "transformer.wpe has 128" in message and "index out of range" in message
    assert len(message.splitlines()) <= 2  # the message and where
    # at the limit the step runs
    assert estimate(model, "1x128", device="cpu").peak_bytes > 0


class LearnedPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(50, 8)
        self.pos = nn.Embedding(16, 8)
        self.out = nn.Linear(8, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.out(self.tok(ids) + self.pos(positions))


def test_sequence_longer_than_a_plain_position_table() -> None:
    model = LearnedPositions()
    with pytest.raises(IndexError):
        model(torch.zeros(2, 17, dtype=torch.long))
    with pytest.raises(EstimateError, match=r"17 positions long, .* table pos has 16"):
        estimate(model, "2x17", device="cpu")
    assert estimate(model, "2x16", device="cpu").peak_bytes > 0


def test_rotary_models_are_not_limited_by_max_position_embeddings() -> None:
    """Llama's rotary positions have no table: the real model runs past the config's limit."""
    from jupyter_vram._estimator.simulator import position_tables

    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=100, max_position_embeddings=16,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model(torch.zeros(1, 40, dtype=torch.long))  # runs
    assert position_tables(model) == []
    bert = transformers.BertModel(
        transformers.BertConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            vocab_size=100, max_position_embeddings=64,
        )
    )  # fmt: skip
    assert [name for name, _ in position_tables(bert)] == ["embeddings.position_embeddings"]


# -- LSTM: the kernel's workspace and temporaries -----------------------------------------


def profiler_peak_delta(step: Any) -> int:
    """Highest (allocated - freed) bytes during ``step()``, from the CPU allocator's own
    events as torch.profiler reports them (an independent truth: not our recorder)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == torch._C._profiler._EventType.Allocation:
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
        stack.extend(event.children)
    live = peak = 0
    for _, size in sorted(events, key=lambda e: e[0]):
        live += size
        peak = max(peak, live)
    return peak


needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="the CPU LSTM runs oneDNN only with mkldnn"
)


@needs_onednn
@pytest.mark.parametrize(
    "shape", [(256, 512, 8, 64), (64, 64, 2, 10), (100, 50, 3, 7), (300, 64, 2, 10)]
)
def test_onednn_workspace_formula_matches_the_real_kernel(
    shape: tuple[int, int, int, int],
) -> None:
    from jupyter_vram._estimator.kernels import onednn_lstm_workspace_bytes

    inp, hidden, batch, steps = shape
    lstm = nn.LSTM(inp, hidden)
    w = lstm._flat_weights
    h0 = torch.zeros(batch, hidden)
    out = torch.ops.aten.mkldnn_rnn_layer(
        torch.randn(steps, batch, inp), w[0], w[1], w[2], w[3], h0, h0.clone(),
        False, [], 2, hidden, 1, True, False, False, True,
    )  # fmt: skip
    real = out[3].numel() * out[3].element_size()
    assert onednn_lstm_workspace_bytes(steps, batch, inp, hidden) == real


class TwoLayerLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(128, 256, num_layers=2, batch_first=True)
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out)


@needs_onednn
def test_lstm_estimate_matches_the_allocator_on_the_cpu() -> None:
    """A 2-layer LSTM training step: the estimate's rise above what exists before the step
    against the CPU allocator's events (the estimate used to miss oneDNN's workspace, -70 %
    of the activations)."""
    from jupyter_vram._estimator.step import StepSettings, make_optimizer, training_step

    torch.manual_seed(0)
    model = TwoLayerLSTM()
    x = torch.randn(8, 64, 128)
    settings = StepSettings(device="cpu", optimizer="sgd")
    optimizer = make_optimizer(settings, model)

    def step() -> None:
        training_step(model, optimizer, (x,), {}, settings, "cpu")

    step()  # optimizer state exists, as in the estimate's recorded step
    measured = profiler_peak_delta(step)
    est = estimate(model, "8x64x128", device="cpu", optimizer="sgd")
    predicted = est.peak_bytes - est.profile.timeline.baseline_bytes
    # the saved workspaces alone: both layers, from the real kernel's sizes
    assert est.peak_breakdown()["activation"] > 2 * 2_000_000
    assert abs(predicted - measured) / measured < 0.03, (predicted, measured)


def test_cuda_lstm_estimate_charges_a_reserve_space() -> None:
    from jupyter_vram._estimator.kernels import cudnn_lstm_reserve_bytes

    cpu = estimate(TwoLayerLSTM(), "8x64x128", device="cpu", optimizer="sgd")
    cuda = estimate(TwoLayerLSTM(), "8x64x128", optimizer="sgd")
    rows = cuda.profile.allocations
    ops = [cuda.profile.ops[i] for i in rows.op]
    # measured on an H200 (cuDNN 9): this 2-layer LSTM's reserve was 5,767,424 bytes =
    # (5 x 2 + 1) slabs of 64 steps x 8 x 256 x fp32, + 256; the slab between the layers is
    # the first layer's output, which the fake run holds as a tensor of its own
    reserve = cudnn_lstm_reserve_bytes(64, 8, 256, 4)
    assert 2 * reserve + 64 * 8 * 256 * 4 + 256 == 5_767_424
    workspaces = [
        int(s) for s, op in zip(rows.size, ops, strict=True)
        if op == "mkldnn_rnn_layer" and s >= reserve
    ]  # fmt: skip
    assert len(workspaces) == 2 and all(w - reserve < 512 for w in workspaces)  # block rounding
    assert cpu.peak_bytes != cuda.peak_bytes


# -- estimate vs measured: which recording, and what of it -----------------------------------


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))


def measured_step(model: nn.Module, x: torch.Tensor) -> Any:
    """A real CPU training step (SGD with momentum, as the estimate), recorded."""
    import jupyter_vram as jv
    from jupyter_vram._estimator.step import StepSettings, make_optimizer, training_step

    settings = StepSettings(device="cpu", optimizer="sgd")
    optimizer = make_optimizer(settings, model)

    def step() -> None:
        training_step(model, optimizer, (x,), {}, settings, "cpu")

    step()
    with jv.record() as rec:
        step()
    return rec.profile


@pytest.fixture(scope="module")
def two_layer() -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = TwoLayer()
    return model, estimate(model, "32x64", device="cpu", optimizer="sgd")


def with_other_model(profile: Any, sizes: list[int], module: str = "Other.big") -> Any:
    """``profile`` as a kernel holding another model records it: that model's parameters
    alive before the cell (baseline rows charged to its modules), untouched by the step."""
    import numpy as np

    from jupyter_vram._model import CATEGORY_INDEX, Allocations

    a = profile.allocations
    n = len(sizes)
    extra = {
        "size": sizes, "alloc_seq": [-1] * n, "free_seq": [-1] * n, "alloc_ns": [0] * n,
        "free_ns": [-1] * n, "device": [0] * n, "op": [0] * n,
        "module": [len(profile.modules)] * n, "stack": [-1] * n, "phase": [0] * n,
        "category": [CATEGORY_INDEX["parameter"]] * n,
    }  # fmt: skip
    columns = {k: np.concatenate([getattr(a, k), np.asarray(v)]) for k, v in extra.items()}
    return profile.replace(
        allocations=Allocations.from_columns(columns), modules=[*profile.modules, module]
    )


def test_comparison_leaves_out_another_model_alive_in_the_kernel(
    two_layer: tuple[nn.Module, Any],
) -> None:
    model, est = two_layer
    alone = measured_step(model, torch.randn(32, 64))
    other = [1024 * 1024 * 4, 1024 * 4]  # a 1024 x 1024 Linear's weight and bias
    measured = with_other_model(alone, other)
    assert measured.peak_bytes == alone.peak_bytes + sum(other)
    assert est.matches(measured)
    comparison = est.compare(measured)
    assert comparison.unrelated_bytes == sum(other)
    assert comparison.measured_bytes == alone.peak_bytes
    assert comparison.measured == alone.peak_breakdown()
    # counting the other model was an error near -95 % on this small step
    assert abs(comparison.relative_difference) < 0.05, comparison
    assert comparison.measured["parameter"] == comparison.estimated["parameter"]


def parameters_alive(model: nn.Module, profile: Any) -> Any:
    """``profile`` with ``model``'s parameters listed as alive and untouched (charged to its
    class, as the recorder names a model it sees before the cell)."""
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    return with_other_model(profile, sizes, type(model).__name__ + ".fc1")


def test_a_different_model_does_not_match(two_layer: tuple[nn.Module, Any]) -> None:
    model, est = two_layer
    conv = measured_step(ConvNet(), torch.randn(4, 3, 16, 16))
    assert not est.matches(conv)
    # the estimated model alive but unused: its parameters are all there, yet it took no
    # part in the run (matching on live parameters alone said yes here)
    alive = parameters_alive(model, conv)
    a = alive.allocations
    mine = np.array([alive.modules[m].startswith("TwoLayer") for m in a.module])
    assert int(a.size[mine].sum()) == est.peak_breakdown()["parameter"]
    assert not est.matches(alive)


def test_the_same_model_with_other_inputs_does_not_match(
    two_layer: tuple[nn.Module, Any],
) -> None:
    model, est = two_layer
    assert est.matches(measured_step(model, torch.randn(32, 64)))
    assert not est.matches(measured_step(model, torch.randn(8, 64)))


def test_a_cell_that_raised_before_the_model_ran_does_not_match(
    two_layer: tuple[nn.Module, Any],
) -> None:
    import jupyter_vram as jv

    model, est = two_layer
    with pytest.raises(ZeroDivisionError), jv.record() as rec:
        scratch = torch.ones(1000)
        print(scratch.sum() / 0, 1 / 0)
    assert not est.matches(parameters_alive(model, rec.profile))


def test_inference_of_the_model_does_not_match_a_training_estimate(
    two_layer: tuple[nn.Module, Any],
) -> None:
    import jupyter_vram as jv

    model, est = two_layer
    with torch.no_grad(), jv.record() as rec:
        model(torch.randn(32, 64))
    assert not est.matches(rec.profile)  # ran, but no gradients: not the training step


def test_comparison_text_says_what_was_left_out(two_layer: tuple[nn.Module, Any]) -> None:
    from jupyter_vram._render.estimate_text import comparison_text
    from jupyter_vram._units import format_bytes

    model, est = two_layer
    measured = with_other_model(measured_step(model, torch.randn(32, 64)), [1 << 22])
    text = comparison_text(est.compare(measured))
    assert f"left out of the measurement: {format_bytes(1 << 22)} of tensors" in text


# -- checkpointing on the CUDA target -------------------------------------------------------


def _families() -> dict[str, tuple[Any, str]]:
    t = transformers
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    return {
        "gpt2": (lambda: t.GPT2LMHeadModel(t.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64)), "2x64"),
        "bert": (lambda: t.BertForMaskedLM(t.BertConfig(
            **small, vocab_size=512, max_position_embeddings=64)), "2x64"),
        "vit": (lambda: t.ViTForImageClassification(t.ViTConfig(
            **small, image_size=32, patch_size=8, num_labels=10)), "2x3x32x32"),
        "t5": (lambda: t.T5ForConditionalGeneration(t.T5Config(
            d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
            vocab_size=512, decoder_start_token_id=0, pad_token_id=0)), "2x64"),
        "llama": (lambda: t.LlamaForCausalLM(t.LlamaConfig(
            **small, num_key_value_heads=2, vocab_size=512, max_position_embeddings=64)),
            "2x64"),
        "resnet": (lambda: t.ResNetForImageClassification(t.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[2, 2], layer_type="basic",
            num_labels=10)), "2x3x32x32"),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("family", "variant"),
    [(family, {}) for family in ("gpt2", "bert", "vit", "t5", "llama", "resnet")]
    + [("gpt2", {"dtype": "bf16"}), ("gpt2", {"amp": "bf16"}), ("llama", {"dtype": "bf16"})],
)
def test_checkpointing_on_the_cuda_target(family: str, variant: dict[str, str]) -> None:
    """Forward and recomputation run the same attention kernel, so checkpointing works on
    the CUDA target as on the CPU (it failed with CheckpointError: the recomputation left the
    CUDA kernels for the CPU path and saved a different number of tensors)."""
    from dataclasses import replace

    from jupyter_vram._model import CATEGORIES

    build, inputs = _families()[family]
    with torch.device("meta"):
        model = build()
    est = estimate(model, inputs, checkpoint=True, **variant)
    assert est.settings.target_type == "cuda" and est.settings.checkpoint
    with est.session() as process:
        plain = process.run(replace(est.settings, checkpoint=False))
    activation = CATEGORIES.index("activation")
    kept = int(est.profile.timeline.by_category()[:, activation].max())
    full = int(plain.timeline.by_category()[:, activation].max())
    assert kept < full, (family, kept, full)


# -- GPU fits: headroom, the runtime allowance, attention per GPU ------------------------------


def test_gpus_know_flash_attention_and_usable_memory() -> None:
    from jupyter_vram._estimator.gpus import RUNTIME_HIDDEN_BYTES, find_gpu, gpu_from_bytes

    assert not find_gpu("T4").flash_attention and not find_gpu("V100 16GB").flash_attention
    assert find_gpu("A100 80GB").flash_attention and find_gpu("L4").flash_attention
    a100 = find_gpu("A100 80GB")
    assert a100.usable_bytes == 80 * 2**30 - RUNTIME_HIDDEN_BYTES
    runtime = gpu_from_bytes("NVIDIA A100-SXM4-80GB", 85_031_714_816)  # already the runtime's
    assert runtime.usable_bytes == 85_031_714_816


class CausalAttention(nn.Module):
    """Causal self-attention without a mask tensor: flash attention's case in bf16."""

    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).unbind(2)
        return nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )


def test_fit_checks_use_the_attention_kernel_of_each_gpu() -> None:
    from dataclasses import replace

    from jupyter_vram._estimator.gpus import find_gpu, gpu_from_bytes

    est = estimate(CausalAttention(), "2x128x64", dtype="bf16")
    assert "_scaled_dot_product_flash_attention" in est.profile.ops
    t4, a100 = find_gpu("T4"), find_gpu("A100 80GB")
    assert est.settings_for(a100) == est.settings
    on_t4 = est.settings_for(t4)
    assert on_t4 == replace(est.settings, flash_attention=False)
    with est.session() as process:
        profile = process.run(on_t4)
    assert "_scaled_dot_product_flash_attention" not in profile.ops
    assert "_scaled_dot_product_efficient_attention" in profile.ops
    # on the T4 also its smaller cuBLAS workspaces (8,519,680 bytes instead of 32 MiB each)
    workspaces = est.cublas_workspace_total // (32 << 20)
    smaller = workspaces * (4096 * 1024 * 2 + 16 * 1024 * 8 - (32 << 20))
    assert est.used_on(t4) == est.run(on_t4).predicted_device_bytes + smaller
    # a card exactly as large as device used fits only when nothing is held back
    used = est.predicted_device_bytes
    assert est.fits(gpu_from_bytes("exact", used, 9.0))
    assert not est.fits(gpu_from_bytes("one byte short", used - 1, 9.0))


def test_an_fp32_model_needs_no_second_run_for_pre_ampere_cards() -> None:
    from jupyter_vram._estimator.gpus import find_gpu

    est = estimate(CausalAttention(), "2x128x64")  # fp32: memory-efficient everywhere
    assert "_scaled_dot_product_flash_attention" not in est.profile.ops
    assert est.settings_for(find_gpu("T4")) == est.settings


def test_text_marks_the_runtime_allowance_as_a_guess() -> None:
    from jupyter_vram._estimator.api import estimate_summary
    from jupyter_vram._units import format_bytes

    est = estimate(CausalAttention(), "2x128x64")
    assert est.runtime_overhead.guessed and est.runtime_overhead.bytes == 2**30
    assert est.predicted_device_bytes == est.reserved_bytes + est.runtime_overhead.bytes
    text = estimate_summary(est)
    assert f"device used = reserved + {format_bytes(2**30)} runtime allowance (GUESSED" in text
    assert "the driver keeps, also a guess" in text


# -- memory that must not grow, processes and folders that must not stay -----------------------


class HoldsArrays(nn.Module):
    """A model that keeps large non-tensor data next to its weights."""

    def __init__(self) -> None:
        super().__init__()
        import array

        self.fc = nn.Linear(16, 4)
        self.table = np.ones((2500, 1000), dtype=np.float32)  # 10 MB
        self.blob = bytearray(3 << 20)
        self.codes = array.array("i", range(1 << 19))  # 2 MiB
        self.small = np.arange(10)  # a constant the forward reads: travels by value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.table.shape == (2500, 1000) and len(self.blob) == 3 << 20
        assert int(self.small[3]) == 3
        return self.fc(x) * float(self.table.dtype.itemsize)


def test_large_arrays_and_buffers_travel_as_shapes() -> None:
    from jupyter_vram._estimator.transport import dumps, loads

    model = HoldsArrays()
    payload = dumps(model)
    assert len(payload) < 64 * 1024  # 10 MB + 3 MiB + 2 MiB of data left behind
    back = loads(payload)
    assert back.table.shape == (2500, 1000) and back.table.dtype == np.float32
    assert back.table.strides == (0, 0)  # a view of one element: no memory
    assert isinstance(back.blob, bytearray) and len(back.blob) == 3 << 20
    assert back.codes.typecode == "i" and len(back.codes) == 1 << 19
    assert back.small.tolist() == list(range(10))


def test_kept_estimates_do_not_grow_with_the_model_data() -> None:
    import gc
    import tracemalloc

    from jupyter_vram._session import remember_estimate

    model = HoldsArrays()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = []
        for _ in range(3):
            est = estimate(model, "4x16", device="cpu", optimizer="sgd")
            remember_estimate(est)
            kept.append(est)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all(len(e._payload) < 64 * 1024 for e in kept)
    assert grown < 2 << 20, f"3 estimates kept {grown:,} bytes"  # the model holds 15 MB


KERNEL = r"""
import sys, time
import torch
from torch import nn
from jupyter_vram._estimator import estimate

class Sleeps(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        print("step started", flush=True)
        time.sleep(600)
        return self.fc(x)

estimate(Sleeps(), "2x4", device="cpu", timeout_s=900)
"""


def test_a_killed_kernel_takes_its_estimator_process_and_folder_with_it(tmp_path: Any) -> None:
    """The 'kernel' (a python process) starts an estimate whose step sleeps for minutes and
    is killed: the estimator process ends within seconds and its job folder is removed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    folders = tmp_path / "tmp"
    folders.mkdir()
    env = {**os.environ, "TMPDIR": str(folders)}
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL], env=env)
    try:
        deadline = time.monotonic() + 60
        worker = None
        while time.monotonic() < deadline and worker is None:
            for child in psutil.Process(kernel.pid).children(recursive=True):
                if "jupyter_vram._estimator.worker" in " ".join(child.cmdline()):
                    worker = child
            time.sleep(0.2)
        assert worker is not None, "the estimator process did not start"
        assert next(p.name for p in folders.iterdir()).startswith("jupyter_vram_estimate_")
        time.sleep(3)  # let it load the model and get into the step
        assert worker.is_running()
        kernel.send_signal(signal.SIGKILL)
        kernel.wait(timeout=10)
        gone = time.monotonic()
        while time.monotonic() - gone < 5 and worker.is_running():
            if worker.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.1)
        running = worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
        assert not running, "the estimator process outlived its kernel"
        assert list(folders.iterdir()) == []
    finally:
        if kernel.poll() is None:
            kernel.kill()


# -- cuBLAS workspaces ----------------------------------------------------------------------


def test_cuda_estimates_hold_one_cublas_workspace_per_matmul_thread() -> None:
    """PyTorch keeps a cuBLAS workspace per thread that runs matmuls (its default
    CUBLAS_WORKSPACE_CONFIG: 4096 KiB x 8 = 32 MiB on compute capability 9.x and later,
    4096 KiB x 2 + 16 KiB x 8 before; measured on an H200: 32 MiB for the forward thread and
    32 MiB for autograd's backward thread)."""
    from jupyter_vram._estimator.gpus import find_gpu
    from jupyter_vram._model import CATEGORIES

    train = estimate(TwoLayer(), "32x64", optimizer="sgd")
    infer = estimate(TwoLayer(), "32x64", inference=True)
    convs = estimate(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), "2x3x8x8", optimizer="sgd")
    cpu = estimate(TwoLayer(), "32x64", optimizer="sgd", device="cpu")
    mib32 = 4096 * 1024 * 8
    assert train.cublas_workspace_total == 2 * mib32
    assert infer.cublas_workspace_total == mib32
    assert convs.cublas_workspace_total == 0  # convolutions run through cuDNN
    assert cpu.cublas_workspace_total == 0
    other = CATEGORIES.index("other")
    assert int(train.profile.timeline.baseline_by_category()[other]) == 2 * mib32
    # an older card keeps smaller workspaces: the fit check takes the difference
    older = 4096 * 1024 * 2 + 16 * 1024 * 8
    assert find_gpu("A100 80GB").cublas_workspace_bytes == older
    assert find_gpu("H100").cublas_workspace_bytes == mib32
    assert train.used_on("A100 80GB") == train.predicted_device_bytes - 2 * (mib32 - older)
    assert train.used_on("H100") == train.predicted_device_bytes
