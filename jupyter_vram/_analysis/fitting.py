"""A run as it would go under a change, predicted from the run's own rows.

Each function takes a profile and returns a new one: the same allocations with the sizes and
the moments the change would give them. A profile in, a profile out, so changes compose (a
smaller micro-batch of a checkpointed run is one function applied after the other) and a
prediction reads like any profile: its peak, breakdown and timeline. Each docstring says what
the change does to the rows and what it assumes; nothing here runs a model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .._model import CATEGORY_INDEX, PHASE_INDEX, Allocations, Profile
from .oom import FLOAT32_OPS

_ACTIVATION = CATEGORY_INDEX["activation"]
_TEMPORARY = CATEGORY_INDEX["temporary"]
_INPUT = CATEGORY_INDEX["input"]
_PARAMETER = CATEGORY_INDEX["parameter"]
_GRADIENT = CATEGORY_INDEX["gradient"]
_STATE = CATEGORY_INDEX["optimizer_state"]
_FORWARD = PHASE_INDEX["forward"]
_BACKWARD = PHASE_INDEX["backward"]
_OPTIMIZER = PHASE_INDEX["optimizer"]

BoolArray = npt.NDArray[np.bool_]

#: The op name of rows a prediction adds (weight casts, an update's working copies).
PREDICTED_OP = "(predicted)"

#: Ops autocast runs in float32. Not batch norm: autocast leaves it out of its float32 lists
#: (CPU and CUDA), and it returns its 16-bit input's dtype.
AUTOCAST_FLOAT32_OPS = FLOAT32_OPS - {
    "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training",
}  # fmt: skip

#: Pointwise ops of the float32 list that, in a forward pass, are seen running on 16-bit
#: inputs in 16 bits (CPU autocast: a GELU's ``pow`` after a matmul).
FOLLOW_INPUT = frozenset({"pow", "exp", "log"})

#: Ops whose output autocast computes in 16 bits from 16-bit copies of their weights.
MATMUL_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution",
     "conv2d", "conv1d", "conv3d", "mkldnn_convolution", "cudnn_convolution", "addbmm"}
)  # fmt: skip


def _columns(profile: Profile) -> dict[str, npt.NDArray[Any]]:
    a = profile.allocations
    return {name: getattr(a, name).copy() for name in a.to_columns()}


def _with(profile: Profile, columns: Mapping[str, npt.NDArray[Any]]) -> Profile:
    return profile.replace(allocations=Allocations.from_columns(columns), event_count=None)


def _under(profile: Profile, prefix: str) -> BoolArray:
    """Rows charged to the module ``prefix`` or its submodules."""
    inside = np.array(
        [m == prefix or m.startswith(prefix + ".") for m in profile.modules], dtype=bool
    )
    return inside[profile.allocations.module] if len(inside) else np.zeros(0, bool)


def with_rows(profile: Profile, rows: Sequence[Mapping[str, int]]) -> Profile:
    """``profile`` with extra allocation rows (``size``, ``alloc_seq``, ``free_seq``,
    ``category``, ``phase``; the rest from ``module`` / defaults): what a change adds."""
    if not rows:
        return profile
    columns = _columns(profile)
    device = profile.devices.index(profile.device)
    defaults = {"alloc_ns": 0, "free_ns": 0, "device": device, "op": 0, "module": 0,
                "stack": -1, "phase": 0}  # fmt: skip
    ops = list(profile.ops)
    if PREDICTED_OP not in ops:
        ops.append(PREDICTED_OP)
    defaults["op"] = ops.index(PREDICTED_OP)
    for name, column in columns.items():
        extra = [int(row.get(name, defaults.get(name, 0))) for row in rows]
        columns[name] = np.concatenate([column, np.asarray(extra, dtype=column.dtype)])
    return profile.replace(allocations=Allocations.from_columns(columns), ops=ops, event_count=None)


# -- activation checkpointing ------------------------------------------------------------------


@dataclass(frozen=True)
class BlockActivations:
    """What one block saved for backward in the run.

    ``inner``: the rows checkpointing gives up (every tensor the block saved but its output,
    the latest it made, which the next block saves as its input); ``recompute_seq``: when
    backward reaches the block (the first of them freed), where recomputation makes them again.
    """

    block: str
    inner: tuple[int, ...]
    inner_bytes: int
    output_bytes: int
    first_seq: int
    recompute_seq: int


def block_activations(profile: Profile, blocks: Iterable[str]) -> dict[str, BlockActivations]:
    """Per block path, the activations its modules made during the run, in forward order
    (blocks that made none are left out)."""
    a = profile.allocations
    made = (a.category == _ACTIVATION) & profile.timeline.device_mask & (a.alloc_seq >= 0)
    if PREDICTED_OP in profile.ops:  # autocast's weight copies stay cached, checkpointed or not
        made &= a.op != profile.ops.index(PREDICTED_OP)
    out: list[BlockActivations] = []
    for block in blocks:
        rows = np.flatnonzero(made & _under(profile, block))
        if not len(rows):
            continue
        rows = rows[np.argsort(a.alloc_seq[rows], kind="stable")]
        inner = rows[:-1]
        frees = a.free_seq[inner]
        frees = frees[frees >= 0]
        out.append(
            BlockActivations(
                block,
                tuple(int(r) for r in inner),
                int(a.size[inner].sum()),
                int(a.size[rows[-1]]),
                int(a.alloc_seq[rows[0]]),
                int(frees.min()) if len(frees) else -1,
            )
        )
    return {b.block: b for b in sorted(out, key=lambda b: b.first_seq)}


def repeated_blocks(profile: Profile) -> list[str]:
    """The run's repeated blocks, from module paths alone: among the groups of numbered
    siblings (``...layers.0``, ``...layers.1``), the one where checkpointing would give up the
    most (every member's saved tensors but its output, less the largest member's, which is
    held again while it is recomputed). Members in forward order; [] when no group has two
    members that saved anything."""
    groups: dict[str, set[str]] = {}
    for module in profile.modules:
        parts = module.split(".")
        for i in range(1, len(parts)):
            if parts[i].isdigit():
                groups.setdefault(".".join(parts[:i]), set()).add(".".join(parts[: i + 1]))
    best: list[str] = []
    best_saving = 0
    for members in groups.values():
        acts = block_activations(profile, sorted(members))
        if len(acts) < 2:
            continue
        inner = [b.inner_bytes for b in acts.values()]
        saving = sum(inner) - max(inner)
        if saving > best_saving:
            best, best_saving = list(acts), saving
    return best


def checkpointed(profile: Profile, blocks: Iterable[str]) -> Profile:
    """The run with ``blocks`` checkpointed (non-reentrant): each keeps only its output for
    backward; its other saved tensors are made again when backward reaches it (just before the
    first of them was freed in the run) and freed as they were. Their short-lived forward
    copies (made and dropped as the block runs) are not counted."""
    acts = block_activations(profile, blocks)
    columns = _columns(profile)
    a = profile.allocations
    for info in acts.values():
        if info.recompute_seq < 0 or not info.inner:
            continue
        rows = np.asarray(info.inner, dtype=np.int64)
        columns["alloc_seq"][rows] = info.recompute_seq - 1
        first_free = np.flatnonzero(a.free_seq == info.recompute_seq)
        columns["alloc_ns"][rows] = a.free_ns[first_free[0]] if len(first_free) else 0
    return _with(profile, columns)


def recompute_share(profile: Profile, blocks: Iterable[str]) -> float:
    """The share of the run's saved tensors (bytes) that ``blocks`` give up: a stand-in for
    the share of the forward pass that checkpointing them runs again."""
    a = profile.allocations
    made = (a.category == _ACTIVATION) & (a.alloc_seq >= 0)
    total = int(a.size[made].sum())
    inner = sum(b.inner_bytes + b.output_bytes for b in block_activations(profile, blocks).values())
    return min(1.0, inner / total) if total else 0.0


# -- a smaller micro-batch, gradients accumulated ----------------------------------------------


def batch_rows(profile: Profile) -> BoolArray:
    """Rows whose size follows the batch: activations, temporaries and inputs the run made
    outside the optimizer step. Tensors from before the run (the batch a notebook variable
    holds) stay, and the optimizer's temporaries are parameter-sized."""
    a = profile.allocations
    kinds = np.isin(a.category, [_ACTIVATION, _TEMPORARY, _INPUT])
    rows: BoolArray = kinds & (a.alloc_seq >= 0) & (a.phase != _OPTIMIZER)
    return rows


