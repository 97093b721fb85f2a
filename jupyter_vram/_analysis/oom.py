"""The OOM post-mortem: what was live when a request failed, and what would have made it fit.

The facts captured with the error (``profile.meta["oom_report"]``: requested bytes, capacity,
the line that asked, allocator state on CUDA) are combined with the profile up to the failure.
Every suggestion's bytes come from the allocations live at that moment:

* checkpointing each block (module paths with an index, ``layers.3``) keeps one activation per
  block (the latest, its output, which the next block saved) and re-holds one block's others
  while it is recomputed in backward: it saves the blocks' other activations minus the largest
  block's;
* autocast (AMP) halves the activations made by ops that follow a low-precision input (matmul,
  conv, elementwise), not those autocast keeps in float32 (norms, softmax, losses, reductions);
* offloading saved tensors to the host (``save_on_cpu``, CUDA only) frees every activation;
* a leaner optimizer saves its share of the optimizer state (Adam keeps two tensors per
  parameter: SGD with momentum one, 8-bit Adam a quarter of the bytes, Adafactor almost none);
* expandable segments (CUDA) let the request use memory reserved but free in partly used
  segments;
* a smaller batch: the batch-proportional memory (activations, temporaries, inputs, and the
  failed request when it came from forward or backward) is divided by the batch size into bytes
  per sample, the rest (parameters, gradients, optimizer state, other) is fixed, and the
  largest batch is the most samples the capacity leaves room for beside the fixed memory,
  assuming memory grows linearly with the batch. The batch size is the first dimension shared
  by the notebook's tensors that were the run's inputs (matched to its live input allocations
  by size); when it cannot be told, the suggestion is a fraction of today's batch.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from .._model import CATEGORY_INDEX, PHASES
from .._model.oom import META_KEY, OomReport, Suggestion

if TYPE_CHECKING:
    from .._model import Profile

#: Ops whose output autocast keeps in float32 (and reductions, which often upcast).
FLOAT32_OPS = frozenset(
    {
        "layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "batch_norm",
        "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
        "rms_norm", "_fused_rms_norm", "softmax", "_softmax", "log_softmax", "_log_softmax",
        "cross_entropy", "nll_loss", "nll_loss_forward", "mse_loss", "l1_loss",
        "binary_cross_entropy", "exp", "log", "pow", "sum", "mean", "prod", "cumsum", "norm",
        "linalg_vector_norm", "var_mean", "std", "var",
    }
)  # fmt: skip
ADAM_LIKE = ("adam", "adamw", "nadam", "radam", "adamax")
_INDEX = re.compile(r"^\d+$")


def oom_report(profile: Profile) -> OomReport | None:
    """The post-mortem of a profile whose run ended in ``torch.OutOfMemoryError`` (else None)."""
    facts = profile.meta.get(META_KEY)
    if not isinstance(facts, dict):
        return None
    t = profile.timeline
    a = profile.allocations
    requested = _int(facts.get("requested_bytes"))
    index, asking = _moment(profile, requested, _int(facts.get("refused_seq")))
    mask = t.live_mask(index)
    live = t.total_at(index)
    by_cat = t.breakdown_at(index)
    modules = _top_modules(profile, mask)
    op = facts.get("op") or (profile.ops[int(a.op[asking])] if asking >= 0 else None)
    module = profile.modules[int(a.module[asking])] if asking >= 0 else None
    phase = PHASES[int(a.phase[asking])] if asking >= 0 else None
    if asking < 0 and isinstance(facts.get("refused_module"), str):  # taken out of the rows
        module = facts["refused_module"]
        phase = facts.get("refused_phase") if facts.get("refused_phase") in PHASES else None
    site = facts.get("site")
    site_text = (
        f"{site[0]}:{site[1]} ({site[2]})" if isinstance(site, list) and len(site) == 3 else None
    )
    raw_allocator = facts.get("allocator")
    allocator = (
        {str(k): v for k, v in raw_allocator.items() if _int(v) is not None}
        if isinstance(raw_allocator, dict)
        else None
    )
    capacity = _int(facts.get("capacity_bytes"))
    segment = _int(facts.get("segment_bytes"))
    shortfall, serve = _shortfall(requested, segment, capacity, live, facts, allocator)
    report = OomReport(
        requested_bytes=requested,
        capacity_bytes=capacity,
        live_bytes=live,
        shortfall_bytes=shortfall,
        op=str(op) if op else None,
        module=module or None,
        phase=phase,
        site=site_text,
        source=str(facts.get("source", "")),
        message=str(facts.get("message", "")),
        live_by_category=by_cat,
        top_modules=modules,
        allocator=allocator,
        expandable_would_serve=serve,
        batch_size=_int(facts.get("batch_size")) or infer_batch(profile, facts, mask),
        optimizers=[str(o) for o in facts.get("optimizers") or [] if isinstance(o, str)],
        moment_index=index,
        segment_bytes=segment,
    )
    suggestions = suggest(profile, report, mask)
    return OomReport(**{**report.__dict__, "suggestions": suggestions})


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _moment(
    profile: Profile, requested: int | None, refused_seq: int | None = None
) -> tuple[int, int]:
    """(timeline index just before the failed request, the allocation row that asked or the
    last one made before it; -1 if none).

    CUDA: the allocator history's ``oom`` entry places the failure. A capacity run: the refused
    output was made and dropped; recorded now, its row was taken out of the profile and its
    sequence number kept (``refused_seq``); in older profiles it is the latest allocation of
    exactly the requested size. Otherwise the end of the run.
    """
    t = profile.timeline
    a = profile.allocations
    if refused_seq is not None:
        return t.index_at_seq(refused_seq - 1), -1
    made = (a.alloc_seq >= 0) & t.device_mask
    ooms = profile.meta.get("oom")
    last_oom = ooms[-1] if isinstance(ooms, list) and ooms else None
    seq_of = _int(last_oom.get("seq")) if isinstance(last_oom, dict) else None
    if seq_of is not None:
        seq = seq_of
        before = made & (a.alloc_seq < seq)
        row = int(np.argmax(np.where(before, a.alloc_seq, -1))) if before.any() else -1
        return t.index_at_seq(seq), row
    if requested is not None:
        same = made & (a.size == requested)
        if same.any():
            row = int(np.argmax(np.where(same, a.alloc_seq, -1)))
            return t.index_at_seq(int(a.alloc_seq[row]) - 1), row
    last = int(np.argmax(np.where(made, a.alloc_seq, -1))) if made.any() else -1
    return len(t) - 1, last


def _top_modules(profile: Profile, mask: Any, limit: int = 8) -> list[tuple[str, int]]:
    from .groups import group

    return [(g.label, g.bytes) for g in group(profile, mask, "module", limit=limit) if g.bytes]


def _shortfall(
    requested: int | None,
    segment: int | None,
    capacity: int | None,
    live: int,
    facts: dict[str, Any],
    allocator: dict[str, int] | None,
) -> tuple[int | None, bool | None]:
    """Bytes missing, and (CUDA) whether memory reserved but free, with what the device still
    had, would have covered the request (what expandable segments make usable).

    CUDA: no cached block served the request, so the allocator needed a new segment
    (``segment``) from what the device and the capacity left: the shortfall is the segment
    less that room. Expandable segments grow the existing ones instead: the request itself
    has to fit in the cached free memory plus the room.
    """
    if allocator is not None:
        need = segment if segment is not None else requested
        if need is None:
            return None, None
        reserved, allocated = allocator.get("reserved", 0), allocator.get("allocated", 0)
        free = _int(facts.get("device_free_bytes")) or allocator.get("device_free", 0)
        room = free if capacity is None else max(0, min(free, capacity - reserved))
        cached = max(0, reserved - allocated)
        serve = None if requested is None else cached + room >= requested
        return max(0, need - room), serve
    if requested is None:
        return None, None
    used = _int(facts.get("in_use_bytes"))
    if capacity is None:
        return None, None
    return max(0, (used if used is not None else live) + requested - capacity), None


def block_of(module: str) -> str | None:
    """The repeated block a module belongs to: its path up to the first index
    (``GPT.h.3.attn`` -> ``GPT.h.3``); None outside such blocks."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if _INDEX.match(part):
            return ".".join(parts[: i + 1])
    return None


