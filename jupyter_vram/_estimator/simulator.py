"""The fake-tensor step simulation the estimator process runs: :class:`Simulator`.

A loaded model runs training (or generation) steps on fake tensors under the dispatch
recorder, at any batch size and settings, and each step's recording becomes the estimate's
Profile (the target GPU's allocator applied afterwards). :func:`describe_error` says in the
user's terms why a model could not be simulated. The process around it (the protocol with the
kernel, the parent watch, spares) is :mod:`.worker`.
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from .._capture.dispatch import DispatchRecorder
from .._capture.stacks import FrameFilter
from .._capture.tagging import iter_tensors
from .._model import Allocations, Profile
from .accumulation import AccumulationWatch, accumulate_in_place
from .inputs import BatchSpec, PendingInputs, parse_dtype, with_default_labels
from .job import Job
from .kernels import (
    RnnCalls,
    bitsandbytes_cpu_update,
    cuda_kernels,
    grouped_mm_any_dtype,
    onednn_scratch,
    rnn_workspaces,
    sparse_tensors,
)
from .order import canonical_baseline, canonical_bursts, rows_of
from .step import (
    EIGHT_BIT,
    PAGED,
    PAGED_MIN_ELEMENTS,
    StepSettings,
    float_dtype,
    is_bitsandbytes,
    make_optimizer,
    training_step,
)
from .transport import TensorDescriptor, TensorSlots
from .workspaces import estimate_workspaces, first_step_positions, with_blas_workspaces

#: The device a fake run's tensors say they are on, whatever the target (its kernels' rules
#: shape the run; the target GPU's allocator is applied afterwards). Their storage is "meta".
FAKE_RUN_DEVICE = "cpu"


def cast_recorder(recorder: object) -> DispatchRecorder:
    """The fake run's recorder (recording on "meta" is always the dispatch recorder)."""
    if not isinstance(recorder, DispatchRecorder):
        raise TypeError(f"expected the dispatch recorder, got {type(recorder).__name__}")
    return recorder


