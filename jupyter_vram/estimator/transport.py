"""Send a model to the estimator process without its data.

A fake-tensor run needs the model's structure, code and tensor shapes, never its values. The
pickler below writes every tensor as a small descriptor (shape, stride, dtype, parameter or
not), so a 7B-parameter model on the meta device, on the CPU or on a GPU travels in kilobytes;
cloudpickle carries classes and functions defined in the notebook (``__main__``) by value.
On the other side tensors come back on the meta device, costing no memory, and each run swaps
them for fake tensors (:class:`TensorSlots`).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import torch
from torch import nn

_TAG = "jupyter_vram.tensor"


@dataclass(frozen=True)
class TensorDescriptor:
    """What a fake run needs to know about one tensor."""

    key: int  # the same tensor object (tied weights) gets the same key
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    parameter: bool

    def meta(self) -> torch.Tensor:
        tensor = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="meta")
        if self.parameter:
            return nn.Parameter(tensor, requires_grad=self.requires_grad)
        return tensor.requires_grad_(self.requires_grad) if self.requires_grad else tensor


def describe(tensor: torch.Tensor, key: int) -> TensorDescriptor:
    return TensorDescriptor(
        key=key,
        shape=tuple(tensor.shape),
        stride=tuple(tensor.stride()),
        dtype=tensor.dtype,
        requires_grad=tensor.requires_grad and tensor.is_leaf,
        parameter=isinstance(tensor, nn.Parameter),
    )


class _DescriptorPickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, with tensors written as descriptors (their data never leaves)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._keys: dict[int, int] = {}
        self._pinned: list[torch.Tensor] = []  # ids stay unique while pickling

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return None
        key = self._keys.get(id(obj))
        if key is None:
            key = self._keys[id(obj)] = len(self._keys)
            self._pinned.append(obj)
        return (_TAG, describe(obj, key))


class _MetaUnpickler(pickle.Unpickler):
    """Rebuild descriptors as meta tensors, one object per key (so ties survive)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self._made: dict[int, torch.Tensor] = {}

    def persistent_load(self, pid: Any) -> Any:
        tag, descriptor = pid
        if tag != _TAG:
            raise pickle.UnpicklingError(f"unknown persistent id {tag!r}")
        made = self._made.get(descriptor.key)
        if made is None:
            made = self._made[descriptor.key] = descriptor.meta()
        return made


def dumps(obj: Any) -> bytes:
    """Pickle ``obj`` with every tensor replaced by its descriptor."""
    buffer = io.BytesIO()
    _DescriptorPickler(buffer).dump(obj)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    """The inverse of :func:`dumps`, with tensors on the meta device."""
    return _MetaUnpickler(io.BytesIO(data)).load()


@dataclass
class _Slot:
    owner: Any
    table: str | None  # "_parameters" / "_buffers", or None for a plain attribute
    name: str
    descriptor: TensorDescriptor


class TensorSlots:
    """Every place a module keeps a tensor, so each run can put fresh fake tensors there.

    Taking the slots empties them (None): the meta tensors the model arrived with are dropped,
    so a recorder's scan of live tensors finds only what a run made.
    """

    def __init__(self, model: nn.Module) -> None:
        keys: dict[int, int] = {}
        self._slots: list[_Slot] = []
        for owner, table, name, tensor in _find_tensors(model):
            key = keys.setdefault(id(tensor), len(keys))
            self._slots.append(_Slot(owner, table, name, describe(tensor, key)))
        self._put(lambda descriptor: None)

    def fill(self, make: Callable[[TensorDescriptor], torch.Tensor]) -> None:
        """Put ``make(descriptor)`` in every slot; one call per distinct tensor (ties kept)."""
        made: dict[int, torch.Tensor] = {}

        def once(descriptor: TensorDescriptor) -> torch.Tensor:
            tensor = made.get(descriptor.key)
            if tensor is None:
                tensor = made[descriptor.key] = make(descriptor)
            return tensor

        self._put(once)

    def clear(self) -> None:
        """Empty every slot, so nothing of a finished run stays referenced."""
        self._put(lambda descriptor: None)

    def _put(self, make: Callable[[TensorDescriptor], torch.Tensor | None]) -> None:
        for slot in self._slots:
            value = make(slot.descriptor)
            if slot.table is None:
                object.__setattr__(slot.owner, slot.name, value)
            else:
                getattr(slot.owner, slot.table)[slot.name] = value

    def descriptors(self) -> list[TensorDescriptor]:
        """One descriptor per distinct tensor."""
        return list({slot.descriptor.key: slot.descriptor for slot in self._slots}.values())

    def __len__(self) -> int:
        return len(self._slots)


def _find_tensors(model: nn.Module) -> Iterator[tuple[Any, str | None, str, torch.Tensor]]:
    for module in model.modules():
        for table in ("_parameters", "_buffers"):
            for name, tensor in getattr(module, table).items():
                if tensor is not None:
                    yield module, table, name, tensor
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor):
                yield module, None, name, value
