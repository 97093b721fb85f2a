"""A memory capacity to test a cell against: ``%%vram --capacity 6GiB`` / ``jv.record(capacity=)``.

On CUDA the caching allocator enforces it (``torch.cuda.set_per_process_memory_fraction``,
restored afterwards, with the cache emptied first: see :class:`CudaCapacity`) and raises its
own ``torch.OutOfMemoryError``.

The CPU allocator has no limit to set, so a :class:`CapacityGuard` (a dispatch mode, entered
only when a capacity is asked for) counts live bytes: the storages the namespace held when it
started, plus every new storage an op returns, minus each one when its memory is released (a
weakref on the storage). When an op's new outputs would take live bytes past the capacity, they
are dropped and ``torch.OutOfMemoryError`` is raised, worded like CUDA's. What this changes:

* a dispatch mode runs Python around every op and makes autograd accumulate gradients out of
  place, so a capacity run may differ slightly from a normal one (the default recording has
  no mode: see the observer-effect tests);
* the op runs before its outputs are counted, so real memory passes the capacity by one op's
  outputs for an instant; buffers an op makes and frees inside itself (workspaces) are not
  counted, nor memory no notebook variable reaches when the guard starts.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .._model import MAX_BYTES
from .._units import BYTE_UNITS
from .tagging import (
    bare_storages,
    device_test,
    one_scan,
    reachable_objects,
    storages_of,
    storages_on,
)

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
#: The largest capacity taken (1 PiB, what a saved profile holds at most): no device is larger.
MAX_CAPACITY = MAX_BYTES


def parse_capacity(value: int | float | str) -> int:
    """Bytes from ``6GiB``, ``6GB`` (10^9), ``512MiB``, ``1.5 GiB``, ``1PB`` or plain bytes,
    exactly (a number of any length, no float rounding); a ValueError that says what is
    accepted otherwise, or that the size is past :data:`MAX_CAPACITY`."""
    accepted = "a size such as 6GiB, 6GB, 512MiB or a number of bytes"
    shown = _shown(value)
    if isinstance(value, bool):
        raise ValueError(f"capacity {shown} is not {accepted}")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"capacity {shown} must be a positive size ({accepted})")
        nbytes = Fraction(value)
    elif isinstance(value, str):
        match = _SIZE.match(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in BYTE_UNITS:
            raise ValueError(f"capacity {shown} is not {accepted}")
        whole = match.group(1).split(".")[0].lstrip("0")
        if len(whole) > 24:  # past any unit's petabytes, and Fraction's digit limit
            nbytes = Fraction(MAX_CAPACITY + 1)
        else:
            try:
                nbytes = Fraction(match.group(1)) * BYTE_UNITS[unit]
            except ValueError:  # thousands of decimals
                raise ValueError(f"capacity {shown} is not {accepted}") from None
    else:
        raise ValueError(f"capacity {shown} is not {accepted}")
    if nbytes > MAX_CAPACITY:
        raise ValueError(
            f"capacity {shown} is more than any device holds (at most 1 PiB, "
            f"{MAX_CAPACITY:,} bytes)"
        )
    if int(nbytes) <= 0:
        raise ValueError(f"capacity {shown} must be a positive size ({accepted})")
    return int(nbytes)


def _shown(value: object) -> str:
    """A value as an error message shows it: short, even for a number of 400 digits."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def out_of_memory_message(requested: int, capacity: int, in_use: int, op: str) -> str:
    """Worded like the CUDA allocator's error, so code that reads it behaves the same."""
    from .._units import format_bytes

    return (
        f"Out of memory (jupyter_vram capacity). Tried to allocate {format_bytes(requested)} "
        f"({requested:,} bytes, in {op}); capacity {format_bytes(capacity)} "
        f"({capacity:,} bytes), {format_bytes(in_use)} ({in_use:,} bytes) already in use."
    )


@dataclass(frozen=True)
class CapacityFailure:
    """The request that did not fit, as the guard saw it."""

    requested_bytes: int
    in_use_bytes: int
    capacity_bytes: int
    op: str
    time_ns: int  # time.time_ns() when it was refused
    #: bytes of each new storage the op made (the refused one at ``refused_index``); the guard
    #: drops them all, and the refused one and those after it were never counted
    output_bytes: tuple[int, ...] = ()
    refused_index: int = 0