def suggest(profile: Profile, report: OomReport, mask: Any) -> list[Suggestion]:
    """Suggestions from the allocations live at the failure, most bytes saved first."""
    a = profile.allocations
    cats = report.live_by_category
    act = mask & (a.category == CATEGORY_INDEX["activation"])
    out = _checkpointing(profile, act) + _autocast(profile, act)
    out += _offload(profile, cats["activation"])
    out.extend(_optimizer(profile, cats["optimizer_state"], report.optimizers))
    out += _expandable_segments(report)
    batch = _batch(profile, report)
    if batch is not None:
        out.append(batch)
    short = report.shortfall_bytes
    out = [
        Suggestion(s.action, s.bytes_saved, s.reason, s.toggle, short is not None and
                   s.bytes_saved >= short)
        for s in out
    ]  # fmt: skip
    return sorted(out, key=lambda s: -s.bytes_saved)


def _checkpointing(profile: Profile, act: Any) -> list[Suggestion]:
    """Checkpointing: per block, all activations but its output, minus one block
    recomputed."""
    a = profile.allocations
    internal: dict[str, int] = {}
    latest: dict[str, tuple[int, int]] = {}
    for row in np.flatnonzero(act):
        block = block_of(profile.modules[int(a.module[row])])
        if block is None:
            continue
        size, seq = int(a.size[row]), int(a.alloc_seq[row])
        internal[block] = internal.get(block, 0) + size
        if seq > latest.get(block, (-2, 0))[0]:
            latest[block] = (seq, size)
    inner = {b: internal[b] - latest[b][1] for b in internal}
    saved = sum(inner.values()) - max(inner.values(), default=0)
    if saved <= 0:
        return []
    return [
        Suggestion(
            "activation checkpointing of each block",
            saved,
            f"{len(inner)} blocks hold {_mb(sum(inner.values()))} of activations besides "
            "their outputs; checkpointing keeps only the outputs and recomputes one block "
            f"at a time in backward (the largest: {_mb(max(inner.values()))})",
            toggle="checkpointing",
        )
    ]


