"""What-ifs on a plain model: fine-tuned with LoRA adapters, on a 4-bit base (QLoRA).

``jv.estimate(model, ..., lora=dict(r=16, target_modules=[...]), qlora=True)`` estimates the
model as it would be after ``peft.get_peft_model``: a copy of it built on the meta device
(shapes only; the user's model is never changed), its linear layers made bitsandbytes
``Linear4bit`` for QLoRA, quantised on the meta device by bitsandbytes itself (so the packed
weights and their QuantState have bitsandbytes' own shapes: half a byte per weight, an absmax
per block of 64, nested statistics), then wrapped by peft itself. That model goes the way a
peft model passed by the user goes: one mechanism for both.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .inputs import parse_dtype
from .runner import EstimateError
from .transport import dumps, loads

#: The adapters the what-if table tries on a transformers model peft knows the layers of.
TABLE_RANK = 16

#: ``qlora=True``: the QLoRA paper's base (NF4 with nested statistics, bitsandbytes' default).
QLORA_DEFAULTS: dict[str, Any] = {"quant_type": "nf4", "double_quant": True,
                                  "compute_dtype": None}  # fmt: skip


@dataclass(frozen=True)
class Adapters:
    """A what-if's adapters: peft ``LoraConfig`` arguments, and the 4-bit base (None: the base
    keeps its weights)."""

    lora: tuple[tuple[str, Any], ...]
    qlora: tuple[tuple[str, Any], ...] | None = None

    def describe(self) -> str:
        lora = dict(self.lora)
        targets = lora.get("target_modules")
        rank = f"r={lora.get('r', _peft_default_rank())}"
        on = f" on {', '.join(targets)}" if isinstance(targets, (list, tuple)) else ""
        if self.qlora is None:
            return f"LoRA {rank}{on}"
        base = dict(self.qlora)
        nested = ", nested" if base["double_quant"] else ""
        return f"QLoRA {rank}{on} ({str(base['quant_type']).upper()} base{nested})"


def check_adapters(
    lora: Mapping[str, Any] | None, qlora: bool | Mapping[str, Any]
) -> Adapters | None:
    """The ``lora`` / ``qlora`` arguments of :func:`jv.estimate`, validated (None: neither)."""
    if lora is None and not qlora:
        return None
    if lora is not None and not isinstance(lora, Mapping):
        raise EstimateError(
            f"lora must be a dict of peft LoraConfig arguments (r=16, target_modules=[...]), "
            f"not {type(lora).__name__}"
        )
    config = dict(lora or {})
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = tuple(config["target_modules"])
    base = _check_qlora(qlora) if qlora else None
    return Adapters(tuple(sorted(config.items())), base)


def _check_qlora(qlora: bool | Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    given = dict(qlora) if isinstance(qlora, Mapping) else {}
    unknown = set(given) - set(QLORA_DEFAULTS)
    if unknown:
        raise EstimateError(
            f"qlora takes {', '.join(QLORA_DEFAULTS)}, not {', '.join(sorted(unknown))}"
        )
    base = {**QLORA_DEFAULTS, **given}
    if base["quant_type"] not in ("nf4", "fp4"):
        raise EstimateError(f"qlora quant_type must be 'nf4' or 'fp4', not {base['quant_type']!r}")
    return tuple(sorted(base.items()))


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as error:  # noqa: BLE001 - not installed, or it fails to load here
        raise EstimateError(
            f"the lora / qlora what-ifs need {name} ({type(error).__name__}: {error})"
        ) from None


def _peft_default_rank() -> int:
    try:
        return int(importlib.import_module("peft").LoraConfig().r)
    except Exception:  # noqa: BLE001 - described without peft: its documented default
        return 8


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` already has peft adapters (a what-if would add a second set)."""
    return any(type(m).__module__.split(".")[0] == "peft" for m in model.modules())


