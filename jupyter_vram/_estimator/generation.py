"""``generate()`` on fake tensors: inference with a KV cache, token by token.

The estimate runs the model's own ``generate()`` (transformers' decoding loop, its cache
classes, logits processors and masks), so what it allocates is what the real call allocates.
Two things a fake run cannot do by itself, because ``generate()`` reads tensor values:

- **When to stop.** After each token it reads whether every sequence has finished (an end of
  sequence token, or the length limit). The estimate asks for exactly ``new_tokens`` tokens
  (``min_new_tokens = max_new_tokens``, so an end-of-sequence token is never chosen) and ends
  the loop after that many steps itself (:func:`decoding_steps`), as the real call ends it.
- **Other reads** (is there padding, does the mask hide anything, is a pad token also an end
  token). :class:`_OrdinaryPromptReads` answers them as for a batch of ordinary prompts: an
  ``all()`` is true (every mask position is set), a tensor of ones is followed through views,
  joins and sums (the mask code's ``sum() == numel()``), anything else false (no padding, no
  special token found). The real call is made the same way: an attention mask of ones is
  passed. transformers' mask code skips these reads for a fake tensor (it takes it for a
  trace) and builds a mask the real call, which reads them, leaves out; within the fake run
  it reads them too (:func:`ordinary_prompt_reads`).

The step is the same code for the fake run and for a measured real run
(:func:`generate_step`), as :func:`~.step.training_step` is for training.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from .inputs import BatchSpec, TensorInput

#: Cache kinds the estimate simulates (transformers' ``cache_implementation`` names).
CACHES = ("dynamic", "static", "quantized")

#: A quantised cache's options (transformers' ``cache_config``) and transformers' defaults.
QUANTIZED_DEFAULTS: dict[str, str | int] = {
    "backend": "quanto",
    "nbits": 4,
    "axis_key": 0,
    "axis_value": 0,
    "q_group_size": 64,
    "residual_length": 128,
}

#: Values quanto's cache layer takes (transformers' ``QuantoQuantizedLayer`` checks them).
_QUANTO_CHOICES = {"nbits": (2, 4), "axis_key": (0, -1), "axis_value": (0, -1)}


class GenerationError(ValueError):
    """The model cannot be estimated generating as asked (no ``generate()``, a cache kind
    that is not simulated)."""


def check_cache(cache: str) -> str:
    """The cache kind, or :class:`GenerationError` naming the reason for one not simulated."""
    if cache in CACHES:
        return cache
    if "quant" in cache:
        raise GenerationError(
            f"cache={cache!r} is not a cache kind; a quantised cache is cache='quantized' "
            "(its backend, nbits, q_group_size and residual_length in cache_config)"
        )
    raise GenerationError(f"cache={cache!r} is not simulated; use one of {', '.join(CACHES)}")


def cache_options(cache: str, config: Mapping[str, Any] | None) -> str:
    """A quantised cache's ``cache_config`` as the settings keep it ("backend=quanto,nbits=4,
    ..."; every option, transformers' default where not given); "" for other caches.
    :class:`GenerationError` names an option or backend the estimate does not simulate: only
    quanto's packing is (the cache's own code runs in the fake run; HQQ's and fp8's not)."""
    check_cache(cache)
    if cache != "quantized":
        if config:
            raise GenerationError(f"cache_config is for cache='quantized', not cache={cache!r}")
        return ""
    given = dict(config or {})
    unknown = sorted(set(given) - set(QUANTIZED_DEFAULTS))
    if unknown:
        raise GenerationError(
            f"cache_config: unknown option(s) {', '.join(unknown)}; a quantised cache takes "
            f"{', '.join(QUANTIZED_DEFAULTS)}"
        )
    options = {**QUANTIZED_DEFAULTS, **given}
    if options["backend"] != "quanto":
        raise GenerationError(
            f"cache_config backend={options['backend']!r}: only the quanto backend "
            "(optimum-quanto) is simulated; HQQ's quantiser and fp8 are not"
        )
    for name in ("nbits", "axis_key", "axis_value", "q_group_size", "residual_length"):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise GenerationError(f"cache_config {name}={value!r} must be a whole number")
        if name in _QUANTO_CHOICES and value not in _QUANTO_CHOICES[name]:
            allowed = " or ".join(str(v) for v in _QUANTO_CHOICES[name])
            raise GenerationError(f"cache_config {name}={value}: quanto takes {allowed}")
        if name in ("q_group_size", "residual_length") and value < 1:
            raise GenerationError(f"cache_config {name}={value} must be positive")
    return ",".join(f"{name}={value}" for name, value in options.items())


def cache_words(cache: str, options: str) -> str:
    """The cache in words: "dynamic KV cache", "quantized KV cache (quanto 4-bit, groups of
    64, the newest 128 tokens unquantised)"."""
    if not options:
        return f"{cache} KV cache"
    config = cache_config(options)
    return (
        f"{cache} KV cache ({config['backend']} {config['nbits']}-bit, groups of "
        f"{config['q_group_size']}, the newest {config['residual_length']} tokens unquantised)"
    )