def held_storages(
    namespace: Mapping[str, Any] | None,
    device_type: str,
    skip: Collection[int] = (),
    limit: int | None = None,
) -> list[Any]:
    """Distinct storages on ``device_type`` the namespace reaches: tensors, and the
    parameters, buffers, gradients and optimizer state of its modules and optimizers (not
    through the objects whose id is in ``skip``); of the namespace's bare tensors, the first
    ``limit`` (the state of modules and optimizers always)."""
    with one_scan():  # the bare tensors' storages below read the same walk
        return _held_storages(namespace, device_type, skip, limit)


def _held_storages(
    namespace: Mapping[str, Any] | None,
    device_type: str,
    skip: Collection[int],
    limit: int | None,
) -> list[Any]:
    tensors, modules, optimizers = reachable_objects(namespace, skip=skip)
    found: dict[int, Any] = {}
    on_device = device_test(device_type)

    def add(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            for storage in storages_on(value, device_type, on_device):
                if storage.nbytes():
                    found.setdefault(storage._cdata, storage)

    for module in modules:
        with contextlib.suppress(Exception):
            for p in module.parameters():
                add(p)
                add(p.grad)
            for b in module.buffers():
                add(b)
    for opt in optimizers:
        with contextlib.suppress(Exception):
            for state in opt.state.values():
                for value in state.values():
                    add(value)
    bare = tensors[:limit]
    if not skip and bare:  # read once while a recording starts (see bare_storages)
        held = bare_storages(namespace, device_type)
        upto = held.entries_of_first(len(bare))
        entries = zip(held.keys[:upto], held.storages[:upto], held.sizes[:upto], strict=True)
        for key, storage, size in entries:
            if size:
                found.setdefault(key, storage)
        bare = bare[len(held.ends) :]
    for tensor in bare:
        add(tensor)
    return list(found.values())


class CapacityGuard(TorchDispatchMode):
    """Counts live bytes on one device and refuses the op output that would pass ``capacity``.

    Bookkeeping never raises; only the capacity check does, with the outputs already dropped
    (a traceback keeps this frame's locals alive, and must not keep them).
    """

    def __init__(self, capacity: int, device_type: str = "cpu") -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.capacity = capacity
        self.device_type = device_type
        self.live_bytes = 0
        self.held_before_bytes = 0
        self.failure: CapacityFailure | None = None
        self._live: dict[int, weakref.ref[Any]] = {}
        self._foreign: set[int] = set()  # storages that existed, uncounted, before the guard

    def count(self, storages: list[Any]) -> None:
        """Count storages that exist now (memory held before the guard starts)."""
        for storage in storages:
            n = self._track(storage)
            self.held_before_bytes += n
            self.live_bytes += n

    def _track(self, storage: Any) -> int:
        key = storage._cdata
        if key in self._live:
            return 0
        n = int(storage.nbytes())
        self._live[key] = weakref.ref(storage, self._released(key, n))
        return n

    def _released(self, key: int, n: int) -> Callable[[Any], None]:
        def callback(_: Any) -> None:
            if self._live.pop(key, None) is not None:
                self.live_bytes -= n

        return callback

    def close(self) -> None:
        """Stop counting: dropping the weakrefs cancels their callbacks."""
        self._live.clear()
        self._foreign.clear()

    def _new_storages(self, out: Any, args: Any, kwargs: Any) -> list[Any]:
        new: dict[int, Any] = {}
        inputs: set[int] | None = None
        for leaf in tree_leaves(out):
            if not isinstance(leaf, torch.Tensor):
                continue
            for storage in storages_of(leaf):
                key = storage._cdata
                if key in self._live or key in self._foreign or key in new:
                    continue
                if storage.device.type != self.device_type or not storage.nbytes():
                    continue
                if inputs is None:
                    inputs = {
                        s._cdata
                        for t in tree_leaves((args, kwargs))
                        if isinstance(t, torch.Tensor)
                        for s in storages_of(t)
                    }
                if key in inputs:  # a view or in-place result of memory nobody counted
                    self._foreign.add(key)
                    continue
                new[key] = storage
        return list(new.values())

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of the user's traceback
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            new = self._new_storages(out, args, kwargs)
        except Exception:  # noqa: BLE001 - never raise from bookkeeping
            return out
        pending = 0
        for index, storage in enumerate(new):
            n = int(storage.nbytes())
            if self.live_bytes + pending + n > self.capacity:
                in_use = self.live_bytes + pending
                op = getattr(getattr(func, "_overloadpacket", None), "__name__", str(func))
                sizes = tuple(int(s.nbytes()) for s in new)
                self.failure = CapacityFailure(
                    n, in_use, self.capacity, op, time.time_ns(), sizes, index
                )
                # the caller's traceback keeps this frame: it must not keep tensors alive
                del out, new, storage
                args, kwargs = (), {}
                raise torch.OutOfMemoryError(
                    out_of_memory_message(n, self.capacity, in_use, f"aten::{op}")
                )
            pending += n
        for storage in new:
            with contextlib.suppress(Exception):
                self.live_bytes += self._track(storage)
        return out


class CudaCapacity:
    """``set_per_process_memory_fraction`` for the length of a recording, then the previous
    fraction back.

    PyTorch checks the fraction only when it needs a new segment (``alloc_block`` in
    c10/cuda/CUDACachingAllocator.cpp): blocks it already caches are handed out without the
    check, so after a big cell a small capacity would let a big step run out of the cache.
    The cache is emptied first (``empty_cache``: every segment without a live block goes
    back), so what the step needs beyond the segments live tensors hold goes through the
    check. A GPU of the capacity's size would also hold this process's CUDA context and the
    library memory outside the allocator: where NVML reports this process's usage, that part
    (usage less reserved) comes off the fraction. ``facts``: what was done, for the header.
    """

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self.device = device
        self._previous: float | None = None
        self.facts: dict[str, Any] = {}

    def start(self) -> None:
        from .._units import format_bytes

        index = self.device.index if self.device.index is not None else 0
        total = int(torch.cuda.get_device_properties(index).total_memory)
        if self.capacity > total:
            raise ValueError(
                f"capacity {format_bytes(self.capacity)} is more than this device has "
                f"({format_bytes(total)})"
            )
        torch.cuda.empty_cache()
        reserved = int(torch.cuda.memory_reserved(index))
        outside = outside_allocator(index, reserved)
        allowed = self.capacity - (outside or 0)
        if allowed < reserved:
            raise ValueError(
                f"capacity {format_bytes(self.capacity)} is less than this process already "
                f"holds on the device: {format_bytes(reserved)} reserved by live tensors "
                f"(after emptying the cache) and {format_bytes(outside or 0)} outside the "
                "allocator (CUDA context, library workspaces)"
            )
        getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        self._previous = float(getter(index)) if getter is not None else 1.0
        torch.cuda.set_per_process_memory_fraction(allowed / total, index)
        self.facts = {"bytes": self.capacity, "allocator_limit": allowed,
                      "reserved_at_start": reserved, "outside_allocator": outside,
                      "cache_emptied": True}  # fmt: skip

    def stop(self) -> None:
        if self._previous is not None:
            index = self.device.index if self.device.index is not None else 0
            torch.cuda.set_per_process_memory_fraction(self._previous, index)
            self._previous = None


def outside_allocator(index: int, reserved: int) -> int | None:
    """Bytes this process holds on device ``index`` outside the caching allocator (CUDA
    context, cuDNN / NCCL buffers): NVML's usage of this process less ``reserved``; None
    where NVML does not report it."""
    from .nvml import device_memory

    info = device_memory(index)
    if info is None or "process_used" not in info:
        return None
    return max(0, int(info["process_used"]) - reserved)


class CapacityLimit:
    """The capacity of one recording, on whichever device it records."""

    def __init__(self, capacity: int, device: str) -> None:
        self.capacity = capacity
        self.device = torch.device(device)
        self.guard: CapacityGuard | None = None
        self._cuda: CudaCapacity | None = None

    def start(self, namespace: Mapping[str, Any] | None) -> None:
        if self.device.type == "cuda":
            self._cuda = CudaCapacity(self.capacity, self.device)
            self._cuda.start()
            return
        guard = CapacityGuard(self.capacity, self.device.type)
        guard.count(held_storages(namespace, self.device.type))
        guard.__enter__()  # type: ignore[no-untyped-call]
        self.guard = guard

    def stop(self) -> None:
        """Switch the limit off (always both parts, even if one fails)."""
        try:
            if self.guard is not None:
                with contextlib.suppress(Exception):
                    self.guard.__exit__(None, None, None)  # type: ignore[no-untyped-call]
                self.guard.close()
        finally:
            if self._cuda is not None:
                self._cuda.stop()

    @property
    def failure(self) -> CapacityFailure | None:
        return self.guard.failure if self.guard is not None else None

    @property
    def facts(self) -> dict[str, Any]:
        """How a CUDA capacity was applied (:class:`CudaCapacity`); empty on the CPU."""
        return self._cuda.facts if self._cuda is not None else {}
