"""Reruns on real models (transformers decoder and encoder from tiny configs, a conv net with
BatchNorm): what each technique does to the measured memory, gradients of a checkpointed
rerun, transformers' own checkpointing switch left as it was, and the magic's flags."""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._session import run_code

from .conftest import ipython_shell

transformers = pytest.importorskip("transformers")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

STEP = (
    "model.zero_grad()\n"
    "loss = model(ids, labels=ids).loss\n"
    "loss.backward()\n"
    "grads.append([p.grad.clone() for p in model.parameters()])\n"
)


@pytest.fixture(autouse=True)
def quiet_transformers() -> Any:
    """transformers says once that checkpointing turns the KV cache off: expected here."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture(autouse=True)
def forget_cells() -> Any:
    """The kernel's latest profile keeps its cell's namespace: let go of this test's models."""
    yield
    from jupyter_vram import _session as session

    session._last_profile = None


@pytest.fixture
def shell() -> Any:
    """IPython's shared test shell; the names a test adds are taken out again (other test
    files count what the namespace holds)."""
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    before = set(shell.user_ns)
    yield shell
    for name in set(shell.user_ns) - before:
        del shell.user_ns[name]
    shell.user_ns.pop("_vram", None)
    shell.user_ns.pop("_vram_variants", None)


def activation_max(frame: Any) -> tuple[int, int]:
    row = frame.loc["activation"]
    return int(row["baseline_bytes"]), int(row["variant_bytes"])


def gpt2() -> nn.Module:
    # eager attention: a KV cache appended twice (once more by a recomputed layer) fails
    # loudly there, where SDPA would silently attend over the doubled keys
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64, bos_token_id=0,
        eos_token_id=0, attn_implementation="eager",
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def bert() -> nn.Module:
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
        vocab_size=256, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.BertForMaskedLM(config)


def notebook(model: nn.Module, batch: int = 8, seq: int = 64) -> dict[str, Any]:
    torch.manual_seed(0)
    return {"model": model, "ids": torch.randint(0, 256, (batch, seq)), "grads": []}


@pytest.mark.slow
def test_decoder_lm_checkpointing_lowers_activations_and_keeps_the_gradients() -> None:
    torch.manual_seed(0)
    model = gpt2()  # dropout on: equal gradients need the first run's random stream
    ns = notebook(model)
    baseline = run_code(STEP, ns).profile
    assert baseline is not None
    variant = jv.rerun(baseline, checkpoint="auto")
    assert variant.variant is not None
    assert variant.variant.checkpointed == (
        "GPT2LMHeadModel.transformer.h.0",
        "GPT2LMHeadModel.transformer.h.1",
    )
    before, after = activation_max(baseline.compare(variant))
    assert after < 0.75 * before
    assert variant.peak_bytes < baseline.peak_bytes
    first, rerun_grads = ns["grads"]
    assert len(first) == len(list(model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(first, rerun_grads, strict=True))
    # transformers' own per-layer switch was used for the rerun only
    for block in model.transformer.h:
        assert "gradient_checkpointing" not in block.__dict__
        assert "_gradient_checkpointing_func" not in block.__dict__
        assert block.gradient_checkpointing is False
    assert model.transformer.gradient_checkpointing is False  # the layers' holder, switched too
    assert model.config.use_cache is True


@pytest.mark.slow
def test_decoder_lm_bf16_autocast_lowers_activation_bytes() -> None:
    ns = notebook(gpt2())
    baseline = run_code(STEP, ns).profile
    assert baseline is not None
    variant = jv.rerun(baseline, amp="bf16")
    before, after = activation_max(baseline.compare(variant))
    assert after < before
    assert variant.variant is not None and variant.variant.amp == "bf16"
    # the model itself stays fp32
    assert {p.dtype for p in ns["model"].parameters()} == {torch.float32}


@pytest.mark.slow
def test_encoder_checkpointing_and_bf16_lower_activations() -> None:
    ns = notebook(bert())
    baseline = run_code(STEP, ns).profile
    assert baseline is not None
    checkpointed = jv.rerun(baseline, checkpoint="auto")
    assert checkpointed.variant is not None
    assert checkpointed.variant.checkpointed == (
        "BertForMaskedLM.bert.encoder.layer.0",
        "BertForMaskedLM.bert.encoder.layer.1",
    )
    before, after = activation_max(baseline.compare(checkpointed))
    assert after < 0.75 * before
    bf16 = jv.rerun(baseline, amp="bf16")
    before, after = activation_max(baseline.compare(bf16))
    assert after < before
    both = jv.rerun(baseline, amp="bf16", checkpoint="auto")
    assert both.peak_bytes < min(bf16.peak_bytes, baseline.peak_bytes)
    assert jv.verdict(baseline, both).startswith("checkpointing 2 blocks + bf16 autocast: ")


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
            for _ in range(4)
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean((2, 3)))


def test_conv_net_with_batchnorm() -> None:
    torch.manual_seed(0)
    model = ConvNet()
    ns = {"model": model, "x": torch.randn(8, 3, 32, 32), "F": nn.functional}
    source = "loss = F.cross_entropy(model(x), torch.zeros(8, dtype=torch.long))\nloss.backward()\n"
    ns["torch"] = torch
    baseline = run_code(source, ns).profile
    assert baseline is not None
    stats = [b.running_mean.clone() for b in (blk[1] for blk in model.blocks)]
    counts = [int(blk[1].num_batches_tracked) for blk in model.blocks]
    assert counts == [1, 1, 1, 1]
    checkpointed = jv.rerun(baseline, checkpoint="auto")
    assert checkpointed.variant is not None
    assert checkpointed.variant.checkpointed == tuple(f"ConvNet.blocks.{i}" for i in range(4))
    # each block saves its conv input, BatchNorm input and ReLU output (3 x 64 KiB per image
    # row of 8): checkpointed, only block inputs stay, plus one block's while it recomputes
    before, after = activation_max(baseline.compare(checkpointed))
    assert after < 0.85 * before
    bf16 = jv.rerun(baseline, amp="bf16")
    before, after = activation_max(baseline.compare(bf16))
    assert after < before
    # the reruns ran BatchNorm in training mode twice more; its statistics are as the first
    # run left them
    assert [int(blk[1].num_batches_tracked) for blk in model.blocks] == counts
    for blk, mean in zip(model.blocks, stats, strict=True):
        assert torch.equal(blk[1].running_mean, mean)