def micro_batch(profile: Profile, parts: int, *, accumulate: bool = True) -> Profile:
    """The run on ``1 / parts`` of its batch: each row of :func:`batch_rows` shrinks by that
    factor (memory linear in the batch). ``accumulate``: a micro-batch of a gradient
    accumulation loop after the first, so the earlier micro-batches' gradients are held from
    its start (the run's gradient rows exist before it)."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, not {parts}")
    columns = _columns(profile)
    rows = batch_rows(profile)
    columns["size"][rows] = -(-columns["size"][rows] // parts)
    if accumulate:
        a = profile.allocations
        grads = (a.category == _GRADIENT) & (a.alloc_seq >= 0)
        columns["alloc_seq"][grads] = -1
        columns["alloc_ns"][grads] = 0
    return _with(profile, columns)


# -- mixed precision -----------------------------------------------------------------------------


def autocast(profile: Profile) -> Profile:
    """The run under 16-bit autocast. Forward: outputs autocast makes in 16 bits take half
    the bytes (see :func:`_sixteen_bit_forward`: matmul and conv outputs and the pointwise ops
    that follow them; float32 ops such as norms, softmax and losses, and what follows them,
    stay). Backward: every temporary and activation but those of float32 ops' backward
    (``_log_softmax_backward_data``, ``nll_loss_backward``) is halved (oneDNN's bf16
    convolution backward on the CPU takes a larger scratch buffer than its float32 one, not
    modelled: 5x on a small conv net, a few % of its peak). Casts are added: the 16-bit
    copies of the weights a module's matmuls use (autocast caches them for backward: half its
    parameters, from its first forward allocation to the end of backward) and of a float32
    input going into a matmul (:func:`_input_casts`). The profile has no
    dtypes: casts a model makes in its own code (``logits.float()``) are not counted."""
    a = profile.allocations
    low = np.array([not _float32_op(name) for name in profile.ops], dtype=bool)
    kinds = np.isin(a.category, [_ACTIVATION, _TEMPORARY])
    rows = kinds & low[a.op] & (a.alloc_seq >= 0) & (a.phase == _BACKWARD)
    sixteen, casts = _sixteen_bit_forward(profile)
    rows |= sixteen
    columns = _columns(profile)
    columns["size"][rows] = -(-columns["size"][rows] // 2)
    return with_rows(_with(profile, columns), _weight_casts(profile) + casts)


def _sixteen_bit_forward(profile: Profile) -> tuple[BoolArray, list[dict[str, int]]]:
    """Forward rows autocast makes in 16 bits, in the order they were made: a matmul's output
    is 16-bit, a float32 op's is not, and any other op's output takes the dtype of the output
    made just before it (elementwise ops follow their input: a GELU after a matmul is 16-bit,
    the ops of a norm that upcasts in its own code stay float32). With them, the casts of
    float32 inputs into matmuls (:func:`_input_casts`; not seen: a second matmul on the same
    input, such as a key projection after the query's, which reads as a matmul on the query's
    16-bit output)."""
    a = profile.allocations
    kinds = np.isin(a.category, [_ACTIVATION, _TEMPORARY])
    forward = np.flatnonzero(kinds & (a.alloc_seq >= 0) & (a.phase == _FORWARD))
    forward = forward[np.argsort(a.alloc_seq[forward], kind="stable")]
    out = np.zeros(len(a), dtype=bool)
    matmul = np.array([name in MATMUL_OPS for name in profile.ops], dtype=bool)
    wide = np.array(
        [_float32_op(name) and name not in FOLLOW_INPUT for name in profile.ops], dtype=bool
    )
    sixteen = False  # the run's inputs are float32
    cast_into: list[tuple[int, int]] = []  # (matmul's first row, the float32 input's row)
    previous = call = -1  # the row made just before; the first row of the op call it is in
    for row in forward:
        op = a.op[row]
        if previous < 0 or (op, a.module[row]) != (a.op[previous], a.module[previous]):
            if matmul[op] and not sixteen:  # its input: the last call's output (its first row)
                cast_into.append((int(row), call))
            call = int(row)
        sixteen = bool(matmul[op]) or (sixteen and not wide[op])
        out[row] = sixteen
        previous = int(row)
    return out, _input_casts(profile, cast_into)


def _input_casts(profile: Profile, cast_into: Sequence[tuple[int, int]]) -> list[dict[str, int]]:
    """A matmul whose input is float32 gets a 16-bit copy of it (autocast casts activations
    every time; only weights are cached). The input is taken to be the output made just
    before (the run's largest input for the first matmul), and the copy lives as long as
    the matmul may need it for backward: to the last backward allocation of its module, or
    to the next forward allocation when its module has none (inference)."""
    a = profile.allocations
    backward = (a.phase == _BACKWARD) & (a.alloc_seq >= 0)
    inputs = (a.category == _INPUT) & profile.timeline.device_mask
    largest_input = int(a.size[inputs].max()) if inputs.any() else 0
    rows: list[dict[str, int]] = []
    for row, before in cast_into:
        size = int(a.size[before]) if before >= 0 else largest_input
        module = int(a.module[row])
        made = int(a.alloc_seq[row])
        ends = a.alloc_seq[backward & (a.module == module)]
        free = int(ends.max()) if len(ends) else made + 1
        if size > 0:
            rows.append({"size": -(-size // 2), "alloc_seq": made, "free_seq": max(free, made),
                         "category": _ACTIVATION, "phase": _FORWARD, "module": module})  # fmt: skip
    return rows


def _float32_op(name: str) -> bool:
    """An op autocast keeps in float32, or the backward of one (``<op>_backward...``)."""
    if name in AUTOCAST_FLOAT32_OPS:
        return True
    head, found, _ = name.partition("_backward")
    return bool(found) and head in AUTOCAST_FLOAT32_OPS


def _weight_casts(profile: Profile) -> list[dict[str, int]]:
    a = profile.allocations
    matmul = np.array([name in MATMUL_OPS for name in profile.ops], dtype=bool)
    forward = (a.phase == _FORWARD) & (a.alloc_seq >= 0) & matmul[a.op]
    backward = (a.phase == _BACKWARD) & (a.alloc_seq >= 0)
    end = int(a.alloc_seq[backward].max()) if backward.any() else -1
    params = (a.category == _PARAMETER) & profile.timeline.device_mask
    rows: list[dict[str, int]] = []
    for module in np.unique(a.module[forward]):
        weights = int(a.size[params & (a.module == module)].sum())
        if weights <= 0:
            continue
        first = int(a.alloc_seq[forward & (a.module == module)].min())
        row = {"size": weights // 2, "alloc_seq": first, "free_seq": max(end, first)}
        rows.append({**row, "category": _ACTIVATION, "phase": _FORWARD, "module": int(module)})
    return rows


# -- offload, frozen weights, paged optimizer state ---------------------------------------------


def offloaded(profile: Profile) -> Profile:
    """Saved tensors kept in host memory (``save_on_cpu``): on the device each exists only
    from just before backward frees it (copied back for the node that needs it)."""
    a = profile.allocations
    rows = (a.category == _ACTIVATION) & (a.alloc_seq >= 0) & (a.free_seq >= 0)
    columns = _columns(profile)
    columns["alloc_seq"][rows] = a.free_seq[rows] - 1
    columns["alloc_ns"][rows] = a.free_ns[rows]
    return _with(profile, columns)


def frozen(profile: Profile, trainable_bytes: int = 0) -> Profile:
    """Every parameter frozen: no gradients, optimizer state or optimizer temporaries of
    them. ``trainable_bytes`` (small adapters, e.g. LoRA's) are added back as parameters,
    their gradients from backward on, and two optimizer state tensors each (Adam)."""
    columns = _columns(profile)
    a = profile.allocations
    gone = np.isin(a.category, [_GRADIENT, _STATE]) | (
        (a.category == _TEMPORARY) & (a.phase == _OPTIMIZER)
    )
    columns["size"][gone] = 0
    out = _with(profile, columns)
    if trainable_bytes <= 0:
        return out
    backward = (a.phase == _BACKWARD) & (a.alloc_seq >= 0)
    start = int(a.alloc_seq[backward].min()) if backward.any() else -1
    return with_rows(
        out,
        [
            {"size": trainable_bytes, "alloc_seq": -1, "free_seq": -1, "category": _PARAMETER},
            {"size": 2 * trainable_bytes, "alloc_seq": -1, "free_seq": -1, "category": _STATE},
            {"size": trainable_bytes, "alloc_seq": start, "free_seq": -1,
             "category": _GRADIENT, "phase": _BACKWARD},
        ],
    )  # fmt: skip


def paged_state(profile: Profile) -> Profile:
    """Optimizer state in paged (unified) memory that leaves the device while forward and
    backward need room: counted only from the optimizer step on."""
    a = profile.allocations
    step = (a.phase == _OPTIMIZER) & (a.alloc_seq >= 0)
    if not step.any():
        return profile
    first = int(a.alloc_seq[step].min())
    rows = (a.category == _STATE) & (a.alloc_seq < first)
    columns = _columns(profile)
    columns["alloc_seq"][rows] = first
    return _with(profile, columns)


def optimizer_step_extra(profile: Profile, nbytes: int) -> Profile:
    """``nbytes`` more held for an instant at the optimizer step's highest moment (an
    update's working copies)."""
    t = profile.timeline
    a = profile.allocations
    if nbytes <= 0 or not len(t):
        return profile
    step = a.phase[t.alloc_index] == _OPTIMIZER
    if not step.any():
        return profile
    index = np.flatnonzero(step)
    at = int(index[np.argmax(t.total[index])])
    seq = int(t.seq[at])
    return with_rows(
        profile,
        [{"size": nbytes, "alloc_seq": seq, "free_seq": seq, "category": _TEMPORARY,
          "phase": _OPTIMIZER}],
    )  # fmt: skip


def largest_parameter_bytes(profile: Profile) -> int:
    """The largest parameter's bytes (one allocation per parameter)."""
    a = profile.allocations
    rows = (a.category == _PARAMETER) & profile.timeline.device_mask
    return int(a.size[rows].max()) if rows.any() else 0
