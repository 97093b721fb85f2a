"""Make it fit: the changes that bring a run under a memory budget, each with its predicted
peak (a predicted run from :mod:`.fitting`) and what it costs, cheapest first.

Cost is one number so options can be ranked: the predicted time factor (1.0: as fast as the
run), plus a charge for what else changes: numerics (16-bit matmuls, 8-bit state, BatchNorm
statistics over smaller batches), what is trained (LoRA) and hardware (more GPUs). The
charges are rules of thumb, said as such in each option's ``why``; nothing here runs a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._model import CATEGORY_INDEX, PHASE_INDEX, Profile
from . import fitting

#: Charges added to the time factor (see the module docstring).
NUMERICS_BF16 = 0.05
NUMERICS_FP16 = 0.08  # fp16 also needs loss scaling (GradScaler)
NUMERICS_8BIT = 0.10
NUMERICS_BATCHNORM = 0.10  # BatchNorm statistics over each micro-batch
TRAINS_ADAPTERS_ONLY = 1.0
#: The forward pass's share of a training step's time (backward costs about twice forward).
FORWARD_SHARE = 1 / 3
MICRO_BATCHES = (2, 4, 8)
#: Time added per halving of the batch (smaller kernels, more launches): a rule of thumb.
MICRO_BATCH_OVERHEAD = 0.05
#: LoRA adapters' share of the weights assumed when nothing says which layers get them.
LORA_SHARE = 0.01

NEEDS_OTHER_OPTIMIZER = "changes the optimizer the notebook builds (bitsandbytes): not rerun"

AMP_NOTE = (
    "AMP: the profile has no dtypes, so which outputs autocast makes in 16 bits is inferred "
    "from the order of ops, and casts a model makes in its own code are not seen; on the CPU, "
    "oneDNN computes 16-bit convolutions channels-last and copies an NCHW net's outputs and "
    "gradients between layouts (AMP alone measured 2-14 % off on three small models, "
    "combined with other changes up to 28 %, either way: verify before relying on it)"
)

CANNOT_PREDICT = (
    "the allocator's cache, fragmentation and kernel workspaces (the budget is compared with "
    "the peak of live tensor bytes; on a GPU leave room for them and the CUDA context)",
    "time factors are rules of thumb, not measurements: verify() measures memory only",
)


@dataclass(frozen=True)
class Candidate:
    """One way to fit: ``changes`` (``amp``, ``checkpoint`` (block paths), ``offload``,
    ``micro_batch``, ``optimizer``, ``shard``, ``lora``), its predicted peak, whether that is
    within the budget, the predicted time factor (None: cannot tell), its rank cost, why, and
    ``verifiable``: None when a rerun of the cell can measure it, else why not."""

    name: str
    changes: Mapping[str, Any]
    predicted_peak_bytes: int
    fits: bool
    time_factor: float | None
    cost: float
    why: str
    verifiable: str | None = None
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class _Ctx:
    profile: Profile
    budget: int
    cuda: bool
    blocks: tuple[str, ...]
    batchnorm: bool


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def plan_candidates(
    profile: Profile, budget: int, extra: Sequence[Prediction] = ()
) -> list[Candidate]:
    """Every option this run allows, and ``extra`` ones for a training run, ranked by cost
    (then by predicted peak)."""
    ctx = _Ctx(
        profile,
        int(budget),
        profile.device.startswith("cuda"),
        tuple(fitting.repeated_blocks(profile)),
        any("batch_norm" in op for op in profile.ops),
    )
    trains = _has_backward(profile)
    out: list[Candidate] = []
    if trains:
        out += _rerunnable(ctx)
        out += _paged_option(ctx)
        out += _lora_option(ctx)
        out += [_predicted(ctx, p) for p in extra]
    else:
        out += _amp_options(ctx, lambda p: p, {}, 1.0, "")
    return sorted(out, key=lambda c: (c.cost, c.predicted_peak_bytes, c.name))


def frontier(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The options worth showing, from a ranked list: each predicted lower than every cheaper
    one (a costlier option that saves no more is never the better choice). The cheapest that
    fits is always among them."""
    kept: list[Candidate] = []
    for c in candidates:
        if not kept or c.predicted_peak_bytes < kept[-1].predicted_peak_bytes:
            kept.append(c)
    return kept


def _has_backward(profile: Profile) -> bool:
    a = profile.allocations
    return bool(((a.phase == PHASE_INDEX["backward"]) & (a.alloc_seq >= 0)).any())


# -- options a rerun can measure ----------------------------------------------------------------