class Simulator:
    """A loaded model, ready to run fake steps at any batch size and settings."""

    def __init__(self, job: Job) -> None:
        self.job = job
        model = job.model
        if not isinstance(model, nn.Module):
            with torch.device("meta"):
                model = model()
            if not isinstance(model, nn.Module):
                raise TypeError(f"the model factory returned {type(model).__name__}, not a Module")
        if isinstance(job.batch, PendingInputs):
            job = self.job = replace(job, batch=job.batch.resolve(model))
        assert isinstance(job.batch, BatchSpec)
        self.given_batch = job.batch  # as the user gave it, no labels added
        self.model = model
        self.slots = TensorSlots(model)
        self.batch = with_default_labels(model, self.given_batch)
        self.added_labels = (
            "labels" in self.batch.kwargs and "labels" not in self.given_batch.kwargs
        )
        params = [d for d in self.slots.descriptors() if d.parameter]
        self.parameter_count = sum(math.prod(d.shape) for d in params)
        self.trainable_count = sum(math.prod(d.shape) for d in params if d.requires_grad)
        # learned from this model's first full warm-up step (see _warm_up)
        self._forward_keeps_nothing = False
        self._stateful_params: frozenset[int] = frozenset()
        self._kept: _Kept | None = None  # the last run's fake tensors, when reusable
        # LSTM workspaces (kernels.rnn_workspaces) until a step shows the model needs none
        self._has_rnn_modules = any(isinstance(m, nn.RNNBase) for m in model.modules())
        # embeddings with sparse gradients (kernels.sparse_tensors)
        self._sparse_gradients = any(
            isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse for m in model.modules()
        )
        self._may_run_rnn = True

    def run(self, settings: StepSettings, batch_size: int | None) -> Profile:
        """Record one steady-state step (after a warm-up step) on fake tensors."""
        from .._capture.fake import fake_mode
        from .._recording import FakeRunRecording
        from .._transforms.checkpointing import enable_checkpointing

        if settings.generate:
            return self._run_generation(settings, batch_size)
        batch = self.batch.with_batch_size(batch_size) if batch_size else self.batch
        cast = parse_dtype(settings.dtype) if settings.dtype else None
        mode, optimizer = self._take_kept(settings)
        if mode is None:  # before checkpointing: it looks for blocks by their parameters
            mode = fake_mode()
            self.slots.fill(_fake_factory(mode, cast))
        try:
            undo = enable_checkpointing(self.model) if settings.checkpoint else None
        except BaseException:
            self.slots.clear()
            raise
        keep: _Kept | None = None
        position_checks = check_positions(self.model)
        lazy_state = _attribute_tensors(self.model)
        started = time.perf_counter()
        unit_bytes = _largest_unit_bytes(self.model)
        try:
            self.model.train(not settings.inference)
            cuda = settings.target_type == "cuda"
            attention = (
                cuda_kernels(flash=settings.flash_attention) if cuda else contextlib.nullcontext()
            )
            calls = RnnCalls()
            rnn = rnn_workspaces(settings.target_type, calls) if self._may_run_rnn else None
            with mode, rnn or contextlib.nullcontext(), attention, grouped_mm_any_dtype():
                args, kwargs = batch.build(FAKE_RUN_DEVICE, float_dtype(settings, self.model))
                if optimizer is None:  # else the state a warm-up makes exists (see _Kept)
                    optimizer = make_optimizer(settings, self.model, self.job.optimizer_factory)
                    if not settings.inference:
                        # optimizer state (and any lazy state) exist, as in a second step
                        self._warm_up(optimizer, args, kwargs, settings)
                before = self._steady_state(optimizer)
                with FakeRunRecording(device="meta", stacks=settings.stacks) as rec:
                    recorder = cast_recorder(rec.recorder)
                    first = rows_of(recorder, _held_tensors(self.slots, optimizer, args, kwargs))
                    watch = AccumulationWatch(recorder)
                    self._step(optimizer, args, kwargs, settings, watch.around_backward)
                facts = _OptimizerFacts.of(optimizer, settings)
                del args, kwargs
                steady = before is not None and self._steady_state(optimizer) == before
                if self._unchanged(cast):
                    keep = _Kept(settings.dtype, _reuse_key(settings), mode,
                                 optimizer if steady else None)  # fmt: skip
                del optimizer
        finally:
            for handle in position_checks:
                handle.remove()
            _restore_attribute_tensors(self.model, lazy_state)
            if keep is None:
                self.slots.clear()
            if undo is not None:
                undo()
        self._kept = keep
        if rnn is not None and not calls.seen and not self._has_rnn_modules:
            self._may_run_rnn = False  # a whole step ran without an LSTM layer op
        info = self._step_info(settings, batch, started, unit_bytes, facts)
        raw, in_sums = canonical_baseline(rec.profile, first, watch.sums)
        raw, sums = accumulate_in_place(raw, watch.segments, in_sums)
        info["in_place_sums"] = sums
        return finish_profile(canonical_bursts(raw), settings, info)

    def _run_info(self, settings: StepSettings, batch: BatchSpec, started: float) -> dict[str, Any]:
        """What every simulated run's ``meta`` says: settings, input, model, how long."""
        return {
            "settings": settings.to_dict(),
            "batch_size": batch.batch_size,
            "input": batch.describe(),
            "model": type(self.model).__name__,
            "parameters": self.parameter_count,
            "trainable_parameters": self.trainable_count,
            "seconds": round(time.perf_counter() - started, 3),
        }

    def _step_info(
        self, settings: StepSettings, batch: BatchSpec, started: float, unit_bytes: int,
        facts: _OptimizerFacts,
    ) -> dict[str, Any]:  # fmt: skip
        """What the estimate says about the step it simulated (``Profile.meta``)."""
        info = {
            **self._run_info(settings, batch, started),
            "unit_parameter_bytes": unit_bytes,
            "default_label_bytes": _label_bytes(batch) if self.added_labels else 0,
            "simulated_on": "fake tensors (torch FakeTensorMode) on the CPU",
        }
        if settings.target_type == "cuda":
            info["host_step_counters"] = facts.host_counters
            info["paged_state_sizes"] = facts.paged_sizes
        if settings.optimizer in EIGHT_BIT:
            info["state_itemsizes"] = facts.state_itemsizes
            info["step_counters"] = facts.all_counters
            info["bitsandbytes"] = facts.real_eight_bit
        return info

    def _run_generation(self, settings: StepSettings, batch_size: int | None) -> Profile:
        """Record one ``generate()`` call of ``settings.generate`` tokens on fake tensors (no
        warm-up: generation keeps no state between calls). Its prompt is the job's input as
        given (no labels added)."""
        from .._capture.fake import fake_mode
        from .._recording import FakeRunRecording
        from .generation import (
            check_generates,
            decoding_steps,
            generate_step,
            ordinary_prompt_reads,
            prompt_length,
            with_prompt_length,
        )
        from .quantized_cache import quanto_as_run

        check_generates(self.model)  # a model sent as its config is first seen here
        self._kept = None  # a training run's fake tensors are not reused here
        batch = self.given_batch.with_batch_size(batch_size) if batch_size else self.given_batch
        if settings.prompt_length:
            batch = with_prompt_length(batch, settings.prompt_length)
        cast = parse_dtype(settings.dtype) if settings.dtype else None
        mode = fake_mode()
        self.slots.fill(_fake_factory(mode, cast))
        position_checks = check_positions(self.model)
        lazy_state = _attribute_tensors(self.model)
        started = time.perf_counter()
        try:
            self.model.eval()
            cuda = settings.target_type == "cuda"
            attention = (
                cuda_kernels(flash=settings.flash_attention) if cuda else contextlib.nullcontext()
            )
            with mode, attention, grouped_mm_any_dtype():
                args, kwargs = batch.build(FAKE_RUN_DEVICE, float_dtype(settings, self.model))
                with FakeRunRecording(device="meta", stacks=settings.stacks) as rec:
                    recorder = cast_recorder(rec.recorder)
                    first = rows_of(recorder, _held_tensors(self.slots, None, args, kwargs))
                    recorder.mark_inputs(iter_tensors((args, kwargs)))
                    with (
                        ordinary_prompt_reads(),
                        decoding_steps(self.model, settings.generate),
                        quanto_as_run(settings.cache_config, settings.target_type),
                    ):
                        generate_step(self.model, args, kwargs, settings.generate,
                                      settings.cache, settings.cache_config)  # fmt: skip
                del args, kwargs
        finally:
            for handle in position_checks:
                handle.remove()
            _restore_attribute_tensors(self.model, lazy_state)
            self.slots.clear()
        info = {
            **self._run_info(settings, batch, started),
            "new_tokens": settings.generate,
            "cache": settings.cache,
            "cache_config": settings.cache_config,
            "prompt_length": prompt_length(batch) or 0,
            "max_positions": max_positions(self.model),
            "simulated_on": "fake tensors (torch FakeTensorMode) on the CPU",
        }
        raw, _ = canonical_baseline(rec.profile, first, {})
        return finish_profile(canonical_bursts(raw), settings, info)

    def _take_kept(self, settings: StepSettings) -> tuple[Any, Any]:
        """The last run's fake mode (its fake parameters stay in the model) and optimizer, where
        this run may start from them; None for what it makes itself."""
        kept, self._kept = self._kept, None
        if kept is None:
            return None, None
        if kept.optimizer is not None and kept.state_key == _reuse_key(settings):
            return kept.mode, kept.optimizer
        mode = kept.mode if kept.dtype == settings.dtype else None
        # the old optimizer and its state must be gone before the recording starts (a fresh
        # process never had them); they are, unless they sit in a reference cycle
        gone = weakref.ref(kept.optimizer) if kept.optimizer is not None else None
        del kept
        if gone is not None and gone() is not None:
            gc.collect()
        return mode, None

    def _unchanged(self, cast: torch.dtype | None) -> bool:
        """Whether the model's slots still hold what this run put there, as it put it (no
        gradient left, no tensor replaced, untied, reshaped or retyped), so that a later run
        may use them instead of making the same again."""
        seen: dict[int, int] = {}
        for descriptor, tensor in zip(self.slots.slot_descriptors(), self.slots.holding(),
                                      strict=True):  # fmt: skip
            if tensor is None or tensor.grad is not None:
                return False
            if seen.setdefault(descriptor.key, id(tensor)) != id(tensor):
                return False
            is_float = descriptor.dtype.is_floating_point and descriptor.castable
            dtype = cast if cast is not None and is_float else descriptor.dtype
            if (
                tuple(tensor.shape) != tuple(descriptor.shape)
                or tensor.stride() != tuple(descriptor.stride)
                or tensor.storage_offset() != 0
                or tensor.dtype != dtype
                or isinstance(tensor, nn.Parameter) != descriptor.parameter
                or (descriptor.parameter and tensor.requires_grad != descriptor.requires_grad)
            ):
                return False
        return True

    def _steady_state(self, optimizer: Any) -> tuple[Any, ...] | None:
        """What a later run needs from this one to skip its own warm-up, or None if it cannot:
        the model's tensors (the same objects, no gradient left) and the optimizer's state,
        described by shapes and plain values.

        A run that leaves this unchanged (compared before and after its recorded step) ends
        as it started, so the next run may start from it instead of from a fresh warm-up.
        That needs the shortcut's conditions (see :meth:`_warm_up`): a forward that leaves
        nothing behind, and an optimizer with state.
        """
        if optimizer is None or not self._forward_keeps_nothing or not self._stateful_params:
            return None
        tensors = self.slots.holding()
        if any(t is None or t.grad is not None for t in tensors):
            return None
        groups = []
        for group in optimizer.param_groups:
            params = []
            for param in group["params"]:
                state = optimizer.state.get(param, {})
                items = tuple(sorted((str(k), _describe_value(v)) for k, v in state.items()))
                params.append((id(param), items))
            others = tuple(sorted((str(k), _describe_value(v)) for k, v in group.items()
                                  if k != "params"))  # fmt: skip
            groups.append((tuple(params), others))
        return (tuple(id(t) for t in tensors), tuple(groups), len(optimizer.state))

    def _warm_up(self, optimizer: Any, args: Any, kwargs: Any, settings: StepSettings) -> None:
        """Bring the model to its steady state: optimizer state exists, lazy state too.

        The first run of a model takes a whole step and learns whether its forward and
        backward leave anything behind on the model (a cache, a lazily built buffer) and which
        parameters receive gradients. When nothing is left behind, later runs only give those
        parameters zero gradients and step the optimizer: the same state, without simulating
        a forward and backward pass (about a third of a run).
        """
        from .._capture.fake import scalars_read_as_one

        trainable = [p for p in self.model.parameters() if p.requires_grad]
        shortcut = self._forward_keeps_nothing and not self._sparse_gradients  # dense zeros
        if optimizer is not None and shortcut and self._stateful_params:
            for index, param in enumerate(trainable):
                if index in self._stateful_params:
                    param.grad = torch.zeros_like(param)
            with scalars_read_as_one():
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return
        before = _model_tensor_ids(self.model)
        self._step(optimizer, args, kwargs, settings)
        self._forward_keeps_nothing = _model_tensor_ids(self.model) == before
        if optimizer is not None:
            stateful = {id(p) for p, state in optimizer.state.items() if state}
            self._stateful_params = frozenset(
                i for i, p in enumerate(trainable) if id(p) in stateful
            )

    def _step(
        self,
        optimizer: Any,
        args: Any,
        kwargs: Any,
        settings: StepSettings,
        backward_context: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        from .._capture.fake import scalars_read_as_one

        cuda = settings.target_type == "cuda"
        scratch = contextlib.nullcontext() if cuda else onednn_scratch()
        sparse = sparse_tensors() if self._sparse_gradients else contextlib.nullcontext()
        with scratch, sparse, bitsandbytes_cpu_update(settings.target_type):
            training_step(
                self.model,
                optimizer,
                args,
                kwargs,
                settings,
                FAKE_RUN_DEVICE,
                self.job.loss_fn,
                optimizer_context=scalars_read_as_one,
                backward_context=backward_context,
            )


@dataclass(frozen=True)
class _OptimizerFacts:
    """What the optimizer holds after the step: its step counters (those on the host, all),
    the item size of each state tensor, whether it is bitsandbytes' own 8-bit optimizer, the
    sizes of the state a paged optimizer keeps in CUDA managed memory."""

    host_counters: list[int]
    all_counters: list[int]
    state_itemsizes: list[list[int]]
    real_eight_bit: bool
    paged_sizes: list[int]

    @classmethod
    def of(cls, optimizer: Any, settings: StepSettings) -> _OptimizerFacts:
        return cls(
            _step_counters(optimizer, host_only=True),
            _step_counters(optimizer, host_only=False),
            _state_itemsizes(optimizer),
            is_bitsandbytes(optimizer),
            _paged_state_sizes(optimizer, settings),
        )


def _fake_factory(
    mode: Any, cast: torch.dtype | None
) -> Callable[[TensorDescriptor], torch.Tensor]:
    """Makes the fake tensor for a model slot (float ones cast to ``cast`` when given)."""

    def fake(descriptor: TensorDescriptor) -> torch.Tensor:
        is_float = descriptor.dtype.is_floating_point and descriptor.castable
        dtype = cast if cast is not None and is_float else descriptor.dtype
        with mode:
            tensor = torch.empty_strided(
                descriptor.shape, descriptor.stride, dtype=dtype, device=FAKE_RUN_DEVICE
            )
        if descriptor.parameter:
            param = nn.Parameter(tensor, requires_grad=descriptor.requires_grad)
            return descriptor.dress(param)
        return tensor

    return fake


@dataclass(frozen=True)
class _Kept:
    """A finished run's fake parameters (left in the model), fake mode and optimizer.

    The next run with the same ``dtype`` uses the parameters instead of making new ones (they
    are what it would make: ``Simulator._unchanged``); with the same :func:`_reuse_key` too,
    it also skips making an optimizer and stepping it once (its warm-up): the recorded step
    ended where it started (``Simulator._steady_state``), so the state is the one a warm-up
    makes. On a 7B model this saves the optimizer's warm-up step over every parameter.
    """

    dtype: str | None
    state_key: tuple[Any, ...]
    mode: Any  # the FakeTensorMode the tensors belong to (fake tensors never mix modes)
    optimizer: Any  # None: only the parameters are reusable


def _held_tensors(slots: TensorSlots, optimizer: Any, args: Any, kwargs: Any) -> list[Any]:
    """The tensors a step starts with, in the order a training program makes them: the
    model's (module order), the optimizer state (parameter by parameter), the inputs."""
    held: list[Any] = list(slots.holding())
    if optimizer is not None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                held.extend(optimizer.state.get(param, {}).values())
    held.extend(iter_tensors((args, kwargs)))
    return held


def _reuse_key(settings: StepSettings) -> tuple[Any, ...]:
    """The settings that decide the parameters and the optimizer state (the batch, AMP,
    stacks and the attention kernel do not)."""
    return (settings.dtype, settings.optimizer, settings.inference, settings.target_type,
            settings.checkpoint)  # fmt: skip


def _describe_value(value: Any) -> Any:
    """A state entry by what decides memory: a tensor's layout, or a plain value itself."""
    if isinstance(value, torch.Tensor) and value.layout == torch.sparse_coo:
        # SGD's momentum for a sparse gradient: its entries decide its memory
        return ("sparse", tuple(value.shape), _describe_value(value._indices()),
                _describe_value(value._values()))  # fmt: skip
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype, value.device,
                value.untyped_storage().nbytes(), value.requires_grad)  # fmt: skip
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_describe_value(v) for v in value))
    return ("object", id(value))


