"""The estimate's parts of the app: its header, the estimate-vs-measured banner, and the
"Fit & what-ifs" tab (GPU table, largest batch per GPU, what-if table).

Runs that need the estimator process (batch search, what-ifs) start from a button and run in
the button's callback, so the kernel is busy meanwhile; their progress reaches the page as
they go (widget updates are sent at once). Their errors are shown in the tab, never raised.
"""

from __future__ import annotations

import html
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import ipywidgets as w

from .._estimator.api import (
    NOT_MODELLED,
    RUNTIME_OVERHEAD,
    Allowance,
    Estimate,
    RunSummary,
    model_weights,
    modelled,
    what_if_fits,
)
from .._estimator.gpus import GPUS, RUNTIME_HIDDEN_BYTES, Gpu, find_gpu
from .._estimator.search import format_batch, format_context
from .._estimator.step import StepSettings, settings_text
from .._estimator.whatif import variants
from .._model import CATEGORIES, Profile
from .._render.templating import render
from .._units import format_bytes, format_change, format_column, format_count
from .export import CsvLink

if TYPE_CHECKING:
    import pandas as pd

    from .._estimator.api import Comparison

TITLE = "Fit & what-ifs"
BADGE = "Estimate · simulated on fake tensors, no GPU used"
TEMPLATE = "estimate_view.html.j2"
T = TypeVar("T")
#: How the estimator decides a fit (Estimate.fits), in words for the tables.
FITS_RULE = (
    "fits: device used on that card (its cuBLAS workspaces and attention kernel included) "
    f"within its memory less the {format_bytes(RUNTIME_HIDDEN_BYTES)} the driver keeps "
    "(Gpu.usable_bytes); headroom is what is left of that"
)


# -- header ------------------------------------------------------------------------------------


def estimate_settings(profile: Profile) -> StepSettings | None:
    """The settings an estimate profile was simulated with (None if its meta lacks them)."""
    raw = profile.meta.get("estimate", {}).get("settings")
    if not isinstance(raw, dict):
        return None
    try:
        return StepSettings(**raw)
    except TypeError:  # a profile saved by another version
        return None


def estimate_facts(profile: Profile, estimate: Estimate | None = None) -> list[tuple[str, str]]:
    """(label, value) pairs for an estimate's header; every number comes from the profile.

    The GPU fit is the estimator's (:meth:`Estimate.fits`): ``estimate`` when given, else the
    estimate the app being built holds, else one made from the profile alone (which cannot
    simulate again: cards that would run another attention kernel are then left out).
    """
    info = profile.meta.get("estimate", {})
    settings = estimate_settings(profile)
    batch = int(info.get("batch_size", 1))
    facts: list[tuple[str, str]] = []
    if info.get("model"):
        facts.append(("model", str(info["model"])))
    if info.get("parameters"):
        facts.append(("parameters", format_count(int(info["parameters"]))))
    if info.get("input"):
        facts.append(("input", f"{info['input']} (batch {batch})"))
    cuda = settings is None or settings.target_type == "cuda"
    if settings is not None:
        step = "inference" if settings.inference else "training step"
        facts.append(("predicted", f"{step} on {settings.device}"))
        facts.append(("settings", settings_text(settings, model_weights(profile))))
    facts.append(("peak allocated", format_bytes(profile.peak_bytes)))
    t = profile.timeline
    if t.peak_index >= 0:
        facts.append(("peak in", t.peak_phase))
    if cuda and profile.meta.get("allocator_model") is not None:
        run = RunSummary.of(profile, batch)
        facts.append(("predicted reserved", format_bytes(run.reserved_bytes)))
        held = estimate if estimate is not None else _held_estimate(profile)
        alone = _profile_estimate(profile, settings) if held is None else None
        source = held if held is not None else alone
        allowance = source.runtime_overhead if source is not None else RUNTIME_OVERHEAD
        used = format_bytes(run.predicted_device_bytes)
        facts.append(("predicted device used", f"≈ {used} ({allowance_text(allowance)})"))
        if held is not None:
            facts.append(("smallest GPU it fits", smallest_gpu(held, GPUS)))
        elif alone is not None:
            facts.append(("smallest GPU it fits", smallest_gpu(alone, GPUS, simulate=False)))
    return facts


def allowance_text(allowance: Allowance) -> str:
    """What device used adds to reserved memory, marked as a guess while it is one."""
    size = format_bytes(allowance.bytes)
    if allowance.guessed:
        return f"includes a {size} CUDA runtime allowance — a guess, not measured per GPU"
    return f"includes {size} for the CUDA runtime: {allowance.note}"


