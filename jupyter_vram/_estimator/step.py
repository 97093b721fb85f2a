"""One training step, the same code for the fake run and for a real measured run.

forward (under autocast when AMP is on) -> loss -> backward -> optimizer step -> zero_grad
(set to None). The model's output is dropped once the loss is taken, before backward, as the
transformers Trainer and Lightning do; whatever autograd saved stays alive, as always.
Inference is one forward under ``torch.no_grad``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from torch import nn

from .._capture.tagging import iter_tensors
from .._transforms.amp import amp_dtype, autocast
from .generation import cache_words
from .inputs import parse_dtype

LossFn = Callable[[Any, Any], torch.Tensor]
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


class StepError(RuntimeError):
    """The step cannot run as asked (no loss to backpropagate, unknown optimizer, ...)."""


@dataclass(frozen=True)
class StepSettings:
    """What a simulated (or measured) step does. Strings, so they travel as JSON."""

    device: str = "cuda"  # the device being predicted: "cuda" or "cpu"
    dtype: str | None = None  # cast parameters and float inputs (fp32 / bf16 / fp16)
    amp: str | None = None  # autocast dtype (bf16 / fp16)
    checkpoint: bool = False  # activation checkpointing of the model's repeated blocks
    optimizer: str = "adamw"  # a name from OPTIMIZERS, "none", or "custom" (a factory)
    inference: bool = False  # forward only, under no_grad
    stacks: bool = True  # record Python stacks (costs time on big models)
    flash_attention: bool = True  # the target GPU has flash attention (compute cap. >= 8.0)
    # the torch the step will run under (its library workspaces differ by version); None:
    # this process's torch
    torch_version: str | None = None
    generate: int = 0  # > 0: a generate() call of that many new tokens instead of a step
    cache: str = "dynamic"  # the KV cache generate() uses (generation.CACHES)
    # a quantised cache's options ("backend=quanto,nbits=4,..."; generation.cache_options)
    cache_config: str = ""
    # > 0: the prompt lengthened (or shortened) to that many tokens (the longest-context
    # search's runs); 0: the prompt as given
    prompt_length: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def target_type(self) -> str:
        return "cuda" if self.device.startswith("cuda") else "cpu"

    def describe(self) -> str:
        parts = [self.dtype or "model dtype"]
        if self.amp:
            parts.append(f"AMP {self.amp}")
        if self.checkpoint:
            parts.append("checkpointing")
        if self.generate:
            prompt = f"after {self.prompt_length} prompt tokens, " if self.prompt_length else ""
            cache = cache_words(self.cache, self.cache_config)
            parts.append(f"generate {self.generate} tokens, {prompt}{cache}")
        else:
            parts.append("inference" if self.inference else f"optimizer {self.optimizer}")
        if self.target_type == "cuda" and not self.flash_attention:
            parts.append("no flash attention (pre-Ampere GPU)")
        return ", ".join(parts)


def settings_text(settings: StepSettings, weights: str | None = None) -> str:
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


def _adam(cls: type[torch.optim.Optimizer]) -> Callable[[list[nn.Parameter], bool], Any]:
    return lambda params, foreach: cls(params, lr=1e-4, foreach=foreach)  # type: ignore[call-arg]


def _adamw8bit(params: list[nn.Parameter], foreach: bool) -> torch.optim.Optimizer:
    """bitsandbytes' own ``AdamW8bit`` where it is installed (its fake kernels run anywhere:
    the state it really allocates, per version); else AdamW, its state resized afterwards
    (see whatif.eight_bit_state)."""
    try:  # an optional package: imported as Any, it has no type information
        bnb: Any = importlib.import_module("bitsandbytes")
    except Exception:  # noqa: BLE001 - not installed, or it fails to load here
        return torch.optim.AdamW(params, lr=1e-4, foreach=foreach)
    return _bitsandbytes_optimizer(bnb.optim.AdamW8bit, params)


def _paged(class_name: str) -> Callable[[list[nn.Parameter], bool], torch.optim.Optimizer]:
    """bitsandbytes' paged optimizer ``class_name`` (no stand-in without bitsandbytes: where
    its state lives is the point of it). See :data:`PAGED_MIN_ELEMENTS`."""

    def make(params: list[nn.Parameter], foreach: bool) -> torch.optim.Optimizer:
        try:
            bnb: Any = importlib.import_module("bitsandbytes")
        except Exception as error:  # noqa: BLE001 - not installed, or it fails to load here
            raise StepError(
                f"{class_name} is bitsandbytes' ({type(error).__name__}: {error})"
            ) from None
        return _bitsandbytes_optimizer(getattr(bnb.optim, class_name), params)

    return make


def _bitsandbytes_optimizer(cls: Any, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    from .._capture.fake import outside_fake_mode

    # it computes its quantisation maps from values at once (a fake run cannot): real ones,
    # handed to the fake run as constants
    with outside_fake_mode() as as_fake:
        optimizer = cls(params, lr=1e-4)
        maps = dict(optimizer.name2qmap)
    optimizer.name2qmap = as_fake(maps)
    return cast(torch.optim.Optimizer, optimizer)


#: bitsandbytes' paged optimizers (0.50, ``Optimizer8bit.get_state_buffer``) put a state
#: buffer in CUDA managed (unified) memory when its parameter has at least this many elements,
#: outside PyTorch's caching allocator, paged to the host when the GPU runs short; smaller
#: ones, and every buffer on the CPU (paging is CUDA-only there), are ordinary tensors.
PAGED_MIN_ELEMENTS = 100_000

#: bitsandbytes' paged optimizers' names here; their state buffers are ``state1`` / ``state2``.
PAGED = {"pagedadamw8bit", "pagedadamw"}


def is_bitsandbytes(optimizer: object) -> bool:
    """Whether an optimizer is bitsandbytes' own (its state needs no resizing afterwards)."""
    return type(optimizer).__module__.split(".")[0] == "bitsandbytes"


