"""Send a model to the estimator process without its data.

A fake-tensor run needs the model's structure, code and tensor shapes, never its values. The
pickler below writes every tensor as a small descriptor (shape, stride, dtype, parameter or
not), so a 7B-parameter model on the meta device, on the CPU or on a GPU travels in kilobytes;
cloudpickle carries classes and functions defined in the notebook (``__main__``) by value.
On the other side tensors come back on the meta device, costing no memory, and each run swaps
them for fake tensors (:class:`TensorSlots`).

Other data travels as shapes too: a numpy array of at least :data:`LARGE_BYTES` comes back as
a read-only array of zeros of its shape and dtype that takes no memory (a broadcast view of
one element), and a large bytes / bytearray / array.array comes back zero-filled, so a model
holding a 400 MB table costs the job a few bytes, not 400 MB per estimate kept.
"""

from __future__ import annotations

import array
import io
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import cloudpickle
import numpy as np
import torch
from torch import nn

_TAG = "jupyter_vram.tensor"
_ARRAY_TAG = "jupyter_vram.ndarray"
_BUFFER_TAG = "jupyter_vram.buffer"

#: Arrays and buffers from this size on travel as shapes; smaller ones (constants, lookup
#: tables a forward may read) travel with their values.
LARGE_BYTES = 1 << 20


