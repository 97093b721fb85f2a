"""Accumulate allocation rows and interned tables while recording, then freeze into a Profile."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._model import CATEGORY_INDEX, Allocations, Frame, Profile, SegmentEvents

UNKNOWN = "(unknown)"
#: op of memory that was there before recording started
BASELINE_OP = "(before recording)"
_ACTIVATION = CATEGORY_INDEX["activation"]
_INPUT = CATEGORY_INDEX["input"]


class Interner:
    """Strings to small ints, in first-seen order."""

    __slots__ = ("index", "names")

    def __init__(self, first: str = UNKNOWN) -> None:
        self.names: list[str] = [first]
        self.index: dict[str, int] = {first: 0}

    def __call__(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.names)
            self.names.append(name)
        return i


class ProfileBuilder:
    """Column arrays for the allocation table plus the tables their ids point into.

    ``array.array`` columns: appends as cheap as a list's from the recorder's hot path, but
    8 bytes or fewer a value instead of a pointer plus an int object (a million-event run
    holds ~50 MB instead of ~200 MB while recording). `build` turns them into numpy arrays.
    """

    def __init__(self) -> None:
        self.size = array("q")
        self.alloc_seq = array("q")
        self.free_seq = array("q")
        self.alloc_ns = array("q")
        self.free_ns = array("q")
        self.device = array("i")
        self.op = array("i")
        self.module = array("i")
        self.stack = array("i")
        self.phase = array("b")
        self.category = array("b")
        self.devices = Interner("cpu")
        self.ops = Interner()
        self.modules = Interner("")
        self.frames: list[Frame] = []
        self.frame_index: dict[Frame, int] = {}
        self.stacks: list[tuple[int, ...]] = []
        self.stack_index: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.size)

    def add(
        self,
        size: int,
        alloc_seq: int,
        alloc_ns: int,
        device: int,
        op: int,
        module: int,
        stack: int,
        phase: int,
        category: int,
    ) -> int:
        """Append one allocation (alive until `free` is called) and return its row."""
        row = len(self.size)
        self.size.append(size)
        self.alloc_seq.append(alloc_seq)
        self.free_seq.append(-1)
        self.alloc_ns.append(alloc_ns)
        self.free_ns.append(-1)
        self.device.append(device)
        self.op.append(op)
        self.module.append(module)
        self.stack.append(stack)
        self.phase.append(phase)
        self.category.append(category)
        return row

    def add_many(
        self,
        size: np.ndarray,
        alloc_ns: np.ndarray,
        device: int,
        op: np.ndarray,
        module: np.ndarray,
        stack: np.ndarray,
        phase: np.ndarray,
        category: int | np.ndarray,
        alloc_seq: int = 0,
    ) -> None:
        """Append allocations in bulk (what ``add`` does one by one: rows follow in order);
        ``alloc_seq`` -1: memory from before the recording."""
        n = len(size)
        for column, values, dtype in (
            (self.size, size, np.int64),
            (self.alloc_seq, np.full(n, alloc_seq), np.int64),
            (self.free_seq, np.full(n, -1), np.int64),
            (self.alloc_ns, alloc_ns, np.int64),
            (self.free_ns, np.full(n, -1), np.int64),
            (self.device, np.full(n, device), np.int32),
            (self.op, op, np.int32),
            (self.module, module, np.int32),
            (self.stack, stack, np.int32),
            (self.phase, phase, np.int8),
            (self.category, np.broadcast_to(category, n), np.int8),
        ):
            column.frombytes(np.ascontiguousarray(values, dtype).tobytes())

    def free(self, row: int, seq: int, ns: int) -> None:
        self.free_seq[row] = seq
        self.free_ns[row] = ns

    def promote(self, row: int, category: int) -> None:
        """Give a row the role a hook saw, if stronger (a lower category index wins).

        The one place of the rule that an activation which existed before recording (a
        baseline row) is an input: data from before the cell that autograd also saved.
        """
        if category == _ACTIVATION and self.alloc_seq[row] < 0:
            category = _INPUT
        if category < self.category[row]:
            self.category[row] = category

    def promote_many(self, rows: np.ndarray, categories: np.ndarray) -> None:
        """:meth:`promote` each row with its category, in one pass (the same rule, over
        columns: thousands of role notes)."""
        before = np.frombuffer(self.alloc_seq, np.int64)[rows] < 0
        roles = np.where((categories == _ACTIVATION) & before, _INPUT, categories)
        column = np.frombuffer(self.category, np.int8)
        np.minimum.at(column, rows, roles.astype(np.int8))
        del column  # the column may grow again

    def intern_stack(self, frames: tuple[Frame, ...]) -> int:
        ids = []
        for frame in frames:
            fid = self.frame_index.get(frame)
            if fid is None:
                fid = self.frame_index[frame] = len(self.frames)
                self.frames.append(frame)
            ids.append(fid)
        key = tuple(ids)
        sid = self.stack_index.get(key)
        if sid is None:
            sid = self.stack_index[key] = len(self.stacks)
            self.stacks.append(key)
        return sid

    def build(
        self,
        *,
        device: str,
        source: str,
        wall_ns: int,
        segments: SegmentEvents | None = None,
        device_info: Mapping[str, Any] | None = None,
        error: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Profile:
        self.devices(device)  # the profile's device always has a table entry
        allocations = Allocations(
            size=np.asarray(self.size, np.int64),
            alloc_seq=np.asarray(self.alloc_seq, np.int64),
            free_seq=np.asarray(self.free_seq, np.int64),
            alloc_ns=np.asarray(self.alloc_ns, np.int64),
            free_ns=np.asarray(self.free_ns, np.int64),
            device=np.asarray(self.device, np.int32),
            op=np.asarray(self.op, np.int32),
            module=np.asarray(self.module, np.int32),
            stack=np.asarray(self.stack, np.int32),
            phase=np.asarray(self.phase, np.int8),
            category=np.asarray(self.category, np.int8),
        )
        return Profile(
            allocations,
            device=device,
            source=source,
            devices=self.devices.names,
            ops=self.ops.names,
            modules=self.modules.names,
            frames=self.frames,
            stacks=self.stacks,
            wall_ns=wall_ns,
            segments=segments,
            device_info=device_info,
            error=error,
            meta=meta,
        )


TEMPORARY = CATEGORY_INDEX["temporary"]
OTHER = CATEGORY_INDEX["other"]
