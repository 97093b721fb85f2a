"""`jv.estimate()`: a full training step's memory, predicted without a GPU.

The step runs on fake tensors in a separate process (see :mod:`.worker`) under the same
recorder as ``%%vram``, so an estimate *is* a profile: same categories, flame graph and
timeline. For a CUDA target the run's requests go through a model of the caching allocator
(:mod:`.cuda_model`), which predicts ``max_memory_allocated`` and ``max_memory_reserved``;
device used adds a fixed allowance for the CUDA context and library workspaces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from torch import nn

from .. import _profile
from .._model import CATEGORIES, CATEGORY_INDEX, PHASES, Allocations, Profile
from .._units import format_bytes, format_count
from .adapters import Adapters, table_adapters, with_adapters
from .gpus import GPUS, RUNTIME_HIDDEN_BYTES, Gpu, find_gpu
from .runner import DEFAULT_TIMEOUT_S, EstimateError, EstimatorProcess, pack_job
from .search import MAX_BATCH, MAX_CONTEXT, largest_fitting
from .step import StepSettings, settings_text
from .whatif import SHARDINGS, check_gpus, sharded_peak, variants

if TYPE_CHECKING:
    import pandas as pd

#: The CUDA context, cuDNN's own workspaces and what the driver keeps back, on top of the
#: allocator's reserved memory. Not simulated: a guess (measured totals vary from about 0.5
#: to 1.5 GiB with the card, driver and libraries loaded). The cuBLAS / cuBLASLt workspaces
#: are not in it: PyTorch allocates them through the caching allocator, so the simulation
#: counts them in reserved (counting them here too would count them twice).
RUNTIME_OVERHEAD_BYTES = 1 << 30


@dataclass(frozen=True)
class Allowance:
    """A fixed amount added to a prediction that the simulation does not compute."""

    bytes: int
    guessed: bool
    note: str


#: What "device used" adds to the predicted reserved memory (``Estimate.runtime_overhead``).
RUNTIME_OVERHEAD = Allowance(
    RUNTIME_OVERHEAD_BYTES,
    guessed=True,
    note=(
        "a guess, not simulated: the CUDA context, cuDNN workspaces and what the driver "
        "keeps usually take 0.5 to 1.5 GiB (cuBLAS workspaces are simulated, in reserved)"
    ),
)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RunSummary:
    """The numbers of one simulated step that fit checks need."""

    batch_size: int
    peak_bytes: int  # allocated (CUDA: in allocator blocks, as max_memory_allocated counts)
    reserved_bytes: int  # CUDA: predicted max_memory_reserved; CPU: same as peak
    predicted_device_bytes: int  # CUDA: reserved + runtime overhead

    @classmethod
    def of(cls, profile: Profile, batch_size: int) -> RunSummary:
        model = profile.meta.get("allocator_model")
        if model is None:
            return cls(batch_size, profile.peak_bytes, profile.peak_bytes, profile.peak_bytes)
        reserved = int(model["peak_reserved"])
        return cls(batch_size, profile.peak_bytes, reserved, reserved + RUNTIME_OVERHEAD_BYTES)


class Estimate:
    """A predicted training step: its profile, peak, and what it fits on.

    Methods that need more runs (``max_batch_size``, ``gpu_table``, ``what_ifs``) start the
    estimator process again; results are cached per settings and batch size.
    """

    def __init__(self, profile: Profile, settings: StepSettings, payload: bytes, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:  # fmt: skip
        self.profile = _profile.Profile.of(profile)  # as users hold it: jv.Profile
        self.settings = settings
        self._payload = payload  # the packed job: shapes and code, never the user's tensors
        self._timeout_s = timeout_s
        info = profile.meta.get("estimate", {})
        self.batch_size: int = int(info.get("batch_size", 1))
        self.model_name: str = str(info.get("model", ""))
        self.parameters: int = int(info.get("parameters", 0))
        self.input: str = str(info.get("input", ""))
        self._summaries: dict[tuple[StepSettings, int], RunSummary] = {
            (settings, self.batch_size): RunSummary.of(profile, self.batch_size)
        }
        self._process: EstimatorProcess | None = None

    # -- the estimate itself --------------------------------------------------------------

    @property
    def peak_bytes(self) -> int:
        """Peak allocated bytes (CUDA: what ``torch.cuda.max_memory_allocated`` would say)."""
        return self.profile.peak_bytes

    def peak_breakdown(self) -> dict[str, int]:
        """Category -> bytes live at the peak; sums to :attr:`peak_bytes`."""
        return self.profile.peak_breakdown()

    @property
    def summary(self) -> RunSummary:
        return self._summaries[(self.settings, self.batch_size)]

    @property
    def reserved_bytes(self) -> int:
        """Predicted ``max_memory_reserved`` (CUDA); the peak itself on CPU."""
        return self.summary.reserved_bytes

    @property
    def predicted_device_bytes(self) -> int:
        """What nvidia-smi would show at the peak: reserved plus the runtime overhead."""
        return self.summary.predicted_device_bytes

    @property
    def runtime_overhead(self) -> Allowance:
        """What device used adds to reserved memory on CUDA (``bytes``; ``guessed`` is True:
        it is not simulated; ``note`` says so in words)."""
        return RUNTIME_OVERHEAD

    def fits(self, gpu: str | Gpu) -> bool:
        """Whether this step, at this batch size, fits ``gpu``: device used (reserved plus the
        runtime allowance) within what the CUDA runtime offers (:attr:`Gpu.usable_bytes`),
        with the attention kernel that card runs."""
        target = _gpu(gpu)
        return target.fits(self.used_on(target))

    @property
    def fitting_gpus(self) -> tuple[str, ...]:
        """The GPUs of :data:`GPUS` this step fits at this batch size (:meth:`fits`); on a
        card that runs another attention kernel that takes another simulated run (cached)."""
        return tuple(g.name for g in GPUS if self.fits(g))

    def first_fit(self, gpus: Sequence[Gpu], *, simulate: bool = True) -> FirstFit:
        """The first of ``gpus`` (ascending by memory) the step fits, by :meth:`fits`.

        ``simulate=False``: only the cards answered without another run (those running the
        same attention kernel as the simulated step); the others are listed as skipped.
        """
        checked = [g for g in gpus if simulate or self.settings_for(g) == self.settings]
        first = next((g.name for g in checked if self.fits(g)), None)
        return FirstFit(first, tuple(g.name for g in gpus if g not in checked))

    @property
    def paged_state_bytes(self) -> int:
        """Optimizer state a bitsandbytes paged optimizer keeps in CUDA managed memory (a
        CUDA target; 0 otherwise): beside the caching allocator, so in no peak, reserved or
        device-used figure; on the GPU while it has room, paged to the host when it runs
        short."""
        return int(self.profile.meta.get("estimate", {}).get("paged_state_bytes", 0))

    @property
    def runtime_hidden_bytes(self) -> int:
        """What a card's driver keeps of its memory, left out of every fit (a guess:
        :data:`~.gpus.RUNTIME_HIDDEN_BYTES`)."""
        return RUNTIME_HIDDEN_BYTES

    @property
    def weights(self) -> str | None:
        """The dtype of the model's weights in the simulated step (:func:`model_weights`)."""
        return model_weights(self.profile)

    def used_on(self, gpu: str | Gpu, batch_size: int | None = None,
                settings: StepSettings | None = None) -> int:  # fmt: skip
        """Device used on ``gpu``: the same as :attr:`predicted_device_bytes` unless the card lacks
        flash attention and the step uses it (then simulated with the memory-efficient
        kernel, as CUDA would run it there)."""
        target = _gpu(gpu)
        settings = self.settings_for(target, settings)
        used = self.run(settings, batch_size or self.batch_size).predicted_device_bytes
        return used + self.cublas_adjustment(target)

    @property
    def cublas_workspace_total(self) -> int:
        """Bytes of the cuBLAS and cuBLASLt workspaces the CUDA estimate holds (op "cuBLAS
        workspace" / "cuBLASLt workspace", category other, alive before the step), 0 on the
        CPU. Made by a process's first matmuls and kept for its life."""
        info = self.profile.meta.get("estimate", {})
        cublas = int(info.get("cublas_workspaces", 0)) * int(info.get("cublas_workspace_bytes", 0))
        lt = int(info.get("cublaslt_workspaces", 0)) * int(info.get("cublaslt_workspace_bytes", 0))
        return cublas + lt

    def cublas_adjustment(self, gpu: Gpu) -> int:
        """Bytes to add on ``gpu`` for its workspace sizes: the simulation takes an unknown
        card's (32 MiB of cuBLAS per thread); which cards get 32 MiB depends on the torch
        version (:mod:`jupyter_vram._blas_workspaces`)."""
        if self.settings.target_type != "cuda":
            return 0
        from .workspaces import estimate_workspaces

        info = self.profile.meta.get("estimate", {})
        on_gpu = estimate_workspaces(self.settings.torch_version, gpu.capability)
        count = int(info.get("cublas_workspaces", 0))
        simulated = int(info.get("cublas_workspace_bytes", on_gpu.cublas_bytes))
        return count * (on_gpu.cublas_bytes - simulated)

    def settings_for(self, gpu: Gpu, settings: StepSettings | None = None) -> StepSettings:
        """``settings`` as run on ``gpu``: without flash attention on a pre-Ampere card."""
        settings = settings or self.settings
        if settings.target_type != "cuda" or gpu.flash_attention or not settings.flash_attention:
            return settings
        if settings == self.settings and not _uses_flash(self.profile):
            return settings  # the same run: no attention went through flash
        return replace(settings, flash_attention=False)

    # -- more runs --------------------------------------------------------------------------

    def run(
        self, settings: StepSettings | None = None, batch_size: int | None = None
    ) -> RunSummary:
        """Simulate again with other settings or batch size (cached)."""
        settings = settings or self.settings
        batch = batch_size or self.batch_size
        key = (settings, batch)
        if key not in self._summaries:
            with self.session() as process:
                profile = process.run(settings, batch)
            self._summaries[key] = RunSummary.of(profile, batch)
        return self._summaries[key]

    def max_batch_size(self, gpu: str | Gpu, *, progress: Progress | None = None,
                       settings: StepSettings | None = None) -> int:  # fmt: skip
        """The largest batch whose step fits ``gpu`` (0: not even batch 1)."""
        return self.max_batch_sizes([gpu], progress=progress, settings=settings)[_gpu(gpu).name]

    def max_batch_sizes(self, gpus: Iterable[str | Gpu] | None = None, *,
                        progress: Progress | None = None,
                        settings: StepSettings | None = None) -> dict[str, int]:  # fmt: skip
        """Largest fitting batch for each GPU, sharing runs between them."""
        return self._largest_fitting_on(
            gpus, settings or self.settings, "batch", lambda on_gpu, batch: (on_gpu, batch),
            start=self.batch_size, progress=progress,
        )  # fmt: skip

    def _largest_fitting_on(
        self, gpus: Iterable[str | Gpu] | None, settings: StepSettings, size: str,
        point: Callable[[StepSettings, int], tuple[StepSettings, int]], *, start: int,
        most: int = MAX_BATCH, progress: Progress | None = None,
    ) -> dict[str, int]:  # fmt: skip
        """For each GPU, the largest ``size`` n in [1, most] whose run fits it (0: none), by
        :func:`.search.largest_fitting`. ``point(settings on that GPU, n)``: the settings and
        batch size of the run at n; runs are cached, so GPUs share them."""
        chosen = [_gpu(g) for g in gpus] if gpus is not None else list(GPUS)
        results: dict[str, int] = {}
        with self.session():
            for gpu in chosen:
                if progress is not None:
                    progress(f"largest {size} for {gpu.name} ...")
                on_gpu = self.settings_for(gpu, settings)
                extra = self.cublas_adjustment(gpu)

                def used(n: int, on_gpu: StepSettings = on_gpu, extra: int = extra) -> int:
                    run_settings, batch = point(on_gpu, n)
                    if progress is not None and (run_settings, batch) not in self._summaries:
                        progress(f"  simulating {size} {n}")
                    return self.run(run_settings, batch).predicted_device_bytes + extra

                limit = gpu.usable_bytes
                fits = largest_fitting(used, limit, start=start, max_batch=most) if most else 0
                results[gpu.name] = fits
        return results

    @property
    def prompt_length(self) -> int:
        """A generation estimate's prompt in tokens (0: not a generation, or a prompt of other
        inputs than token ids)."""
        return int(self.profile.meta.get("estimate", {}).get("prompt_length", 0))

    def max_context(self, gpu: str | Gpu, *, progress: Progress | None = None) -> int:
        """The longest context (prompt + new tokens, in tokens) whose ``generate()`` fits
        ``gpu`` at this batch and number of new tokens: the answer to "how long a context fits
        on a T4?". Searched over the prompt's length with the new tokens as estimated (each
        point a simulated run, as :meth:`max_batch_size` searches batches); at most the
        positions the model's config allows; 0: not even a 1-token prompt fits."""
        return self.max_contexts([gpu], progress=progress)[_gpu(gpu).name]

    def max_contexts(self, gpus: Iterable[str | Gpu] | None = None, *,
                     progress: Progress | None = None) -> dict[str, int]:  # fmt: skip
        """:meth:`max_context` for each GPU, sharing runs between them."""
        settings = self.settings
        new_tokens = settings.generate
        if not new_tokens or not self.prompt_length:
            raise EstimateError(
                "the longest context is searched for a generation estimate whose prompt is "
                "token ids (jv.estimate_generate(model, prompt=length, ...))"
            )
        limit = int(self.profile.meta.get("estimate", {}).get("max_positions", 0))
        given = self.prompt_length

        def point(on_gpu: StepSettings, prompt: int) -> tuple[StepSettings, int]:
            if prompt != given:  # the prompt as given is the estimate's own run
                on_gpu = replace(on_gpu, prompt_length=prompt)
            return on_gpu, self.batch_size

        prompts = self._largest_fitting_on(
            gpus, settings, "prompt", point, start=given,
            most=max(limit - new_tokens, 0) if limit else MAX_CONTEXT, progress=progress,
        )  # fmt: skip
        return {gpu: prompt + new_tokens if prompt else 0 for gpu, prompt in prompts.items()}

    def gpu_table(self, gpus: Iterable[str | Gpu] | None = None, *, search: bool = True,
                  progress: Progress | None = None) -> pd.DataFrame:  # fmt: skip
        """One row per GPU: memory, whether this step fits, headroom, largest batch; for a
        generation from token ids also the longest context that fits (``max_context``, in
        tokens: prompt + new, 0 when none; :meth:`max_context`)."""
        import pandas as pd

        chosen = [_gpu(g) for g in gpus] if gpus is not None else list(GPUS)
        largest = self.max_batch_sizes(chosen, progress=progress) if search else {}
        contexts: dict[str, int] = {}
        if search and self.settings.generate and self.prompt_length:
            contexts = self.max_contexts(chosen, progress=progress)
        rows = []
        for gpu in chosen:
            row: dict[str, Any] = {
                "gpu": gpu.name,
                "memory_gib": round(gpu.memory_gib, 1),
                "fits": self.fits(gpu),
                "headroom_gib": round((gpu.usable_bytes - self.used_on(gpu)) / 2**30, 2),
            }
            if search:
                row["max_batch_size"] = largest[gpu.name]
            if contexts:
                row["max_context"] = contexts[gpu.name]
            rows.append(row)
        return pd.DataFrame(rows)

    def what_ifs(self, *, gpus: int = 8, progress: Progress | None = None) -> pd.DataFrame:
        """The same step under other precision, checkpointing, optimizer and sharding."""
        return what_if_table(self, data_parallel=gpus, progress=progress)

    def matches(self, measured: Profile) -> bool:
        """Whether ``measured`` recorded the step this estimate predicts.

        The estimated model must have *taken part* in the recorded run, not merely be alive:
        its modules (named from its class) made allocations during the run, its parameters
        there weigh what the estimate's do (within 2 %, which absorbs CUDA block rounding), a
        training step produced gradients for them, and the inputs weigh what the estimate's
        do (the estimate's default ``labels`` may be missing: a training loop can pass the ids
        as labels). A different model, a model alive but unused, or a cell that failed before
        the model ran does not match.
        """
        if not self.model_name or measured.source == "estimate":
            return False
        a = measured.allocations
        mine = _module_rows(measured, self.model_name)
        during = a.alloc_seq >= 0
        if not (mine & during).any():
            return False  # the model did nothing in this run
        estimated = self.peak_breakdown()
        params = int(a.size[mine & (a.category == CATEGORY_INDEX["parameter"])].sum())
        expected = estimated["parameter"]
        if expected <= 0 or abs(params - expected) > 0.02 * expected:
            return False
        if not self.settings.inference:
            grads = mine & during & (a.category == CATEGORY_INDEX["gradient"])
            if not grads.any():
                return False
        return self._inputs_match(measured)

    def _inputs_match(self, measured: Profile) -> bool:
        a = measured.allocations
        rows = a.category == CATEGORY_INDEX["input"]
        inputs = int(a.size[rows].sum())
        ours = self.profile.allocations
        our_rows = ours.category == CATEGORY_INDEX["input"]
        expected = int(ours.size[our_rows].sum())
        labels = int(self.profile.meta.get("estimate", {}).get("default_label_bytes", 0))
        slack = 512 * int(our_rows.sum()) + 0.02 * expected  # CUDA block rounding
        return any(abs(inputs - want) <= slack for want in {expected, expected - labels})

    def compare(self, measured: Profile) -> Comparison:
        """This estimate against a measured profile of the same step."""
        return Comparison.of(self, measured)

    # -- process ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def session(self) -> Iterator[EstimatorProcess]:
        """An estimator process for the duration of the outermost call."""
        if self._process is not None:
            yield self._process
            return
        with EstimatorProcess(self._payload, timeout_s=self._timeout_s) as process:
            self._process = process
            try:
                yield process
            finally:
                self._process = None

    # -- display --------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (
            f"<Estimate {self.model_name} batch {self.batch_size} on {self.settings.device}: "
            f"peak {format_bytes(self.peak_bytes)}, reserved {format_bytes(self.reserved_bytes)}>"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(estimate_summary(self))