def check_quantizer(options: str) -> None:
    """Refuse a quantised cache where its backend's package is missing (the fake run runs its
    quantisation), naming the package."""
    import importlib.util

    if not options:
        return
    try:
        found = importlib.util.find_spec("optimum.quanto") is not None
    except ModuleNotFoundError:  # no optimum at all
        found = False
    if not found:
        raise GenerationError(
            "cache='quantized' (quanto backend) needs optimum-quanto installed "
            "(pip install optimum-quanto): the estimate runs its quantisation on fake tensors"
        )


def cache_config(options: str) -> dict[str, str | int]:
    """The ``cache_config`` dict of :func:`cache_options`' text."""
    pairs = (item.split("=", 1) for item in options.split(",") if item)
    return {name: value if name == "backend" else int(value) for name, value in pairs}


def check_generates(model: nn.Module) -> None:
    """Refuse a model without transformers' ``generate()`` (the decoding loop the estimate
    runs), naming what is missing."""
    if not callable(getattr(model, "generate", None)) or getattr(model, "config", None) is None:
        raise GenerationError(
            f"{type(model).__name__} has no transformers generate(): estimate_generate runs "
            "a transformers model's own decoding loop; estimate a plain forward with "
            "jv.estimate(model, inputs, inference=True)"
        )


def generation_kwargs(
    model: nn.Module, new_tokens: int, cache: str, options: str = ""
) -> dict[str, Any]:
    """The arguments of the ``generate()`` call estimated and measured: greedy decoding of
    exactly ``new_tokens`` tokens with a cache (``options``: a quantised cache's, as
    :func:`cache_options` writes them)."""
    config = getattr(model, "generation_config", None) or getattr(model, "config", None)
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        eos = getattr(config, "eos_token_id", None)
        pad = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    kwargs: dict[str, Any] = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": False,
        "num_beams": 1,
        "use_cache": True,
        "pad_token_id": 0 if pad is None else pad,
    }
    if cache != "dynamic":
        kwargs["cache_implementation"] = cache
    if options:
        kwargs["cache_config"] = cache_config(options)
    return kwargs


def generate_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    new_tokens: int,
    cache: str,
    options: str = "",
) -> None:
    """One ``generate()`` call of ``new_tokens`` tokens; its result is dropped at once. A
    positional input is the model's main input (``input_ids``, Whisper's ``input_features``);
    token ids get an attention mask of ones."""
    inputs = dict(kwargs)
    if args:
        inputs.setdefault(str(getattr(model, "main_input_name", "input_ids")), args[0])
    ids = inputs.get("input_ids")
    if isinstance(ids, torch.Tensor) and not ids.is_floating_point():
        inputs.setdefault("attention_mask", torch.ones_like(ids))
    with torch.no_grad():
        out = model.generate(**inputs, **generation_kwargs(model, new_tokens, cache, options))  # type: ignore[operator]
    del out


