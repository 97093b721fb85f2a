"""Budgets for CI: `jv.assert_fits` (an estimated training step against a GPU, no GPU needed)
and the limits the pytest marker checks (see jupyter_vram.pytest_plugin)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._units import format_bytes

if TYPE_CHECKING:
    from torch import nn

    from ._estimator import Estimate


def assert_fits(
    model: nn.Module | Callable[[], nn.Module],
    inputs: Any = None,
    *,
    gpu: str,
    optimizer: Any = "adamw",
    **options: Any,
) -> Estimate:
    """Estimate one training step of ``model`` on ``inputs`` (:func:`jupyter_vram.estimate`,
    with ``optimizer`` and any of its ``options``: dtype, amp, checkpoint, batch_size ...) and
    raise AssertionError when it does not fit ``gpu`` (a name from the GPU table), naming the
    GPU, the predicted device memory, what the card offers and the largest categories at the
    peak. Runs on a machine without a GPU (fake tensors in a subprocess); returns the estimate
    when it fits."""
    from ._estimator import estimate
    from ._estimator.gpus import find_gpu

    card = find_gpu(gpu)
    result = estimate(model, inputs, optimizer=optimizer, **options)
    used = result.used_on(card)
    if card.fits(used):
        return result
    largest = sorted(result.peak_breakdown().items(), key=lambda kv: -kv[1])[:3]
    parts = ", ".join(f"{name} {format_bytes(n)}" for name, n in largest if n > 0)
    raise AssertionError(
        f"the step does not fit a {card.name}: predicted device memory {format_bytes(used)}, "
        f"the card offers {format_bytes(card.usable_bytes)} (short by "
        f"{format_bytes(used - card.usable_bytes)}); largest at the peak: {parts}"
    )
