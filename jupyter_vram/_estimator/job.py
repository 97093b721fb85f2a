"""What the kernel sends the estimator once: the model and how to feed and train it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from .inputs import BatchSpec, PendingInputs
from .step import LossFn, OptimizerFactory


@dataclass
class Job:
    """Everything the kernel sends once: the model (or a factory) and how to feed it."""

    model: nn.Module | Callable[[], nn.Module]
    batch: BatchSpec | PendingInputs  # pending: read where the model is built
    loss_fn: LossFn | None = None
    optimizer_factory: OptimizerFactory | None = None
    sys_path: tuple[str, ...] = ()
