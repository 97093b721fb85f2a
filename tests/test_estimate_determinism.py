"""The same estimate twice gives the same numbers, row for row, in one process.

Runs the estimator's simulator in the test process, several times over: fresh simulators (a
new model load each, as after a restart of the estimator process) and one warm simulator
(runs that start from the previous run's fake tensors). The first run of a process used to
differ from the later ones: the tensors alive before the step were listed in the garbage
collector's order, and the CUDA allocator model places blocks in that order (GPT-2 small,
8x512, AMP: 2 MiB of peak apart); frees in one burst (autocast's cast cache) came in a hash
map's order.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from jupyter_vram._estimator.inputs import make_batch_spec
from jupyter_vram._estimator.job import Job
from jupyter_vram._estimator.simulator import Simulator
from jupyter_vram._estimator.step import StepSettings
from jupyter_vram._model import Profile


def rows(profile: Profile) -> list[tuple[Any, ...]]:
    """Every row as the numbers see it: size, when, what, where (times left out)."""
    a = profile.allocations
    return list(
        zip(
            a.size.tolist(), a.alloc_seq.tolist(), a.free_seq.tolist(),
            [profile.ops[i] for i in a.op], [profile.modules[i] for i in a.module],
            a.phase.tolist(), a.category.tolist(), strict=True,
        )
    )  # fmt: skip


def numbers(profile: Profile) -> tuple[Any, ...]:
    model = profile.meta.get("allocator_model", {})
    return profile.peak_bytes, model.get("peak_reserved"), profile.peak_breakdown(), rows(profile)


@pytest.mark.parametrize("amp", [None, "bf16"])
def test_the_same_estimate_gives_the_same_numbers_every_time(amp: str | None) -> None:
    with torch.device("meta"):
        model = nn.Sequential(
            nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256), nn.LayerNorm(256)
        )
    spec = make_batch_spec(model, "8x256")
    settings = StepSettings(amp=amp)
    fresh = [numbers(Simulator(Job(model, spec)).run(settings, None)) for _ in range(3)]
    warm = Simulator(Job(model, spec))
    warm.run(StepSettings(optimizer="sgd"), None)
    again = [numbers(warm.run(settings, None)) for _ in range(2)]
    for other in [*fresh[1:], *again]:
        assert other[:3] == fresh[0][:3]
        assert other[3] == fresh[0][3]


def test_tensors_alive_before_the_step_come_in_the_order_training_makes_them() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    profile = Simulator(Job(model, make_batch_spec(model, "8x256"))).run(StepSettings(), None)
    a = profile.allocations
    columns = zip(a.module.tolist(), a.size.tolist(), a.alloc_seq.tolist(), strict=True)
    before = [(profile.modules[m], size) for m, size, seq in columns if seq < 0]
    # the parameters in module order (weight, bias; float32: 4 bytes an element), then
    # AdamW's state for each in turn: the step counter (CUDA keeps it on the host: no row),
    # the two moments
    weight0, bias0, weight2, bias2 = 1024 * 256 * 4, 1024 * 4, 256 * 1024 * 4, 256 * 4
    assert before[:4] == [("Sequential.0", weight0), ("Sequential.0", bias0),
                          ("Sequential.2", weight2), ("Sequential.2", bias2)]  # fmt: skip
    moments = [weight0, weight0, bias0, bias0, weight2, weight2, bias2, bias2]
    assert [size for _, size in before[4:12]] == moments


class FunctionalLSTM(nn.Module):
    """An LSTM layer called as a function: no ``nn.LSTM`` module in the model."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.LSTM(32, 64, batch_first=True)._flat_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = x.new_zeros(1, x.shape[0], 64)
        weights = list(self.weights)
        out, _, _ = torch.lstm(x, (h0, h0), weights, True, 1, 0.0, self.training, False, True)
        return out  # type: ignore[no-any-return]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN's LSTM only")
def test_a_later_run_keeps_lstm_workspaces_without_an_lstm_module() -> None:
    # later runs leave out the dispatch mode that adds LSTM workspaces when a step showed
    # the model has no LSTM op: one called as a function must keep them
    with torch.device("meta"):
        model = FunctionalLSTM()
    job = Job(model, make_batch_spec(model, "4x16x32"))
    fresh = Simulator(job).run(StepSettings(optimizer="sgd"), None)  # gone before the next
    warm = Simulator(job)
    warm.run(StepSettings(), None)
    later = warm.run(StepSettings(optimizer="sgd"), None)
    assert numbers(later) == numbers(fresh)
    # cuDNN's reserve for the layer, 5 x steps x batch x hidden x 4 bytes, lives as a row
    assert 5 * 16 * 4 * 64 * 4 in rows_sizes(fresh)


def rows_sizes(profile: Profile) -> list[int]:
    a = profile.allocations
    return [int(s) for s, op in zip(a.size, a.op, strict=True) if "rnn" in profile.ops[op]]
