"""`jv.estimate` on peft models as users pass them: LoRA on a float base, QLoRA on a
bitsandbytes NF4 base. The weights' bytes are hand arithmetic (NF4 = half a byte per weight,
QuantState from bitsandbytes' block sizes); the peak is held against the same step measured on
the real CPU model (its labels a tensor of their own, as the estimate builds them).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._estimator.step import StepSettings, make_optimizer, training_step

from .test_finetune_recording import (
    LAYER_LINEARS,
    LAYERS,
    LORA_BYTES,
    OTHER_WEIGHT_BYTES,
    VOCAB,
    llama,
    lora,
    nf4_llama,
    quant_state_bytes,
)

BATCH, SEQ = 2, 32


def measured(model: Any) -> jv.Profile:
    """One steady-state CPU step (after a warm-up one), the estimator's own step code."""
    settings = StepSettings(device="cpu", optimizer="adamw")
    opt = make_optimizer(settings, model)
    torch.manual_seed(1)
    ids, labels = torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
    batch = {"input_ids": ids, "labels": labels}
    training_step(model, opt, (), batch, settings, "cpu")
    with jv.record() as rec:
        training_step(model, opt, (), batch, settings, "cpu")
    return rec.profile


def within(estimated: int, truth: int, share: float) -> bool:
    return abs(estimated - truth) <= share * truth


def test_lora_estimate_adds_the_labels_a_wrapped_causal_lm_wants() -> None:
    """A plain ``PeftModel`` forwards ``*args, **kwargs``: the labels come from the causal LM
    it wraps (before, none were passed, no loss on the logits: -9 % here, -25 % reported)."""
    model = lora(llama())
    est = jv.estimate(model, f"{BATCH}x{SEQ}", optimizer="adamw", device="cpu")
    at_peak = est.peak_breakdown()
    assert at_peak["parameter"] == LORA_BYTES
    linear_bytes = 4 * LAYERS * sum(i * o for i, o in LAYER_LINEARS)
    assert at_peak["frozen_parameter"] == linear_bytes + OTHER_WEIGHT_BYTES
    assert at_peak["input"] == 2 * BATCH * SEQ * 8  # input_ids and labels, int64
    truth = measured(model)
    assert within(est.peak_bytes, truth.peak_bytes, 0.01), (est.peak_bytes, truth.peak_bytes)


def test_qlora_estimate_runs_nf4_layers_on_fake_tensors() -> None:
    model = lora(nf4_llama())
    est = jv.estimate(model, f"{BATCH}x{SEQ}", optimizer="adamw", device="cpu")
    at_peak = est.peak_breakdown()
    sizes = [i * o for i, o in LAYER_LINEARS] * LAYERS
    assert at_peak["frozen_parameter"] == sum(n // 2 for n in sizes) + OTHER_WEIGHT_BYTES
    assert at_peak["quant_state"] == sum(quant_state_bytes(n) for n in sizes)
    assert at_peak["parameter"] == LORA_BYTES
    truth = measured(model)
    assert truth.peak_breakdown()["quant_state"] == at_peak["quant_state"]
    assert within(est.peak_bytes, truth.peak_bytes, 0.01), (est.peak_bytes, truth.peak_bytes)


def test_adamw8bit_estimate_is_bitsandbytes_own_state_and_cpu_update() -> None:
    """bitsandbytes' AdamW8bit itself runs on fake tensors: uint8 moments and an fp32 absmax per
    256 elements (not the 2048 assumed before), and on the CPU its update's fp32 working
    copies (both moments dequantised, the gradient, the weight and the denominator: five
    tensors the size of the parameter), which set this step's peak."""
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )  # fmt: skip
    est = jv.estimate(model, "8x512", optimizer="adamw8bit", device="cpu")
    big = 512 * 1024  # the two large weights' elements each
    last = 512 * 10  # 5120 elements: 8-bit too (4096 and more)
    biases = 1024 + 512 + 10  # under 4096 elements: fp32 moments
    eight_bit = 2 * 2 * (big + 4 * big // 256) + 2 * (last + 4 * last // 256)
    state = eight_bit + 2 * 4 * biases + 2 * 4 * 256  # + the two shared quantisation maps
    assert state == 2_154_736
    at_peak = est.peak_breakdown()
    assert at_peak["optimizer_state"] == state
    assert at_peak["temporary"] == 5 * 4 * big  # the update's five fp32 copies
    settings = StepSettings(device="cpu", optimizer="adamw8bit")
    opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-4)
    x = torch.randn(8, 512)
    training_step(model, opt, (x,), {}, settings, "cpu")
    with jv.record() as rec:
        training_step(model, opt, (x,), {}, settings, "cpu")
    truth = rec.profile
    assert truth.peak_breakdown()["optimizer_state"] == state
    assert within(est.peak_bytes, truth.peak_bytes, 0.01), (est.peak_bytes, truth.peak_bytes)