#: The prompt's inputs that run along its tokens (dim 1): what a longer prompt lengthens.
_TOKEN_INPUTS = ("input_ids", "attention_mask")


def prompt_length(spec: BatchSpec) -> int | None:
    """The prompt's length in tokens: dim 1 of its token ids (``input_ids``, or a first
    positional index tensor); None for a prompt of other inputs (Whisper's features)."""
    ids = spec.kwargs.get("input_ids") or (spec.args[0] if spec.args else None)
    if ids is None or not ids.is_index or len(ids.shape) != 2:
        return None
    return int(ids.shape[1])


def with_prompt_length(spec: BatchSpec, length: int) -> BatchSpec:
    """``spec`` with a prompt of ``length`` tokens (its token ids and attention mask resized;
    the batch unchanged): the longest-context search's runs."""
    if prompt_length(spec) is None:
        raise GenerationError(
            f"the longest context is searched by lengthening the prompt's token ids; this "
            f"prompt ({spec.describe()}) has none"
        )

    def resized(t: TensorInput) -> TensorInput:
        return replace(t, shape=(t.shape[0], length)) if len(t.shape) == 2 else t

    return replace(
        spec,
        args=tuple(resized(t) if i == 0 and t.is_index else t for i, t in enumerate(spec.args)),
        kwargs={n: resized(t) if n in _TOKEN_INPUTS else t for n, t in spec.kwargs.items()},
    )


@contextlib.contextmanager
def decoding_steps(model: nn.Module, steps: int) -> Iterator[None]:
    """Within the block, ``model.generate()`` decodes exactly ``steps`` tokens: its loop's
    "any sequence unfinished?" question (``_has_unfinished_sequences``) is answered yes that
    many times, then no (a fake run cannot read the answer from its tensors)."""
    if not callable(getattr(model, "_has_unfinished_sequences", None)):
        raise GenerationError(
            "this transformers version's generate() loop is not one the estimate knows "
            "(no _has_unfinished_sequences): cannot end it after the asked number of tokens"
        )
    remaining = [steps]

    def has_unfinished(*args: Any, **kwargs: Any) -> bool:
        remaining[0] -= 1
        return remaining[0] >= 0

    model._has_unfinished_sequences = has_unfinished  # type: ignore[assignment]
    try:
        yield
    finally:
        del model._has_unfinished_sequences
    if remaining[0] >= 0:  # the loop was left early, or never entered
        raise GenerationError(
            f"{type(model).__name__}.generate() did not decode token by token as asked (it "
            f"stopped after {steps - remaining[0]} of {steps} tokens): its own generate() "
            "decides from tensor values, which the estimate cannot read (Whisper's generate() "
            "loops `while (seek < max_frames).any()` over 30-second audio segments and moves "
            "seek by the timestamps it decoded); this model's generation is not simulated"
        )


#: Ops whose result holds the values of their first operand (views, copies, conversions).
_SAME_VALUE_OPS = (
    "alias view _unsafe_view reshape slice select expand unsqueeze squeeze clone _to_copy "
    "contiguous detach lift_fresh t transpose permute"
)
_SAME_VALUES = frozenset(getattr(torch.ops.aten, name) for name in _SAME_VALUE_OPS.split())
_ONES = frozenset((torch.ops.aten.ones, torch.ops.aten.ones_like, torch.ops.aten.new_ones))


