"""torch-kitsune's predictions for the bench's cases, beside ours, when it is installed.

torch-kitsune is not a dependency of jupyter_vram: ``bench/estimate_vs_measured.py`` adds its
column only when ``import kitsune.predict`` works. Each case is put to kitsune the way its own
documentation asks: ``predict_memory`` for a training step (the model, the input's shape
without the batch dimension, the batch size, the dtype, the optimizer), ``estimate_lora_memory``
for LoRA / QLoRA (the base model before fine-tuning, rank and target modules), and
``estimate_kv_cache`` for ``generate()`` (prompt plus new tokens as the sequence length).
Settings it has no parameter for (autocast, activation checkpointing) get no prediction, with
the reason, rather than one for another step.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

#: the bench's optimizers in kitsune's names (the bench's SGD has momentum 0.9)
OPTIMIZER_NAMES = {"adamw": "adamw", "sgd": "sgd_momentum", "adamw8bit": "adam8bit"}
#: the bench's LoRA adapters (``_lora`` in estimate_vs_measured.py)
LORA_RANK = 16
LORA_TARGETS = ("q_proj", "v_proj")
DTYPES = {None: torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class CaseLike(Protocol):
    """What the adapter reads of a bench case (a frozen dataclass: read-only members)."""

    @property
    def inputs(self) -> str: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def dtype(self) -> str | None: ...
    @property
    def amp(self) -> str | None: ...
    @property
    def checkpoint(self) -> bool: ...
    @property
    def generate(self) -> int: ...
    @property
    def fine_tune(self) -> str: ...


@dataclass(frozen=True)
class Prediction:
    """kitsune's peak for one case, or why it has none."""

    total_bytes: int = 0  # its peak, its safety margin included (0: no prediction)
    margin_bytes: int = 0  # the margin kitsune adds for allocator overhead (15 %)
    reason: str = ""  # why there is no prediction

    @property
    def answered(self) -> bool:
        return not self.reason


def load_kitsune() -> Any | None:
    """``kitsune.predict`` if torch-kitsune is installed, else None."""
    try:
        import kitsune.predict
    except ImportError:
        return None
    module: Any = kitsune.predict
    return module


def first_input(inputs: str) -> tuple[int, tuple[int, ...]]:
    """Batch size and per-sample shape of the first tensor of a bench input string
    (``"8x128"``, ``"input_features=4x80x400,labels=4x32"``): kitsune takes one input shape."""
    first = inputs.partition(",")[0]  # "name=AxB:dtype" or "AxB"
    shape = first.rpartition("=")[2].partition(":")[0]
    sizes = tuple(int(n) for n in shape.split("x"))
    return sizes[0], sizes[1:]


def unanswerable(case: CaseLike) -> str:
    """Why kitsune cannot be asked about ``case`` ("" when it can)."""
    if case.amp:
        return "kitsune has no autocast (AMP) setting"
    if case.checkpoint:
        return "kitsune has no activation-checkpointing setting"
    if not case.generate and case.optimizer not in OPTIMIZER_NAMES:
        return f"kitsune has no {case.optimizer} optimizer setting"
    return ""


def predict(case: CaseLike, kitsune: Any, model: nn.Module) -> Prediction:
    """kitsune's prediction for ``case``; ``model`` is the case's model with real weights on
    the CPU in the case's dtype (the base model, before LoRA, for a fine-tuning case)."""
    reason = unanswerable(case)
    if reason:
        return Prediction(reason=reason)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # its fallbacks print torch.fx traces
            result = _ask(case, kitsune, model)
    except Exception as error:  # noqa: BLE001 - its failure is the answer for this case
        return Prediction(reason=f"kitsune raised {type(error).__name__}")
    return Prediction(int(result.total_bytes), int(result.overhead_bytes))


def _ask(case: CaseLike, kitsune: Any, model: nn.Module) -> Any:
    """The kitsune call that answers ``case``: KV cache, LoRA, or a training step."""
    batch, shape = first_input(case.inputs)
    dtype = DTYPES[case.dtype]
    if case.generate:
        return kitsune.estimate_kv_cache(
            model, seq_len=shape[-1] + case.generate, batch_size=batch, dtype=dtype
        )
    optimizer = OPTIMIZER_NAMES[case.optimizer]
    if case.fine_tune:
        qlora = case.fine_tune == "qlora"
        config = kitsune.LoRAConfig(
            rank=LORA_RANK, target_modules=LORA_TARGETS, use_qlora=qlora, optimizer=optimizer
        )
        return kitsune.estimate_lora_memory(model, shape, batch, dtype, config)
    return kitsune.predict_memory(model, shape, batch, dtype, optimizer, training=True)
