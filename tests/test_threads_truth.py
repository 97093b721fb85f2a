"""Other threads: the CPU allocator reports to the profiler only on the recording thread.

Memory another thread makes or frees is not reported. The recorder must not guess it into
the profile without evidence (an idle thread changes nothing), and must close memory made
here and freed there when the evidence allows. Expected values are hand arithmetic of the
tensors alive, or torch.profiler's allocator events of the same program.
"""

from __future__ import annotations

import os
import threading
import time
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._capture.builder import ProfileBuilder
from jupyter_vram._capture.cpu_rows import BASELINE_OP, ELSEWHERE_OP, build_rows
from jupyter_vram._capture.cpu_threads import MemoryMap
from jupyter_vram._capture.profiler_read import AllocEvent, EventRead
from jupyter_vram._model import CATEGORY_INDEX

from .test_observer_effect import _case, recorded_peak, train_step, true_peak

MIB = 1 << 20


def _wait_on(fd: int) -> None:
    """A user thread that does nothing: blocked reading a pipe."""
    os.read(fd, 1)


@pytest.fixture
def idle_thread() -> Iterator[threading.Thread]:
    read_end, write_end = os.pipe()
    thread = threading.Thread(target=_wait_on, args=(read_end,), name="idle-reader", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        os.write(write_end, b"x")
        thread.join(10)
        os.close(read_end)
        os.close(write_end)


def _drop(box: list[torch.Tensor]) -> None:
    box.pop()  # the last reference: the memory is freed on this thread


def _free_elsewhere(box: list[torch.Tensor]) -> None:
    thread = threading.Thread(target=_drop, args=(box,))
    thread.start()
    thread.join()


def _until_a_map_is_due(rec: Any) -> None:
    """Wait until the next module call reads the memory map: at most every 50 ms, or 100
    times what the last read took (on a loaded machine, longer than any fixed sleep)."""
    threads = rec.recorder._threads
    while time.monotonic_ns() <= threads.next_map:
        time.sleep(0.005)


def _end_bytes(prof: jv.Profile) -> int:
    t = prof.timeline
    return int(t.total_at(len(t) - 1) - t.baseline_bytes)


# -- an idle thread changes nothing -----------------------------------------------------------


@pytest.mark.parametrize("name", ["three_heads", "depthwise", "checkpointed"])
def test_an_idle_thread_changes_nothing(idle_thread: threading.Thread, name: str) -> None:
    """The model is a local (the namespace scan does not reach it): its parameters and
    optimizer state are memory held before the cell, idle thread or not, and every buffer
    made inside an op is in the peak (truth: torch.profiler's allocator events)."""
    model, batch = _case(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = train_step(model, opt, batch)
    step()
    truth = true_peak(step)
    recorded, prof = recorded_peak(step)
    assert abs(recorded - truth) <= 0.005 * truth, (name, recorded, truth)  # as alone
    assert "other_threads" not in prof.meta
    df = prof.to_dataframe()
    assert not (df["op"] == ELSEWHERE_OP).any()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    held = df[df["op"] == BASELINE_OP]
    assert held[held["category"] == "parameter"]["bytes"].sum() == params


def test_a_thread_that_ran_is_named_and_its_memory_is_not_baseline() -> None:
    """A thread started during the recording makes a tensor the cell then uses: it is named,
    and its tensor is not memory held before the cell."""
    made: list[torch.Tensor] = []
    lin = nn.Linear(512, 2)

    def make() -> None:
        made.append(torch.ones(512, 512))

    with jv.record("cpu") as rec, torch.no_grad():
        thread = threading.Thread(target=make, name="maker")
        thread.start()
        thread.join()
        lin(made[0])
    prof = rec.profile
    assert prof.meta.get("other_threads") == ["maker"]
    df = prof.to_dataframe()
    there = df[df["op"] == ELSEWHERE_OP]
    assert list(there["bytes"]) == [512 * 512 * 4]
    assert set(there["category"]) == {"input"} and (there["alloc_seq"] >= 0).all()
    assert prof.timeline.baseline_bytes == 512 * 2 * 4 + 2 * 4  # the layer's weight and bias


# -- memory made here and freed on another thread --------------------------------------------


def test_a_noted_tensor_freed_on_another_thread_is_freed_in_the_profile() -> None:
    """x (4 MiB, the layer's input) is made here; a Python thread drops its last reference.
    By hand: x + out = 8 MiB at the peak, out + z = 5 MiB at the end (without inferring
    the free: 9 MiB, x alive to the end)."""
    lin = nn.Linear(256, 256)
    with jv.record("cpu") as rec, torch.no_grad():
        box = [torch.ones(4096, 256)]
        out = lin(box[0])
        _free_elsewhere(box)
        z = torch.ones(1024, 256)
    prof = rec.profile
    assert out.numel() * 4 == 4 * MIB and z.numel() * 4 == MIB
    assert prof.peak_bytes - prof.timeline.baseline_bytes == 8 * MIB
    assert _end_bytes(prof) == 5 * MIB
    assert prof.meta.get("inferred_frees", 0) >= 1


def test_same_program_on_one_thread_agrees() -> None:
    """The same program with the drop on the recording thread: the allocator reports the
    free (truth), and the profile with the free on another thread has the same timeline."""
    lin = nn.Linear(256, 256)
    totals = []
    for elsewhere in (False, True):
        with jv.record("cpu") as rec, torch.no_grad():
            box = [torch.ones(4096, 256)]
            out = lin(box[0])
            if elsewhere:
                _free_elsewhere(box)
            else:
                _drop(box)
            z = torch.ones(1024, 256)
        t = rec.profile.timeline
        totals.append([int(t.total_at(i)) for i in range(len(t))])
        del out, z
    assert totals[0] == totals[1]


def test_unnoted_memory_freed_on_another_thread_is_gone_by_the_next_module_call() -> None:
    """x, a 64 MiB buffer nothing notes (no role), is freed on a Python thread; a step later a
    layer runs, then y (64 MiB) is made. Blocks this large are mapped on their own (glibc's
    mmap threshold is at most 32 MiB): the memory map read at the layer's call no longer has
    x's bytes. By hand: peak = y + the layer's input and output = 66 MiB (130 MiB with x
    kept), and the same 66 MiB live at the end."""
    lin = nn.Linear(256, 256)
    with jv.record("cpu") as rec, torch.no_grad():
        inp = torch.ones(1024, 256)
        box = [torch.empty(16 * MIB)]
        _free_elsewhere(box)
        _until_a_map_is_due(rec)
        out = lin(inp)
        y = torch.empty(16 * MIB)
    prof = rec.profile
    assert inp.numel() * 4 == MIB and out.numel() * 4 == MIB and y.numel() * 4 == 64 * MIB
    assert prof.peak_bytes - prof.timeline.baseline_bytes == 66 * MIB
    assert _end_bytes(prof) == 66 * MIB
    assert prof.meta.get("inferred_frees", 0) >= 1


def test_unnoted_memory_freed_on_another_thread_is_gone_at_the_end() -> None:
    """Without a module call after the free, the last memory map (at the end) still proves
    it gone: 1 MiB live at the end by hand. When it went is not known, so the peak may hold
    it (the latest time the evidence allows)."""
    with jv.record("cpu") as rec:
        box = [torch.empty(16 * MIB)]
        _free_elsewhere(box)
        z = torch.ones(MIB // 4)
    assert z.numel() * 4 == MIB
    assert _end_bytes(rec.profile) == MIB


def _broadcast_and_drop() -> None:
    """Each rank: a 64 MiB buffer broadcast asynchronously and dropped at once, so gloo's
    work thread holds its last reference and frees it there (on the recording thread when
    the main thread happens to let go last); then a step later a layer runs and another
    64 MiB buffer is made."""
    import torch.distributed as dist

    lin = nn.Linear(256, 256)
    big = torch.ones(16 * MIB)
    work = dist.broadcast(big, 0, async_op=True)
    del big, work
    dist.barrier()
    time.sleep(0.2)
    with torch.no_grad():
        out = lin(torch.ones(1024, 256))
    y = torch.empty(16 * MIB)
    del out, y


def test_a_buffer_gloo_frees_on_its_thread_leaves_the_peak() -> None:
    """By hand, per rank: the peak is the second buffer + the layer's output + its weight
    and bias = 64 MiB + 1 MiB + 263,168 B (with the broadcast buffer kept: 64 MiB more)."""
    profiles = jv.launch(_broadcast_and_drop, nproc=2, stacks=False, timeout=300)
    expected = 64 * MIB + MIB + 256 * 256 * 4 + 256 * 4
    for prof in profiles:
        assert prof.peak_bytes - prof.timeline.baseline_bytes == expected, prof.meta
        assert _end_bytes(prof) == 0


# -- the rules themselves, on reports written by hand -----------------------------------------

T0 = 1_000_000_000
A = 0x10_0000
INPUT = CATEGORY_INDEX["input"]
PARAMETER = CATEGORY_INDEX["parameter"]


def _rows(
    events: list[tuple[int, int, int]],
    notes: Sequence[tuple[int, int, int, int, int, int]] = (),
    modules: Sequence[str] = (),
    **options: object,
) -> tuple[jv.Profile, int]:
    builder = ProfileBuilder()
    for name in modules:  # their ids from 1 on, for notes to name
        builder.modules(name)
    read = EventRead.of(
        ["", "op"], [AllocEvent(T0 + t, ptr, size, op=1) for t, ptr, size in events]
    )
    inferred = build_rows(builder, read, notes, {}, t0=T0, **options).inferred_frees  # type: ignore[arg-type]
    return builder.build(device="cpu", source="test", wall_ns=10**9), inferred


def _live_at_end(prof: jv.Profile) -> list[int]:
    a = prof.allocations
    return sorted(int(s) for s in a.size[a.free_seq < 0])


def test_an_allocation_over_a_live_block_ends_it_just_before() -> None:
    """Block 1 [A, A+100) is never seen freed; block 2 [A+50, A+150) is handed out at 2 ms:
    block 1 was freed before, unseen. Peak by hand: 100 (never 200)."""
    prof, inferred = _rows([(1_000_000, A, 100), (2_000_000, A + 50, 100)])
    assert inferred == 1
    assert prof.peak_bytes == 100
    assert _live_at_end(prof) == [100]
    assert int(prof.allocations.free_ns[0]) == 2_000_000 - 1


def test_reported_frees_are_not_counted_as_inferred() -> None:
    prof, inferred = _rows([(1_000, A, 100), (2_000, A, -100), (3_000, A, 100)])
    assert inferred == 0 and prof.peak_bytes == 100


def _map(at: int, *ranges: tuple[int, int]) -> MemoryMap:
    return MemoryMap(
        T0 + at,
        T0 + at + 10,
        array("Q", [r[0] for r in ranges]),
        array("Q", [r[1] for r in ranges]),
    )


def test_a_block_unmapped_in_a_later_snapshot_ends_there() -> None:
    """Block [A, A+100) is never seen freed; the memory map at 3 ms no longer has its bytes:
    it went before then (by hand: 100 bytes until 3 ms, then 30)."""
    mapped = (A, 2 * A + 100)
    maps = [_map(0, mapped), _map(2_000_000, mapped), _map(3_000_000, (2 * A, 2 * A + 100))]
    prof, inferred = _rows([(1_000, A, 100), (2_000, 2 * A, 30)], maps=maps)
    assert inferred == 1
    assert _live_at_end(prof) == [30]
    assert int(prof.allocations.free_ns[0]) == 3_000_000 + 10
    assert prof.peak_bytes == 130


def test_a_maps_column_of_addresses_agrees_with_one_by_one() -> None:
    """Which addresses a snapshot holds, asked for a whole column at once (the live blocks of
    a cell that keeps 300,000 tensors), is what asking for each one says: ranges are
    half-open, and addresses before the first range or past the last are not held."""
    snapshot = _map(0, (100, 200), (300, 301), (2**63 + 5, 2**63 + 50))
    ptrs = np.array([0, 99, 100, 150, 199, 200, 299, 300, 301, 10**12, 2**62], np.int64)
    by_hand = [False, False, True, True, True, False, False, True, False, False, False]
    assert snapshot.holds_each(ptrs).tolist() == by_hand
    assert [snapshot.holds(int(p)) for p in ptrs] == by_hand
    assert _map(0).holds_each(ptrs).tolist() == [False] * len(ptrs)  # nothing mapped


def test_memory_from_before_the_cell_unmapped_later_ends_there() -> None:
    """Two storages from before the cell (noted at the start, no report): the one at 4A is
    gone from the memory map at 3 ms (freed on another thread), the one at 5A stays mapped.
    By hand: 64 + 32 bytes before the cell, 32 at the end."""
    notes = [(T0 - 10, 4 * A, 64, INPUT, 0, 1), (T0 - 5, 5 * A, 32, INPUT, 0, 2)]
    both, kept = (4 * A, 5 * A + 32), (5 * A, 5 * A + 32)
    maps = [_map(0, both), _map(2_000_000, both), _map(3_000_000, kept)]
    prof, inferred = _rows([], notes, maps=maps)
    assert inferred == 1
    assert _live_at_end(prof) == [32]
    assert prof.timeline.baseline_bytes == 96
    assert int(prof.allocations.free_ns[0]) == 3_000_000 + 10


def test_a_block_still_mapped_stays() -> None:
    maps = [_map(0, (A, A + 100)), _map(3_000_000, (A, A + 100))]
    prof, inferred = _rows([(1_000, A, 100)], maps=maps)
    assert inferred == 0 and _live_at_end(prof) == [100]


def test_unreported_memory_is_baseline_without_evidence() -> None:
    """A storage noted at 3 ms that no report covers: held before the cell, also when other
    threads exist but none ran (no ``threads_ran_from``)."""
    note = (T0 + 3_000_000, 4 * A, 64, INPUT, 0, 7)
    prof, _ = _rows([(1_000_000, A, 100)], [note])
    a = prof.allocations
    assert prof.ops[int(a.op[1])] == BASELINE_OP and int(a.alloc_seq[1]) == -1
    assert prof.timeline.baseline_bytes == 64


def test_a_thread_that_ran_makes_it_another_threads_from_its_start() -> None:
    note = (T0 + 3_000_000, 4 * A, 64, INPUT, 0, 7)
    prof, _ = _rows([(1_000_000, A, 100)], [note], threads_ran_from=T0 + 2_000_000)
    a = prof.allocations
    assert prof.ops[int(a.op[1])] == ELSEWHERE_OP
    assert int(a.alloc_ns[1]) == 0  # from the start: a guess must not lower a peak
    assert prof.timeline.baseline_bytes == 0 and prof.peak_bytes == 164


def test_a_thread_that_ran_says_nothing_about_a_models_parameters() -> None:
    note = (T0 + 3_000_000, 4 * A, 64, PARAMETER, 0, 7)
    prof, _ = _rows([(1_000_000, A, 100)], [note], threads_ran_from=T0 + 2_000_000)
    assert prof.ops[int(prof.allocations.op[1])] == BASELINE_OP


def test_a_note_over_bytes_the_recording_saw_freed_is_another_threads() -> None:
    """[A, A+100) was allocated and freed here (1-2 ms); at 3 ms a storage nobody reported
    sits at A: it was made after 2 ms, elsewhere, though no thread was seen to run."""
    note = (T0 + 3_000_000, A, 100, INPUT, 0, 7)
    prof, _ = _rows([(1_000_000, A, 100), (2_000_000, A, -100)], [note])
    a = prof.allocations
    assert prof.ops[int(a.op[1])] == ELSEWHERE_OP
    assert int(a.alloc_ns[1]) == 2_000_000 + 1  # from just after the bytes were seen free
    assert prof.timeline.baseline_bytes == 0 and prof.peak_bytes == 100


def test_a_note_over_a_live_block_ends_that_block() -> None:
    """Block [A, A+100) never seen freed; at 3 ms another thread's storage is noted at
    [A+40, A+140): the block was gone by then. Peak by hand: 100."""
    note = (T0 + 3_000_000, A + 40, 100, INPUT, 0, 7)
    prof, inferred = _rows([(1_000_000, A, 100)], [note])
    assert inferred == 1
    assert prof.peak_bytes == 100
    assert np.array_equal(prof.allocations.free_seq >= 0, [True, False])


def test_notes_from_before_the_start_all_at_once_are_as_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The notes taken as recording starts (the namespace's tensors, model state) become
    rows all at once exactly as one note at a time would make them: first size, strongest
    role (an activation from before the cell is an input), first module, last address and
    time; then later notes of the same storages and the reports as ever."""
    from jupyter_vram._capture import cpu_rows

    rng = np.random.default_rng(3)
    roles = [PARAMETER, INPUT, CATEGORY_INDEX["activation"], CATEGORY_INDEX["buffer"],
             CATEGORY_INDEX["other"], CATEGORY_INDEX["gradient"]]  # fmt: skip
    for trial in range(40):
        keys = rng.integers(1, 30, int(rng.integers(1, 80)))
        early = [
            (T0 - 5_000_000 + 10 * i, A * (int(k) + 2) + int(rng.integers(0, 2)) * (A // 2),
             64 * int(k), int(rng.choice(roles)), int(rng.choice([0, 0, 3, 4])), int(k))
            for i, k in enumerate(keys)
        ]  # fmt: skip
        later = [
            (T0 + 2_000_000 + i, A * (k + 2), 64 * k, INPUT, 0, k) for i, k in enumerate((1, 2, 40))
        ]
        # a block over the far half of storage 5's bytes, after every note: it ends the
        # storage's row where that was its last address
        events = [
            (1_000_000, A * 100, 4096),
            (3_000_000, A * 100, -4096),
            (5_000_000, A * 7 + A // 2, 64),
        ]
        notes = early + later
        monkeypatch.setattr(cpu_rows, "_early_notes", lambda *a: 0)  # one note at a time
        expected = _columns(_rows(events, notes, MODULES)[0])
        monkeypatch.undo()
        assert _columns(_rows(events, notes, MODULES)[0]) == expected, trial
        assert len(expected["size"]) == 2 + len(set(keys.tolist()) | {1, 2, 40})  # by key


MODULES = ("Net", "Net.a", "Net.b", "Net.c")


def _columns(prof: jv.Profile) -> dict[str, list[int]]:
    a = prof.allocations
    names = ("size", "alloc_seq", "free_seq", "category", "module", "op")
    return {name: np.asarray(getattr(a, name)).tolist() for name in names}


def test_notes_placed_together_are_as_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training loop notes thousands of tensors (gradients, activations saved for
    backward, parameters saved again at every step). Those whose row is settled before any
    note is placed go in together: the rows, the addresses kept for leaks and the frees
    inferred are exactly what placing them one at a time gives, over random reports (blocks
    made, freed, made over without a free) and notes (on live, freed and never-reported
    memory; storages from before the cell noted again; deaths known or not)."""
    from jupyter_vram._capture import cpu_rows

    together = cpu_rows._notes_at_once
    placed: list[tuple[int, int]] = []  # (notes placed together, of them before the cell)

    def one_by_one(*args: Any) -> cpu_rows._AtOnce:
        n = len(args[3])
        return cpu_rows._AtOnce(np.full(n, -1), np.zeros(n, np.int64), {})

    def counted(*args: Any) -> cpu_rows._AtOnce:
        found = together(*args)
        placed.append((int((found.rows >= 0).sum()), len(found.last)))
        return found

    rng = np.random.default_rng(11)
    for trial in range(60):
        case = _random_notes_case(rng)
        monkeypatch.setattr(cpu_rows, "_notes_at_once", one_by_one)
        expected = _placed(*case)
        monkeypatch.setattr(cpu_rows, "_notes_at_once", counted)
        assert _placed(*case) == expected, trial
    assert sum(n for n, _ in placed) > 500 and sum(b for _, b in placed) > 20  # both exercised


Note = tuple[int, int, int, int, int, int]


def _random_notes_case(
    rng: np.random.Generator,
) -> tuple[list[tuple[int, int, int]], list[Note], dict[int, int]]:
    """Reports at seven addresses, notes at nine (two never reported), deaths of some."""
    roles = [PARAMETER, INPUT, CATEGORY_INDEX["activation"], CATEGORY_INDEX["gradient"],
             CATEGORY_INDEX["optimizer_state"], CATEGORY_INDEX["other"]]  # fmt: skip
    events: list[tuple[int, int, int]] = []
    live: dict[int, int] = {}
    for step in range(int(rng.integers(5, 60))):
        at = A * int(rng.integers(1, 8))
        t = 1_000_000 + 100_000 * step
        if at in live and rng.random() < 0.6:
            events.append((t, at, -live.pop(at)))  # a reported free
        else:
            live[at] = 64 * int(rng.integers(1, 4))  # a new block (over a live one: unseen)
            events.append((t, at, live[at]))
    early: list[Note] = [
        (T0 - 1_000_000 + i, A * k, 64, int(rng.choice(roles)), 0, 100 + k)
        for i, k in enumerate(rng.integers(1, 10, int(rng.integers(0, 6))).tolist())
    ]  # memory from before the cell
    later: list[Note] = []
    for i in range(int(rng.integers(1, 300))):
        k = int(rng.integers(1, 10))
        # the same storage (now and then elsewhere, or over part of a block), or not
        key = 100 + k if rng.random() < 0.5 else 1000 + i
        at = A * k + (32 if rng.random() < 0.1 else 0)
        if key < 1000 and rng.random() < 0.1:
            key = 100 + int(rng.integers(1, 10))
        later.append((T0 + 1_000_000 + int(rng.integers(0, len(events) * 100_000)), at,
                      64 * int(rng.integers(1, 4)), int(rng.choice(roles)),
                      int(rng.choice([0, 0, 1, 2, 3])), key))  # fmt: skip
    notes = early + sorted(later)  # in time order
    freed = {key: T0 + 1_000_000 + int(rng.integers(0, 7_000_000))
             for key in {n[5] for n in notes} if rng.random() < 0.3}  # fmt: skip
    return events, notes, freed


def _placed(
    events: list[tuple[int, int, int]], notes: list[Note], freed: dict[int, int]
) -> tuple[dict[str, list[int]], list[bool], int]:
    """The rows' columns, which rows keep an address, and how many frees were inferred."""
    builder = ProfileBuilder()
    for name in MODULES:
        builder.modules(name)
    read = EventRead.of(["", "op"], [AllocEvent(T0 + t, p, s, op=1) for t, p, s in events])
    found = build_rows(builder, read, list(notes), dict(freed), t0=T0)
    prof = builder.build(device="cpu", source="test", wall_ns=10**9)
    return _columns(prof), (found.addresses >= 0).tolist(), found.inferred_frees


def test_a_row_takes_the_first_module_noted_on_it() -> None:
    """A block made at 1 ms with no module, noted at 2, 3 and 4 ms in calls of Net.a, Net.b
    and Net (placed together), is Net.a's; a block made in Net keeps its module. A storage
    from before the cell noted in Net.b then Net is Net.b's (a storage over part of its
    bytes, noted between, is placed one note at a time)."""
    builder = ProfileBuilder()
    for name in MODULES:
        builder.modules(name)
    read = EventRead.of(
        ["", "op"],
        [
            AllocEvent(T0 + 1_000_000, A, 64, op=1),
            AllocEvent(T0 + 1_000_000, 2 * A, 64, op=1, module=1),
        ],
    )
    notes = [
        (T0 - 10, 5 * A, 64, INPUT, 0, 50),
        (T0 + 2_000_000, A, 64, CATEGORY_INDEX["activation"], 2, 1),
        (T0 + 2_500_000, 2 * A, 64, CATEGORY_INDEX["activation"], 3, 2),
        (T0 + 3_000_000, A, 64, CATEGORY_INDEX["activation"], 3, 1),
        (T0 + 3_500_000, 5 * A + 8, 32, INPUT, 3, 51),  # over part of it: the loop's
        (T0 + 3_600_000, 5 * A, 64, INPUT, 3, 50),
        (T0 + 4_000_000, A, 64, CATEGORY_INDEX["activation"], 1, 1),
        (T0 + 4_100_000, 5 * A, 64, INPUT, 1, 50),
    ]
    build_rows(builder, read, notes, {}, t0=T0)
    prof = builder.build(device="cpu", source="test", wall_ns=10**9)
    names = [prof.modules[int(m)] for m in prof.allocations.module]
    assert names == ["Net.a", "Net", "Net.b", "Net.b"]  # ids: Net 1, Net.a 2, Net.b 3