class _OrdinaryPromptReads(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Answers value reads of fake tensors as for ordinary prompts (see the module docstring).

    Tensors made of ones (the attention mask, the tokens it grows by, what is cut or joined
    from them) are followed: their ``all()`` reads true, their whole ``sum()`` is their number
    of elements, and a comparison of a known number reads as that comparison does. Otherwise
    the result of an ``all()`` reads true, any other boolean false, a number 0."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        # by identity: tensors compare by value
        self._all_results = WeakIdKeyDictionary()
        self._ones = WeakIdKeyDictionary()  # tensors known to hold only ones -> their storage
        self._values = WeakIdKeyDictionary()  # one-element tensors whose value is known

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        from torch._subclasses.fake_tensor import FakeTensor

        if func is torch.ops.aten._local_scalar_dense.default and isinstance(args[0], FakeTensor):
            tensor = args[0]
            if tensor in self._values:
                return self._values[tensor]
            if tensor.dtype == torch.bool:
                return tensor in self._all_results
            return 0.0 if tensor.dtype.is_floating_point else 0
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self._follow(func.overloadpacket, args, out)
        return out

    def _follow(self, op: Any, args: tuple[Any, ...], out: torch.Tensor) -> None:
        """What ``out`` is known to hold, from ``op`` and its operands."""
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if first is not None and str(op.__name__).endswith("_"):  # written in place
            self._forget_storage(first)
        ones = first is not None and first in self._ones
        known = first is not None and first in self._values
        if op is torch.ops.aten.all:
            self._all_results[out] = True
            if ones:
                self._values[out] = True
        elif op in _ONES or (op in _SAME_VALUES and ones) or self._joins_ones(op, args):
            self._ones[out] = _storage(out)
        elif op is torch.ops.aten.sum and first is not None and ones and out.dim() == 0:
            self._values[out] = first.numel()
        elif op in (torch.ops.aten.eq, torch.ops.aten.ne) and known:
            other = args[1]
            if isinstance(other, torch.Tensor):
                if other not in self._values:
                    return
                other = self._values[other]
            same = self._values[first] == other
            self._values[out] = same if op is torch.ops.aten.eq else not same

    def _forget_storage(self, tensor: torch.Tensor) -> None:
        """Values written in place: nothing is known of the tensors on that storage."""
        written = _storage(tensor)
        ones = list(self._ones.items())  # type: ignore[no-untyped-call]
        for known in [t for t, storage in ones if storage == written]:
            del self._ones[known]
        if tensor in self._values:
            del self._values[tensor]

    def _joins_ones(self, op: Any, args: tuple[Any, ...]) -> bool:
        if op is not torch.ops.aten.cat or not args:
            return False
        return all(isinstance(t, torch.Tensor) and t in self._ones for t in args[0])


def _storage(tensor: torch.Tensor) -> int:
    """Which storage ``tensor`` views (shared by all views of it)."""
    return int(tensor.untyped_storage()._cdata)


def _not_tracing_fakes(is_tracing: Any) -> Any:
    """transformers' ``is_tracing`` that does not take a fake tensor for a trace."""
    from torch._subclasses.fake_tensor import FakeTensor

    def is_tracing_but_for_fakes(tensor: Any = None) -> bool:
        return bool(is_tracing(None if isinstance(tensor, FakeTensor) else tensor))

    return is_tracing_but_for_fakes


@contextlib.contextmanager
def ordinary_prompt_reads() -> Iterator[None]:
    """Within the block, fake tensors' value reads get :class:`_OrdinaryPromptReads`' answers,
    and transformers' attention-mask code reads them (it skips those reads for a tensor it
    takes for a trace, a fake one included, and then builds a mask the real call leaves out:
    a prompt without padding runs SDPA's own causal or full attention)."""
    import sys

    masking: Any = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "is_tracing", None)
    if masking is not None and callable(original):
        masking.is_tracing = _not_tracing_fakes(original)
    try:
        with _OrdinaryPromptReads():
            yield
    finally:
        if masking is not None and callable(original):
            masking.is_tracing = original


__all__ = [
    "CACHES",
    "QUANTIZED_DEFAULTS",
    "GenerationError",
    "cache_config",
    "cache_options",
    "cache_words",
    "check_cache",
    "check_generates",
    "check_quantizer",
    "decoding_steps",
    "generate_step",
    "generation_kwargs",
    "ordinary_prompt_reads",
    "prompt_length",
    "with_prompt_length",
]
