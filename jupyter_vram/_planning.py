"""`jv.plan`: the ways to bring a run under a memory budget, ranked by what they cost, each
with a predicted peak, and `option.verify()` to measure one by rerunning the `%%vram` cell.

The predictions come from the run's own rows (analysis.plan / analysis.fitting); a
verification is a plain `jv.rerun` with the option's changes, so the notebook's state is left
as it was. The plan keeps what each verification measured, to show predicted beside measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._analysis.plan import (
    CANNOT_PREDICT,
    NEEDS_OTHER_OPTIMIZER,
    Candidate,
    Prediction,
    frontier,
    largest_block_weights,
    plan_candidates,
)
from ._model import Profile as ProfileData
from ._profile import Profile
from ._rerun import Progress, RerunError
from ._units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

    from ._estimator import Estimate


def parse_budget(budget: int | float | str) -> tuple[int, str]:
    """(bytes, how to say it) from bytes, a size (``"14GiB"``) or a GPU name (``"T4"``: the
    memory the CUDA runtime offers on it); ValueError naming what is accepted."""
    from ._capture.capacity import parse_capacity

    try:
        nbytes = parse_capacity(budget)
        return nbytes, format_bytes(nbytes)
    except ValueError as size_error:
        if not isinstance(budget, str):
            raise ValueError(str(size_error).replace("capacity", "budget")) from None
        from ._estimator.gpus import find_gpu

        try:
            gpu = find_gpu(budget)
        except ValueError:
            raise ValueError(
                f"budget {budget!r} is neither a size (14GiB, 512MiB, bytes) nor a GPU name "
                "(T4, A10G, A100-80GB ...)"
            ) from None
        return gpu.usable_bytes, f"{gpu.name} ({format_bytes(gpu.usable_bytes)} usable)"


@dataclass(frozen=True)
class Option:
    """One way to fit (see :class:`Plan`): ``name``, the ``changes`` it makes, its
    ``predicted_peak_bytes``, whether that ``fits`` the budget, its predicted
    ``time_factor`` (1.0: as fast as the run), its rank ``cost`` and ``why``."""

    name: str
    changes: Mapping[str, Any]
    predicted_peak_bytes: int
    fits: bool
    time_factor: float | None
    cost: float
    why: str
    verifiable: str | None
    notes: tuple[str, ...]
    plan: Plan = field(repr=False, compare=False)

    @classmethod
    def of(cls, candidate: Candidate, plan: Plan) -> Option:
        c = candidate
        return cls(c.name, c.changes, c.predicted_peak_bytes, c.fits, c.time_factor, c.cost,
                   c.why, c.verifiable, c.notes, plan)  # fmt: skip

    @property
    def measured_peak_bytes(self) -> int | None:
        """The peak :meth:`verify` measured (None before it ran). A micro-batch option's is
        the measured micro-batch step with its own gradients held from its start, as every
        micro-batch after the first holds them in an accumulation loop."""
        measured = self.plan.measured.get(self.name)
        if measured is None:
            return None
        if self.changes.get("micro_batch"):
            from ._analysis.fitting import micro_batch

            return micro_batch(measured, 1).peak_bytes
        return measured.peak_bytes

    def verify(self, progress: Progress | None = None) -> Profile:
        """Rerun the `%%vram` cell with this option (:func:`jupyter_vram.rerun`: the notebook's
        state is left as it was) and return its profile; the plan keeps it to show measured
        beside predicted. RerunError when this option cannot be rerun (it says why)."""
        from ._rerun import rerun

        if self.verifiable is not None:
            raise RerunError(f"{self.name}: {self.verifiable}")
        if self.plan.estimate is not None:
            raise RerunError(
                "this plan is of an estimate, which has no cell to rerun: record the step "
                "with %%vram and plan from its profile"
            )
        c = self.changes
        blocks = c.get("checkpoint")
        measured = rerun(
            self.plan.profile,
            amp=c.get("amp"),
            checkpoint=list(blocks) if blocks else None,
            offload=bool(c.get("offload", False)),
            micro_batch=c.get("micro_batch"),
            progress=progress,
        )
        self.plan.measured[self.name] = measured
        return measured


@dataclass(eq=False)
class Plan:
    """What :func:`plan` found: the ``options`` cheapest first (each predicted lower than every
    cheaper one; ``considered`` holds all), ``best`` (the cheapest that fits, None when none
    does), the ``budget_bytes`` and what the plan ``cannot_predict``."""

    profile: ProfileData
    budget_bytes: int
    budget_label: str
    estimate: Estimate | None = None
    options: tuple[Option, ...] = ()
    considered: tuple[Option, ...] = ()
    measured: dict[str, Profile] = field(default_factory=dict)

    @property
    def best(self) -> Option | None:
        return next((o for o in self.options if o.fits), None)

    @property
    def cannot_predict(self) -> tuple[str, ...]:
        notes = {n for o in self.options for n in o.notes}
        return (*CANNOT_PREDICT, *sorted(notes))

    def option(self, name: str) -> Option:
        """The option called ``name`` (KeyError listing the names otherwise)."""
        for option in self.considered:
            if option.name == name:
                return option
        names = ", ".join(o.name for o in self.considered)
        raise KeyError(f"no option {name!r}; options: {names}")

    def summary(self) -> str:
        """One line: what fits and what it costs, or that nothing does and how close it came."""
        peak, budget = self.profile.peak_bytes, self.budget_bytes
        head = f"peak {format_bytes(peak)}, budget {self.budget_label}"
        if peak <= budget:
            return f"{head}: it fits as it is"
        best = self.best
        if best is not None:
            return (
                f"{head}: cheapest that fits: {best.name} (predicted "
                f"{format_bytes(best.predicted_peak_bytes)}, time ~{best.time_factor or 1:.2f}x)"
            )
        low = min(self.options, key=lambda o: o.predicted_peak_bytes, default=None)
        if low is None:
            return f"{head}: nothing predicted to fit"
        return (
            f"{head}: nothing predicted to fit; the lowest is {low.name} at "
            f"{format_bytes(low.predicted_peak_bytes)}"
        )

    def to_dataframe(self) -> pd.DataFrame:
        """One row per option (and per verified option of ``considered``): predicted and
        (once verified) measured peak, the error, fits, time factor, cost, why."""
        import pandas as pd

        rows = []
        shown = [*self.options]
        shown += [o for o in self.considered if o.name in self.measured and o not in shown]
        for o in shown:
            measured = o.measured_peak_bytes
            error = None if measured is None else (o.predicted_peak_bytes - measured) / measured
            rows.append({"option": o.name, "predicted_bytes": o.predicted_peak_bytes,
                         "measured_bytes": measured, "error": error, "fits": o.fits,
                         "time_factor": o.time_factor, "cost": o.cost, "why": o.why,
                         "verify": o.verifiable or "rerun"})  # fmt: skip
        return pd.DataFrame(rows).set_index("option")

    def __repr__(self) -> str:
        lines = [self.summary()]
        for o in self.options[:12]:
            mark = "fits" if o.fits else "over"
            measured = o.measured_peak_bytes
            seen = f", measured {format_bytes(measured)}" if measured is not None else ""
            lines.append(
                f"  {mark}  {o.name}: {format_bytes(o.predicted_peak_bytes)}{seen} "
                f"(cost {o.cost:.2f})"
            )
        lines.append("cannot predict: " + "; ".join(self.cannot_predict))
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def plan(profile_or_estimate: ProfileData | Estimate, budget: int | float | str) -> Plan:
    """The ways to bring the run under ``budget`` (bytes, a size such as ``"14GiB"``, or a GPU
    name: its usable memory), ranked by what they cost. See :class:`Plan` and
    :meth:`Option.verify`."""
    nbytes, label = parse_budget(budget)
    estimate = None if isinstance(profile_or_estimate, ProfileData) else profile_or_estimate
    profile = profile_or_estimate if estimate is None else estimate.profile
    if estimate is not None:  # options are peaks: leave room for what the estimate adds
        extra = max(0, estimate.predicted_device_bytes - estimate.peak_bytes)
        nbytes = max(1, nbytes - extra)
        label += (
            f", less {format_bytes(extra)} the estimate adds to the peak (allocator cache, "
            "CUDA runtime)"
        )
    if not isinstance(profile, ProfileData):
        raise TypeError(f"plan needs a Profile or an Estimate, not {type(profile).__name__}")
    result = Plan(profile, nbytes, label, estimate)
    ranked = plan_candidates(profile, nbytes, _what_ifs(profile))
    result.considered = tuple(Option.of(c, result) for c in ranked)
    shown = {c.name for c in frontier(ranked)}
    result.options = tuple(o for o in result.considered if o.name in shown)
    return result


#: Data-parallel sizes the sharding options are predicted for.
SHARD_GPUS = (2, 4, 8)


def _what_ifs(profile: ProfileData) -> list[Prediction]:
    """8-bit optimizer state and ZeRO / FSDP sharding, from the estimator's what-if
    arithmetic on the run's rows (neither can be rerun in this kernel)."""
    from ._analysis.plan import NUMERICS_8BIT
    from ._estimator.whatif import SHARDINGS, eight_bit_state, sharded_peak
    from ._model import CATEGORY_INDEX

    out: list[Prediction] = []
    if (profile.allocations.category == CATEGORY_INDEX["optimizer_state"]).any():
        why = "Adam's moments quantized blockwise to 8 bits (bitsandbytes AdamW8bit)"
        peak = eight_bit_state(profile).peak_bytes
        changes = {"optimizer": "8bit"}
        out.append(Prediction("8-bit optimizer state", changes, peak, 1.0, why,
                              NEEDS_OTHER_OPTIMIZER, NUMERICS_8BIT))  # fmt: skip
    unit = largest_block_weights(profile)
    for sharding in SHARDINGS[1:]:
        for gpus in SHARD_GPUS:
            why = (
                f"each of {gpus} GPUs keeps 1/{gpus} of the sharded states and runs its own "
                "batch (communication time not predicted)"
            )
            cannot = f"needs {gpus} processes (jv.launch / torchrun): not rerun in this kernel"
            peak = sharded_peak(profile, sharding, gpus, unit)
            out.append(Prediction(f"{sharding.name} over {gpus} GPUs",
                                  {"shard": (sharding.name, gpus)}, peak, 1.1, why, cannot,
                                  charge=gpus))  # fmt: skip
    return out