def with_adapters(model: nn.Module, adapters: Adapters, dtype: str | None = None) -> nn.Module:
    """A meta-device copy of ``model`` as peft (and for QLoRA bitsandbytes) would make it.

    ``dtype``: the estimate's ``dtype`` (the weights a 4-bit layer is quantised from and
    computes in, unless ``qlora`` names a ``compute_dtype``).
    """
    if is_peft_model(model):
        raise EstimateError(
            "the model already has peft adapters: estimate it as it is (without lora= / qlora=)"
        )
    peft = _import("peft")
    copy = loads(dumps(model))  # shapes only, on the meta device
    if adapters.qlora is not None:
        quantise_linears(copy, dict(adapters.qlora), parse_dtype(dtype) if dtype else None)
    config = dict(adapters.lora)
    if isinstance(config.get("target_modules"), tuple):
        config["target_modules"] = list(config["target_modules"])
    try:
        lora_config = peft.LoraConfig(**config)
        wrapped: nn.Module = peft.get_peft_model(copy, lora_config)
    except (TypeError, ValueError) as error:
        raise EstimateError(f"peft cannot add these LoRA adapters: {error}") from None
    return wrapped


def quantise_linears(model: nn.Module, base: dict[str, Any], dtype: torch.dtype | None) -> int:
    """Make every plain ``nn.Linear`` of a meta-device ``model`` a bitsandbytes ``Linear4bit``
    but its output layer (kept in full precision, as transformers' 4-bit loading keeps
    ``lm_head``), quantised on the meta device. Returns how many were replaced."""
    bnb = _import("bitsandbytes")
    outputs = getattr(model, "get_output_embeddings", None)
    output = outputs() if callable(outputs) else None
    replaced = 0
    with _meta_code_tables(bnb):
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is not nn.Linear or child is output:
                    continue
                setattr(parent, name, _linear4bit(bnb, child, base, dtype))
                replaced += 1
    if not replaced:
        raise EstimateError("qlora: the model has no nn.Linear layers to quantise")
    return replaced


@contextlib.contextmanager
def _meta_code_tables(bnb: Any) -> Iterator[None]:
    """Inside, bitsandbytes' cached quantisation map (``name2qmap``, made on the device of its
    first use and reused by every later quantisation) is a meta one, and afterwards what it
    was: a real model quantised later in this process must not find a meta map there."""
    tables: dict[str, Any] = bnb.functional.name2qmap
    saved = dict(tables)
    tables["dynamic"] = bnb.functional.create_dynamic_map().to("meta")
    try:
        yield
    finally:
        tables.clear()
        tables.update(saved)


def _linear4bit(bnb: Any, linear: nn.Linear, base: dict[str, Any],
                dtype: torch.dtype | None) -> nn.Module:  # fmt: skip
    """``linear`` as a 4-bit layer whose weight bitsandbytes quantised on the meta device."""
    weight_dtype = dtype or linear.weight.dtype
    compute = base["compute_dtype"]
    compute_dtype = parse_dtype(compute) if isinstance(compute, str) else compute or weight_dtype
    layer: nn.Module = bnb.nn.Linear4bit(
        linear.in_features, linear.out_features, bias=linear.bias is not None,
        compute_dtype=compute_dtype, compress_statistics=base["double_quant"],
        quant_type=base["quant_type"], device="meta",
    )  # fmt: skip
    weight = torch.empty(linear.weight.shape, dtype=weight_dtype, device="meta")
    layer.weight = bnb.nn.Params4bit(
        weight, requires_grad=False, compress_statistics=base["double_quant"],
        quant_type=base["quant_type"], module=layer,
    )._quantize("meta")  # fmt: skip
    if linear.bias is not None:
        layer.bias = nn.Parameter(torch.empty_like(linear.bias, dtype=weight_dtype),
                                  requires_grad=False)  # fmt: skip
    return layer


def table_adapters(model: nn.Module) -> list[Adapters]:
    """The LoRA and QLoRA what-ifs of the what-if table, for a transformers model whose layers
    peft knows (its default target modules for that architecture); none for other models:
    which layers would get adapters is the user's choice there (``lora=dict(...)``)."""
    if is_peft_model(model):
        return []
    try:
        constants = importlib.import_module("peft.utils.constants")
    except Exception:  # noqa: BLE001 - no peft: no adapter rows
        return []
    kind = getattr(getattr(model, "config", None), "model_type", None)
    targets = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(kind)
    if not targets:
        return []
    lora = (("r", TABLE_RANK), ("target_modules", tuple(targets)))
    rows = [Adapters(lora)]
    if importlib.util.find_spec("bitsandbytes") is not None:
        rows.append(Adapters(lora, tuple(sorted(QLORA_DEFAULTS.items()))))
    return rows
