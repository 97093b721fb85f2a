"""The estimate predicts the program as it runs without us: gradients that arrive from several
branches are summed in place by autograd, although the fake run sums them out of place."""

from __future__ import annotations

import torch
from torch import nn

import jupyter_vram as jv
from tests.test_observer_effect import ThreeHeads, true_peak


def held_bytes(*tensors: torch.Tensor) -> int:
    """Bytes of the distinct storages behind ``tensors`` (an independent count)."""
    return sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values()
    )


def measured_step_peak(model: nn.Module, x: torch.Tensor) -> int:
    """Peak bytes of a steady-state AdamW step, from the CPU allocator's own reports."""
    opt = torch.optim.AdamW(model.parameters())

    def step() -> None:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # optimizer state exists from here on, as in the estimate's measured step
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return held_bytes(*model.parameters(), *state, x) + true_peak(step)


def test_branching_gradients_are_summed_in_place() -> None:
    torch.manual_seed(0)
    model, x = ThreeHeads(), torch.randn(1024, 256)
    # the hidden state's gradient (1024 x 2048 x 4 B = 8 MiB) arrives from three heads
    estimate = jv.estimate(model, x, loss_fn=lambda out, batch: out.pow(2).mean(), device="cpu")
    truth = measured_step_peak(model, x)
    assert abs(estimate.peak_bytes - truth) <= 0.005 * truth, (estimate.peak_bytes, truth)
    # two sums per step (three arrivals) were rewritten; without that the estimate is one
    # gradient-sized buffer (8 MiB) too high
    assert estimate.profile.meta["estimate"]["in_place_sums"] >= 2


def test_a_single_consumer_needs_no_rewrite() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    estimate = jv.estimate(model, "16x64", device="cpu")
    assert estimate.profile.meta["estimate"]["in_place_sums"] == 0