def smallest_gpu(estimate: Estimate, gpus: Sequence[Gpu], *, simulate: bool = True) -> str:
    """The first of ``gpus`` (ascending by memory) the step fits, in words (the estimator's
    :meth:`Estimate.first_fit`; ``simulate=False``: without another run, and the answer
    names the cards that would need one)."""
    found = estimate.first_fit(gpus, simulate=simulate)
    first = found.gpu or "none listed"
    if found.skipped:
        skipped = ", ".join(found.skipped)
        return f"{first} (not checked: {skipped}, which run another attention kernel)"
    return first


def _held_estimate(profile: Profile) -> Estimate | None:
    """The estimate of ``profile`` that the latest app keeps (the one being built)."""
    from . import holder

    return next(
        (e for e in holder.latest_held() if isinstance(e, Estimate) and e.profile is profile), None
    )


def _profile_estimate(profile: Profile, settings: StepSettings | None) -> Estimate | None:
    """An estimate made from a saved estimate's profile alone (no job: it cannot run again)."""
    return Estimate(profile, settings, b"") if settings is not None else None


def estimate_header_html(profile: Profile, estimate: Estimate | None = None) -> str:
    """The header of an estimate's app: a clear 'this is an estimate', the facts, the caveats."""
    return render(
        TEMPLATE,
        "header",
        badge=BADGE,
        facts=estimate_facts(profile, estimate),
        error=profile.error,
        modelled=modelled(estimate.settings if estimate is not None else None),
        not_modelled=NOT_MODELLED,
    )


def gpu_answer(estimate: Estimate, gpu: str | Gpu, largest: int | None = None,
               context: int | None = None) -> str:  # fmt: skip
    """The answer to ``--gpu``: 'T4: batch 8 fits; largest batch that fits: 78', by
    :meth:`Estimate.fits` and :meth:`Estimate.max_batch_size` (``largest``: its result, when
    the caller already has it); for a generation with a token prompt, also the longest context
    that fits (:meth:`Estimate.max_context`; ``context``: its result, when known)."""
    card = gpu if isinstance(gpu, Gpu) else find_gpu(gpu)
    fits = "fits" if estimate.fits(card) else "does NOT fit"
    try:
        if largest is None:
            largest = estimate.max_batch_size(card)
        if context is None and estimate.settings.generate and estimate.prompt_length:
            context = estimate.max_context(card)
    except Exception as error:  # noqa: BLE001 - the app shows the rest; the answer says why
        return (
            f"{card.name}: batch {estimate.batch_size:,} {fits}; largest batch not found "
            f"({type(error).__name__}: {error})"
        )
    answer = (
        f"{card.name}: batch {estimate.batch_size:,} {fits}; "
        f"largest batch that fits: {format_batch(largest)}"
    )
    if context is not None:
        answer += "; longest context that fits: " + context_text(estimate, context)
    return answer


def context_text(estimate: Estimate, context: int) -> str:
    """A :meth:`Estimate.max_context` result in words (prompt and new tokens, the model's
    position limit when it is the bound)."""
    limit = int(estimate.profile.meta.get("estimate", {}).get("max_positions", 0))
    return format_context(context, estimate.settings.generate, limit)


def gpu_answer_html(answer: str, fits: bool) -> str:
    """The ``--gpu`` answer as the first line of the estimate's app."""
    return render(TEMPLATE, "gpu_answer", answer=answer, fits=fits)


def comparison_html(comparison: Comparison) -> str:
    """Banner 'estimated X vs measured Y: difference +z.z%' and the per-category table."""
    error = comparison.relative_difference
    verdict = (
        "the estimate is high"
        if error > 0.005
        else "the estimate is low"
        if error < -0.005
        else "on the mark"
    )
    rows = [(c, comparison.estimated.get(c, 0), comparison.measured.get(c, 0)) for c in CATEGORIES]
    kept = ""
    if comparison.kept_output:
        from .._render.estimate_text import kept_output_note

        kept = kept_output_note(comparison.kept_output).strip("()")
    return render(
        TEMPLATE,
        "comparison",
        c=comparison,
        verdict=verdict,
        rows=[r for r in rows if r[1] or r[2]],
        kept=kept,
    )


# -- tables ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuRow:
    """One row of the GPU table, its numbers as shown."""

    name: str
    memory: str
    fits: bool
    headroom: str
    largest: str
    chosen: bool
    context: str = ""  # a generation's longest context that fits, where searched