#: What the simulation models and what it does not; shown with every estimate.
#: what the fake run was, by kind of estimate (see :func:`modelled`)
_RUNS = {
    "train": "a forward, loss, backward and optimizer step (the second step, so optimizer "
    "state exists)",
    "inference": "a forward pass without autograd",
    "generate": "generate(): the prompt's forward and each decoding step (the weights, the KV "
    "cache as it grows, each step's temporaries)",
}
MODELLED = (
    "modelled: every tensor of {run} at its exact size and lifetime; on CUDA the caching "
    "allocator's 512 B rounding, block splitting and 2/20 MiB segments, Adam's foreach path, "
    "attention through the flash / memory-efficient kernel each GPU runs (no flash before "
    "compute capability 8.0: T4, V100), PyTorch's cuBLAS workspaces (one per matmul thread); "
    "LSTM workspaces (oneDNN's exact, cuDNN's reserve as measured on an H200)"
)


def modelled(settings: StepSettings | None) -> str:
    """What the estimate models, for the run it made (a training step, a forward pass or a
    generate() call)."""
    run = "train"
    if settings is not None and settings.generate:
        run = "generate"
    elif settings is not None and settings.inference:
        run = "inference"
    return MODELLED.format(run=_RUNS[run])


NOT_MODELLED = (
    "not modelled: CUDA kernels' temporary workspaces (cuDNN, flash attention; the cuBLAS "
    "workspaces are modelled), "
    "fragmentation after many steps, other processes, NCCL buffers, torch.compile"
)