@dataclass(frozen=True)
class TensorDescriptor:
    """What a fake run needs to know about one tensor."""

    key: int  # the same tensor object (tied weights) gets the same key
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    parameter: bool
    #: a parameter subclass (bitsandbytes' ``Params4bit``) and its own attributes (its
    #: ``quant_state``, ``blocksize``, ...), set again on every copy: quantised layers read them
    subclass: type | None = None
    attributes: tuple[tuple[str, Any], ...] = ()
    #: whether a run in another float dtype (``dtype=``) casts it: not a parameter's own state
    #: (a QuantState's absmax and code tables keep their dtype, as bitsandbytes needs them)
    castable: bool = True

    def meta(self) -> torch.Tensor:
        tensor = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="meta")
        if self.parameter and self.subclass is not None:
            # the class without its constructor (which may quantise or check devices)
            made: torch.Tensor = torch.Tensor._make_subclass(
                self.subclass, tensor, self.requires_grad
            )
            return self.dress(made)
        if self.parameter:
            return nn.Parameter(tensor, requires_grad=self.requires_grad)
        return tensor.requires_grad_(self.requires_grad) if self.requires_grad else tensor

    def dress(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` with the described parameter's attributes (the same objects)."""
        if self.attributes:
            tensor.__dict__.update(self.attributes)
        return tensor


def describe(tensor: torch.Tensor, key: int) -> TensorDescriptor:
    cls = type(tensor)
    # a parameter subclass's state travels with it (not a fake run's own tensors: a fake
    # parameter is a FakeTensor, whose attributes are the fake mode's)
    subclass = cls if cls is not nn.Parameter and issubclass(cls, nn.Parameter) else None
    return TensorDescriptor(
        key=key,
        shape=tuple(tensor.shape),
        stride=tuple(tensor.stride()),
        dtype=tensor.dtype,
        requires_grad=tensor.requires_grad and tensor.is_leaf,
        parameter=isinstance(tensor, nn.Parameter),
        subclass=subclass,
        attributes=_parameter_attributes(tensor) if subclass is not None else (),
    )


def _parameter_attributes(tensor: torch.Tensor) -> tuple[tuple[str, Any], ...]:
    """What a parameter keeps in its instance dict (read without running its class's code):
    bitsandbytes' ``Params4bit`` / ``Int8Params`` hold their quantisation state there, and
    the fake run's layers need it; a plain parameter holds nothing or plain flags."""
    try:
        attrs = object.__getattribute__(tensor, "__dict__")
    except Exception:  # noqa: BLE001 - no instance dict
        return ()
    if type(attrs) is not dict:
        return ()
    return tuple((str(k), v) for k, v in attrs.items() if not str(k).startswith("__"))


class _DescriptorPickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, with tensors written as descriptors (their data never leaves)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._keys: dict[int, int] = {}
        self._pinned: list[torch.Tensor] = []  # ids stay unique while pickling

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return _data_id(obj)
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
        if tag == _ARRAY_TAG:
            shape, dtype = descriptor
            return np.broadcast_to(np.zeros((), dtype=np.dtype(dtype)), shape)
        if tag == _BUFFER_TAG:
            kind, size, typecode = descriptor
            if kind == "array":
                return array.array(typecode, bytes(size))
            return bytearray(size) if kind == "bytearray" else bytes(size)
        if tag != _TAG:
            raise pickle.UnpicklingError(f"unknown persistent id {tag!r}")
        made = self._made.get(descriptor.key)
        if made is None:
            made = self._made[descriptor.key] = descriptor.meta()
        return made


def _data_id(obj: Any) -> Any:
    """A descriptor for a large numpy array or buffer (None: pickle it as usual)."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject or obj.nbytes < LARGE_BYTES:
            return None
        return (_ARRAY_TAG, (tuple(obj.shape), obj.dtype.str))
    if isinstance(obj, (bytes, bytearray)) and len(obj) >= LARGE_BYTES:
        return (_BUFFER_TAG, (type(obj).__name__, len(obj), ""))
    if isinstance(obj, array.array) and obj.itemsize * len(obj) >= LARGE_BYTES:
        return (_BUFFER_TAG, ("array", obj.itemsize * len(obj), obj.typecode))
    return None


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
            descriptor = describe(tensor, key)
            if isinstance(owner, _ParameterState):
                owner, descriptor = owner.holder, replace(descriptor, castable=False)
            self._slots.append(_Slot(owner, table, name, descriptor))
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

    def holding(self) -> list[torch.Tensor | None]:
        """What each slot holds now (a run may have replaced or dropped a tensor)."""
        return [
            vars(slot.owner).get(slot.name)
            if slot.table is None
            else getattr(slot.owner, slot.table).get(slot.name)
            for slot in self._slots
        ]

    def slot_descriptors(self) -> list[TensorDescriptor]:
        """The descriptor of each slot, in the order of :meth:`holding`."""
        return [slot.descriptor for slot in self._slots]

    def descriptors(self) -> list[TensorDescriptor]:
        """One descriptor per distinct tensor."""
        return list({slot.descriptor.key: slot.descriptor for slot in self._slots}.values())

    def __len__(self) -> int:
        return len(self._slots)


def _find_tensors(model: nn.Module) -> Iterator[tuple[Any, str | None, str, torch.Tensor]]:
    seen: set[int] = set()
    for module in model.modules():
        for table in ("_parameters", "_buffers"):
            for name, tensor in getattr(module, table).items():
                if tensor is not None:
                    yield module, table, name, tensor
                    if table == "_parameters":
                        yield from _state_slots(dict(describe(tensor, 0).attributes), seen)
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor):
                yield module, None, name, value


@dataclass(frozen=True)
class _ParameterState:
    """Marks a slot found in a parameter's own state object (``holder``), not in a module."""

    holder: Any


#: how deep a parameter's state objects are looked into (a QuantState's nested ``state2``)
_STATE_DEPTH = 3


def _state_slots(
    attrs: dict[str, Any], seen: set[int], depth: int = 0
) -> Iterator[tuple[Any, str | None, str, torch.Tensor]]:
    """Tensors kept in plain objects a parameter holds (a bitsandbytes QuantState's absmax
    and code tables), as slots of those objects: each run fills them with fake tensors."""
    for value in attrs.values():
        if id(value) in seen or isinstance(value, (torch.Tensor, nn.Module, type)):
            continue
        try:
            inner = object.__getattribute__(value, "__dict__")
        except Exception:  # noqa: BLE001 - no instance dict: holds no slot
            continue
        if type(inner) is not dict or type(value).__module__.split(".")[0] == "torch":
            continue
        seen.add(id(value))
        for name, item in inner.items():
            if isinstance(item, torch.Tensor):
                yield _ParameterState(value), None, name, item
        if depth < _STATE_DEPTH:
            yield from _state_slots(inner, seen, depth + 1)
