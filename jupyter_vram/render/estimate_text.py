"""Plain-text rendering of an estimate: the prediction, what it fits, what-ifs, comparison."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .text import format_bytes

if TYPE_CHECKING:
    import pandas as pd

    from ..estimator.api import Comparison, Estimate
    from ..estimator.step import StepSettings
    from ..model import Profile

#: Bytes per parameter -> the weights' dtype, for a model estimated in its own dtype.
ITEMSIZE_NAMES = {8: "fp64", 4: "fp32", 2: "16-bit", 1: "8-bit"}
BLOCK = 512  # the CUDA caching allocator rounds requests up to this

#: What the simulation models and what it does not; shown with every estimate.
MODELLED = (
    "modelled: every tensor of a forward, loss, backward and optimizer step (the second step, "
    "so optimizer state exists) at its exact size and lifetime; on CUDA the caching "
    "allocator's 512 B rounding, block splitting and 2/20 MiB segments, Adam's foreach path, "
    "attention through the flash / memory-efficient kernel each GPU runs (no flash before "
    "compute capability 8.0: T4, V100), PyTorch's cuBLAS workspaces (one per matmul thread); "
    "LSTM workspaces (oneDNN's exact, cuDNN's reserve as measured on an H200)"
)
NOT_MODELLED = (
    "not modelled: CUDA kernels' temporary workspaces (cuDNN, flash attention; the cuBLAS "
    "workspaces are modelled), "
    "fragmentation after many steps, other processes, NCCL buffers, torch.compile"
)


def estimate_summary(estimate: Estimate) -> str:
    """The estimate in a few lines: settings, peak, reserved, device used, breakdown, fits."""
    from ..estimator.gpus import GPUS, RUNTIME_HIDDEN_BYTES

    s = estimate.settings
    params = f"{format_count(estimate.parameters)} parameters"
    lines = [
        f"jupyter_vram estimate · {estimate.model_name} ({params}) · input {estimate.input}",
        f"{'inference' if s.inference else 'training step'} on {s.device}: "
        + settings_text(s, model_weights(estimate.profile)),
        f"peak allocated {format_bytes(estimate.peak_bytes)}"
        + (
            f", reserved {format_bytes(estimate.reserved_bytes)}, device used "
            f"{format_bytes(estimate.device_used_bytes)}"
            if s.target_type == "cuda"
            else ""
        ),
    ]
    if s.target_type == "cuda":
        allowance = estimate.runtime_overhead
        lines.append(
            f"  device used = reserved + {format_bytes(allowance.bytes)} runtime allowance "
            f"({'GUESSED: ' if allowance.guessed else ''}{allowance.note})"
        )
    lines.append("at the peak:")
    peak = max(estimate.peak_bytes, 1)
    for name, nbytes in estimate.peak_breakdown().items():
        if nbytes:
            lines.append(f"  {name:<16}{format_bytes(nbytes):>12} {100 * nbytes / peak:5.1f}%")
    if s.target_type == "cuda":
        fits = [g.name for g in GPUS if estimate.fits(g)]
        lines.append(
            "fits at this batch size: "
            + (", ".join(fits) if fits else "none of the GPUs")
            + f" (device used within the card's memory less the "
            f"{format_bytes(RUNTIME_HIDDEN_BYTES)} the driver keeps, also a guess)"
        )
    else:
        lines.append("a CPU estimate: use device='cuda' (--device cuda) for the GPUs it fits")
    lines += [MODELLED, NOT_MODELLED]
    return "\n".join(lines)


def model_weights(profile: Profile) -> str | None:
    """The dtype an estimated model's weights had, from the simulated step itself: the one
    element size that makes the parameters alive before the step as large as they are (each
    rounded up to the CUDA allocator's 512 B blocks on a CUDA target). None if no size or
    more than one does, e.g. a model mixing dtypes."""
    from ..model import CATEGORIES

    count = int(profile.meta.get("estimate", {}).get("parameters", 0))
    t = profile.timeline
    rows = t.live_mask(-1) & (profile.allocations.category == CATEGORIES.index("parameter"))
    nbytes = int(profile.allocations.size[rows].sum())
    if count <= 0 or not nbytes:
        return None
    slack = BLOCK * int(rows.sum())  # at most 511 B of rounding per allocation
    names = [name for size, name in ITEMSIZE_NAMES.items() if 0 <= nbytes - size * count < slack]
    return names[0] if len(names) == 1 else None


def settings_text(settings: StepSettings, weights: str | None = None) -> str:
    """The simulated step's settings in words: 'weights fp32 (the model's), no autocast,
    optimizer adamw'. ``weights``: the model's own dtype (see :func:`model_weights`), used
    when the estimate kept it (no ``dtype`` given)."""
    if settings.dtype:
        parts = [f"weights cast to {settings.dtype}"]
    else:
        parts = [f"weights {weights} (the model's)" if weights else "weights in the model's dtype"]
    parts.append(f"autocast {settings.amp}" if settings.amp else "no autocast")
    if settings.checkpoint:
        parts.append("activation checkpointing")
    parts.append(
        "no optimizer (inference)" if settings.inference else f"optimizer {settings.optimizer}"
    )
    if settings.target_type == "cuda" and not settings.flash_attention:
        parts.append("no flash attention (pre-Ampere GPU)")
    return ", ".join(parts)


def format_count(n: int) -> str:
    """1234 -> '1.2K', 124_439_808 -> '124.4M', 6_738_415_616 -> '6.74B'."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return str(n)


def gpu_table_text(table: pd.DataFrame) -> str:
    """The GPU table as aligned text."""
    lines = [f"{'GPU':<16}{'memory':>10}  {'fits':<5}{'headroom':>11}  largest batch"]
    for _, row in table.iterrows():
        largest = row.get("max_batch_size")
        lines.append(
            f"{row['gpu']:<16}{row['memory_gib']:>7.1f} GiB  {'yes' if row['fits'] else 'no':<5}"
            f"{row['headroom_gib']:>7.1f} GiB  {'' if largest is None else largest}"
        )
    return "\n".join(lines)


def what_if_text(table: pd.DataFrame) -> str:
    """The what-if table as aligned text."""
    lines = [f"{'what if':<46}{'peak':>12}{'device used':>14}{'change':>9}"]
    for _, row in table.iterrows():
        if row.get("note"):
            lines.append(f"{row['what_if']:<46}  n/a: {row['note']}")
            continue
        lines.append(
            f"{row['what_if']:<46}{format_bytes(row['peak_bytes']):>12}"
            f"{format_bytes(row['device_used_bytes']):>14}{100 * row['change']:>+8.1f}%"
        )
    return "\n".join(lines)


def comparison_text(comparison: Comparison) -> str:
    """Estimated vs measured peak, and where they differ."""
    lines = [
        f"estimate {format_bytes(comparison.estimated_bytes)} vs measured "
        f"{format_bytes(comparison.measured_bytes)}: error {100 * comparison.error:+.1f}%"
    ]
    if comparison.unrelated_bytes:
        lines.append(
            f"(left out of the measurement: {format_bytes(comparison.unrelated_bytes)} of "
            "tensors that existed before the cell and are not the model's or its inputs)"
        )
    if not comparison.same_device:
        lines.append(
            f"(estimate for {comparison.estimated_device}, measured on "
            f"{comparison.measured_device}: CUDA block rounding and kernels differ)"
        )
    for name, measured in comparison.measured.items():
        estimated = comparison.estimated.get(name, 0)
        if measured or estimated:
            lines.append(
                f"  {name:<16}{format_bytes(estimated):>12} est {format_bytes(measured):>12} meas"
            )
    return "\n".join(lines)