def estimate_summary(estimate: Estimate) -> str:
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
    lines += [modelled(s), NOT_MODELLED]
    return "\n".join(lines)


@dataclass(frozen=True)
class FirstFit:
    """The first GPU of a list a step fits (None: none of them), and the GPUs left
    unchecked (they run another attention kernel and no more runs were allowed)."""

    gpu: str | None
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """Estimated vs measured peak (and per category), with the relative error.

    The measured side counts only what belongs to the step (see :meth:`of`);
    :attr:`unrelated_bytes` says how much was left out at the measured peak.
    """

    estimated_bytes: int
    measured_bytes: int
    estimated: dict[str, int]
    measured: dict[str, int]
    estimated_device: str = ""
    measured_device: str = ""
    left_out_bytes: int = 0
    kept_output_bytes: int = 0

    @property
    def kept_output(self) -> int:
        """Bytes the measured cell kept from the model's forward through backward that the
        estimate's step had dropped: the model's output held by a variable (``out =
        model(...)`` and then ``out.loss.backward()`` keeps the logits alive at the peak; the
        estimate takes the loss and drops the output first, as the transformers Trainer
        does). Part of :attr:`measured_bytes`, and the usual reason a language model's
        estimate is one logits-sized buffer short."""
        return self.kept_output_bytes

    @property
    def unrelated_bytes(self) -> int:
        """Bytes at the measured peak in tensors that play no role in the step (alive before
        the cell and not the estimated model's, nor its inputs: another model's parameters,
        earlier cells' tensors), left out of :attr:`measured_bytes`."""
        return self.left_out_bytes

    @property
    def same_device(self) -> bool:
        """Both sides on the same kind of device (a CUDA estimate vs a CPU run differs by the
        allocator's rounding and CUDA-only kernels)."""
        return self.estimated_device.split(":")[0] == self.measured_device.split(":")[0]

    @property
    def relative_difference(self) -> float:
        """(estimated - measured) / measured: how far the prediction is from the measurement
        of the same step (unrelated tensors are already left out of the measurement)."""
        return (self.estimated_bytes - self.measured_bytes) / max(self.measured_bytes, 1)

    @classmethod
    def of(cls, estimate: Estimate, measured: Profile) -> Comparison:
        """Compare with the part of ``measured`` that belongs to the step: rows allocated
        during the run, plus, of what existed before it, the estimated model's own tensors
        (parameters, buffers, optimizer state) and the inputs it was fed."""
        a = measured.allocations
        keep = (
            (a.alloc_seq >= 0)
            | _module_rows(measured, estimate.model_name)
            | (a.category == CATEGORY_INDEX["input"])
        ) & ~_workspace_rows(measured)
        step = measured.replace(
            allocations=Allocations.from_columns(
                {name: getattr(a, name)[keep] for name in a.to_columns()}
            )
        )
        timeline = measured.timeline
        at_peak = timeline.live_mask(timeline.peak_index)
        left_out = int(a.size[at_peak & ~keep].sum())
        # BLAS workspaces are the process's, not the step's: the estimate's are left out, and
        # the measurement's too (made by a first cell's matmuls, or before the cell)
        workspaces = estimate.cublas_workspace_total
        estimated = estimate.peak_breakdown()
        estimated["other"] = max(estimated.get("other", 0) - workspaces, 0)
        name = estimate.model_name
        kept = _forward_outputs_at_peak(step, name) - _forward_outputs_at_peak(
            estimate.profile, name
        )
        return cls(estimate.peak_bytes - workspaces, step.peak_bytes, estimated,
                   step.peak_breakdown(), estimate.settings.device, measured.device,
                   left_out, max(kept, 0))  # fmt: skip