_AttributeState = dict[int, tuple[nn.Module, dict[str, Any], set[str]]]


def _attribute_tensors(model: nn.Module) -> _AttributeState:
    """Each module's plain attributes (not its parameters or buffers) and buffer names, so
    that what a run builds lazily (a cache made of this run's fake tensors, which the next
    run's fake mode cannot use) is undone after it."""
    return {
        id(m): (m, {k: v for k, v in vars(m).items() if not k.startswith("_")}, set(m._buffers))
        for m in model.modules()
    }


def _restore_attribute_tensors(model: nn.Module, saved: _AttributeState) -> None:
    for module in model.modules():
        entry = saved.get(id(module))
        if entry is None:
            continue
        _, attributes, buffers = entry
        for name, value in list(vars(module).items()):
            if name.startswith("_") or attributes.get(name, _MISSING) is value:
                continue
            if _holds_tensor(value):
                if name in attributes:
                    setattr(module, name, attributes[name])
                else:
                    delattr(module, name)
        for name in set(module._buffers) - buffers:
            del module._buffers[name]


_MISSING = object()


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (dict, list, tuple)):
        items = value.values() if isinstance(value, dict) else value
        return any(isinstance(v, torch.Tensor) for v in items)
    return False


def _model_tensor_ids(model: nn.Module) -> set[int]:
    """Every tensor the model's modules hold (parameters, buffers, plain attributes)."""
    found: set[int] = set()
    for module in model.modules():
        for value in module.__dict__.values():
            if isinstance(value, torch.Tensor):
                found.add(id(value))
            elif isinstance(value, (dict, list, tuple)):
                items = value.values() if isinstance(value, dict) else value
                found.update(id(v) for v in items if isinstance(v, torch.Tensor))
    return found


