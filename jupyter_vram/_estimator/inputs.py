"""What the model is fed: input specs, parsed in the kernel and built in the estimator.

Users describe a batch the way they think of it: a shape (``"8x3x224x224"``; ``"8x512"`` is
token ids for a language model), named shapes (``"input_ids=8x512,attention_mask=8x512"``),
example tensors (only their shape and dtype travel), or a function that builds a batch. The
first dimension is the batch: ``--batch-size`` and the batch search change it and nothing else.
With no spec at all, a transformers config says what a natural input is.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

#: Argument names that carry integer ids (token ids, masks, labels) rather than float data.
_INDEX_NAMES = re.compile(r"(^|_)(ids?|idx|index|indices|mask|labels?|tokens?|positions?)$")
_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp64": torch.float64, "float64": torch.float64,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int64,
    "bool": torch.bool, "uint8": torch.uint8,
}  # fmt: skip


class InputError(ValueError):
    """An input spec that cannot be understood, with what would be understood instead."""


def parse_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name.strip().lower()]
    except KeyError:
        known = ", ".join(sorted(_DTYPES))
        raise InputError(f"unknown dtype {name!r}; use one of {known}") from None


@dataclass(frozen=True)
class TensorInput:
    """One tensor of the batch. ``dtype=None`` means the model's floating dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    high: int = 2  # exclusive upper bound of integer values (vocabulary size, classes)
    channels_last: bool = False  # an image batch in channels_last layout (oneDNN kernels differ)

    @property
    def is_index(self) -> bool:
        return self.dtype is not None and not self.dtype.is_floating_point

    def describe(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return dims if self.dtype is None else f"{dims}:{str(self.dtype).removeprefix('torch.')}"


@dataclass(frozen=True)
class BatchSpec:
    """A batch: positional and named tensors, or a builder function ``f(batch_size)``."""

    args: tuple[TensorInput, ...] = ()
    kwargs: Mapping[str, TensorInput] = field(default_factory=dict)
    builder: Callable[..., Any] | None = None
    builder_batch_size: int | None = None

    @property
    def batch_size(self) -> int:
        if self.builder is not None:
            return self.builder_batch_size or 1
        first = next(iter([*self.args, *self.kwargs.values()]), None)
        return first.shape[0] if first is not None and first.shape else 1

    def with_batch_size(self, batch_size: int) -> BatchSpec:
        """The same batch with its first dimension set to ``batch_size``."""
        if batch_size < 1:
            raise InputError(f"batch size must be at least 1, not {batch_size}")
        if self.builder is not None:
            return replace(self, builder_batch_size=batch_size)

        def resized(t: TensorInput) -> TensorInput:
            return replace(t, shape=(batch_size, *t.shape[1:])) if t.shape else t

        return replace(
            self,
            args=tuple(resized(t) for t in self.args),
            kwargs={name: resized(t) for name, t in self.kwargs.items()},
        )

    def describe(self) -> str:
        if self.builder is not None:
            name = getattr(self.builder, "__name__", "builder")
            return f"{name}(batch_size={self.batch_size})"
        parts = [t.describe() for t in self.args]
        parts += [f"{name}={t.describe()}" for name, t in self.kwargs.items()]
        return ", ".join(parts)

    def build(
        self, device: str, float_dtype: torch.dtype
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Make the tensors (fake ones inside a FakeTensorMode, real ones outside)."""
        if self.builder is not None:
            made = _call_builder(self.builder, self.batch_size)
            if isinstance(made, Mapping):
                return (), dict(made)
            if isinstance(made, tuple):
                return made, {}
            return (made,), {}

        def make(t: TensorInput) -> torch.Tensor:
            if t.is_index:
                assert t.dtype is not None
                if t.dtype == torch.bool:
                    return torch.ones(t.shape, dtype=torch.bool, device=device)
                return torch.randint(0, max(t.high, 1), t.shape, dtype=t.dtype, device=device)
            if t.channels_last:
                layout = torch.channels_last
                made = torch.empty(t.shape, dtype=t.dtype or float_dtype, device=device,
                                   memory_format=layout)  # fmt: skip
                return made.normal_()
            return torch.randn(t.shape, dtype=t.dtype or float_dtype, device=device)

        return tuple(make(t) for t in self.args), {n: make(t) for n, t in self.kwargs.items()}


def _call_builder(builder: Callable[..., Any], batch_size: int) -> Any:
    try:
        takes_size = bool(inspect.signature(builder).parameters)
    except (TypeError, ValueError):
        takes_size = True
    return builder(batch_size) if takes_size else builder()


def parse_shape(text: str) -> tuple[int, ...]:
    """``"8x3x224x224"`` (also ``8,3,224,224`` or ``(8, 3, 224, 224)``) -> a shape tuple."""
    cleaned = text.strip().strip("()[]").replace("\u00d7", "x")
    parts = [p for p in re.split(r"\s*[x,*]\s*", cleaned) if p]
    if not parts or not all(p.isdigit() for p in parts):
        raise InputError(
            f"cannot read the shape {text!r}: write dimensions joined by 'x', e.g. 8x3x224x224"
        )
    shape = tuple(int(p) for p in parts)
    if any(d == 0 for d in shape):
        raise InputError(f"shape {text!r} has a zero dimension")
    return shape


def forward_parameters(model: nn.Module) -> list[str]:
    """Names of ``model.forward``'s parameters, in order (``*args`` / ``**kwargs`` left out)."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in plain or p.kind == inspect.Parameter.KEYWORD_ONLY]


def wrapped_model(model: nn.Module) -> nn.Module:
    """The model a pass-through wrapper calls: peft's ``PeftModel`` (and its ``LoraModel``)
    take ``*args, **kwargs`` and hand them to the one model they hold, so that model's
    signature, class and config say what the batch is (``labels`` for a causal LM head).
    Read through ``_modules`` in the instance dict: no wrapper code runs."""
    for _ in range(8):
        if forward_parameters(model):
            break
        try:
            children = object.__getattribute__(model, "__dict__").get("_modules") or {}
        except Exception:  # noqa: BLE001 - no instance dict: nothing to unwrap
            break
        inner = [m for m in children.values() if isinstance(m, nn.Module)]
        if len(inner) != 1:
            break
        model = inner[0]
    return model


def vocabulary_size(model: nn.Module) -> int | None:
    """How many token ids the model embeds (config.vocab_size, else its first nn.Embedding)."""
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return int(module.num_embeddings)
    return None


def takes_token_ids(model: nn.Module, name: str | None) -> bool:
    """Whether an input called ``name`` (None: the first positional one) is integer ids."""
    if name is not None and _INDEX_NAMES.search(name):
        return True
    if name is None:
        params = forward_parameters(wrapped_model(model))
        if params and _INDEX_NAMES.search(params[0]):
            return True
        if params and params[0] in ("pixel_values", "input_values", "inputs_embeds"):
            return False
        first_leaf = next((m for m in model.modules() if not list(m.children())), None)
        return isinstance(first_leaf, nn.Embedding)
    return False


def _tensor_input(model: nn.Module, name: str | None, shape: tuple[int, ...],
                  dtype: torch.dtype | None) -> TensorInput:  # fmt: skip
    if dtype is None and takes_token_ids(model, name):
        dtype = torch.int64
    if dtype is not None and not dtype.is_floating_point:
        is_mask = name is not None and "mask" in name
        high = 2 if is_mask else (vocabulary_size(model) or 2)
        return TensorInput(shape, dtype, high)
    return TensorInput(shape, dtype)


def _parse_text(model: nn.Module, text: str) -> BatchSpec:
    args: list[TensorInput] = []
    kwargs: dict[str, TensorInput] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, _, rest = item.rpartition("=")
        shape_text, _, dtype_text = rest.partition(":")
        dtype = parse_dtype(dtype_text) if dtype_text else None
        if name:
            kwargs[name.strip()] = _tensor_input(
                model, name.strip(), parse_shape(shape_text), dtype
            )
        else:
            args.append(_tensor_input(model, None, parse_shape(shape_text), dtype))
    if args and len(args) > 1:
        raise InputError(
            f"{text!r}: several unnamed shapes; name them, "
            "e.g. input_ids=8x512,attention_mask=8x512"
        )
    return BatchSpec(tuple(args), kwargs)


def _from_tensor(model: nn.Module, name: str | None, tensor: torch.Tensor) -> TensorInput:
    """An example tensor's shape, with its kind of dtype: a float tensor stays float (the
    model's float dtype, so ``dtype=`` casts it as training code would), never token ids;
    if the model cannot take it, the run fails as the real model would."""
    if tensor.dtype.is_floating_point:
        channels_last = (
            tensor.dim() == 4
            and not tensor.is_contiguous()
            and tensor.is_contiguous(memory_format=torch.channels_last)
        )
        return TensorInput(tuple(tensor.shape), None, channels_last=channels_last)
    return _tensor_input(model, name, tuple(tensor.shape), tensor.dtype)


def default_input(model: nn.Module) -> BatchSpec | None:
    """A natural single example for a transformers model, read from its config."""
    config = getattr(wrapped_model(model), "config", None)
    if config is None:
        return None
    image = getattr(config, "image_size", None)
    channels = getattr(config, "num_channels", None)
    if isinstance(image, int) and isinstance(channels, int):
        return BatchSpec((TensorInput((1, channels, image, image)),))
    for attr in ("max_position_embeddings", "n_positions", "n_ctx"):
        length = getattr(config, attr, None)
        if isinstance(length, int) and length > 0:
            return BatchSpec(
                (), {"input_ids": _tensor_input(model, "input_ids", (1, length), None)}
            )
    return None


def make_batch_spec(model: nn.Module, inputs: Any, batch_size: int | None = None) -> BatchSpec:
    """Understand whatever the user passed as ``inputs``; ``batch_size`` overrides dim 0."""
    if inputs is None:
        spec = default_input(model)
        if spec is None:
            raise InputError(
                "say what the model takes: inputs='8x3x224x224' (a shape), "
                "'input_ids=8x512' (named), example tensors, or a function batch_size -> batch"
            )
    elif isinstance(inputs, BatchSpec):
        spec = inputs
    elif isinstance(inputs, str):
        spec = _parse_text(model, inputs)
    elif isinstance(inputs, torch.Tensor):
        spec = BatchSpec((_from_tensor(model, None, inputs),))
    elif isinstance(inputs, Mapping):
        kwargs = {}
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor):
                kwargs[str(name)] = _from_tensor(model, str(name), value)
            elif isinstance(value, (str, tuple, list)):
                shape = parse_shape(value) if isinstance(value, str) else tuple(map(int, value))
                kwargs[str(name)] = _tensor_input(model, str(name), shape, None)
            else:
                raise InputError(f"input {name!r}: expected a tensor or a shape, got {value!r}")
        spec = BatchSpec((), kwargs)
    elif isinstance(inputs, Sequence) and all(isinstance(v, torch.Tensor) for v in inputs):
        spec = BatchSpec(tuple(_from_tensor(model, None, t) for t in inputs))
    elif isinstance(inputs, Sequence) and all(isinstance(v, int) for v in inputs):
        spec = BatchSpec((_tensor_input(model, None, tuple(inputs), None),))
    elif callable(inputs):
        spec = BatchSpec(builder=inputs, builder_batch_size=batch_size)
    else:
        raise InputError(
            f"cannot use {type(inputs).__name__} as inputs: pass a shape string, a tensor, "
            "a dict or tuple of tensors, or a function batch_size -> batch"
        )
    return spec.with_batch_size(batch_size) if batch_size is not None else spec


@dataclass(frozen=True)
class PendingInputs:
    """``inputs`` as the user gave them, read by :func:`make_batch_spec` in the estimator
    process, where the model is built (a model sent as its config is never built here)."""

    inputs: Any
    batch_size: int | None = None

    def resolve(self, model: nn.Module) -> BatchSpec:
        return make_batch_spec(model, self.inputs, self.batch_size)


#: transformers heads whose ``labels`` have the shape of the token ids / one id per example.
_TOKEN_LABEL_HEADS = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration",
                      "ForTokenClassification", "ForSeq2SeqLM")  # fmt: skip
_EXAMPLE_LABEL_HEADS = ("ForSequenceClassification", "ForImageClassification",
                        "ForAudioClassification", "ForMultipleChoice")  # fmt: skip


def with_default_labels(model: nn.Module, spec: BatchSpec) -> BatchSpec:
    """Add ``labels`` for a transformers head that computes its own loss, as training does."""
    if spec.builder is not None or "labels" in spec.kwargs:
        return spec
    model = wrapped_model(model)
    if "labels" not in forward_parameters(model):
        return spec
    cls = type(model).__name__
    ids = spec.kwargs.get("input_ids") or (spec.args[0] if spec.args else None)
    if ids is None or not ids.shape:
        return spec
    if cls.endswith(_TOKEN_LABEL_HEADS) and ids.is_index:
        labels = TensorInput(ids.shape, torch.int64, vocabulary_size(model) or 2)
    elif cls.endswith(_EXAMPLE_LABEL_HEADS):
        classes = getattr(getattr(model, "config", None), "num_labels", 2)
        labels = TensorInput((ids.shape[0],), torch.int64, int(classes) or 2)
    else:
        return spec
    return replace(spec, kwargs={**spec.kwargs, "labels": labels})