def _workspace_rows(profile: Profile) -> npt.NDArray[np.bool_]:
    """The rows a CUDA recording named as cuBLAS / cuBLASLt workspaces."""
    from .._blas_workspaces import CUBLAS_LABEL, CUBLASLT_LABEL

    named = np.array([op in (CUBLAS_LABEL, CUBLASLT_LABEL) for op in profile.ops], dtype=bool)
    a = profile.allocations
    return named[a.op] if len(named) else np.zeros(len(a), dtype=bool)


def _forward_outputs_at_peak(profile: Profile, model_name: str) -> int:
    """Bytes the model's layers made in the forward pass, saved by nobody (temporaries), and
    still alive at a peak that came after the forward: what the program itself held of the
    forward, e.g. the model's output kept by a variable through backward."""
    t = profile.timeline
    if not model_name or t.peak_phase not in ("backward", "optimizer"):
        return 0
    a = profile.allocations
    inside = np.array([m.startswith(model_name + ".") for m in profile.modules], dtype=bool)
    if not len(inside):
        return 0
    rows = (
        t.live_mask(t.peak_index)
        & (a.alloc_seq >= 0)
        & (a.phase == PHASES.index("forward"))
        & (a.category == CATEGORY_INDEX["temporary"])
        & inside[a.module]
    )
    return int(a.size[rows].sum())