def _rerunnable(ctx: _Ctx) -> list[Candidate]:
    """AMP, checkpointing, offload and micro-batches, alone and combined."""
    out: list[Candidate] = []
    bases: list[tuple[str, Callable[[Profile], Profile], dict[str, Any], float, str]] = [
        ("", lambda p: p, {}, 1.0, "")
    ]
    for parts in MICRO_BATCHES:
        bases.append(_micro(ctx, parts))
    for label, shrink, changes, time, why in bases:
        if label:
            out.append(_candidate(ctx, label, shrink(ctx.profile), changes, time, why))
        out += _amp_options(ctx, shrink, changes, time, why, label)
        out += _checkpoint_options(ctx, shrink, changes, time, why, label)
    if ctx.cuda:
        offloaded = fitting.offloaded(ctx.profile)
        why = "saved tensors wait in pinned host memory (save_on_cpu); copies partly overlap"
        out.append(_candidate(ctx, "activation offload", offloaded, {"offload": True}, 1.2, why))
    return out


def _micro(
    ctx: _Ctx, parts: int
) -> tuple[str, Callable[[Profile], Profile], dict[str, Any], float, str]:
    time = 1 + MICRO_BATCH_OVERHEAD * math.log2(parts)
    why = (
        f"1/{parts} of the batch per step, gradients accumulated over {parts} micro-batches "
        f"before one optimizer step (the effective batch is kept); smaller kernels and "
        f"{parts}x the launches: time ~{time:.2f}x"
        + ("; BatchNorm sees the smaller batches" if ctx.batchnorm else "")
    )
    return (
        f"micro-batch 1/{parts} x {parts} accumulated",
        lambda p: fitting.micro_batch(p, parts),
        {"micro_batch": parts},
        time,
        why,
    )


def _join(*labels: str) -> str:
    return " + ".join(label for label in labels if label)


