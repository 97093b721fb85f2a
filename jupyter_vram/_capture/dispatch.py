"""Any-device recording: a dispatch mode that sees every storage an aten op allocates.

Each op's outputs are checked for storages we have not seen; a new one becomes an allocation
row and gets a weakref whose callback records the free (it fires when the memory is released,
not while a view lives). Tensors alive before recording are registered as the baseline.

The hot path (`__torch_dispatch__` -> `_record`) runs on every aten op: per-op facts are cached
per OpOverload, and stacks are interned per distinct call site.
"""

from __future__ import annotations

import itertools
import sys
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from types import FrameType
from typing import Any

import torch

from .._model import CATEGORY_INDEX, Profile
from .builder import BASELINE_OP, OTHER, TEMPORARY, ProfileBuilder
from .modes import ObservingMode
from .stacks import StackSampler
from .tagging import ACTIVATION, PHASE_OTHER, Tagger, live_objects, storages_of

_SKIP, _FRESH, _MUTATES = 0, 1, 2


class DispatchRecorder:
    """Records allocations and frees of every tensor storage on any device."""

    source = "dispatch"

    def __init__(self, device: str = "cpu", *, stacks: bool = True) -> None:
        self.device = str(torch.device(device))
        self._stacks = stacks
        self.builder = ProfileBuilder()
        self._live: dict[int, int] = {}  # storage key -> allocation row
        self._refs: dict[int, tuple[weakref.ref[torch.UntypedStorage], int]] = {}
        self._ops: dict[Any, tuple[int, int]] = {}  # OpOverload -> (kind, op id)
        self._device_ids: dict[torch.device, int] = {}
        self._seq = itertools.count()
        self._t0 = 0
        self._wall_ns = 0
        self._active = False
        self._mode_entered = False
        self.tagger = Tagger(self._on_role, self.builder.modules, on_enter=self._entered,
                             on_exit=self._exited)  # fmt: skip
        # activation checkpointing: rows made while a block is recomputed (a top-level module
        # call inside backward), and those of them still alive when the recompute ended
        self._recomputing: list[int] | None = None
        self._kept_by_recompute: list[int] = []
        self._sampler = StackSampler(self.builder) if stacks else None
        self._mode = ObservingMode(after=self._observe)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(
        self, entry_frame: FrameType | None = None, namespace: Mapping[str, Any] | None = None
    ) -> None:
        """Register the baseline and switch recording on.

        ``entry_frame`` is the frame that asked for recording; stacks stop there.
        """
        if self._sampler is not None:
            self._sampler.set_boundary(entry_frame)
        self._baseline_op = self.builder.ops(BASELINE_OP)
        tensors, modules, optimizers = live_objects()
        for tensor in tensors:
            self._register_existing(tensor, OTHER)
        del tensors
        self._active = True
        self.tagger.adopt(modules, optimizers)
        del modules, optimizers
        self.tagger.start()
        self._t0 = time.perf_counter_ns()
        self._mode.__enter__()  # type: ignore[no-untyped-call]
        self._mode_entered = True

    def stop(self, error: str | None = None) -> Profile:
        """Switch recording off (always) and freeze what was seen into a Profile."""
        try:
            if self._mode_entered:
                self._mode_entered = False
                self._mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        finally:
            self._wall_ns = time.perf_counter_ns() - self._t0
            try:
                if self._active:
                    self.tagger.final_scan()
                    self._recompute_kept_are_activations()
            finally:
                self.tagger.stop()
                self._active = False
                self._refs.clear()  # dropping the weakrefs cancels their callbacks
                self._live.clear()
                if self._sampler is not None:
                    self._sampler.set_boundary(None)  # do not keep the user's frame alive
        return self.builder.build(
            device=self.device,
            source=self.source,
            wall_ns=self._wall_ns,
            error=error,
            meta={"torch": torch.__version__, "module_types": dict(self.tagger.module_types)},
        )

    def row_of(self, tensor: torch.Tensor) -> int | None:
        """The allocation row of ``tensor``'s storage while recording, None if not seen (a
        sparse tensor's: its values')."""
        try:
            return self._live.get(_storages(tensor)[-1]._cdata)
        except Exception:  # noqa: BLE001 - sparse / wrapper tensors have no plain storage
            return None

    def mark_inputs(self, tensors: Iterable[Any]) -> None:
        """Count ``tensors`` as the run's inputs (a caller that feeds the model through a
        loop of its own, e.g. ``generate()``, never passes them to the model as they are)."""
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                self._on_role(tensor, CATEGORY_INDEX["input"], 0)

    def mark(self) -> int:
        """The next event sequence number: a point in the event order to refer to later."""
        return next(self._seq)

    def watch_sums(self, sums: dict[int, tuple[int, bool]] | None) -> None:
        """While ``sums`` is a dict, record each out-of-place tensor sum (``aten.add.Tensor``)
        in it: the sum's allocation row -> (the first operand's row or -1, whether that
        operand is a whole dense buffer of its own). None stops watching."""
        if sums is None:
            self._mode.inspect = None
            return
        add = torch.ops.aten.add.Tensor

        def inspect(func: Any, args: tuple[Any, ...], out: Any) -> None:
            try:
                if func is not add or not isinstance(out, torch.Tensor):
                    return
                row = self._live.get(out.untyped_storage()._cdata)
                first = args[0]
                if row is None or not isinstance(first, torch.Tensor):
                    return
                storage = first.untyped_storage()
                # autograd sums in place only into a buffer it holds the last reference to;
                # a view (a folded matmul's gradient, a transposed weight gradient) keeps its
                # base alive, so it never qualifies (aten's InputBuffer accumulate)
                whole = (
                    not first._is_view()
                    and first.storage_offset() == 0
                    and storage.nbytes() == first.numel() * first.element_size()
                    and (
                        first.is_contiguous()
                        or first.is_contiguous(memory_format=torch.channels_last)
                    )
                )
                sums[row] = (self._live.get(storage._cdata, -1), whole)
            except Exception:  # noqa: BLE001 - never raise from bookkeeping
                pass

        self._mode.inspect = inspect

    # -- hot path ----------------------------------------------------------------------------

    def _op_info(self, func: Any) -> tuple[int, int]:
        info = self._ops.get(func)
        if info is None:
            schema = func._schema
            if func.namespace == "prim" or func.is_view:
                kind = _SKIP
            elif schema.is_mutable:
                kind = _MUTATES
            else:
                kind = _FRESH
            info = self._ops[func] = (kind, self.builder.ops(func._overloadpacket.__name__))
        return info

    def _observe(self, func: Any, out: Any) -> None:
        try:
            kind, op = self._op_info(func)
            if kind == _SKIP:
                return
            if isinstance(out, torch.Tensor):
                self._record(out, op, kind)
            elif isinstance(out, (tuple, list)):
                for item in out:
                    if isinstance(item, torch.Tensor):
                        self._record(item, op, kind)
        except Exception:  # noqa: BLE001 - never raise from bookkeeping
            pass

    def _record(self, tensor: torch.Tensor, op: int, kind: int) -> None:
        for storage in _storages(tensor):
            key = storage._cdata
            row = self._live.get(key)
            if row is not None:
                if kind == _MUTATES and storage.nbytes() != self.builder.size[row]:
                    self._resized(storage, key, row, op)
                continue
            size = storage.nbytes()
            if size:
                self._add(storage, key, size, op, TEMPORARY)

    def _add(self, storage: torch.UntypedStorage, key: int, size: int, op: int, cat: int) -> int:
        phase, module = self.tagger.phase_and_module()
        if self._recomputing is not None and self.tagger.module_stack:
            module = self.tagger.module_stack[-1]  # the recomputed module, not the backward node
        stack = self._sampler.sample(sys._getframe(3)) if self._sampler is not None else -1
        row = self.builder.add(
            size,
            next(self._seq),
            time.perf_counter_ns() - self._t0,
            self._device_id(storage.device),
            op,
            module,
            stack,
            phase,
            cat,
        )
        self._track(storage, key, row)
        if self._recomputing is not None:
            self._recomputing.append(row)
        return row

    def _track(self, storage: torch.UntypedStorage, key: int, row: int) -> None:
        self._live[key] = row
        ref = weakref.ref(storage, self._on_free)
        self._refs[id(ref)] = (ref, key)

    def _on_free(self, ref: weakref.ref[torch.UntypedStorage]) -> None:
        entry = self._refs.pop(id(ref), None)
        if entry is None:
            return
        row = self._live.pop(entry[1], None)
        if row is not None:
            self.builder.free(row, next(self._seq), time.perf_counter_ns() - self._t0)

    def _resized(self, storage: torch.UntypedStorage, key: int, row: int, op: int) -> None:
        """An in-place op (resize_, out=) changed a storage's size: end the old row."""
        self.builder.free(row, next(self._seq), time.perf_counter_ns() - self._t0)
        del self._live[key]
        new_row = self._add(storage, key, storage.nbytes(), op, self.builder.category[row])
        self._live[key] = new_row

    def _device_id(self, device: torch.device) -> int:
        did = self._device_ids.get(device)
        if did is None:
            did = self._device_ids[device] = self.builder.devices(str(device))
        return did

    # -- activation checkpointing ------------------------------------------------------------

    def _entered(self, module: int) -> None:
        """A module call began: a top-level one inside backward is a recompute."""
        if len(self.tagger.module_stack) == 1 and torch._C._current_graph_task_id() != -1:
            self._recomputing = []

    def _exited(self) -> None:
        """A module call ended: at the end of a recompute, note what it keeps for backward."""
        if self._recomputing is not None and not self.tagger.module_stack:
            free_seq = self.builder.free_seq
            self._kept_by_recompute += [row for row in self._recomputing if free_seq[row] < 0]
            self._recomputing = None

    def _recompute_kept_are_activations(self) -> None:
        """What a recompute keeps for backward past its end is an activation (as the CPU
        recorder says): checkpointing's own saved-tensor hooks hide it from ours."""
        category = self.builder.category
        for row in self._kept_by_recompute:
            if category[row] == TEMPORARY:
                category[row] = ACTIVATION

    # -- roles -------------------------------------------------------------------------------

    def _register_existing(self, tensor: torch.Tensor, category: int) -> None:
        """A tensor that was alive before recording; a sparse one as its indices and values."""
        for storage in _storages(tensor):
            self._register_storage(storage, category)

    def _register_storage(self, storage: torch.UntypedStorage, category: int) -> int | None:
        """A storage alive before recording (or first seen through a role): its row."""
        key = storage._cdata
        row = self._live.get(key)
        if row is not None:
            return row
        size = storage.nbytes()
        if size == 0:
            return None
        row = self.builder.add(
            size, -1, 0, self._device_id(storage.device), self._baseline_op, 0, -1,
            PHASE_OTHER, category,
        )  # fmt: skip
        self._track(storage, key, row)
        return row

    def _on_role(self, tensor: torch.Tensor, category: int, module: int) -> None:
        if not self._active:
            return
        # a sparse tensor (an embedding's sparse gradient, SGD's momentum for it): its parts
        for storage in _storages(tensor):
            row = self._live.get(storage._cdata)
            if row is None:
                row = self._register_storage(storage, category)
            if row is None:
                continue
            self.builder.promote(row, category)
            if module and not self.builder.module[row]:
                self.builder.module[row] = module


def _storages(tensor: torch.Tensor) -> Sequence[torch.UntypedStorage]:
    """The storages holding ``tensor``'s memory: its own, at the cost of one call, for the
    strided tensors nearly every op makes; else :func:`.tagging.storages_of`'s (a sparse
    tensor's indices and values; none for a wrapper without plain storage)."""
    try:
        return (tensor.untyped_storage(),)
    except Exception:  # noqa: BLE001 - sparse / wrapper tensors have no plain storage
        return storages_of(tensor)