#: Bytes per parameter -> the weights' dtype, for a model estimated in its own dtype.
ITEMSIZE_NAMES = {8: "fp64", 4: "fp32", 2: "16-bit", 1: "8-bit"}
BLOCK = 512  # the CUDA caching allocator rounds requests up to this


def model_weights(profile: Profile) -> str | None:
    """The dtype an estimated model's weights had, from the simulated step itself: the one
    element size that makes the parameters alive before the step as large as they are (each
    rounded up to the CUDA allocator's 512 B blocks on a CUDA target). None if no size or
    more than one does, e.g. a model mixing dtypes."""
    count = int(profile.meta.get("estimate", {}).get("parameters", 0))
    t = profile.timeline
    rows = t.live_mask(-1) & (profile.allocations.category == CATEGORIES.index("parameter"))
    nbytes = int(profile.allocations.size[rows].sum())
    if count <= 0 or not nbytes:
        return None
    slack = BLOCK * int(rows.sum())  # at most 511 B of rounding per allocation
    names = [name for size, name in ITEMSIZE_NAMES.items() if 0 <= nbytes - size * count < slack]
    return names[0] if len(names) == 1 else None


def _module_rows(profile: Profile, model_name: str) -> npt.NDArray[np.bool_]:
    """Rows charged to the modules of a model whose root class is ``model_name``."""
    if not model_name:
        return np.zeros(len(profile.allocations), bool)
    prefix = model_name + "."
    ours = np.array([m == model_name or m.startswith(prefix) for m in profile.modules], dtype=bool)
    return ours[profile.allocations.module] if len(ours) else np.zeros(0, bool)


