"""CUDA recording from the caching allocator's own history (``_record_memory_history``).

The allocator logs every block it hands out and takes back, with Python stacks, at ~2 us per
event and without touching user code, so this is the exact record of device memory. Two things
are added on top of it, both cheap:

* every allocation is labelled ``"phase|module|op"`` (the history's *user metadata* field).
  By default the labels come from the torch profiler's reports of the same allocations
  (matched by address and order) and the module ranges our global hooks open: no Python runs
  per op, and autograd runs as it would unrecorded (measured on an H200: a dispatch mode
  around every op raised a three-headed model's true peak by 18.6 %, these labels by 0.0 %).
  ``labels="mode"`` sets the metadata from a dispatch mode before each op instead;
* the :class:`~.tagging.Tagger` reports roles (parameter, gradient, activation, ...) of live
  tensors; a role is a storage address, placed in the event order by a *marker*: a 1-byte
  allocation labelled ``"jv-marker|k"`` (filtered out of the profile).

At the end the final snapshot, the baseline snapshot taken at the start and the roles go to
:func:`~.cuda_convert.profile_from_snapshot`, which also recovers block sizes
(:mod:`.cuda_allocator`). Every private torch API used for CUDA recording lives in this file
(:class:`_CudaApi`).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from types import FrameType
from typing import Any

import torch

from .._model import CATEGORIES, Profile
from ._common import RecordingError
from .builder import Interner, ProfileBuilder
from .cuda_convert import (
    MARKER_FALLBACK_BYTES,
    MARKER_PREFIX,
    SOURCE,
    Role,
    profile_from_snapshot,
)
from .modes import ObservingMode
from .profiler_chunks import ChunkedProfiler
from .profiler_read import AllocEvent, Reports
from .profiler_session import profiler_busy
from .row_addresses import note_addresses
from .tagging import Tagger, live_objects

__all__ = ["CudaSnapshotRecorder", "cuda_unavailable"]


def cuda_unavailable(index: int | None = None) -> str | None:
    """Why CUDA memory (device ``index``, None: the current one) cannot be recorded or read
    here; None when it can. One sentence, no trailing period (callers add their outcome)."""
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "no usable CUDA device"
        return (
            f"CUDA memory recording needs a CUDA device, and torch.cuda.is_available() is "
            f"False (torch {torch.__version__}: {build}); record on the CPU instead: "
            f"--device cpu, jv.record(device='cpu')"
        )
    count = int(torch.cuda.device_count())
    if index is not None and not 0 <= index < count:
        return f"cuda:{index} does not exist ({count} CUDA device{'s' if count != 1 else ''})"
    return None


#: Why a process on the cudaMallocAsync backend cannot be recorded: its allocator keeps no
#: history (``_record_memory_history`` raises there), and the backend is chosen once, when
#: CUDA starts.
ASYNC_BACKEND = (
    "CUDA memory recording reads the caching allocator's history, and this process uses the "
    "cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync), which keeps "
    "none; restart the kernel without that setting to record, or estimate instead: "
    "%vram_estimate, jv.estimate()"
)


class _CudaApi:
    """Every private torch CUDA memory API this package calls, in one replaceable place."""

    def available(self) -> str | None:
        """None if CUDA memory history can be recorded here, else why not."""
        why = cuda_unavailable()
        if why is not None:
            return why
        memory = torch.cuda.memory
        if not (hasattr(memory, "_record_memory_history") and hasattr(memory, "_snapshot")):
            return f"torch {torch.__version__} has no CUDA allocator history to record"
        backend = getattr(memory, "get_allocator_backend", None)
        if backend is not None and backend() == "cudaMallocAsync":
            return ASYNC_BACKEND
        return None

    def metadata_supported(self) -> bool:
        memory = torch.cuda.memory
        return hasattr(memory, "_set_memory_metadata") and hasattr(memory, "_get_memory_metadata")

    def current_device(self) -> int:
        return int(torch.cuda.current_device())

    def device_count(self) -> int:
        return int(torch.cuda.device_count())

    def start_history(self, *, context: str | None, max_entries: int) -> None:
        record = torch.cuda.memory._record_memory_history
        wanted: dict[str, Any] = {
            "enabled": "all",
            "context": context,
            "stacks": "python",
            "max_entries": max_entries,
            "clear_history": True,
        }
        params = inspect.signature(record).parameters
        try:
            record(**{k: v for k, v in wanted.items() if k in params})
        except RuntimeError as error:  # e.g. a backend that keeps no history
            raise RecordingError(
                f"the CUDA allocator would not record its history ({error}); "
                "estimate instead: %vram_estimate, jv.estimate()"
            ) from error

    def stop_history(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)

    def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = torch.cuda.memory._snapshot()
        return snap

    def set_metadata(self, text: str) -> None:
        torch.cuda.memory._set_memory_metadata(text)

    def get_metadata(self) -> str:
        return str(torch.cuda.memory._get_memory_metadata())

    def alloc_marker(self, device: torch.device, nbytes: int = 1) -> None:
        """Allocate and free one tiny block: trace events at this point of the run."""
        marker = torch.empty((nbytes,), dtype=torch.uint8, device=device)
        del marker

    def workspace_sizes(self, index: int) -> dict[int, str] | None:
        """The BLAS workspace sizes this torch gives a thread on device ``index`` (size ->
        label), with PyTorch's environment variables; None if the device cannot be asked."""
        import os

        from .._blas_workspaces import blas_workspaces

        try:
            props = torch.cuda.get_device_properties(index)
            capability = (int(props.major), int(props.minor))
        except Exception:  # noqa: BLE001 - then every default size is looked for
            return None
        return blas_workspaces(torch.__version__, capability, os.environ).sizes

    def device_info(self, index: int) -> dict[str, Any]:
        """Device and allocator totals at the end; the keys the renderers read."""
        from .nvml import device_memory

        props = torch.cuda.get_device_properties(index)
        info: dict[str, Any] = {
            "name": props.name,
            "total": int(props.total_memory),
            "allocated": int(torch.cuda.memory_allocated(index)),
            "reserved": int(torch.cuda.memory_reserved(index)),
            "max_allocated": int(torch.cuda.max_memory_allocated(index)),
            "max_reserved": int(torch.cuda.max_memory_reserved(index)),
            "cuda": torch.version.cuda,
        }
        nvml = device_memory(index)
        if nvml is not None:  # device-wide: the CUDA context, workspaces, other processes
            info["device_used"] = nvml["used"]
            if "process_used" in nvml:
                info["process_used"] = nvml["process_used"]
        return info


