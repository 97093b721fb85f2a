"""bitsandbytes' paged optimizers (``PagedAdamW8bit``, ``PagedAdamW``) as bitsandbytes 0.50
allocates their state (``Optimizer8bit.get_state_buffer``): on the CPU it pages nothing (it
warns and makes ordinary tensors), so the CPU estimate is held against a real recorded step;
on a CUDA target the ``state1`` / ``state2`` of a parameter of at least 100,000 elements are
CUDA managed memory, beside PyTorch's caching allocator: out of the peak, counted apart. Every
expected byte count is hand arithmetic from the model's shapes.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._estimator.step import StepSettings, training_step

from .test_estimate_finetune import within

bnb = pytest.importorskip("bitsandbytes")

BIG = 512 * 1024  # elements of each of the two large weights
LAST = 512 * 10  # the last weight: 8-bit state (4096 elements or more), not paged (< 100,000)
BIASES = 1024 + 512 + 10


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )  # fmt: skip


def recorded(optimizer: type) -> jv.Profile:
    """The real step on the CPU with bitsandbytes' own optimizer (after a warm-up step)."""
    model = mlp()
    opt = optimizer(model.parameters(), lr=1e-4)
    settings = StepSettings(device="cpu")
    x = torch.randn(8, 512)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Paged optimizers are not supported on CPU"
        training_step(model, opt, (x,), {}, settings, "cpu")
    with jv.record() as rec:
        training_step(model, opt, (x,), {}, settings, "cpu")
    return rec.profile


def test_paged_adamw8bit_on_the_cpu_is_the_recorded_step() -> None:
    est = jv.estimate(mlp(), "8x512", optimizer="paged_adamw_8bit", device="cpu")
    assert est.settings.optimizer == "pagedadamw8bit"
    # uint8 moments with an fp32 absmax per 256 elements; fp32 moments under 4096 elements;
    # the two 256-entry quantisation maps
    state = 2 * 2 * (BIG + 4 * BIG // 256) + 2 * (LAST + 4 * LAST // 256) + 2 * 4 * BIASES
    state += 2 * 4 * 256
    at_peak = est.peak_breakdown()
    assert at_peak["optimizer_state"] == state == 2_154_736
    assert at_peak["temporary"] == 5 * 4 * BIG  # the CPU update's five fp32 working copies
    assert est.paged_state_bytes == 0  # nothing paged on the CPU
    truth = recorded(bnb.optim.PagedAdamW8bit)
    assert truth.peak_breakdown()["optimizer_state"] == state
    assert within(est.peak_bytes, truth.peak_bytes, 0.01), (est.peak_bytes, truth.peak_bytes)


def test_paged_adamw_32bit_on_the_cpu_is_the_recorded_step() -> None:
    """Two fp32 moments per element; the CPU update's fp32 temporaries (the scaled gradient,
    the denominator, the update: three of the largest parameter at once)."""
    est = jv.estimate(mlp(), "8x512", optimizer="paged_adamw_32bit", device="cpu")
    params = 2 * BIG + LAST + BIASES
    at_peak = est.peak_breakdown()
    assert at_peak["optimizer_state"] == 2 * 4 * params == 8_441_936
    assert at_peak["temporary"] == 3 * 4 * BIG
    truth = recorded(bnb.optim.PagedAdamW)
    assert truth.peak_breakdown()["optimizer_state"] == 2 * 4 * params
    assert within(est.peak_bytes, truth.peak_bytes, 0.01), (est.peak_bytes, truth.peak_bytes)


def test_paged_state_on_cuda_is_managed_memory_beside_the_allocator() -> None:
    """On a CUDA target the two large weights' uint8 moments (524,288 elements each, over
    bitsandbytes' 100,000) are managed memory; everything else is in 512 B allocator blocks."""
    est = jv.estimate(mlp(), "8x512", optimizer="pagedadamw8bit", device="cuda")
    assert est.paged_state_bytes == 2 * 2 * BIG
    block = 512
    absmax_big = 2 * 2 * 4 * BIG // 256  # 8192 B each: whole blocks
    last = 2 * LAST + 2 * block  # uint8 moments (5120 B each), absmax of 80 B in a block each
    biases = 2 * (4 * 1024 + 4 * 512 + block)  # fp32 moments; 40 B in one block
    maps = 2 * 4 * 256
    at_peak = est.peak_breakdown()
    assert at_peak["optimizer_state"] == absmax_big + last + biases + maps == 59_392
