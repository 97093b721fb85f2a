"""Weak references to storages, one per storage for a whole recording.

A recording's start watches every storage the notebook holds: the recorder to learn when
memory from before the cell goes (the allocator does not say where another thread frees it),
the leak finder to tell a storage held before the cell from a new one at the same address.
Each weak reference is an object the garbage collector tracks until the cell ends: with
50,000 tensors in the notebook, two references each were enough new objects to set off a
collection of the whole heap (~0.1 s with 300,000 tensors in it) in most cells. Both share
one reference per storage here, made in C loops.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any

Ref = weakref.ref[Any]


class StorageWatch:
    """Storage key (``storage._cdata``) -> a weak reference, for the storages alive now; when a
    storage whose key is in ``timed`` dies, the time it did goes to ``freed``."""

    def __init__(self) -> None:
        self.refs: dict[int, Ref] = {}
        self.timed: set[int] = set()
        self.freed: dict[int, int] = {}  # storage key -> time its memory was released
        self._key_of: dict[Ref, int] = {}

    def watch(self, storages: Sequence[Any], keys: Sequence[int]) -> None:
        """Watch these storages (``keys[i]`` is ``storages[i]._cdata``). A key already watched
        is the same storage: its reference is dropped the moment its storage dies."""
        refs = self.refs
        new = {k: s for k, s in zip(keys, storages, strict=True) if k not in refs}
        try:
            made = list(map(weakref.ref, new.values(), [self._released] * len(new)))
        except TypeError:  # one cannot be weakly referenced: the others one by one
            for key, storage in new.items():
                try:
                    self._add(storage, key)
                except TypeError:
                    continue
            return
        refs.update(zip(new, made, strict=True))
        self._key_of.update(zip(made, new, strict=True))

    def time_frees(self, keys: Sequence[int]) -> None:
        """From now on, note in ``freed`` when each of these watched storages dies."""
        self.timed.update(set(keys).intersection(self.refs))

    def add_timed(self, storage: Any, key: int) -> None:
        """Watch one storage and time its free (the recorder's hooks, for each new storage
        they note; raises TypeError if it cannot be weakly referenced)."""
        if key not in self.refs:
            self._add(storage, key)
        self.timed.add(key)

    def close(self) -> None:
        """Stop timing and let go of the references (ones kept elsewhere stay valid)."""
        self.refs.clear()
        self._key_of.clear()
        self.timed.clear()

    def _add(self, storage: Any, key: int) -> None:
        ref = weakref.ref(storage, self._released)
        self.refs[key] = ref
        self._key_of[ref] = key

    def _released(self, ref: Ref) -> None:
        """A weakref callback (never raises). A Ctrl-C landing in here is dropped by the
        interpreter: ``jv.record`` sends it again (``resent_interrupts``)."""
        key = self._key_of.pop(ref, None)
        if key is None:
            return
        if self.refs.get(key) is ref:
            del self.refs[key]
        if key in self.timed:
            self.timed.discard(key)
            self.freed[key] = time.time_ns()
