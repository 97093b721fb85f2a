"""Fake tensors (torch's FakeTensorMode): a training step's shapes and memory, no data.

The estimator's only contact with torch's private fake-tensor machinery. A dispatch mode
stacked on FakeTensorMode that raises can abort the process, so fake runs happen in
the estimator process, and our recorder's hooks never raise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map_only

T = TypeVar("T")


def fake_mode() -> FakeTensorMode:
    """A fresh fake-tensor mode: tensors made inside it have shapes, dtypes and no data."""
    return FakeTensorMode()


class _ScalarsReadAsOne(TorchDispatchMode):  # type: ignore[no-untyped-call]
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


@contextlib.contextmanager
def outside_fake_mode() -> Iterator[Callable[[T], T]]:
    """Within, tensors are real; yields the function that hands real tensors (in any nested
    containers) to the fake mode that was active, as constants. For tables a library computes
    from values (bitsandbytes' quantisation maps call ``.tolist()``), which fake tensors
    cannot give; their contents never change what is allocated. Without an active fake mode
    the function returns its argument."""
    mode = torch._guards.detect_fake_mode()
    if mode is None:
        yield lambda value: value
        return
    with _disable_current_modes():
        yield lambda value: tree_map_only(torch.Tensor, mode.from_tensor, value)
