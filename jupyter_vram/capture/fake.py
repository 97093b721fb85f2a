"""Fake tensors (torch's FakeTensorMode): a training step's shapes and memory, no data.

The estimator's only contact with torch's private fake-tensor machinery. A dispatch mode
stacked on FakeTensorMode that raises can abort the process (FACTS.md), so fake runs happen in
the estimator process, and our recorder's hooks never raise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


def fake_mode() -> FakeTensorMode:
    """A fresh fake-tensor mode: tensors made inside it have shapes, dtypes and no data."""
    return FakeTensorMode()


class _ScalarsReadAsOne(TorchDispatchMode):  # type: ignore[misc,no-untyped-call]
    """Answers ``.item()`` on fake tensors with 1 instead of failing.

    Optimizers read scalars (Adafactor's parameter norm, a grad scaler's inf check) only to
    scale values; what they allocate does not depend on the answer.
    """

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            tensor = args[0]
            if isinstance(tensor, fake_tensor.FakeTensor):
                if tensor.dtype.is_floating_point:
                    return 1.0
                return True if tensor.dtype == torch.bool else 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def scalars_read_as_one() -> Iterator[None]:
    """Within the block, a fake tensor's ``.item()`` returns 1 (see :class:`_ScalarsReadAsOne`)."""
    with _ScalarsReadAsOne():  # type: ignore[no-untyped-call]
        yield


def is_data_dependent(error: BaseException) -> bool:
    """The run needed a tensor's values (``.item()``, ``nonzero``), which fake tensors lack."""
    return isinstance(
        error,
        (fake_tensor.DataDependentOutputException, fake_tensor.DynamicOutputShapeException),
    )


def is_unsupported(error: BaseException) -> bool:
    """An operator without a fake implementation."""
    return isinstance(error, fake_tensor.UnsupportedOperatorException)


class _CudaAttention(TorchFunctionMode):
    """Runs ``scaled_dot_product_attention`` through the kernel CUDA would pick.

    On the CPU, attention with dropout falls back to the math path, which keeps the whole
    (batch, heads, seq, seq) probability matrix; on CUDA the flash and memory-efficient kernels
    handle dropout and masks in place and save only the output and a log-sum-exp. Their fake
    implementations run anywhere, so a CUDA estimate calls them directly. Anything they do not
    cover (grouped-query heads, odd head sizes) runs as the user wrote it.
    """

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = _cuda_attention(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _cuda_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """CUDA's choice between flash and memory-efficient attention, or None for "as written"."""
    same_heads = key.shape[:-2] == query.shape[:-2] == value.shape[:-2]
    if enable_gqa or query.dim() != 4 or not same_heads or query.shape[-1] % 8:
        return None
    half = query.dtype in (torch.float16, torch.bfloat16)
    aten = torch.ops.aten
    if half and attn_mask is None and query.shape[-1] <= 256:
        result = aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )
        return result[0]  # type: ignore[no-any-return]
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:  # CUDA turns a boolean mask into a bias
        bias = torch.zeros(bias.shape, dtype=query.dtype, device=bias.device).masked_fill(
            bias.logical_not(), float("-inf")
        )
    if bias is not None and bias.dim() == 4 and bias.shape[-1] % 16:
        return None  # CUDA pads such a bias first: leave these to the math path
    needs_grad = query.requires_grad or key.requires_grad or value.requires_grad
    result = aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, needs_grad and torch.is_grad_enabled(), dropout_p, is_causal,
        scale=scale,
    )  # fmt: skip
    return result[0]  # type: ignore[no-any-return]


@contextlib.contextmanager
def cuda_attention() -> Iterator[None]:
    """Within the block, attention runs through CUDA's kernels (see :class:`_CudaAttention`)."""
    with _CudaAttention():
        yield
