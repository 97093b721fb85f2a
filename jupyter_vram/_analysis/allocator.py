"""Allocator state: allocated vs reserved vs device used, and what explains each gap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .._allocator_rules import is_small
from .._model import Int64Array
from .._units import format_bytes

if TYPE_CHECKING:
    from .._model import Profile

EXCESS_RESERVED_ADVICE_SHARE = 0.2  # share of reserved memory beyond the allocated peak
EXPANDABLE_MIN_RESERVED = 256 * 2**20


@dataclass(frozen=True)
class Gap:
    """Bytes between two levels (e.g. reserved - allocated) and what they are."""

    label: str
    bytes: int
    explanation: str


@dataclass(frozen=True)
class StrandedRequest:
    """A request that made the allocator reserve a new segment although at least as many
    bytes were cached but free: the free bytes were in pieces too small for it (or in the
    other pool). This is the fragmentation that ``expandable_segments`` avoids."""

    seq: int
    size: int  # the request (its block)
    cached_free: int  # reserved minus allocated just before it


@dataclass(frozen=True)
class AllocatorState:
    """Allocated, reserved and device levels, and how much of reserved memory was not in use.

    ``cached_free_share`` is the cached-but-free share of reserved memory *at the allocated
    peak* (reserved then minus the peak, over reserved then): what the caching allocator kept
    aside when memory was tightest. ``excess_reserved`` is how far the reserved peak exceeds the
    allocated peak. Neither is fragmentation by itself; ``stranded`` lists the requests that
    fragmentation made cost a new segment.
    """

    device: str
    has_caching_allocator: bool
    peak_allocated: int
    peak_reserved: int | None
    allocated_at_reserved_peak: int | None
    end_allocated: int
    end_reserved: int | None
    device_used: int | None
    device_total: int | None
    reserved_at_allocated_peak: int | None
    cached_free_share: float | None
    excess_reserved: int | None
    stranded: tuple[StrandedRequest, ...]  # largest first
    gaps: tuple[Gap, ...]
    advice: tuple[str, ...]
    expandable_segments: bool = False
    # device used (NVML) at the end, split into parts that sum to it (see device_parts)
    device_parts: tuple[Gap, ...] = ()

    @property
    def stranded_bytes(self) -> int:
        return sum(r.size for r in self.stranded)


def has_segments(profile: Profile) -> bool:
    return bool(len(profile.segments.seq) or profile.segments.baseline)


def reserved_series(profile: Profile) -> tuple[Int64Array, Int64Array]:
    """(seq, reserved bytes after that segment event), in sequence order."""
    seg = profile.segments
    order = np.argsort(seg.seq, kind="stable")
    return seg.seq[order], seg.baseline + np.cumsum(seg.delta[order], dtype=np.int64)


def reserved_peak(profile: Profile) -> int:
    _, reserved = reserved_series(profile)
    return int(max(profile.segments.baseline, int(reserved.max(initial=0))))


def reserved_at(profile: Profile, seqs: npt.ArrayLike) -> Int64Array:
    """Reserved bytes right after each event in ``seqs`` (-1: before the run), in one pass."""
    seg_seqs, reserved = reserved_series(profile)
    at = np.searchsorted(seg_seqs, np.asarray(seqs, np.int64), side="right") - 1
    with_baseline = np.concatenate([[profile.segments.baseline], reserved]).astype(np.int64)
    return with_baseline[at + 1]


def stranded_requests(profile: Profile) -> list[StrandedRequest]:
    """Large requests that got a new segment while at least their size was cached but free.

    A segment event at seq ``s`` is made for the first allocation at or after ``s``; the free
    cached bytes are reserved minus allocated just before that allocation. Largest first.
    """
    t = profile.timeline
    seg = profile.segments
    order = np.argsort(seg.seq, kind="stable")
    seg_seq, delta = seg.seq[order], seg.delta[order]
    reserved_after = seg.baseline + np.cumsum(delta, dtype=np.int64)
    reserved_before = reserved_after - delta
    allocs = np.flatnonzero(t.delta > 0)
    grows = np.flatnonzero(delta > 0)
    requests = np.searchsorted(t.seq[allocs], seg_seq[grows], side="left")
    out = []
    for k, j in zip(grows.tolist(), requests.tolist(), strict=True):
        if j >= len(allocs):
            continue
        event = int(allocs[j])
        size = int(t.delta[event])
        if is_small(size):  # small-pool requests share 2 MiB segments
            continue
        free = int(reserved_before[k]) - t.total_at(event - 1)
        if free >= size:
            out.append(StrandedRequest(int(t.seq[event]), size, free))
    out.sort(key=lambda r: -r.size)
    return out


def capture_words(profile: Profile) -> tuple[str, str, str]:
    """(who recorded, what one allocation is, what it leaves out) for a profile without a
    caching allocator. The CPU allocator's own reports include the buffers an op makes and
    frees inside itself; the dispatch tracker (used while the user's own profiler runs) and
    a fake-tensor estimate see only the storages ops return."""
    if profile.source == "dispatch":
        return (
            "the tensor tracker",
            "tensor storages ops returned",
            "Kernel workspaces (cuBLAS, cuDNN) and buffers an op makes and frees inside itself "
            "are not seen by the tracker.",
        )
    if profile.source == "estimate":
        return (
            "the estimate's fake-tensor run",
            "tensor storages the simulated step made",
            "Buffers a real op makes and frees inside itself are in it only where the "
            "estimator models them.",
        )
    return (
        "the CPU allocator",
        "allocations the allocator reported, buffers made inside ops included",
        "The requests are the CPU allocator's own, buffers an op makes and frees inside "
        "itself included; the workspaces CUDA libraries keep (cuBLAS, cuDNN) have no CPU "
        "counterpart and are not in them.",
    )


def allocator_state(profile: Profile) -> AllocatorState:
    """Reconcile the levels the user sees in different tools, and explain the differences."""
    t = profile.timeline
    info = profile.device_info
    used = info.get("device_used")
    total = info.get("total")
    end_allocated = t.total_at(len(t) - 1)
    if not has_segments(profile):
        return _without_allocator(profile, end_allocated, used, total)
    seqs, reserved = reserved_series(profile)
    peak_reserved = reserved_peak(profile)
    if len(reserved) and int(reserved.max()) >= profile.segments.baseline:
        at = int(seqs[int(np.argmax(reserved))])
    else:
        at = -1
    allocated_then = t.total_at(t.index_at_seq(at))
    cached = max(0, peak_reserved - allocated_then)
    end_reserved = int(reserved[-1]) if len(reserved) else profile.segments.baseline
    peak = profile.peak_bytes
    reserved_then = int(reserved_at(profile, [t.seq_at(t.peak_index)])[0])
    cached_at_peak = max(0, reserved_then - peak)
    share = cached_at_peak / reserved_then if reserved_then else 0.0
    excess = max(0, peak_reserved - peak)
    stranded = tuple(stranded_requests(profile))
    expandable = bool(profile.meta.get("expandable_segments"))
    gaps = _reserved_gaps(cached, used, end_reserved)
    advice = _fragmentation_advice(stranded, expandable, peak_reserved, excess)
    if total and used is not None and int(used) > 0.9 * int(total):
        advice.append("The device is more than 90% full: the next larger batch will likely OOM.")
    advice += _category_advice(profile)
    return AllocatorState(
        profile.device, True, peak, peak_reserved, allocated_then, end_allocated,
        end_reserved, used, total, reserved_then, share, excess, stranded, tuple(gaps),
        tuple(advice), expandable, tuple(device_parts(profile)),
    )  # fmt: skip


def _without_allocator(
    profile: Profile, end_allocated: int, used: int | None, total: int | None
) -> AllocatorState:
    """A device with no caching allocator (the CPU): allocated is all there is."""
    gap = Gap(
        "no caching allocator",
        0,
        f"Allocated is what was recorded ({capture_words(profile)[1]}) while live; "
        "there is no reserved pool on this device, so it is what the process holds "
        "for tensors.",
    )
    return AllocatorState(
        profile.device, False, profile.peak_bytes, None, None, end_allocated, None,
        used, total, None, None, None, (), (gap,), tuple(_category_advice(profile)),
    )  # fmt: skip


def _reserved_gaps(cached: int, used: int | None, end_reserved: int) -> list[Gap]:
    """What lies between allocated and reserved, and between reserved and the device's use."""
    gaps = [
        Gap(
            "cached free blocks",
            cached,
            "Reserved minus allocated when reserved peaked: blocks the caching allocator keeps "
            "after tensors are freed, for reuse. torch.cuda.empty_cache() hands them back, but "
            "the next step reserves them again.",
        )
    ]
    if used is not None:
        gaps.append(
            Gap(
                "CUDA context and others",
                max(0, int(used) - end_reserved),
                "Device used (nvidia-smi) minus reserved at the end: the CUDA context and "
                "kernels (hundreds of MiB), libraries that allocate outside PyTorch's "
                "allocator (NCCL buffers, cuDNN / cuFFT plans) and other processes on this "
                "GPU (cuBLAS workspaces are in reserved).",
            )
        )
    return gaps


def _fragmentation_advice(
    stranded: Sequence[StrandedRequest], expandable: bool, peak_reserved: int, excess: int
) -> list[str]:
    """Expandable segments, when reserved memory peaked well above allocated because requests
    found the cached memory in pieces too small."""
    if not (
        stranded
        and not expandable
        and peak_reserved >= EXPANDABLE_MIN_RESERVED
        and excess > EXCESS_RESERVED_ADVICE_SHARE * peak_reserved
    ):
        return []
    big = stranded[0]
    return [
        f"Reserved memory peaked {format_bytes(excess)} ({100 * excess / peak_reserved:.0f}% "
        f"of it) above the allocated peak, and {len(stranded)} request(s) needed a new "
        f"segment while enough was cached but free in smaller pieces (largest: "
        f"{format_bytes(big.size)} with {format_bytes(big.cached_free)} free): set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (before CUDA initialises) so "
        "segments can grow instead of fragmenting."
    ]


def _end_workspaces(profile: Profile) -> int:
    """Bytes of the cuBLAS / cuBLASLt workspaces the recording named that are alive at its end
    (they always are: PyTorch keeps them)."""
    made = profile.meta.get("blas_workspaces")
    if not isinstance(made, list):
        return 0
    return sum(int(w.get("bytes", 0)) for w in made if isinstance(w, dict))


def device_parts(profile: Profile) -> list[Gap]:
    """Device used (NVML, the whole GPU) at the end of the run, split into what it is, the
    parts summing to it: PyTorch's tensors (BLAS workspaces apart, where the run made them),
    blocks its caching allocator keeps free, this process's memory outside the allocator, and
    other processes. Without NVML's per-process figure the last two are one part. Empty
    without device used or the allocator's end counters."""
    info = profile.device_info
    used, reserved, allocated = (info.get(k) for k in ("device_used", "reserved", "allocated"))
    if not all(isinstance(v, int) for v in (used, reserved, allocated)):
        return []
    assert isinstance(used, int) and isinstance(reserved, int) and isinstance(allocated, int)
    workspaces = min(_end_workspaces(profile), allocated)
    held = "memory_allocated(): blocks the caching allocator has handed to tensors"
    parts = [Gap("tensors (allocated)", allocated - workspaces, held)]
    if workspaces:
        parts.append(Gap("cuBLAS / cuBLASLt workspaces", workspaces,
                         "made by this process's first matmuls, kept for its life (in "
                         "memory_allocated, not the cell's)"))  # fmt: skip
    parts.append(Gap("cached free in PyTorch's pool", max(reserved - allocated, 0),
                     "memory_reserved() - memory_allocated(): kept for reuse; "
                     "torch.cuda.empty_cache() hands it back"))  # fmt: skip
    process = info.get("process_used")
    if isinstance(process, int):
        parts.append(Gap("this process outside PyTorch's allocator", max(process - reserved, 0),
                         "NVML's usage of this process - reserved: the CUDA context and loaded "
                         "kernels, and libraries that allocate directly (NCCL buffers, cuDNN / "
                         "cuFFT plans, other frameworks)"))  # fmt: skip
        parts.append(Gap("other processes", max(used - max(process, reserved), 0),
                         "device used - this process's usage: other programs on this GPU "
                         "(nvidia-smi lists them)"))  # fmt: skip
    else:
        parts.append(Gap("outside PyTorch's reserved pool", max(used - reserved, 0),
                         "device used - reserved: this process's CUDA context and libraries "
                         "outside the allocator, and other processes (NVML did not report "
                         "this process's share)"))  # fmt: skip
    return parts


def _category_advice(profile: Profile) -> list[str]:
    peak = profile.peak_bytes
    if not peak:
        return []
    b = profile.peak_breakdown()
    out = []
    if b["activation"] > 0.4 * peak:
        out.append(
            f"Activations are {100 * b['activation'] / peak:.0f}% of the peak: activation "
            "checkpointing or bf16 autocast cut them most."
        )
    if b["optimizer_state"] > 0.3 * peak:
        out.append(
            f"Optimizer state is {100 * b['optimizer_state'] / peak:.0f}% of the peak: a "
            "lower-memory optimizer (SGD, Adafactor, 8-bit Adam) or sharding (FSDP/ZeRO) helps."
        )
    return out