def _why(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _amp_options(
    ctx: _Ctx,
    shrink: Callable[[Profile], Profile],
    changes: dict[str, Any],
    time: float,
    why: str,
    label: str = "",
) -> list[Candidate]:
    predicted = shrink(fitting.autocast(ctx.profile))
    speed = 0.8 if ctx.cuda else 1.0
    timing = "tensor cores: ~0.8x" if ctx.cuda else "CPU speed under autocast varies: assumed 1x"
    out = [
        _candidate(
            ctx,
            _join("AMP bf16", label),
            predicted,
            {"amp": "bf16", **changes},
            time * speed,
            _why(f"matmuls in bf16 ({timing})", why),
            notes=(AMP_NOTE,),
        )
    ]
    if ctx.cuda:
        out.append(
            _candidate(
                ctx,
                _join("AMP fp16", label),
                predicted,
                {"amp": "fp16", **changes},
                time * speed,
                _why("matmuls in fp16 with loss scaling (GradScaler)", why),
                notes=(AMP_NOTE,),
            )
        )
    return out


def _checkpoint_options(
    ctx: _Ctx,
    shrink: Callable[[Profile], Profile],
    changes: dict[str, Any],
    time: float,
    why: str,
    label: str,
) -> list[Candidate]:
    """Checkpointing every repeated block, the fewest blocks that get under the budget, and
    each with bf16 AMP."""
    if len(ctx.blocks) < 2:
        return []
    out: list[Candidate] = []
    speed = 0.8 if ctx.cuda else 1.0
    for amp in (False, True):
        start = fitting.autocast(ctx.profile) if amp else ctx.profile
        chosen = fewest_blocks(start, ctx.blocks, ctx.budget, shrink)
        sets = [tuple(ctx.blocks)] + ([chosen] if chosen and len(chosen) < len(ctx.blocks) else [])
        for blocks in sets:
            share = fitting.recompute_share(ctx.profile, blocks)
            every = len(blocks) == len(ctx.blocks)
            count = f"{len(blocks)} block{'s' if len(blocks) > 1 else ''}"
            name = "checkpoint all blocks" if every else f"checkpoint {count}"
            base_time = time * (1 + FORWARD_SHARE * share) * (speed if amp else 1.0)
            more = {"checkpoint": blocks, **changes}
            text = (
                f"{len(blocks)} of {len(ctx.blocks)} blocks ({blocks[0]} ...) recompute their "
                f"forward in backward (~{share:.0%} of the saved tensors: time "
                f"~{1 + FORWARD_SHARE * share:.2f}x)"
            )
            predicted = shrink(fitting.checkpointed(start, blocks))
            if amp:
                name, more = _join("AMP bf16", name), {"amp": "bf16", **more}
                text = "matmuls in bf16; " + text
            out.append(_candidate(ctx, _join(name, label), predicted, more, base_time,
                                  _why(text, why)))  # fmt: skip
    return out


def fewest_blocks(
    profile: Profile,
    blocks: Sequence[str],
    budget: int,
    shrink: Callable[[Profile], Profile] = lambda p: p,
) -> tuple[str, ...]:
    """A selective policy: blocks in the order of what checkpointing each gives up (most
    first), added until the predicted peak is within ``budget``; () when all of them are not
    enough (then checkpointing all is the option)."""
    acts = fitting.block_activations(profile, blocks)
    order = sorted(acts.values(), key=lambda b: -b.inner_bytes)
    chosen: list[str] = []
    for block in order:
        chosen.append(block.block)
        if shrink(fitting.checkpointed(profile, chosen)).peak_bytes <= budget:
            forward = [b for b in blocks if b in chosen]
            return tuple(forward)
    return ()


# -- options the cell would need changing for ------------------------------------------------------


def _paged_option(ctx: _Ctx) -> list[Candidate]:
    a = ctx.profile.allocations
    if not (a.category == CATEGORY_INDEX["optimizer_state"]).any():
        return []
    return [
        _candidate(ctx, "paged optimizer state", fitting.paged_state(ctx.profile),
                   {"optimizer": "paged"}, 1.05, "optimizer state in unified memory, paged out "
                   "while forward and backward run (bitsandbytes paged optimizers)",
                   verifiable=NEEDS_OTHER_OPTIMIZER),
    ]  # fmt: skip


@dataclass(frozen=True)
class Prediction:
    """An option predicted elsewhere (the estimator's what-ifs: 8-bit state, sharding), to
    rank with the rest: ``charge`` is added to its time factor for what else it changes."""

    name: str
    changes: Mapping[str, Any]
    peak_bytes: int
    time_factor: float
    why: str
    verifiable: str | None
    charge: float = 0.0


def largest_block_weights(profile: Profile) -> int:
    """The parameter bytes of the largest repeated block (all parameters when there are no
    blocks): what a sharded run gathers at a time."""
    a = profile.allocations
    params = (a.category == CATEGORY_INDEX["parameter"]) & profile.timeline.device_mask
    best = 0
    for block in fitting.repeated_blocks(profile) or [""]:
        inside = fitting._under(profile, block) if block else params
        best = max(best, int(a.size[params & inside].sum()))
    return best


def _lora_option(ctx: _Ctx) -> list[Candidate]:
    a = ctx.profile.allocations
    weights = int(a.size[(a.category == CATEGORY_INDEX["parameter"])].sum())
    adapters = int(weights * LORA_SHARE)
    predicted = fitting.frozen(ctx.profile, adapters)
    return [
        Candidate(
            "LoRA (fine-tuning)",
            {"lora": True},
            predicted.peak_bytes,
            predicted.peak_bytes <= ctx.budget,
            0.9,
            0.9 + TRAINS_ADAPTERS_ONLY,
            f"weights frozen, small adapters trained (assumed {LORA_SHARE:.0%} of the weights: "
            f"{_mib(adapters)}); changes what is trained",
            "changes the model (peft): not rerun; jv.estimate(model, lora=...) simulates it",
        )
    ]


def _candidate(
    ctx: _Ctx,
    name: str,
    predicted: Profile,
    changes: Mapping[str, Any],
    time: float,
    why: str,
    *,
    verifiable: str | None = None,
    notes: tuple[str, ...] = (),
) -> Candidate:
    """An option whose cost is its time factor plus the charges for what else it changes."""
    peak = predicted.peak_bytes
    cost = round(time + _charges(changes, ctx), 3)
    return Candidate(
        name, dict(changes), peak, peak <= ctx.budget, round(time, 3), cost, why, verifiable,
        notes,
    )  # fmt: skip


def _predicted(ctx: _Ctx, p: Prediction) -> Candidate:
    cost = round(p.time_factor + p.charge + _charges(p.changes, ctx), 3)
    fits = p.peak_bytes <= ctx.budget
    return Candidate(p.name, dict(p.changes), p.peak_bytes, fits, p.time_factor, cost, p.why,
                     p.verifiable)  # fmt: skip


def _charges(changes: Mapping[str, Any], ctx: _Ctx) -> float:
    """The non-time part of a cost (see the module docstring)."""
    amp = changes.get("amp")
    charge = NUMERICS_BF16 if amp == "bf16" else NUMERICS_FP16 if amp == "fp16" else 0.0
    if changes.get("micro_batch") and ctx.batchnorm:
        charge += NUMERICS_BATCHNORM
    if changes.get("optimizer") == "8bit":
        charge += NUMERICS_8BIT
    return charge
