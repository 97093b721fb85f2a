"""Roles that only exist in distributed training, for the CPU recorder.

* FSDP2 parameters, gradients and optimizer state are DTensors: their memory is the local
  shard (:func:`local_tensor`), which the tagger reports like any other tensor.
* FSDP2 and c10d name what they do with profiler ranges (``FSDP::all_gather``,
  ``FSDP::all_gather_copy_out``, ``FSDP::post_backward_reduce``, ``c10d::...``,
  ``gloo:...``, ``nccl:...``). An allocation inside one of them is an all-gather buffer, an
  unsharded parameter, a reduce-scatter buffer / sharded gradient, or a collective's
  temporary (:class:`DistributedRoles.read` walks the event tree for them).
* DDP's reducer allocates one flat gradient bucket per bucket (at construction, and again
  when it rebuilds them in a forward of the first steps, before the wrapped module runs).
  A global forward hook reads the construction-time bucket sizes from each
  ``DistributedDataParallel`` it sees run; ``empty`` allocations DDP makes in its own forward,
  and construction-time ones of exactly a bucket's size, are the buckets.

The finer name of each labelled allocation goes to ``profile.meta["kinds"]`` (kind -> row
indices), and its category is set to the role's (gradient for buckets and sharded gradients,
parameter for unsharded parameters, temporary for communication buffers): the category
table itself stays as it is, so every saved profile stays loadable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .._model import CATEGORY_INDEX, Profile

PARAMETER = CATEGORY_INDEX["parameter"]
GRADIENT = CATEGORY_INDEX["gradient"]
TEMPORARY = CATEGORY_INDEX["temporary"]
_WEAK = frozenset({CATEGORY_INDEX[c] for c in ("activation", "temporary", "other")})

DDP_BUCKET = "ddp_gradient_bucket"
UNSHARDED_PARAMETER = "fsdp_unsharded_parameter"
SHARDED_PARAMETER = "fsdp_sharded_parameter"
SHARDED_GRADIENT = "fsdp_sharded_gradient"
ALL_GATHER = "all_gather_buffer"
REDUCE_SCATTER = "reduce_scatter_buffer"
COLLECTIVE = "collective_temporary"
#: Every kind, in the order the app lists them.
KINDS: tuple[str, ...] = (
    SHARDED_PARAMETER,
    UNSHARDED_PARAMETER,
    SHARDED_GRADIENT,
    DDP_BUCKET,
    ALL_GATHER,
    REDUCE_SCATTER,
    COLLECTIVE,
)

#: Range name prefix -> kind. FSDP's ranges win over the c10d op inside them; the copy-out
#: into unsharded parameters wins over the all-gather around it.
_FSDP_RANGES: tuple[tuple[str, str], ...] = (
    ("FSDP::all_gather_copy_out", UNSHARDED_PARAMETER),
    ("FSDP::all_gather", ALL_GATHER),
    ("FSDP::post_backward_reduce", REDUCE_SCATTER),
)
_COLLECTIVE_PREFIXES = ("c10d::", "gloo:", "nccl:")


def local_tensor(tensor: torch.Tensor) -> torch.Tensor | None:
    """The local shard of a DTensor (None for any other tensor)."""
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    if dtensor is not None and isinstance(tensor, dtensor):
        local = getattr(tensor, "_local_tensor", None)
        return local if isinstance(local, torch.Tensor) else None
    return None


def distributed_run() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available()) and (dist.is_initialized() or "WORLD_SIZE" in os.environ)


def _range_kind(name: str, current: str | None) -> str | None:
    if name.startswith("FSDP::"):
        for prefix, kind in _FSDP_RANGES:
            if name.startswith(prefix):
                if current in (None, COLLECTIVE) or kind == UNSHARDED_PARAMETER:
                    return kind
                return current
        return current
    if current is None and name.startswith(_COLLECTIVE_PREFIXES):
        return COLLECTIVE
    return current


class DistributedRoles:
    """Collects distributed roles while a recorder runs; :meth:`label` applies them."""

    def __init__(self, device_type: str) -> None:
        self._device_type = device_type
        self._hits: dict[tuple[int, int], str] = {}  # (time ns, bytes) -> kind
        self._bucket_sizes: set[int] = set()
        self._ddp_types: dict[type, bool] = {}
        self._fsdp_seen = False
        self._handles: list[RemovableHandle] = []
        self.active = False

    def start(self) -> None:
        """Watch only where distributed training can happen: a process group is up, or a
        launcher (torchrun, jv.launch) set WORLD_SIZE for a script that starts one."""
        self.active = distributed_run()
        if not self.active:
            return
        self._handles = [
            nn.modules.module.register_module_forward_pre_hook(self._module_call),
            nn.modules.module.register_module_forward_hook(self._module_done, always_call=True),
        ]

    def stop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- hooks (never raise) -------------------------------------------------------------------

    def _is_ddp(self, module: nn.Module) -> bool:
        cls = type(module)
        known = self._ddp_types.get(cls)
        if known is None:
            known = self._ddp_types[cls] = cls.__name__ == "DistributedDataParallel" and hasattr(
                module, "_get_ddp_logging_data"
            )
        return known

    def _module_call(self, module: nn.Module, args: Any) -> None:
        if self._is_ddp(module):
            self._read_buckets(module)

    def _module_done(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._is_ddp(module):  # buckets rebuilt in this call have their new sizes now
            self._read_buckets(module)

    def _read_buckets(self, module: nn.Module) -> None:
        with contextlib.suppress(Exception):
            sizes = str(module._get_ddp_logging_data().get("bucket_sizes", ""))  # type: ignore[operator]
            self._bucket_sizes.update(int(s) for s in sizes.split(",") if s.strip().isdigit())

    # -- the profiler's event tree -----------------------------------------------------------

    def read(self, roots: Sequence[Any]) -> None:
        """Note the allocations made inside FSDP and collective ranges."""
        from torch._C._profiler import _EventType

        if not self.active:
            return
        alloc_tag, op_tag = _EventType.Allocation, _EventType.TorchOp
        todo: list[tuple[Any, str | None]] = [(r, None) for r in roots]
        while todo:
            event, kind = todo.pop()
            tag = event.tag
            if tag == alloc_tag:
                extra = event.extra_fields
                if (
                    kind is not None
                    and extra.alloc_size > 0
                    and extra.device.type == self._device_type
                ):
                    self._hits[(event.start_time_ns, extra.alloc_size)] = kind
                continue
            if tag == op_tag:
                name = event.name
                if name.startswith("FSDP::"):
                    self._fsdp_seen = True
                kind = _range_kind(name, kind)
            children = event.children
            if children:
                todo.extend((c, kind) for c in children)

    # -- the profile ---------------------------------------------------------------------------

    def label(self, profile: Profile, t0: int) -> Profile:
        """The profile with distributed kinds in ``meta["kinds"]`` and their categories."""
        if not (self._hits or self._bucket_sizes or self._fsdp_seen):
            return profile
        a = profile.allocations
        category = a.category.copy()
        kinds: dict[str, list[int]] = {}
        recorded = np.flatnonzero(a.alloc_seq >= 0)
        for row in recorded.tolist():
            kind = self._hits.get((int(a.alloc_ns[row]) + t0, int(a.size[row])))
            if kind is None:
                continue
            if kind == REDUCE_SCATTER and category[row] == GRADIENT:
                kind = SHARDED_GRADIENT
            elif kind == UNSHARDED_PARAMETER:
                category[row] = PARAMETER
            elif category[row] in _WEAK:
                category[row] = TEMPORARY
            kinds.setdefault(kind, []).append(row)
        if self._bucket_sizes:
            for row in self._ddp_buckets(profile, recorded):
                if row not in kinds.get(COLLECTIVE, ()):
                    category[row] = GRADIENT
                    kinds.setdefault(DDP_BUCKET, []).append(row)
        if self._fsdp_seen:
            labelled = {r for rows in kinds.values() for r in rows}
            for name, cat in ((SHARDED_PARAMETER, PARAMETER), (SHARDED_GRADIENT, GRADIENT)):
                rows = [r for r in np.flatnonzero(category == cat).tolist() if r not in labelled]
                kinds.setdefault(name, []).extend(rows)
        allocations = dataclasses.replace(a, category=category)
        meta = {
            **profile.meta,
            "kinds": {k: sorted(v) for k, v in kinds.items() if v},
        }
        if self._bucket_sizes:
            meta["ddp_bucket_sizes"] = sorted(self._bucket_sizes)
        return profile.replace(allocations=allocations, meta=meta)

    def _ddp_buckets(self, profile: Profile, rows: np.ndarray) -> list[int]:
        """``empty`` allocations DDP makes itself: at construction (no module running) of
        exactly a bucket's size as DDP logs them, and in its forward before the wrapped module
        runs, a run of consecutive ones holding all the buckets' bytes together (a rebuild
        regroups the gradients, so the sizes change but their total does not)."""
        a = profile.allocations
        empty = {i for i, name in enumerate(profile.ops) if name == "empty"}
        own = {i for i, name in enumerate(profile.modules) if name == "DistributedDataParallel"}
        total = sum(self._bucket_sizes)
        found: list[int] = []
        rebuilt: list[int] = []
        for row in rows[np.argsort(a.alloc_seq[rows], kind="stable")].tolist():
            if int(a.op[row]) not in empty or int(a.category[row]) not in _WEAK:
                continue
            module = int(a.module[row])
            if module == 0 and int(a.size[row]) in self._bucket_sizes:
                found.append(row)
            elif module in own:
                rebuilt.append(row)
        start, held = 0, 0
        for end, row in enumerate(rebuilt):  # consecutive runs summing to the total
            held += int(a.size[row])
            while held > total and start <= end:
                held -= int(a.size[rebuilt[start]])
                start += 1
            if held == total and total:
                found.extend(rebuilt[start : end + 1])
                start, held = end + 1, 0
        return sorted(found)
