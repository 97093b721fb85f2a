"""Plain-text rendering of what an estimate computed: its GPU and what-if tables, and its
comparison with a measurement.

The estimate's own summary is the estimator's (``estimate_summary`` in
``_estimator/api.py``: IPython shows it for an :class:`Estimate`), its settings in words
``settings_text`` in ``_estimator/step.py``. This module reads the estimator's real types, so
it sits above the estimator (see the layer table in tests/test_architecture.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._units import format_bytes, format_change, format_column

if TYPE_CHECKING:
    import pandas as pd

    from .._estimator.api import Comparison


def gpu_table_text(table: pd.DataFrame) -> str:
    """The GPU table as aligned text (a generation's longest context, in tokens, where the
    table has it)."""
    contexts = "max_context" in table.columns
    head = f"{'GPU':<16}{'memory':>10}  {'fits':<5}{'headroom':>11}  largest batch"
    lines = [head + ("  longest context" if contexts else "")]
    for _, row in table.iterrows():
        largest = row.get("max_batch_size")
        line = (
            f"{row['gpu']:<16}{row['memory_gib']:>7.1f} GiB  {'yes' if row['fits'] else 'no':<5}"
            f"{row['headroom_gib']:>7.1f} GiB  {'' if largest is None else largest}"
        )
        if contexts:
            line = f"{line:<62}  {int(row['max_context']):,} tokens"
        lines.append(line)
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


def comparison_text(comparison: Comparison) -> str:
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
