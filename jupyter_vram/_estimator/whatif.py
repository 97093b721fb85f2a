"""What-ifs computed from a simulated profile rather than simulated again.

8-bit optimizer state and data-parallel sharding change *how much* of each category a GPU
holds, not the order of operations, so they are arithmetic on the profile's rows and its
per-category timeline. Each function says what it assumes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from .._model import CATEGORY_INDEX, PHASE_INDEX, Allocations, Profile
from .step import StepSettings

if TYPE_CHECKING:
    pass

_STATE = CATEGORY_INDEX["optimizer_state"]
_TEMPORARY = CATEGORY_INDEX["temporary"]
_OPTIMIZER = PHASE_INDEX["optimizer"]

#: bitsandbytes keeps 32-bit state for tensors under this many elements (``min_8bit_size``).
MIN_8BIT_NUMEL = 4096
#: bitsandbytes' blockwise quantization: one float32 absmax per this many elements (its 8-bit
#: optimizers' block: 256 in bitsandbytes 0.50, on every device).
QUANT_BLOCK = 256


def eight_bit_state(profile: Profile) -> Profile:
    """AdamW state as bitsandbytes' 8-bit Adam holds it, from an AdamW profile.

    bitsandbytes allocates its state by element count, whatever the weights' dtype: a state
    tensor of n >= 4096 elements becomes n bytes (uint8) plus one float32 absmax per 256
    elements; a smaller one is float32 (4n bytes). So AdamW's two moments cost about 2 bytes
    per parameter with fp32 and with bf16 weights alike. The element count of a row comes from
    ``meta["estimate"]["state_itemsizes"]`` (``[bytes, element size]`` pairs the estimator
    process read off the optimizer's state; float32 when absent). The update runs as one fused
    kernel per parameter, so the optimizer phase's temporaries (foreach intermediates) are
    dropped.
    """
    a = profile.allocations
    size = a.size.copy()
    state = a.category == _STATE
    itemsize = np.full(len(size), 4, np.int64)
    pairs = profile.meta.get("estimate", {}).get("state_itemsizes") or []
    for nbytes, item in pairs:
        itemsize[state & (size == int(nbytes))] = int(item)
    numel = size // itemsize
    big = state & (numel >= MIN_8BIT_NUMEL)
    small = state & ~big
    size[big] = numel[big] + 4 * (-(-numel[big] // QUANT_BLOCK))
    size[small] = 4 * numel[small]
    size[(a.category == _TEMPORARY) & (a.phase == _OPTIMIZER)] = 0
    columns = {name: getattr(a, name) for name in a.to_columns()}
    columns["size"] = size
    meta = {**profile.meta, "eight_bit_state": True}
    return profile.replace(allocations=Allocations.from_columns(columns), meta=meta)


@dataclass(frozen=True)
class Sharding:
    """How a data-parallel scheme splits memory over ``gpus`` devices."""

    name: str
    parameters: bool
    gradients: bool
    optimizer_state: bool
    gradient_buckets: bool = False  # DDP keeps a flat copy of the gradients for all-reduce
    gathers_units: bool = False  # FSDP / ZeRO-3 gather one block's parameters at a time

    def factor(self, gpus: int) -> tuple[float, float, float]:
        """Share of (parameters, gradients, optimizer state) one GPU holds."""
        share = 1.0 / gpus
        return (
            share if self.parameters else 1.0,
            share if self.gradients else 1.0,
            share if self.optimizer_state else 1.0,
        )


#: The data-parallel schemes of the what-if table. ZeRO-2 is also FSDP's SHARD_GRAD_OP and
#: ZeRO-3 its FULL_SHARD.
SHARDINGS: tuple[Sharding, ...] = (
    Sharding("DDP", False, False, False, gradient_buckets=True),
    Sharding("ZeRO-1", False, False, True),
    Sharding("ZeRO-2 / FSDP grad-op", False, True, True),
    Sharding("ZeRO-3 / FSDP full shard", True, True, True, gathers_units=True),
)


def sharded_peak(profile: Profile, sharding: Sharding, gpus: int, unit_bytes: int) -> int:
    """Peak bytes one of ``gpus`` GPUs holds when the step is data-parallel under ``sharding``.

    Each GPU runs the same step on its own batch, so activations and temporaries are those of
    the profile; parameters, gradients and optimizer state (with the optimizer step's
    temporaries, which work on the local shard) scale by the shard. Extras: DDP's gradient
    buckets (a flat copy of all gradients, ``gradient_as_bucket_view=False``); with sharded
    gradients, one block's full gradients before the reduce-scatter; with sharded parameters,
    two blocks' gathered parameters (the running one and the prefetched one). ``unit_bytes``
    is the parameter bytes of the largest block (the whole model if it has no blocks).
    Communication buffers (NCCL) are not counted.
    """
    gpus = check_gpus(gpus)
    timeline = profile.timeline
    if len(timeline) == 0:
        by_cat = timeline.baseline_by_category()[None, :]
        opt_temp = np.zeros(1, np.int64)
    else:
        by_cat = timeline.by_category()
        a = profile.allocations
        rows = timeline.alloc_index
        is_opt_temp = (a.category[rows] == _TEMPORARY) & (a.phase[rows] == _OPTIMIZER)
        opt_temp = np.cumsum(np.where(is_opt_temp, timeline.delta, 0))
    params = by_cat[:, CATEGORY_INDEX["parameter"]]
    grads = by_cat[:, CATEGORY_INDEX["gradient"]]
    state = by_cat[:, _STATE] + opt_temp
    rest = by_cat.sum(axis=1) - params - grads - state
    fp, fg, fs = sharding.factor(gpus)
    total = params * fp + grads * fg + state * fs + rest
    extra = 0
    if sharding.gradient_buckets:
        extra += int(grads.max())
    if sharding.gradients and gpus > 1:
        extra += unit_bytes
    if sharding.gathers_units and gpus > 1:
        extra += 2 * unit_bytes
    return int(np.ceil(total.max())) + extra


def check_gpus(gpus: object) -> int:
    """The number of data-parallel GPUs, validated: a whole number, at least 1."""
    from .runner import EstimateError

    if isinstance(gpus, bool) or not isinstance(gpus, (int, np.integer)) or gpus < 1:
        raise EstimateError(
            f"the number of GPUs for the data-parallel what-ifs must be a whole number of at "
            f"least 1, not {gpus!r}"
        )
    return int(gpus)


def variants(base: StepSettings) -> list[tuple[str, StepSettings]]:
    """The simulated what-ifs that differ from ``base``."""
    options = [
        ("bf16 weights", replace(base, dtype="bf16", amp=None)),
        ("AMP bf16", replace(base, amp="bf16")),
        ("AMP fp16", replace(base, amp="fp16")),
        ("activation checkpointing", replace(base, checkpoint=True)),
        ("checkpointing + AMP bf16", replace(base, checkpoint=True, amp="bf16")),
        ("SGD with momentum", replace(base, optimizer="sgd")),
        ("Adafactor", replace(base, optimizer="adafactor")),
        ("8-bit AdamW (bitsandbytes)", replace(base, optimizer="adamw8bit")),
    ]
    if base.inference:
        options = [o for o in options if o[1].optimizer == base.optimizer and not o[1].checkpoint]
    if base.generate:  # the same generate() call with the other cache kind
        other = "static" if base.cache == "dynamic" else "dynamic"
        options.append((f"{other} KV cache", replace(base, cache=other, cache_config="")))
    if base.optimizer == "custom":
        options = [o for o in options if o[1].optimizer == "custom"]
    seen = {base}
    kept = []
    for name, settings in options:
        if settings not in seen:
            seen.add(settings)
            kept.append((name, settings))
    return kept