def _frame_chain(frame: FrameType | None) -> list[tuple[str, int, str]]:
    """``frame`` and its callers, innermost first, as a CUDA traceback lists them."""
    chain = []
    while frame is not None:
        chain.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return chain


class CudaSnapshotRecorder:
    """Records one CUDA device through the caching allocator's history (see the module doc).

    ``stacks``: keep Python stacks of allocations. ``labels``: where each allocation's op,
    module and phase come from: ``"profiler"`` (default), ``"mode"`` (a dispatch mode, a few us
    per op, and it changes how autograd accumulates gradients) or ``"none"``; ``ops`` is the
    older switch (True: ``"mode"``, False: ``"none"``). ``max_entries``: size of the
    allocator's ring buffer; longer runs keep the end and say ``meta["truncated"]``.
    ``keep_raw``: keep the raw snapshots and roles in ``.raw`` (for fixtures and debugging).
    """

    source = SOURCE

    def __init__(
        self,
        device: torch.device | str = "cuda",
        *,
        stacks: bool = True,
        ops: bool | None = None,
        labels: str = "profiler",
        max_entries: int = 250_000,
        keep_raw: bool = False,
        label_ops: str = "auto",
    ) -> None:
        dev = torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"CudaSnapshotRecorder records CUDA devices, not {dev}")
        self._index = dev.index
        self.device = f"cuda:{dev.index}" if dev.index is not None else "cuda"
        self._stacks = stacks
        if ops is not None:  # the older switch: True = the labelling mode, False = no labels
            labels = "mode" if ops else "none"
        if labels not in ("profiler", "mode", "none"):
            raise ValueError(f"labels must be 'profiler', 'mode' or 'none', not {labels!r}")
        self._labels_from = labels
        self._ops = labels == "mode"
        self._warnings: list[str] = []
        self._modules = Interner("")
        self._chunks = ChunkedProfiler(
            "cuda", self._modules, ops=label_ops, idle=self._idle, warnings=self._warnings
        )
        self._max_entries = max_entries
        self._keep_raw = keep_raw
        self.raw: dict[str, Any] | None = None
        self._api = _CudaApi()
        by_profiler = labels == "profiler"
        self.tagger = Tagger(
            self._on_role,
            self._modules,
            on_enter=self._enter_module if by_profiler else None,
            on_exit=self._exit_module if by_profiler else None,
            tag_graph=self._ops,
        )
        self._mode = ObservingMode(before=self._label)
        self._labels: dict[tuple[int, int, Any], str] = {}
        self._roles: list[Role] = []
        self._markers = 0
        self._dirty = True
        self._in_marker = False
        self._metadata_ok = False
        self._prev_metadata = ""
        self._baseline: dict[str, Any] | None = None
        self._started = False
        self._active = False
        self._history_on = False
        self._mode_entered = False
        self._t0 = 0
        self._meta: dict[str, Any] = {}
        self._boundary: list[tuple[str, int, str]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(
        self, entry_frame: FrameType | None = None, namespace: Mapping[str, Any] | None = None
    ) -> None:
        """Take the baseline snapshot and switch history, hooks and labels on.

        ``entry_frame`` is the frame that asked for recording; stacks stop there.
        """
        self._boundary = _frame_chain(entry_frame)
        why = self._api.available()
        if why is not None:
            raise RecordingError(why)
        index = self._index if self._index is not None else self._api.current_device()
        if not 0 <= index < self._api.device_count():
            raise RecordingError(
                f"cuda:{index} does not exist ({self._api.device_count()} devices)"
            )
        self._index = index
        self.device = f"cuda:{index}"
        self._torch_device = torch.device("cuda", index)
        self._started = True
        self._metadata_ok = self._api.metadata_supported()
        # One tiny block before the baseline, so a marker never needs a fresh segment.
        self._api.alloc_marker(self._torch_device, self._marker_bytes)
        if self._metadata_ok:
            self._prev_metadata = self._api.get_metadata()
        else:
            self._meta["marker_size"] = MARKER_FALLBACK_BYTES
            if self._ops:
                self._warnings.append(
                    f"labels='mode' needs torch 2.10 or later (_set_memory_metadata); torch "
                    f"{torch.__version__} records the allocations without op labels"
                )
        _, modules, optimizers = live_objects()
        self._active = True
        self.tagger.adopt(modules, optimizers)  # roles seen now carry marker 0 (the baseline)
        del modules, optimizers
        self._baseline = self._api.snapshot()
        if any(self._baseline.get("device_traces") or ()):
            self._meta["history_was_on"] = True  # the user's own history is switched off at stop
        if self._labels_from == "profiler":
            if profiler_busy():  # the user's own profiler: record without op labels
                self._labels_from = "none"
                self._meta["labels_note"] = "a torch profiler was running: no op labels"
            else:  # labels read a chunk at a time; stacks come from the allocator's history
                code = entry_frame.f_code if entry_frame is not None else None
                where = (code.co_filename, code.co_name) if code is not None else None
                self._chunks.start(
                    where, traced=False, sampled=False, from_thread=False, builder=ProfileBuilder()
                )
        self._t0 = time.perf_counter_ns()
        self._history_on = True  # set first: stop() switches it off even if this call fails
        self._api.start_history(
            context="alloc" if self._stacks else None, max_entries=self._max_entries
        )
        self.tagger.start()
        if self._ops:
            self._mode.__enter__()  # type: ignore[no-untyped-call]
            self._mode_entered = True

    def stop(self, error: str | None = None) -> Profile:
        """Switch everything off (always, in this order), then convert the final snapshot."""
        snapshot: dict[str, Any] | None = None
        events: Sequence[Any] = ()
        lean = False
        wall_ns = 0
        try:
            if self._mode_entered:
                self._mode_entered = False
                self._mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        finally:
            wall_ns = time.perf_counter_ns() - self._t0 if self._t0 else 0
            try:
                if self._active:
                    self.tagger.final_scan()  # markers still go into the trace
            finally:
                self.tagger.stop()
                self._active = False
                if self._history_on:
                    self._history_on = False
                    try:
                        snapshot = self._api.snapshot()  # switching history off clears it
                    finally:
                        self._api.stop_history()
                        if self._metadata_ok:
                            self._api.set_metadata(self._prev_metadata)
                events, lean = self._chunks.stop()
        self._chunks.read(events, lean)
        del events
        reports = self._chunks.reports
        if snapshot is not None and len(reports) and self._index is not None:
            with contextlib.suppress(Exception):  # labels are a nicety; never lose the profile
                traces = snapshot.get("device_traces") or []
                if self._index < len(traces):
                    self._meta["profiler_labels"] = label_from_profiler(
                        traces[self._index], reports, self._chunks.state.ops.names
                    )
        if self._labels_from == "profiler":
            self._meta.update(self._chunks.coverage(wall_ns))
        if self._warnings:
            self._meta.setdefault("warnings", []).extend(self._warnings)
        self._chunks.reports = Reports()
        return self._convert(snapshot, wall_ns, error)

    def _idle(self) -> bool:
        """No label chunk may be read now: recording stopped, or an optimizer is stepping."""
        return not self._active or bool(self.tagger.optimizer_depth)

    def _enter_module(self, module_id: int) -> None:
        self._chunks.enter(module_id, sys._getframe(2))  # the frame above our hooks

    def _exit_module(self) -> None:
        self._chunks.exit()

    def _convert(self, snapshot: dict[str, Any] | None, wall_ns: int, error: str | None) -> Profile:
        meta = {
            "torch": torch.__version__,
            "stacks": self._stacks,
            "ops": self._labels_from != "none",
            "labels": self._labels_from,
            "module_types": dict(self.tagger.module_types),
            **self._meta,
        }
        if snapshot is None or self._index is None:
            return ProfileBuilder().build(
                device=self.device, source=self.source, wall_ns=wall_ns, error=error, meta=meta
            )
        try:
            device_info: dict[str, Any] = self._api.device_info(self._index)
        except Exception:  # noqa: BLE001 - device facts are a nicety; never lose the profile
            device_info = {}
        roles, self._roles = self._roles, []
        if self._keep_raw:
            self.raw = {
                "snapshot": snapshot,
                "baseline": self._baseline,
                "roles": [list(r) for r in roles],
                "category_names": list(CATEGORIES),
                "modules": list(self._modules.names),
                "max_entries": self._max_entries,
                "device_index": self._index,
                "boundary": [list(f) for f in self._boundary],
                "marker_size": None if self._metadata_ok else MARKER_FALLBACK_BYTES,
                "markers_emitted": self._markers,
            }
        baseline, self._baseline = self._baseline, None
        addresses: list[int] = []  # each row's block, for leaks (never saved)
        profile = profile_from_snapshot(
            snapshot,
            device_index=self._index,
            baseline=baseline,
            roles=roles,
            modules=self._modules.names,
            max_entries=self._max_entries,
            boundary=self._boundary,
            wall_ns=wall_ns,
            device_info=device_info,
            error=error,
            meta=meta,
            row_addresses=addresses,
            workspaces=self._api.workspace_sizes(self._index),
            marker_size=None if self._metadata_ok else MARKER_FALLBACK_BYTES,
            markers_emitted=self._markers,
        )
        note_addresses(profile, addresses)
        return profile

    def _label(self, func: Any) -> None:
        """Name the allocations of the op about to run: ``"phase|module|op"``."""
        if self._in_marker:
            return
        try:
            self._dirty = True
            phase, module = self.tagger.phase_and_module()
            key = (phase, module, func)
            label = self._labels.get(key)
            if label is None:
                label = self._labels[key] = f"{phase}|{module}|{func._overloadpacket.__name__}"
            self._api.set_metadata(label)  # per thread: backward runs on its own thread
        except Exception:  # noqa: BLE001 - never raise from bookkeeping
            pass

    # -- roles -------------------------------------------------------------------------------

    def _on_role(self, tensor: torch.Tensor, category: int, module: int) -> None:
        if not self._active:
            return
        try:
            dev = tensor.device
            if dev.type != "cuda" or dev.index != self._index:
                return
            addr = tensor.untyped_storage().data_ptr()
            if not addr:
                return
            if not self._history_on:
                marker = 0
            else:
                if self._dirty or not self._ops:  # without the mode, ops go unseen
                    self._emit_marker()
                marker = self._markers
            self._roles.append((addr, category, module, marker))
        except Exception:  # noqa: BLE001 - never raise from a hook
            pass

    @property
    def _marker_bytes(self) -> int:
        return 1 if self._metadata_ok else MARKER_FALLBACK_BYTES

    def _emit_marker(self) -> None:
        """Put marker ``k + 1`` into the trace: roles seen until the next op are placed there.
        Labelled ``jv-marker|k``; where torch cannot label allocations (before 2.10), known by
        its size and its place among the markers (:func:`.cuda_convert.markers_by_size`)."""
        self._in_marker = True
        try:
            self._markers += 1
            if not self._metadata_ok:
                self._api.alloc_marker(self._torch_device, MARKER_FALLBACK_BYTES)
                self._dirty = False
                return
            previous = self._api.get_metadata()
            self._api.set_metadata(f"{MARKER_PREFIX}{self._markers}")
            try:
                self._api.alloc_marker(self._torch_device)  # its free carries the label too
            finally:
                self._api.set_metadata(previous)
            self._dirty = False
        finally:
            self._in_marker = False


def label_from_profiler(
    entries: list[dict[str, Any]], events: Iterable[AllocEvent], ops: Sequence[str]
) -> int:
    """Give each ``alloc`` entry of the allocator history the ``"phase|module|op"`` label of the
    report the profiler saw for the same block: the same address, the same occurrence of it
    (both see every allocation of the run, in order). Markers keep their own labels. Returns
    how many entries were labelled.
    """
    by_ptr: dict[int, list[AllocEvent]] = {}
    for ev in events:
        if ev.size > 0:
            by_ptr.setdefault(ev.ptr, []).append(ev)
    seen: dict[int, int] = {}
    labelled = 0
    for entry in entries:
        if entry.get("action") != "alloc":
            continue
        addr = int(entry.get("addr", 0))
        k = seen.get(addr, 0)
        seen[addr] = k + 1
        if str(entry.get("user_metadata") or "").startswith(MARKER_PREFIX):
            continue
        found = by_ptr.get(addr)
        if found is None or k >= len(found):
            continue
        ev = found[k]
        entry["user_metadata"] = f"{ev.phase}|{ev.module}|{ops[ev.op]}"
        labelled += 1
    return labelled