def gpu_table_html(
    frame: pd.DataFrame, gpus: Sequence[Gpu], batch_size: int, chosen: str | None = None
) -> str:
    """The GPU table: memory, fits at this batch, headroom, and the largest batch if searched.
    The row of ``chosen`` (the GPU asked about) is highlighted."""
    approximate = {g.name for g in gpus if g.approximate}
    searched = "max_batch_size" in frame.columns
    contexts = "max_context" in frame.columns
    rows = [
        GpuRow(
            name=str(row["gpu"]),
            memory=f"{row['memory_gib']:.1f} GiB" + (" ≈" if row["gpu"] in approximate else ""),
            fits=bool(row["fits"]),
            headroom=f"{row['headroom_gib']:.2f} GiB",
            largest=format_batch(int(row["max_batch_size"])) if searched else "",
            chosen=str(row["gpu"]) == chosen,
            context=f"{int(row['max_context']):,} tokens" if contexts else "",
        )
        for row in _records(frame)
    ]
    return render(
        TEMPLATE,
        "gpu_table",
        rows=rows,
        batch_size=batch_size,
        searched=searched,
        contexts=contexts,
        rule=FITS_RULE,
        approximate=bool(approximate),
    )


@dataclass(frozen=True)
class WhatIfRow:
    """One row of the what-if table, as shown: ``reason`` why it could not run (else None),
    else its byte columns as (exact, shown) and its change."""

    name: str
    kind: str
    reason: str | None
    bytes: tuple[tuple[str, str], ...] = ()
    trend: str = ""
    change: str = ""
    fits: str = "-"


def what_if_html(
    frame: pd.DataFrame,
    gpu: Gpu | None,
    data_parallel: int,
    fits: Sequence[bool | None] | None = None,
) -> str:
    """The what-if table: each byte column in one unit that keeps its rows apart, change as a
    signed % (a factor from ten times on), fits on ``gpu``.

    ``fits``: one answer per row for ``gpu`` (see :func:`what_if_fits`; None: "-").
    """
    records = _records(frame)
    keys = ("peak_bytes", "reserved_bytes", "predicted_device_bytes")
    shown = _byte_columns(records, keys)
    rows = []
    for i, row in enumerate(records):
        name, kind, note = str(row["what_if"]), str(row["kind"]), row.get("note")
        if note or row["predicted_device_bytes"] != row["predicted_device_bytes"]:  # NaN
            rows.append(WhatIfRow(name, kind, reason=str(note or "no result")))
            continue
        change = float(row["change"])
        fit = fits[i] if fits is not None and i < len(fits) else None
        rows.append(
            WhatIfRow(
                name,
                kind,
                reason=None,
                bytes=tuple((format_bytes(int(row[k])), shown[k][i]) for k in keys),
                trend="jv-up" if change > 0.0005 else "jv-down" if change < -0.0005 else "",
                change=format_change(1.0, 1.0 + change, space=""),
                fits="-" if fit is None else "yes" if fit else "no",
            )
        )
    return render(
        TEMPLATE,
        "what_ifs",
        rows=rows,
        gpu=gpu.name if gpu is not None else None,
        data_parallel=data_parallel,
    )


def _byte_columns(records: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, dict[int, str]]:
    """Each byte column of the rows that ran, in one unit that keeps different rows apart
    (see :func:`format_column`): key -> row index -> text."""
    ran = [
        i for i, r in enumerate(records)
        if not r.get("note") and r["predicted_device_bytes"] == r["predicted_device_bytes"]
    ]  # fmt: skip
    return {
        key: dict(zip(ran, format_column([int(records[i][key]) for i in ran]), strict=True))
        for key in keys
    }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]


# -- the tab -----------------------------------------------------------------------------------


class RunProgress(w.HBox):  # type: ignore[misc]
    """A bar and a line of text, fed by an estimate's ``progress`` callback."""

    def __init__(self, css: str) -> None:
        self.bar = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="180px"))
        self.status = w.HTML()
        self.bar.add_class(f"{css}-progress")
        self.status.add_class(f"{css}-status")
        self._step = ""
        self._started = 0.0
        super().__init__([self.bar, self.status], layout=w.Layout(visibility="hidden"))

    def start(self, steps: int, text: str) -> None:
        self.bar.max = max(steps, 1)
        self.bar.value = 0
        self.bar.bar_style = "info"
        self.status.value = html.escape(text)
        self._step = ""
        self._started = time.perf_counter()
        self.layout.visibility = "visible"

    def report(self, message: str, *, step: bool) -> None:
        """One progress message; ``step`` messages start the next of the counted steps."""
        text = message.strip()
        if step:
            if self._step:
                self.bar.value = min(self.bar.value + 1, self.bar.max)
            self._step = text.rstrip(". …")
            self.status.value = html.escape(text)
        else:
            self.status.value = html.escape(f"{self._step}: {text}" if self._step else text)

    def finish(self, text: str, *, failed: bool = False) -> None:
        self.bar.value = self.bar.max if not failed else self.bar.value
        self.bar.bar_style = "danger" if failed else "success"
        seconds = time.perf_counter() - self._started
        self.status.value = html.escape(f"{text} ({seconds:.1f} s)")


