"""Plain-text rendering of an estimate: the prediction, what it fits, what-ifs, comparison."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .._units import format_bytes, format_change, format_column

if TYPE_CHECKING:
    import pandas as pd


# What the text reads of an estimate, declared here so that the renderer needs none of the
# estimator's classes: the estimator's StepSettings, Allowance, Estimate and Comparison have
# these members (mypy checks it where they are passed in). All of them are plain data the
# estimator computed (the fits included); the text only formats them.


class SettingsData(Protocol):
    """A simulated step's settings (the estimator's ``StepSettings``)."""

    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str | None: ...
    @property
    def amp(self) -> str | None: ...
    @property
    def checkpoint(self) -> bool: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def inference(self) -> bool: ...
    @property
    def flash_attention(self) -> bool: ...
    @property
    def target_type(self) -> str: ...


class AllowanceData(Protocol):
    """A fixed amount the estimator adds to a prediction (``Allowance``)."""

    @property
    def bytes(self) -> int: ...
    @property
    def guessed(self) -> bool: ...
    @property
    def note(self) -> str: ...


class EstimateData(Protocol):
    """An estimate's numbers (``Estimate``)."""

    @property
    def settings(self) -> SettingsData: ...
    @property
    def model_name(self) -> str: ...
    @property
    def parameters(self) -> int: ...
    @property
    def input(self) -> str: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def peak_bytes(self) -> int: ...
    @property
    def reserved_bytes(self) -> int: ...
    @property
    def predicted_device_bytes(self) -> int: ...
    @property
    def runtime_overhead(self) -> AllowanceData: ...
    @property
    def weights(self) -> str | None: ...
    @property
    def fitting_gpus(self) -> tuple[str, ...]: ...
    @property
    def runtime_hidden_bytes(self) -> int: ...
    def peak_breakdown(self) -> dict[str, int]: ...


class ComparisonData(Protocol):
    """An estimate against a measurement (``Comparison``)."""

    @property
    def estimated_bytes(self) -> int: ...
    @property
    def measured_bytes(self) -> int: ...
    @property
    def estimated(self) -> dict[str, int]: ...
    @property
    def measured(self) -> dict[str, int]: ...
    @property
    def estimated_device(self) -> str: ...
    @property
    def measured_device(self) -> str: ...
    @property
    def unrelated_bytes(self) -> int: ...
    @property
    def kept_output(self) -> int: ...
    @property
    def same_device(self) -> bool: ...
    @property
    def relative_difference(self) -> float: ...


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


def estimate_summary(estimate: EstimateData) -> str:
    """The estimate in a few lines: settings, peak, reserved, device used, breakdown, fits."""
    s = estimate.settings
    params = f"{format_count(estimate.parameters)} parameters"
    lines = [
        f"jupyter_vram estimate · {estimate.model_name} ({params}) · input {estimate.input}",
        f"{'inference' if s.inference else 'training step'} on {s.device}: "
        + settings_text(s, estimate.weights),
        f"peak allocated {format_bytes(estimate.peak_bytes)}"
        + (
            f", reserved {format_bytes(estimate.reserved_bytes)}, device used "
            f"{format_bytes(estimate.predicted_device_bytes)}"
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
        fits = estimate.fitting_gpus
        lines.append(
            "fits at this batch size: "
            + (", ".join(fits) if fits else "none of the GPUs")
            + f" (device used within the card's memory less the "
            f"{format_bytes(estimate.runtime_hidden_bytes)} the driver keeps, also a guess)"
        )
    else:
        lines.append("a CPU estimate: use device='cuda' (--device cuda) for the GPUs it fits")
    lines += [MODELLED, NOT_MODELLED]
    return "\n".join(lines)


def settings_text(settings: SettingsData, weights: str | None = None) -> str:
    """The simulated step's settings in words: 'weights fp32 (the model's), no autocast,
    optimizer adamw'. ``weights``: the model's own dtype (the estimator's ``model_weights``), used
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
    lines = [f"{'what if':<46}{'peak':>14}{'device used':>16}{'change':>10}"]
    rows = [row for _, row in table.iterrows()]
    ran = [i for i, row in enumerate(rows) if not row.get("note")]
    peaks = dict(zip(ran, format_column([int(rows[i]["peak_bytes"]) for i in ran]), strict=True))
    used = [int(rows[i]["predicted_device_bytes"]) for i in ran]
    useds = dict(zip(ran, format_column(used), strict=True))
    for i, row in enumerate(rows):
        if row.get("note"):
            lines.append(f"{row['what_if']:<46}  n/a: {row['note']}")
            continue
        change = format_change(1.0, 1.0 + float(row["change"]), space="")
        lines.append(f"{row['what_if']:<46}{peaks[i]:>14}{useds[i]:>16}{change:>10}")
    return "\n".join(lines)


def comparison_text(comparison: ComparisonData) -> str:
    """Estimated vs measured peak, and where they differ."""
    lines = [
        f"estimate {format_bytes(comparison.estimated_bytes)} vs measured "
        f"{format_bytes(comparison.measured_bytes)}: "
        f"difference {100 * comparison.relative_difference:+.1f}%"
    ]
    if comparison.unrelated_bytes:
        lines.append(
            f"(left out of the measurement: {format_bytes(comparison.unrelated_bytes)} of "
            "tensors that existed before the cell and are not the model's or its inputs)"
        )
    if comparison.kept_output:
        lines.append(kept_output_note(comparison.kept_output))
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


def kept_output_note(nbytes: int) -> str:
    """Why a measurement holds more than the estimate when its cell kept the model's output."""
    return (
        f"(the measured cell kept {format_bytes(nbytes)} of the forward's output alive through "
        "backward, e.g. out = model(...) then out.loss.backward(): the estimate drops the output "
        "once the loss is taken, as the transformers Trainer does; take loss = model(...).loss "
        "or del out before backward to measure the same step)"
    )
