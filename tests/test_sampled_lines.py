"""Sampled stacks give backward's and the optimizer step's allocations the line that called
them: a sample as each begins (backward: at its first saved tensor) and one as it ends, both
on that line, as module calls have. Before, they lay between the model call's sample and the
next one, on different lines, and got "somewhere in this function"; the loop's last step,
followed by the block's end, got the caller's frame instead, so one op was listed twice.

The expected lines are read from this file's text, not from the recorder."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._model import PHASES, Profile

BACKWARD, OPTIMIZER = PHASES.index("backward"), PHASES.index("optimizer")


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _line_of(text: str) -> int:
    lines, first = inspect.getsourcelines(_train)
    (offset,) = [i for i, line in enumerate(lines) if line.strip() == text]
    return first + offset


def _innermost(profile: Profile, rows: list[int]) -> list[tuple[str, int]]:
    """(function, line) of the innermost frame of each row's stack (("", -1): none)."""
    out = []
    for row in rows:
        frames = profile.stack_of(int(profile.allocations.stack[row]))
        out.append((frames[-1].name, frames[-1].line) if frames else ("", -1))
    return out


@pytest.mark.parametrize("steps", [3, 60])  # 60: most steps repeat (labels from the template)
def test_backward_and_optimizer_allocations_are_on_the_lines_that_called_them(
    steps: int,
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with jv.record("cpu") as recording:
        _train(model, opt, steps)
    profile = recording.profile
    a = profile.allocations
    made = a.alloc_seq >= 0
    ops = [profile.ops[int(op)] for op in a.op]
    optimizer = [int(i) for i in (made & (a.phase == OPTIMIZER)).nonzero()[0]]
    # backward's allocations but the seed gradient, made before the engine starts
    backward = [
        int(i) for i in (made & (a.phase == BACKWARD)).nonzero()[0] if ops[i] != "ones_like"
    ]
    # AdamW's state (3 per parameter, first step) and temporaries every step; backward: the
    # gradients of 2 weights, 2 biases, the ReLU and the loss, every step
    assert len(optimizer) >= 4 * 3 and len(backward) >= 4 * steps
    step_line, backward_line = _line_of("opt.step()"), _line_of("loss.backward()")
    # every step's, the last one's too (it was charged to this test's frame, which recorded)
    assert set(_innermost(profile, optimizer)) == {("_train", step_line)}
    assert set(_innermost(profile, backward)) == {("_train", backward_line)}
