"""`%vram_estimate --device cpu` and `jv.estimate` on a config-built Llama against the measured
step, with the logits-sized buffers counted by hand; a measured cell that keeps the model's
output through backward holds one logits buffer more, and the comparison says so."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._session import run_code

from .conftest import ipython_shell

transformers = pytest.importorskip("transformers")

HIDDEN, LAYERS, VOCAB, MLP, BATCH, SEQ = 256, 4, 8000, 688, 4, 128
LOGITS = BATCH * SEQ * VOCAB * 4  # one float32 (batch, seq, vocab) buffer: 16,384,000 B
# parameters by hand: embedding and lm_head (untied), per layer q/k/v/o, gate/up/down and two
# RMSNorm weights, and the final norm
PARAMETERS = 2 * VOCAB * HIDDEN + LAYERS * (4 * HIDDEN**2 + 3 * HIDDEN * MLP + 2 * HIDDEN) + HIDDEN


@pytest.fixture(scope="module")
def model() -> Any:
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=MLP, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=4, vocab_size=VOCAB,
        max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.fixture
def shell() -> Any:
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    yield shell
    for name in ("llama", "_vram_estimate"):
        shell.user_ns.pop(name, None)


def logits_rows_at_peak(profile: jv.Profile) -> list[tuple[str, str]]:
    frame = profile.to_dataframe()
    rows = frame[frame["live_at_peak"] & (frame["bytes"] == LOGITS)]
    return sorted((str(r["op"]), str(r["category"])) for r in rows.to_dict("records"))


def test_magic_and_api_estimate_the_same_step_as_hand_arithmetic(model: Any, shell: Any) -> None:
    shell.user_ns["llama"] = model
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_line_magic("vram_estimate", f"llama --input {BATCH}x{SEQ} --device cpu --text")
    magic = shell.user_ns["_vram_estimate"]
    api = jv.estimate(model, f"{BATCH}x{SEQ}", optimizer="adamw", device="cpu")
    assert magic.peak_breakdown() == api.peak_breakdown()
    assert magic.peak_bytes == api.peak_bytes
    for est in (magic, api):
        breakdown = est.peak_breakdown()
        assert breakdown["parameter"] == 4 * PARAMETERS
        # the peak is in backward through the loss: log-softmax's output (saved for its
        # backward), the gradient nll_loss hands back and log-softmax's gradient of the logits
        assert logits_rows_at_peak(est.profile) == [
            ("_log_softmax", "activation"),
            ("_log_softmax_backward_data", "temporary"),
            ("nll_loss_backward", "temporary"),
        ]
        # two logits buffers and two 4-byte scalars (nll_loss's total weight, the loss's
        # gradient)
        assert breakdown["temporary"] == 2 * LOGITS + 2 * 4


STEP = (
    "loss = llama(input_ids=ids, labels=ids).loss\nloss.backward()\nopt.step()\nopt.zero_grad()\n"
)
KEEPS_OUTPUT = (
    "out = llama(input_ids=ids, labels=ids)\nout.loss.backward()\nopt.step()\nopt.zero_grad()\n"
)


def test_a_cell_that_keeps_the_output_holds_one_logits_buffer_more_and_is_told(
    model: Any,
) -> None:
    from jupyter_vram._app.estimate_view import comparison_html
    from jupyter_vram._render.estimate_text import comparison_text

    est = jv.estimate(model, f"{BATCH}x{SEQ}", device="cpu")
    torch.manual_seed(1)
    ns: dict[str, Any] = {
        "llama": model,
        "opt": torch.optim.AdamW(model.parameters()),
        "ids": torch.randint(0, VOCAB, (BATCH, SEQ)),
    }
    run_code(STEP, ns)  # the optimizer state exists, as in the estimate's second step
    plain = run_code(STEP, ns).profile
    kept = run_code(KEEPS_OUTPUT, ns).profile
    assert plain is not None and kept is not None
    same = est.compare(plain)
    assert same.kept_output == 0
    assert same.measured["temporary"] == est.peak_breakdown()["temporary"]
    # the cell passes ids as labels too: one (batch, seq) int64 input less than the estimate
    assert same.measured["input"] == est.peak_breakdown()["input"] - BATCH * SEQ * 8
    off = est.compare(kept)
    assert off.kept_output == LOGITS  # lm_head's output, held by `out` at the backward peak
    assert off.measured["temporary"] - est.peak_breakdown()["temporary"] == LOGITS
    assert "kept 15.6 MiB of the forward's output alive through backward" in comparison_text(off)
    assert "kept 15.6 MiB of the forward" in comparison_html(off)
    assert "forward's output" not in comparison_text(same)