def _autocast(profile: Profile, act: Any) -> list[Suggestion]:
    """Autocast: half of the activations made by ops that would run in 16 bits."""
    a = profile.allocations
    ops = np.array([name not in FLOAT32_OPS for name in profile.ops], dtype=bool)
    low = int(a.size[act & ops[a.op]].sum())
    if low // 2 <= 0:
        return []
    return [
        Suggestion(
            "mixed precision (autocast to bf16 / fp16)",
            low // 2,
            f"{_mb(low)} of activations come from matmul / conv / elementwise ops, which "
            "autocast runs in 16 bits (half the bytes, if they are float32 now); norms, "
            "softmax and losses stay float32",
            toggle="AMP",
        )
    ]


def _offload(profile: Profile, activations: int) -> list[Suggestion]:
    """Offloading: every activation live at the failure (CUDA only: the host is the CPU's)."""
    if not (profile.device.startswith("cuda") and activations > 0):
        return []
    return [
        Suggestion(
            "offload saved activations to the host (save_on_cpu)",
            activations,
            f"{_mb(activations)} of activations wait for backward on the device; "
            "torch.autograd.graph.save_on_cpu keeps them in pinned host memory instead "
            "(slower: each one crosses PCIe twice)",
            toggle="offload",
        )
    ]


def _expandable_segments(report: OomReport) -> list[Suggestion]:
    """Expandable segments: what was reserved but free when the request failed."""
    if report.allocator is None:
        return []
    cached = max(0, report.allocator.get("reserved", 0) - report.allocator.get("allocated", 0))
    if cached <= 0:
        return []
    verdict = (
        "that would have served this request"
        if report.expandable_would_serve
        else "not enough for this request on its own"
    )
    return [
        Suggestion(
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set before CUDA starts)",
            cached,
            f"{_mb(cached)} was reserved but free in partly used segments, "
            f"{verdict}: expandable segments grow one mapping instead of cutting "
            "new segments, so freed memory is not stranded",
        )
    ]


