"""What a ``torch.OutOfMemoryError`` leaves behind to explain it.

Collected while the error is fresh, as plain data (no tensor, frame or exception is kept): the
request that failed, the line of user code that made it, and on CUDA the caching allocator's
state. The CUDA allocator reports each OOM to observers registered with the private
``torch._C._cuda_attach_out_of_memory_observer``; an observer cannot be removed again, so one
is attached per process, the first time a CUDA recording starts, and it forwards to the
recording running then (when none is, it does nothing).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import torch

from .._units import BYTE_UNITS
from .capacity import CapacityFailure
from .stacks import FrameFilter, cell_name
from .tagging import reachable_objects

_lock = threading.Lock()
_attached = False
_listener: OomWatch | None = None

_TRIED = re.compile(r"Tried to allocate ([0-9.]+) ?([KMGT]i?B|B|bytes)", re.IGNORECASE)


def _observer(device: int, alloc_size: int, limit: int, device_free: int) -> None:
    """Called by the CUDA caching allocator on each OOM (on the thread that asked), with the
    segment it tried to get (``get_allocation_size`` of the request, not the request), the
    limit (the fraction's bytes when one is set, else the device total) and what the device
    had free."""
    watch = _listener
    if watch is not None:
        watch.observed.append(
            {
                "device": int(device),
                "segment": int(alloc_size),
                "limit": int(limit),
                "device_free": int(device_free),
                "time_ns": time.time_ns(),
            }
        )


def _attach_observer() -> bool:
    global _attached
    with _lock:
        if not _attached:
            attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
            if attach is None:
                return False
            attach(_observer)
            _attached = True
    return True


class OomWatch:
    """Listens for the allocator's OOM reports while one recording runs (CUDA)."""

    def __init__(self, device: str, namespace: Mapping[str, Any] | None = None) -> None:
        self.device = torch.device(device)
        self.namespace = namespace
        self.observed: list[dict[str, int]] = []
        self.observer = False

    def start(self) -> None:
        global _listener
        if self.device.type == "cuda" and torch.cuda.is_available():
            self.observer = _attach_observer()
            _listener = self

    def stop(self) -> None:
        global _listener
        if _listener is self:
            _listener = None

    def facts(
        self,
        error: BaseException,
        failure: CapacityFailure | None = None,
        capacity: int | None = None,
        trace_ooms: Any = None,
    ) -> dict[str, Any]:
        """The post-mortem's raw facts (JSON-ready) for ``error``; never raises.

        On CUDA the request and the segment are two numbers: ``malloc()`` in
        c10/cuda/CUDACachingAllocator.cpp gives the observer (and "Tried to allocate") the
        segment it tried to get, ``get_allocation_size(size)`` (a 4 KiB request asks for a
        2 MiB segment, 3 MiB for 20 MiB), and records the request itself, rounded to 512 B,
        in the trace's ``oom`` entry (``trace_ooms``: the profile's ``meta["oom"]``).
        ``requested_bytes`` is the trace's request (None without one), ``segment_bytes`` the
        segment.
        """
        facts: dict[str, Any] = {"message": str(error)[:2000], "capacity_bytes": capacity}
        if failure is not None:
            facts.update(
                source="capacity",
                requested_bytes=failure.requested_bytes,
                in_use_bytes=failure.in_use_bytes,
                capacity_bytes=failure.capacity_bytes,
                op=failure.op,
            )
        else:
            facts.update(self._cuda_facts(str(error), trace_ooms))
        if self.device.type == "cuda":
            with contextlib.suppress(Exception):  # a nicety: never lose the post-mortem
                facts["allocator"] = cuda_allocator_state(self.device)
            _reachable_capacity(facts)
        facts["site"] = user_site(error.__traceback__)
        facts["optimizers"] = optimizer_types(self.namespace)
        facts["leading_dims"] = leading_dims(self.namespace, self.device.type)
        return facts

    def _cuda_facts(self, message: str, trace_ooms: Any) -> dict[str, Any]:
        """The request from the trace, the segment from the observer (else the message)."""
        last = trace_ooms[-1] if isinstance(trace_ooms, list) and trace_ooms else None
        size = last.get("size") if isinstance(last, dict) else None
        facts: dict[str, Any] = {"requested_bytes": int(size) if isinstance(size, int) else None}
        if self.observed:
            seen = self.observed[-1]
            facts.update(
                source="cuda",
                segment_bytes=seen["segment"],
                capacity_bytes=seen["limit"],
                device_free_bytes=seen["device_free"],
            )
        else:
            facts.update(source="error message", segment_bytes=requested_in_message(message))
        return facts


def _reachable_capacity(facts: dict[str, Any]) -> None:
    """On CUDA the observer's limit is the device total when no fraction is set, though the
    CUDA context and other processes hold part of it: the capacity is at most what this
    process's allocator could reach, its reserved memory plus what the device had free."""
    state = facts.get("allocator")
    limit = facts.get("capacity_bytes")
    if facts.get("source") != "cuda" or not isinstance(state, dict):
        return
    free = facts.get("device_free_bytes") or state.get("device_free") or 0
    reach = int(state.get("reserved", 0)) + int(free)
    if isinstance(limit, int) and limit > reach:
        facts["device_limit_bytes"] = limit
        facts["capacity_bytes"] = reach


def requested_in_message(message: str) -> int | None:
    """Bytes from CUDA's ``Tried to allocate 20.00 MiB`` (rounded as the message is): the
    segment the allocator tried to get, not the request."""
    match = _TRIED.search(message)
    if match is None:
        return None
    return int(float(match.group(1)) * BYTE_UNITS.get(match.group(2).lower(), 1))


def cuda_allocator_state(device: torch.device) -> dict[str, int]:
    """Allocated, reserved and cached-but-free bytes right after the failure."""
    stats = torch.cuda.memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    return {
        "allocated": int(stats.get("allocated_bytes.all.current", 0)),
        "reserved": int(stats.get("reserved_bytes.all.current", 0)),
        "inactive_split": int(stats.get("inactive_split_bytes.all.current", 0)),
        "device_free": int(free),
        "device_total": int(total),
        "num_ooms": int(stats.get("num_ooms", 0)),
    }


def optimizer_types(namespace: Mapping[str, Any] | None) -> list[str]:
    """Class names of the optimizers the notebook holds (their state is what a leaner one
    saves); never raises."""
    try:
        _, _, optimizers = reachable_objects(namespace)
    except Exception:  # noqa: BLE001
        return []
    return sorted({type(opt).__name__ for opt in optimizers})


def leading_dims(
    namespace: Mapping[str, Any] | None, device_type: str, limit: int = 256
) -> list[list[int]]:
    """``[storage bytes, first dim]`` of the plain tensors the notebook names on the device
    (not parameters): the post-mortem reads the batch size off the ones that were the run's
    inputs (``analysis.oom``). Distinct pairs, at most ``limit``; never raises."""
    try:
        tensors, _, _ = reachable_objects(namespace)
    except Exception:  # noqa: BLE001
        return []
    found: dict[tuple[int, int], None] = {}
    for tensor in tensors:
        if len(found) >= limit:
            break
        with contextlib.suppress(Exception):
            if (
                isinstance(tensor, torch.nn.Parameter)
                or tensor.device.type != device_type
                or tensor.layout != torch.strided
                or tensor.dim() == 0
            ):
                continue
            found[(int(tensor.untyped_storage().nbytes()), int(tensor.shape[0]))] = None
    return [list(pair) for pair in found]


def user_site(tb: TracebackType | None) -> list[Any] | None:
    """``[file, line, function]`` of the innermost frame of user code in a traceback (the
    cell's ``In[n]``), read from code objects only: no frame's locals are touched."""
    keep = FrameFilter().keep
    site = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if keep(code.co_filename):
            site = [cell_name(code.co_filename), int(tb.tb_lineno), code.co_name]
        tb = tb.tb_next
    return site