def _uses_flash(profile: Profile) -> bool:
    """Whether a simulated step ran attention through the flash kernel."""
    return any("flash_attention" in op for op in profile.ops)


def _gpu(gpu: str | Gpu) -> Gpu:
    return gpu if isinstance(gpu, Gpu) else find_gpu(gpu)


def _probe(model: nn.Module | Callable[[], nn.Module]) -> nn.Module:
    """The model itself, or one built by the factory on the meta device (no memory)."""
    if isinstance(model, nn.Module):
        return model
    import torch

    try:
        with torch.device("meta"):
            built = model()
    except Exception as error:  # noqa: BLE001 - the user's factory failed: say so plainly
        raise EstimateError(f"the model factory failed: {type(error).__name__}: {error}") from None
    if not isinstance(built, nn.Module):
        raise EstimateError(f"the model factory returned {type(built).__name__}, not a Module")
    return built


__all__ = [
    "RUNTIME_OVERHEAD",
    "Allowance",
    "Comparison",
    "Estimate",
    "EstimateError",
    "FirstFit",
    "RunSummary",
    "estimate_summary",
    "model_weights",
]


# -- what-ifs: the estimate simulated again under other settings, or sharded by arithmetic --


def what_if_table(estimate: Estimate, *, data_parallel: int = 8,
                  progress: Callable[[str], None] | None = None) -> pd.DataFrame:  # fmt: skip
    """Every what-if in one table: simulated variants, then data-parallel sharding.

    Columns: ``what_if``, ``kind`` ("simulated" / "arithmetic"), ``peak_bytes``,
    ``reserved_bytes``, ``predicted_device_bytes``, ``change`` (peak vs the estimate's peak) and
    ``note`` (why a variant could not run: its numbers are NaN).
    """
    import pandas as pd

    from .runner import EstimateError

    data_parallel = check_gpus(data_parallel)
    base = estimate.settings
    rows: list[dict[str, Any]] = []

    def add(name: str, kind: str, peak: float, reserved: float, used: float,
            note: str = "") -> None:  # fmt: skip
        change = (peak - estimate.peak_bytes) / max(estimate.peak_bytes, 1)
        rows.append({"what_if": name, "kind": kind, "peak_bytes": peak,
                     "reserved_bytes": reserved, "predicted_device_bytes": used,
                     "change": change, "note": note})  # fmt: skip

    summary = estimate.summary
    add("as estimated: " + base.describe(), "simulated", summary.peak_bytes,
        summary.reserved_bytes, summary.predicted_device_bytes)  # fmt: skip
    with estimate.session():
        for name, settings in variants(base):
            if progress is not None:
                progress(f"simulating {name} ...")
            try:
                run = estimate.run(settings)
            except EstimateError as error:  # e.g. nothing to checkpoint: a row that says so
                nan = float("nan")
                add(name, "simulated", nan, nan, nan, note=str(error).splitlines()[0])
                continue
            add(name, "simulated", run.peak_bytes, run.reserved_bytes, run.predicted_device_bytes)
    if not base.inference:
        for adapters, run_or_error in adapter_runs(estimate, progress):
            if isinstance(run_or_error, str):
                nan = float("nan")
                add(adapters.describe(), "simulated", nan, nan, nan, note=run_or_error)
            else:
                add(adapters.describe(), "simulated", run_or_error.peak_bytes,
                    run_or_error.reserved_bytes, run_or_error.predicted_device_bytes)  # fmt: skip

        unit = int(estimate.profile.meta.get("estimate", {}).get("unit_parameter_bytes", 0))
        ratio = summary.reserved_bytes / max(summary.peak_bytes, 1)
        overhead = summary.predicted_device_bytes - summary.reserved_bytes
        for sharding in SHARDINGS:
            peak = sharded_peak(estimate.profile, sharding, data_parallel, unit)
            reserved = int(peak * ratio)
            add(f"{sharding.name} on {data_parallel} GPUs (per GPU)", "arithmetic", peak,
                reserved, reserved + overhead)  # fmt: skip
    return pd.DataFrame(rows)