def _optimizer(profile: Profile, state: int, held: list[str]) -> list[Suggestion]:
    """Leaner optimizers, from the optimizer state live at the failure."""
    if state <= 0:
        return []
    names = [m[: -len(".step")] for m in profile.modules if m.endswith(".step")] + held
    name = names[0] if names else ""
    if name.lower() in ADAM_LIKE:
        why = f"{name} keeps two tensors per parameter ({_mb(state)} live)"
        return [
            Suggestion("Adafactor", state, why + "; Adafactor keeps no first moment and "
                       "factors the second into a row and a column per matrix: almost none"),
            Suggestion("8-bit AdamW (bitsandbytes)", state * 3 // 4,
                       why + "; 8-bit AdamW stores both in one byte per value instead of four"),
            Suggestion("SGD with momentum", state // 2, why + "; SGD with momentum keeps one"),
        ]  # fmt: skip
    if name.lower() == "sgd":
        return [
            Suggestion("SGD without momentum", state,
                       f"the momentum buffers take {_mb(state)}; plain SGD keeps none"),
        ]  # fmt: skip
    label = name or "the optimizer"
    return [
        Suggestion("an optimizer with less state (SGD, Adafactor, 8-bit)", state // 2,
                   f"{label} holds {_mb(state)} of state; leaner optimizers keep half or less"),
    ]  # fmt: skip


def infer_batch(profile: Profile, facts: dict[str, Any], mask: Any) -> int | None:
    """The batch size: the first dimension shared by every notebook tensor (``leading_dims``,
    noted at the failure) whose storage is the size of an input allocation live then; None
    when there is none, or they disagree."""
    dims = facts.get("leading_dims")
    if not isinstance(dims, list):
        return None
    a = profile.allocations
    live = mask & (a.category == CATEGORY_INDEX["input"])
    sizes = {int(n) for n in a.size[live]}
    cuda = profile.device.startswith("cuda")
    found: set[int] = set()
    for item in dims:
        if not (isinstance(item, list) and len(item) == 2):
            continue
        nbytes, first = _int(item[0]), _int(item[1])
        if nbytes is None or first is None or nbytes <= 0 or first <= 0:
            continue
        if cuda:  # an allocator block: the request rounded up to 512 bytes (plus a remainder)
            low = -(-nbytes // 512) * 512
            if any(low <= size <= low + (1 << 20) for size in sizes):
                found.add(first)
        elif nbytes in sizes:
            found.add(first)
    return found.pop() if len(found) == 1 else None


def _batch(profile: Profile, report: OomReport) -> Suggestion | None:
    """The largest batch that fits: fixed memory plus bytes per sample times the batch, up to
    the capacity (linear in the batch), as an integer batch size when the batch is known."""
    capacity, requested = report.capacity_bytes, report.requested_bytes
    if capacity is None or requested is None or report.shortfall_bytes in (None, 0):
        return None
    cats = report.live_by_category
    scaled = cats["activation"] + cats["temporary"] + cats["input"]
    with_request = report.phase in ("forward", "backward")
    if with_request:
        scaled += requested
    fixed = report.live_bytes + requested - scaled
    room = capacity - fixed
    if scaled <= 0 or room >= scaled:
        return None
    if room <= 0:
        return None  # the fixed memory alone does not fit: no batch size helps
    scales = (
        f"{_mb(scaled)} scales with the batch (activations, temporaries, inputs"
        f"{', the request' if with_request else ''}); {_mb(fixed)} does not (parameters, "
        "gradients, optimizer state, other)"
    )
    caveat = (
        "; counted at the failure: later parts of the step (the rest of forward, backward) "
        "were not reached and may need more"
    )
    now = report.batch_size
    if now:
        largest = room * now // scaled  # the most samples whose bytes fit in the room
        if largest <= 0:
            return None
        saved = scaled - largest * scaled // now
        return Suggestion(
            f"a smaller batch: batch size {largest} (now {now})",
            saved,
            f"{scales}: {_mb(scaled // now)} per sample at batch {now}; the capacity leaves "
            f"{_mb(room)} beside the fixed memory, room for {largest} samples, assuming "
            f"memory grows linearly with the batch{caveat}",
        )
    fraction = room / scaled
    return Suggestion(
        f"a smaller batch: {fraction:.0%} of it",
        int(scaled - room),
        f"{scales}; the capacity leaves {_mb(room)} for the batch, assuming memory grows "
        f"linearly with it (the batch size could not be told from the run's inputs){caveat}",
    )


def _mb(n: int) -> str:
    from .._units import format_bytes

    return format_bytes(n)
