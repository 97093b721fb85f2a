"""Plain-text rendering of an estimate: the prediction, what it fits, what-ifs, comparison."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .text import format_bytes

if TYPE_CHECKING:
    import pandas as pd

    from ..estimator.api import Comparison, Estimate

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
        f"{'inference' if s.inference else 'training step'} on {s.device}: {s.describe()}",
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