def test_magic_flags_record_the_change_and_compare(shell: Any) -> None:
    torch.manual_seed(0)
    shell.user_ns.update(
        torch=torch,
        net=nn.Sequential(*[nn.Sequential(nn.Linear(64, 256), nn.GELU()) for _ in range(1)],
                          *[nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(3)]),
        xb=torch.randn(128, 64),
        counter=0,
    )  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = shell.run_cell(
            "%%vram --compare checkpoint,offload,amp --text\n"
            "counter += 1\nnet(xb).square().mean().backward()\n"
        )
    assert result.success
    text = out.getvalue()
    assert "checkpointing 4 blocks: activations" in text  # four Sequential children
    assert "offload: offload moves activations to host memory" in text
    assert "bf16 autocast: activations" in text
    assert shell.user_ns["counter"] == 1  # the baseline ran once; reruns did not leak
    variants = shell.user_ns["_vram_variants"]
    assert [v.variant.amp for v in variants] == [None, "bf16"]
    assert variants[0].variant.baseline_cell.startswith("In [")
    # without --text: the app, with each variant in its Compare tab
    from jupyter_vram._app import ProfileApp

    shown: list[Any] = []
    with mock.patch("IPython.display.display", shown.append):
        result = shell.run_cell(
            "%%vram --compare checkpoint\ncounter += 1\nnet(xb).square().mean().backward()\n"
        )
    assert result.success
    (app,) = shown
    assert isinstance(app, ProfileApp)
    assert app.compare_view is not None
    assert "checkpointing 4 blocks" in app.compare_view.text()
    with contextlib.redirect_stdout(io.StringIO()):
        result = shell.run_cell(
            "%%vram --checkpoint Sequential.2,net.3 --amp bf16 -q\nnet(xb).sum().backward()\n"
        )
    assert result.success
    variant = shell.user_ns["_vram"].variant
    assert variant.checkpointed == ("Sequential.2", "Sequential.3")
    assert variant.amp == "bf16"
    assert all("forward" not in m.__dict__ for m in shell.user_ns["net"].modules())
    assert jv.rerun_unavailable(shell.user_ns["_vram"], amp="bf16") == (
        "this cell was recorded with checkpointing 2 blocks + bf16 autocast: rerun a plain "
        "%%vram profile of it, to compare with"
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        shell.run_cell("%%vram --compare amp,speed\ncounter += 1\n")
    assert "not 'speed'" in err.getvalue()
    assert shell.user_ns["counter"] == 2


@pytest.mark.cuda
@cuda
def test_offload_moves_activations_off_the_device() -> None:
    """On CUDA the activations wait in pinned host memory: the device's activation maximum
    falls (on the CPU the reruns refuse: host memory is the device)."""
    model = gpt2().cuda()
    ns = notebook(model)
    ns["ids"] = ns["ids"].cuda()
    baseline = run_code(STEP, ns).profile
    assert baseline is not None
    variant = jv.rerun(baseline, offload=True)
    before, after = activation_max(baseline.compare(variant))
    assert after < 0.5 * before
    assert variant.peak_bytes < baseline.peak_bytes  # not just named otherwise: gone
    first, rerun_grads = ns["grads"]
    assert all(torch.equal(a, b) for a, b in zip(first, rerun_grads, strict=True))


def test_flags_on_a_cell_with_top_level_await_say_why_and_run_it(shell: Any) -> None:
    import asyncio

    # see tests/test_robustness.py: an earlier test's library may leave a running-loop mark
    leftover = asyncio.events._get_running_loop()
    asyncio.events._set_running_loop(None)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            result = shell.run_cell(
                "%%vram --amp bf16\nimport asyncio\nawait asyncio.sleep(0)\nawaited = 1\n"
            )
    finally:
        asyncio.events._set_running_loop(leftover)
    assert result.success and shell.user_ns["awaited"] == 1
    assert "need a cell without top-level await; the cell runs unrecorded" in err.getvalue()


def test_reruns_record_without_python_stacks_unless_asked() -> None:
    """A rerun is compared by category, module and op: it records without Python stacks (a
    faster rerun, a Cancel that does not wait for the profiler to post-process every Python
    call), unless asked and the first run had them."""
    torch.manual_seed(0)
    ns = {"model": nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)),
          "x": torch.randn(16, 32)}  # fmt: skip
    cell = "loss = model(x).square().mean()\nloss.backward()\n"
    baseline = run_code(cell, ns, filename="<cell-7>").profile
    assert baseline is not None and baseline.meta["stacks"] == "sampled"
    assert any(f.filename == "<cell-7>" for f in baseline.frames)

    plain = jv.rerun(baseline, amp="bf16")
    assert plain.meta["stacks"] == "none" and plain.frames == ()
    assert plain.variant is not None and plain.variant.amp == "bf16"

    lined = jv.rerun(baseline, amp="bf16", stacks=True)
    assert lined.meta["stacks"] == "sampled"
    assert any(f.filename == "<cell-7>" for f in lined.frames)
    # the same allocations either way: stacks only add source lines
    assert plain.peak_bytes == lined.peak_bytes