#: Optimizers by name: factory(params, foreach).
OPTIMIZERS: dict[str, Callable[[list[nn.Parameter], bool], torch.optim.Optimizer]] = {
    "adamw": _adam(torch.optim.AdamW),
    "adam": _adam(torch.optim.Adam),
    "adamw8bit": _adamw8bit,
    "pagedadamw8bit": _paged("PagedAdamW8bit"),
    "pagedadamw": _paged("PagedAdamW"),
    "sgd": lambda params, foreach: torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=foreach),
    "sgd-nomomentum": lambda params, foreach: torch.optim.SGD(params, lr=1e-3, foreach=foreach),
    "adafactor": lambda params, foreach: torch.optim.Adafactor(params, foreach=foreach),
    "adagrad": lambda params, foreach: torch.optim.Adagrad(params, foreach=foreach),
    "rmsprop": lambda params, foreach: torch.optim.RMSprop(params, foreach=foreach),
}
EIGHT_BIT = {"adamw8bit", "pagedadamw8bit"}


def optimizer_names() -> list[str]:
    return [*OPTIMIZERS, "none"]


def check_optimizer(name: str) -> str:
    key = name.lower().replace("_", "").replace("-8bit", "8bit")
    if key in ("adam8bit", "adamw8bit", "8bit"):
        return "adamw8bit"
    if key == "pagedadamw32bit":  # the transformers Trainer's name
        return "pagedadamw"
    if key not in OPTIMIZERS and key not in ("none", "custom"):
        raise StepError(f"unknown optimizer {name!r}; use one of {', '.join(optimizer_names())}")
    return key


def make_optimizer(
    settings: StepSettings, model: nn.Module, factory: OptimizerFactory | None = None
) -> torch.optim.Optimizer | None:
    """The optimizer the step uses: foreach on CUDA, as torch picks there by default."""
    if settings.inference or settings.optimizer == "none":
        return None
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise StepError("the model has no parameter that requires grad: nothing to train")
    if factory is not None:
        return factory(params)
    foreach = settings.target_type == "cuda"
    return OPTIMIZERS[settings.optimizer](params, foreach)


def float_dtype(settings: StepSettings, model: nn.Module) -> torch.dtype:
    """The dtype float inputs take: the requested one, else the model's first float param."""
    if settings.dtype:
        return parse_dtype(settings.dtype)
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def default_loss(output: Any) -> torch.Tensor:
    """``output.loss`` when the model computes one, else the sum of its float outputs."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    tensors = [t for t in iter_tensors(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        raise StepError(
            "the model's output has no float tensor that needs a gradient, so there is nothing "
            "to backpropagate; pass loss_fn=lambda output, batch: ... or use inference=True"
        )
    total = tensors[0].sum()
    for t in tensors[1:]:
        total = total + t.sum()
    return total


def _forward_loss(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], loss_fn: LossFn | None
) -> torch.Tensor:
    output = model(*args, **kwargs)
    loss = loss_fn(output, (args, kwargs)) if loss_fn is not None else default_loss(output)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise StepError(f"the loss must be a one-element tensor, got {type(loss).__name__}")
    return loss


def training_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    settings: StepSettings,
    device_type: str,
    loss_fn: LossFn | None = None,
    optimizer_context: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    backward_context: Callable[[torch.Tensor], AbstractContextManager[None]] | None = None,
) -> None:
    """Run one step. ``device_type`` is where tensors live (autocast follows it).

    ``optimizer_context`` wraps the optimizer step (the fake run answers scalar reads there);
    ``backward_context(loss)`` wraps the backward pass (the fake run watches it there).
    """
    amp = amp_dtype(settings.amp)
    if settings.inference:
        with torch.no_grad(), autocast(device_type, amp):
            model(*args, **kwargs)
        return
    with autocast(device_type, amp):
        loss = _forward_loss(model, args, kwargs, loss_fn)
    with backward_context(loss) if backward_context else contextlib.nullcontext():
        loss.backward()  # type: ignore[no-untyped-call]
    del loss
    if optimizer is not None:
        with optimizer_context():
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