class EstimateView(w.VBox):  # type: ignore[misc]
    """Which GPUs the estimated step fits, the largest batch on each, and the what-ifs.

    ``gpus`` restricts the GPU table (names or :class:`Gpu`); default: every GPU in GPUS.
    ``gpu``: the GPU asked about (``%vram_estimate --gpu``): its row is highlighted and the
    what-ifs' "fits on" starts on it (else on the smallest GPU the step fits).
    """

    def __init__(
        self,
        estimate: Estimate,
        *,
        gpus: Iterable[str | Gpu] | None = None,
        data_parallel: int = 8,
        gpu: str | Gpu | None = None,
    ) -> None:
        # weakly, like the app's profile (see .holder): the latest app keeps it alive
        self._estimate = weakref.ref(estimate)
        self.batch_size = estimate.batch_size
        self.gpus = [g if isinstance(g, Gpu) else find_gpu(g) for g in gpus or GPUS]
        self.chosen = gpu if isinstance(gpu, Gpu) or gpu is None else find_gpu(gpu)
        if self.chosen is not None and self.chosen.name not in {g.name for g in self.gpus}:
            self.gpus.append(self.chosen)
        self.fit_frame: pd.DataFrame = estimate.gpu_table(self.gpus, search=False)
        self.what_if_frame: pd.DataFrame | None = None
        self.what_if_fits: list[bool | None] | None = None  # for the chosen GPU
        self._what_if_gpus = 0
        self.message = w.HTML()
        self.message.add_class("jv-estimate-error")
        self._build_fit_section(estimate)
        self._build_what_if_section(estimate, data_parallel)
        super().__init__(
            [
                self.message,
                self.fit_intro,
                w.HBox([self.search_button, self.search_progress]),
                self.fit_table,
                w.HTML("<b>What if</b> the step ran with other settings:"),
                w.HBox([self.data_parallel, self.gpu_choice, self.what_if_button]),
                self.what_if_progress,
                self.what_if_table,
                self.what_if_export,
            ]
        )
        self.add_class("jv-estimate-view")

    def _build_fit_section(self, estimate: Estimate) -> None:
        """What device used is made of, the GPU table and its largest-batch search."""
        allowance = estimate.runtime_overhead
        self.fit_intro = w.HTML(
            render(
                TEMPLATE,
                "fit_intro",
                batch_size=estimate.batch_size,
                used=format_bytes(estimate.predicted_device_bytes),
                cuda=estimate.settings.target_type == "cuda",
                allowance_note=allowance.note,
                allowance=allowance_text(allowance),
            )
        )
        self.fit_table = w.HTML(self._fit_html())
        self.fit_table.add_class("jv-fit-table")
        self.search_button = w.Button(
            description="Find the largest batch per GPU",
            icon="search",
            tooltip="simulate more batch sizes (a few runs per GPU)",
            layout=w.Layout(width="auto"),
        )
        self.search_button.add_class("jv-batch-search")
        self.search_progress = RunProgress("jv-batch")
        self.search_button.on_click(lambda _: self.find_largest_batches())

    def _build_what_if_section(self, estimate: Estimate, data_parallel: int) -> None:
        """The what-ifs' controls (GPUs for data-parallel, the card the fits are for, the
        button) and their table, empty until the button runs them."""
        self.data_parallel = w.BoundedIntText(
            value=data_parallel,
            min=1,
            max=65536,
            description="GPUs for data-parallel",
            style={"description_width": "initial"},
            layout=w.Layout(width="230px"),
        )
        self.data_parallel.add_class("jv-whatif-gpus")
        names = [g.name for g in self.gpus]
        fitting = [g.name for g in self.gpus if estimate.fits(g)]
        if self.chosen is not None:
            first = self.chosen.name
        else:
            first = fitting[0] if fitting else names[-1]
        self.gpu_choice = w.Dropdown(
            options=names,
            value=first,
            description="fits on",
            layout=w.Layout(width="250px"),
        )
        self.gpu_choice.add_class("jv-whatif-gpu")
        self.what_if_button = w.Button(
            description="Compute what-ifs",
            icon="calculator",
            tooltip="simulate other precision, checkpointing, optimizers; sharding by arithmetic",
            layout=w.Layout(width="auto"),
        )
        self.what_if_button.add_class("jv-whatif-run")
        self.what_if_progress = RunProgress("jv-whatif")
        self.what_if_table = w.HTML()
        self.what_if_table.add_class("jv-whatif-table")
        self.what_if_export = CsvLink("what_ifs.csv")
        self.what_if_button.on_click(lambda _: self.compute_what_ifs())
        self.gpu_choice.observe(lambda _: self._show_what_ifs(), "value")
        self.data_parallel.observe(self._on_data_parallel, "value")

    @property
    def estimate(self) -> Estimate | None:
        """The estimate, while something else (the latest app, the user) still holds it."""
        return self._estimate()

    def _live(self) -> Estimate:
        estimate = self.estimate
        if estimate is None:
            raise RuntimeError(
                "this estimate is no longer in memory (a newer one replaced it); run "
                "jv.show(estimate) on one you kept"
            )
        return estimate

    # -- actions (the buttons call these) -------------------------------------------------

    def find_largest_batches(self) -> pd.DataFrame | None:
        """Run the batch search for every GPU of the table; show it with the largest batch."""
        progress = self.search_progress
        progress.start(len(self.gpus), "starting the estimator ...")

        def report(message: str) -> None:
            progress.report(message, step=message.startswith("largest batch"))

        frame = self._run(
            self.search_button,
            progress,
            lambda: self._live().gpu_table(self.gpus, search=True, progress=report),
        )
        if frame is not None:
            self.fit_frame = frame
            self.fit_table.value = self._fit_html()
            progress.finish(f"largest batch found for {len(self.gpus)} GPUs")
        return frame

    def compute_what_ifs(self) -> pd.DataFrame | None:
        """Simulate the what-if variants, add the sharding rows; show the table."""
        progress = self.what_if_progress
        gpus = int(self.data_parallel.value)
        estimate = self.estimate
        steps = len(variants(estimate.settings)) if estimate is not None else 1
        progress.start(steps, "starting the estimator ...")
        frame = self._run(
            self.what_if_button,
            progress,
            lambda: self._live().what_ifs(
                gpus=gpus, progress=lambda m: progress.report(m, step=True)
            ),
        )
        if frame is not None:
            self.what_if_frame = frame
            self._what_if_gpus = gpus
            if self._show_what_ifs():
                progress.finish(f"{len(frame)} what-ifs")
        return frame

    # -- internals ------------------------------------------------------------------------

    def _run(self, button: w.Button, progress: RunProgress, job: Callable[[], T]) -> T | None:
        """Run ``job`` with its button disabled; an error is shown here, not raised."""
        self.message.value = ""
        button.disabled = True
        try:
            return job()
        except Exception as error:  # noqa: BLE001 - shown in the tab, never a kernel traceback
            self.message.value = render(
                TEMPLATE,
                "run_error",
                button=button.description,
                name=type(error).__name__,
                error=error,
            )
            progress.finish("failed", failed=True)
            return None
        finally:
            button.disabled = False

    def _fit_html(self) -> str:
        chosen = self.chosen.name if self.chosen is not None else None
        return gpu_table_html(self.fit_frame, self.gpus, self.batch_size, chosen)

    def _chosen_gpu(self) -> Gpu | None:
        return next((g for g in self.gpus if g.name == self.gpu_choice.value), None)

    def _show_what_ifs(self) -> bool:
        """Show the what-if table with its fits on the chosen GPU (a card that runs another
        attention kernel simulates the variants again); False if that failed."""
        frame = self.what_if_frame
        if frame is None:
            return True
        gpu = self._chosen_gpu()
        fits: list[bool | None] | None = None
        if gpu is not None:
            progress = self.what_if_progress
            progress.status.value = html.escape(f"checking the fits on {gpu.name} ...")
            fits = self._run(
                self.what_if_button, progress, lambda: what_if_fits(self._live(), frame, gpu)
            )
            if fits is None:
                return False
            progress.status.value = html.escape(f"fits on {gpu.name} checked")
        self.what_if_fits = fits
        self.what_if_table.value = what_if_html(frame, gpu, self._what_if_gpus, fits)
        export = frame.copy()
        if gpu is not None and fits is not None:
            export[f"fits on {gpu.name}"] = fits
        self.what_if_export.show(export)
        return True

    def _on_data_parallel(self, change: dict[str, Any]) -> None:
        if self.what_if_frame is not None and change["new"] != self._what_if_gpus:
            self.what_if_progress.status.value = html.escape(
                f"the table is for {self._what_if_gpus} GPUs; compute again for {change['new']}"
            )