#: Names of learned absolute position tables (GPT-2's wpe, BERT's position_embeddings, ...).
_POSITION_TABLE = re.compile(
    r"(^|_)(wpe|pos|positions?|position_embeddings?|pos_emb(ed|eds|edding|eddings)?|"
    r"embed_positions|positional_embeddings?)$"
)


class PositionError(IndexError):
    """A sequence longer than the model's table of learned positions."""


def position_tables(model: nn.Module) -> list[tuple[str, nn.Embedding]]:
    """The model's learned absolute position tables: embeddings named as positions, or whose
    size is the config's position limit (``max_position_embeddings`` / ``n_positions`` /
    ``n_ctx``) and not the vocabulary's."""
    config = getattr(model, "config", None)
    limits = {getattr(config, a, None) for a in ("max_position_embeddings", "n_positions", "n_ctx")}
    limits = {n for n in limits if isinstance(n, int) and n > 0}
    vocab = getattr(config, "vocab_size", None)
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Embedding):
            continue
        named = _POSITION_TABLE.search(name.rpartition(".")[2]) is not None
        sized = module.num_embeddings in limits and module.num_embeddings != vocab
        if named or sized:
            found.append((name, module))
    return found


def check_positions(model: nn.Module) -> list[Any]:
    """Hooks that fail the run where the real model fails on a sequence longer than a position
    table: the real lookup reads positions 0..L-1 and raises "index out of range"; a fake
    tensor has no values, so the lookup alone would pass. Positions run along the last
    dimension of the ids the table is given."""

    def hook(name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def check(module: nn.Module, args: tuple[Any, ...]) -> None:
            assert isinstance(module, nn.Embedding)
            ids = args[0] if args else None
            if isinstance(ids, torch.Tensor) and ids.dim() >= 1:
                length = int(ids.shape[-1])
                if length > module.num_embeddings:
                    raise PositionError(
                        f"the sequence is {length} positions long, but the model's position "
                        f"table {name} has {module.num_embeddings}: the real model fails here "
                        "with 'index out of range in self'; use a sequence of at most "
                        f"{module.num_embeddings}"
                    )

        return check

    return [m.register_forward_pre_hook(hook(n)) for n, m in position_tables(model)]


def _label_bytes(batch: BatchSpec) -> int:
    """Bytes of the ``labels`` the estimator added for a transformers head."""
    labels = batch.kwargs["labels"]
    itemsize = torch.empty(0, dtype=labels.dtype or torch.float32).element_size()
    return int(math.prod(labels.shape)) * itemsize


def _largest_unit_bytes(model: nn.Module) -> int:
    """Parameter bytes of the largest repeated block (what FSDP gathers at once)."""
    from .._transforms.checkpointing import repeated_blocks

    def size(module: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    blocks = repeated_blocks(model)
    return max((size(b) for b in blocks), default=size(model))


def finish_profile(raw: Profile, settings: StepSettings, info: dict[str, Any]) -> Profile:
    """Name the simulated device as the target and apply what the fake run cannot show."""
    from .whatif import eight_bit_state

    # Fake tensors keep their storage on "meta" and stand for memory on the target device;
    # real tensors of this process (library constants, RNG state) are not the model's.
    fake_rows = raw.allocations.device == raw.devices.index(raw.device)
    if settings.target_type == "cuda":
        fake_rows &= ~_rows_of_host_counters(raw, info.get("host_step_counters", []))
        # paged optimizer state: CUDA managed memory, beside the caching allocator
        paged = info.get("paged_state_sizes", [])
        fake_rows &= ~_rows_of_host_counters(raw, paged)
        info["paged_state_bytes"] = sum(paged)
    kept = _without_rows(raw, ~fake_rows)
    kept = Allocations.from_columns(
        {**{name: getattr(kept, name) for name in _COLUMN_NAMES},
         "device": np.zeros(len(kept), np.int32)}
    )  # fmt: skip
    profile = raw.replace(
        allocations=kept,
        devices=[settings.device],
        device=settings.device,
        source="estimate",
        meta={**raw.meta, "estimate": info},
    )
    if settings.target_type == "cuda":
        profile = with_blas_workspaces(profile, estimate_workspaces(settings.torch_version))
    if settings.optimizer in EIGHT_BIT and not info.get("bitsandbytes"):
        # bitsandbytes counts steps in a Python int: no counter tensors at all
        counters = _rows_of_host_counters(profile, info.get("step_counters", []))
        profile = eight_bit_state(profile.replace(allocations=_without_rows(profile, counters)))
    if settings.target_type == "cuda":
        from .cuda_model import simulate, to_cuda_profile

        # a training step is the program's second: replay its first before it (the warm-up)
        warm_up = None if settings.inference else first_step_positions(profile)
        profile = to_cuda_profile(profile, simulate(profile, warm_up=warm_up),
                                  device=settings.device)  # fmt: skip
    return profile


def _step_counters(optimizer: Any, *, host_only: bool) -> list[int]:
    """Byte sizes of the optimizer's scalar ``step`` counters (``host_only``: those CUDA keeps
    in host memory).

    Adam, AdamW and friends create ``state["step"]`` on the CPU unless ``fused`` or
    ``capturable`` is set, so on a GPU those counters take no device memory.
    """
    if optimizer is None:
        return []
    sizes = []
    for group in optimizer.param_groups:
        if host_only and (group.get("fused") or group.get("capturable")):
            continue
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and step.dim() == 0:
                sizes.append(step.element_size())
    return sizes


def _paged_state_sizes(optimizer: Any, settings: StepSettings) -> list[int]:
    """Byte sizes of the state buffers a bitsandbytes paged optimizer keeps in CUDA managed
    memory on a CUDA target (``state1`` / ``state2`` of parameters of at least
    :data:`~.step.PAGED_MIN_ELEMENTS` elements); none on the CPU, where it pages nothing."""
    if optimizer is None or settings.optimizer not in PAGED or settings.target_type != "cuda":
        return []
    sizes = []
    for param, state in optimizer.state.items():
        if param.numel() < PAGED_MIN_ELEMENTS:
            continue
        for name in ("state1", "state2"):
            buffer = state.get(name)
            if isinstance(buffer, torch.Tensor):
                sizes.append(buffer.numel() * buffer.element_size())
    return sizes


def _state_itemsizes(optimizer: Any) -> list[list[int]]:
    """``[bytes, element size]`` of the optimizer's state tensors (one pair per distinct byte
    size): an AdamW state row's byte size alone does not say how many elements it holds."""
    if optimizer is None:
        return []
    pairs: dict[int, int] = {}
    for state in optimizer.state.values():
        for name, value in state.items():
            if name != "step" and isinstance(value, torch.Tensor):
                pairs.setdefault(value.numel() * value.element_size(), value.element_size())
    return [[size, item] for size, item in sorted(pairs.items())]


_COLUMN_NAMES = tuple(Allocations.__dataclass_fields__)


def _without_rows(profile: Profile, drop: npt.NDArray[np.bool_]) -> Allocations:
    a = profile.allocations
    return Allocations.from_columns({name: getattr(a, name)[~drop] for name in _COLUMN_NAMES})


def _rows_of_host_counters(raw: Profile, sizes: list[int]) -> npt.NDArray[np.bool_]:
    """Rows to leave out for the host-side step counters: that many optimizer-state scalars
    of those sizes alive before recording (rows of equal size and lifetime are
    interchangeable, so which ones does not change any number)."""
    from .._model import CATEGORY_INDEX

    a = raw.allocations
    drop = np.zeros(len(a), bool)
    candidates = (a.category == CATEGORY_INDEX["optimizer_state"]) & (a.alloc_seq < 0)
    for size in set(sizes):
        rows = np.flatnonzero(candidates & (a.size == size))[: sizes.count(size)]
        drop[rows] = True
    return drop


#: Config fields that bound the positions a model takes (its context window), by family.
_POSITION_LIMITS = ("max_position_embeddings", "n_positions", "max_target_positions", "n_ctx")


def max_positions(model: nn.Module) -> int:
    """The most positions (prompt and generated tokens) the model's config allows; 0 if it
    says none."""
    config = getattr(model, "config", None)
    config = getattr(config, "get_text_config", lambda **_: config)(decoder=True)
    for name in _POSITION_LIMITS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def describe_error(error: BaseException) -> str:
    """A message that says what went wrong in the user's terms, and where."""
    from .._capture.fake import is_data_dependent, is_unsupported

    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    where = _user_frame(error)
    if isinstance(error, PositionError):
        head = text
    elif is_data_dependent(error):
        head = (
            f"the model computes something from tensor values ({text}), which a fake-tensor "
            "run cannot know; estimate a model whose forward does not call .item(), "
            "nonzero() or boolean indexing on data"
        )
    elif is_unsupported(error):
        head = f"operator {text} has no fake-tensor implementation, so it cannot be simulated"
    elif "cuda" in text.lower() or "nvidia" in text.lower():
        head = (
            "the model calls a GPU-only operation (" + text + "); the estimator simulates the "
            "step on fake CPU tensors, so device-specific calls (.cuda(), device='cuda', "
            "CUDA-only kernels) must not be hard-coded in the model's forward"
        )
    elif isinstance(error, RuntimeError) and "'indices'" in text and "scalar type" in text:
        head = (
            f"the model rejected the input ({text}): an embedding takes integer token ids, "
            "not float values; pass integer tensors or a shape (a shape is token ids for a "
            "model that starts with an embedding)"
        )
    elif isinstance(error, RuntimeError) and any(
        w in text for w in ("shape", "size", "dim", "mat1", "expected", "mismatch")
    ):
        head = f"the model rejected the input ({text}); check the input spec"
    else:
        head = f"{type(error).__name__}: {text}"
    return head + (f"\n  at {where}" if where else "")


def _user_frame(error: BaseException) -> str | None:
    """The innermost traceback frame of the user's code (not torch, jupyter_vram, ...)."""
    keep = FrameFilter().keep
    found = None
    for frame in traceback.extract_tb(error.__traceback__):
        if keep(frame.filename):
            found = f"{frame.filename}:{frame.lineno} in {frame.name}: {frame.line or ''}".strip()
    return found