def adapter_runs(
    estimate: Estimate, progress: Callable[[str], None] | None = None
) -> Iterator[tuple[Adapters, RunSummary | str]]:
    """The estimated step with LoRA / QLoRA adapters (:func:`.adapters.table_adapters`), each
    model simulated in an estimator process of its own; a failure is its first line."""
    from .transport import loads

    job = loads(estimate._payload)
    base = _probe(job.model)
    for adapters in table_adapters(base):
        if progress is not None:
            progress(f"simulating {adapters.describe()} ...")
        try:
            model = with_adapters(base, adapters, estimate.settings.dtype)
            payload = pack_job(replace(job, model=model))
            with EstimatorProcess(payload, timeout_s=estimate._timeout_s) as process:
                profile = process.run(estimate.settings, estimate.batch_size)
        except EstimateError as error:
            yield adapters, str(error).splitlines()[0]
            continue
        yield adapters, RunSummary.of(profile, estimate.batch_size)


def what_if_fits(estimate: Estimate, frame: pd.DataFrame, gpu: Gpu) -> list[bool | None]:
    """Whether each row of :func:`what_if_table`'s ``frame`` fits ``gpu``, by the fit rule
    (:meth:`Gpu.fits`).

    The estimated step: :meth:`Estimate.fits`. A simulated variant: its device used on that
    card (:meth:`Estimate.used_on` with its settings: that card's attention kernel and cuBLAS
    workspaces). An arithmetic row (sharding), computed from the estimated step: its device
    used plus what that card adds to the estimated step's. A row that could not run: None.
    """
    settings = {f"as estimated: {estimate.settings.describe()}": estimate.settings}
    settings.update(variants(estimate.settings))
    card_extra = estimate.used_on(gpu) - estimate.predicted_device_bytes
    answers: list[bool | None] = []
    for row in frame.to_dict("records"):
        used = row["predicted_device_bytes"]
        chosen = settings.get(str(row["what_if"]))
        if row.get("note") or used != used:  # could not run (NaN)
            answers.append(None)
        elif chosen == estimate.settings:
            answers.append(estimate.fits(gpu))
        elif chosen is not None and row["kind"] == "simulated":
            answers.append(gpu.fits(estimate.used_on(gpu, settings=chosen)))
        else:
            answers.append(gpu.fits(int(used) + card_extra))
    return answers
