"""One weak reference per storage for a whole recording: what the start of a recording in a
notebook holding many tensors leaves for the garbage collector, and the watch's own rules
(frees timed only where asked, references handed out staying valid after it closes)."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections import Counter
from typing import Any

import torch

import jupyter_vram as jv
from jupyter_vram._capture.leaks import RowMatcher, SizeMatcher, made_by_run, storage_keys
from jupyter_vram._capture.storage_watch import StorageWatch
from jupyter_vram._capture.tagging import one_scan, storage_watch

from .conftest import CLEAN, recording_state

#: tensors the test notebook holds: under the recorder's per-tensor bound (50,000)
HELD = 20_000


def _new_objects_while_started(namespace: dict[str, Any]) -> Counter[str]:
    """Types of the objects the garbage collector tracks that a recording's start made and
    that stay alive while the cell runs."""
    gc.collect()
    gc.disable()
    try:
        before = {id(o) for o in gc.get_objects()}
        recording = jv.record("cpu", namespace=namespace)
        recording.__enter__()
        try:
            return Counter(type(o).__name__ for o in gc.get_objects() if id(o) not in before)
        finally:
            recording.__exit__(None, None, None)
    finally:
        gc.enable()


def test_a_start_beside_many_tensors_makes_one_weak_reference_each_and_no_note_objects() -> None:
    """Each object the start makes and keeps is one more for every collection of the whole
    heap to visit, and enough of them set one off: the recorder's watch and the leak baseline
    share one weak reference per storage, and the notes of the namespace's storages are one
    array, not a tuple each."""
    namespace: dict[str, Any] = {"held": [torch.ones(1) for _ in range(HELD)]}
    namespace["held"][0].untyped_storage()  # (storage objects: made once, kept by torch)
    _new_objects_while_started(namespace)  # storage objects of every tensor made here
    made = _new_objects_while_started(namespace)
    assert HELD <= made["ReferenceType"] < HELD + 1_000, made.most_common(5)
    assert made["tuple"] < 1_000, made.most_common(5)
    assert recording_state() == CLEAN


def test_storages_from_before_the_cell_end_when_freed_here_or_on_another_thread() -> None:
    """The shared references still time frees: 100 of the namespace's tensors deleted in the
    cell and 300 freed on another thread (which the allocator reports to nobody) end their
    rows; the rest stay live; the cell's own tensor is a row of its own."""
    namespace: dict[str, Any] = {
        "held": [torch.ones(3) for _ in range(5_000)],  # 12 bytes each
        "other": [torch.ones(5) for _ in range(300)],  # 20 bytes each
        "threading": threading,
        "torch": torch,
    }
    with jv.record("cpu", namespace=namespace) as recording:
        exec(
            "del held[:100]\n"
            "x = torch.ones(7)\n"
            "t = threading.Thread(target=other.clear)\nt.start()\nt.join()\n",
            namespace,
        )
    frame = recording.profile.to_dataframe()
    before = frame[frame["op"] == "(before recording)"]
    assert len(before) == 5_000 + 300
    ended = before[before["free_ms"].notna()]
    assert sorted(Counter(ended["bytes"]).items()) == [(12, 100), (20, 300)]
    assert (frame["bytes"] == 28).sum() == 1 and namespace["x"].numel() == 7


def test_a_variable_remade_in_the_cell_is_a_leak_of_the_cell() -> None:
    """The leak baseline reads the shared references: ``x`` deleted and made again (its new
    storage often where the old one was) is memory the cell left, not memory from before."""
    namespace: dict[str, Any] = {"torch": torch, "x": torch.ones(4096)}
    with jv.record("cpu", namespace=namespace) as recording:
        exec("del x\nx = torch.ones(4096)\nkept = torch.ones(4096)\n", namespace)
    leaks = recording.profile.leaks()
    assert sorted(leaks["holders"]) == ["kept", "x"]
    assert list(leaks["bytes"]) == [4096 * 4, 4096 * 4]


def test_a_storage_at_a_key_the_baseline_knew_is_new_when_that_reference_is_dead() -> None:
    """The allocator often gives a new storage the key (``_cdata``) of one that died in the
    cell; the baseline's reference for that key then gives nothing back, and the new storage
    is the run's. Made certain here: the baseline holds a dead reference at the new key."""
    gone = torch.ones(16).untyped_storage()
    dead = weakref.ref(gone)
    del gone
    assert dead() is None
    x = torch.ones(4096)
    storage = x.untyped_storage()
    rows = RowMatcher({storage.data_ptr(): (7, storage.nbytes())}, SizeMatcher({}, cuda=False))
    namespace = {"x": x}
    made, exact, _ = made_by_run(namespace, "cpu", {storage._cdata: dead}, rows)
    assert made[storage._cdata]() is storage
    assert exact == {storage._cdata: 7}
    # the same key with a live reference to that very storage: held before the run
    made, exact, _ = made_by_run(namespace, "cpu", {storage._cdata: weakref.ref(storage)}, rows)
    assert (made, exact) == ({}, {})


def test_the_leak_baseline_shares_the_watch_and_tells_a_new_storage_at_an_old_key() -> None:
    """Within one start, the leak baseline's reference for a storage is the watch's; once
    that storage dies, the reference gives nothing back, so a new storage made at its key
    (the allocator reuses freed objects) is never taken for it."""
    namespace: dict[str, Any] = {"x": torch.ones(4096)}
    with one_scan():
        before = storage_keys(namespace, "cpu")
        watch = storage_watch()
        (key,) = before
        assert watch.refs[key] is before[key]
        assert before[key]() is namespace["x"].untyped_storage()
    namespace["x"] = torch.ones(4096)  # the old storage dies; the new one may take its key
    assert key not in watch.refs
    assert before[key]() is None


def test_a_watch_times_only_the_frees_it_was_asked_to() -> None:
    timed, untimed = torch.ones(8), torch.ones(8)
    storages = [timed.untyped_storage(), untimed.untyped_storage()]
    keys = [s._cdata for s in storages]
    watch = StorageWatch()
    watch.watch(storages, keys)
    watch.watch(storages, keys)  # watched already: the same references
    assert [watch.refs[k]() for k in keys] == storages
    refs = dict(watch.refs)
    watch.time_frees(keys[:1])
    del storages
    start = time.time_ns()
    del timed, untimed
    end = time.time_ns()
    assert list(watch.freed) == keys[:1]
    assert start <= watch.freed[keys[0]] <= end
    assert watch.refs == {} and watch.timed == set()
    assert all(ref() is None for ref in refs.values())


def test_a_closed_watch_times_nothing_and_its_references_stay_valid() -> None:
    tensor = torch.ones(8)
    storage = tensor.untyped_storage()
    key = storage._cdata
    watch = StorageWatch()
    watch.add_timed(storage, key)
    kept = watch.refs[key]  # as the leak baseline keeps it
    watch.close()
    assert kept() is storage
    del storage, tensor
    assert kept() is None and watch.freed == {}


def test_a_watch_lets_go_of_a_storage_it_watches() -> None:
    tensor = torch.ones(8)
    storage = tensor.untyped_storage()
    watch = StorageWatch()
    watch.add_timed(storage, storage._cdata)
    probe = weakref.ref(tensor)
    del storage, tensor
    assert probe() is None and len(watch.freed) == 1
