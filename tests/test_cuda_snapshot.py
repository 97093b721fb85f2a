"""CUDA allocator snapshots -> Profile, checked against an independently simulated allocator.

The fixture (tests/fixtures/make_cuda_snapshot.py) plays the caching allocator and the
recorder through one MLP training step and writes the snapshot in torch's format together with
the allocator's own counters; the tests compare the converted profile against those. Recorder
wiring runs against a fake allocator API here; the ``cuda``-marked tests run on a real GPU.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._allocator_rules import round_size
from jupyter_vram._analysis.tables import allocations_frame
from jupyter_vram._capture import RECORDING_LOCK, RecordingError
from jupyter_vram._capture.cuda_convert import (
    MARKER_FALLBACK_BYTES,
    markers_by_size,
    profile_from_snapshot,
)
from jupyter_vram._capture.cuda_snapshot import CudaSnapshotRecorder
from jupyter_vram._model import CATEGORIES, CATEGORY_INDEX, LEGACY_CATEGORIES, Frame, Profile

from .conftest import cuda_snapshot_generator

FIXTURES = Path(__file__).parent / "fixtures"
MIB = 1 << 20


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / "cuda_snapshot_mlp.json").read_text())
    return loaded


@pytest.fixture(scope="module")
def prof(data: dict[str, Any]) -> Profile:
    return convert(data)


def convert(data: dict[str, Any], **kwargs: Any) -> Profile:
    args: dict[str, Any] = {
        "baseline": data["baseline"],
        "roles": current_roles(data),
        "modules": data["modules"],
    }
    args.update(kwargs)
    snapshot = args.pop("snapshot", data["snapshot"])
    return profile_from_snapshot(snapshot, **args)


def current_roles(data: dict[str, Any]) -> list[list[int]]:
    """The fixture's roles with categories in this version's table (the generator writes the
    table it used; the stored fixture predates ``frozen_parameter`` and friends)."""
    names = data.get("category_names", LEGACY_CATEGORIES)
    return [[a, CATEGORY_INDEX[names[c]], m, k] for a, c, m, k in data["roles"]]


def reserved_peak(profile: Profile) -> int:
    seg = profile.segments
    order = np.argsort(seg.seq, kind="stable")
    running = np.cumsum(seg.delta[order])
    return int(seg.baseline + max(0, int(running.max()) if len(running) else 0))


def rows_by_seq(profile: Profile) -> dict[int, int]:
    return {int(s): i for i, s in enumerate(profile.allocations.alloc_seq) if s >= 0}


def end_bytes(profile: Profile) -> int:
    t = profile.timeline
    return t.total_at(len(t) - 1)


def wrapped(data: dict[str, Any]) -> dict[str, Any]:
    """The snapshot a ring buffer of ``keep_last`` entries would have kept."""
    snapshot: dict[str, Any] = copy.copy(data["snapshot"])
    snapshot["device_traces"] = [
        data["snapshot"]["device_traces"][0][-data["wrapped"]["keep_last"] :]
    ]
    return snapshot


# -- the fixture itself ------------------------------------------------------------------------


def test_fixture_is_what_the_generator_writes(data: dict[str, Any]) -> None:
    with cuda_snapshot_generator() as module:
        assert json.loads(json.dumps(module.build())) == data


def test_fixture_follows_the_snapshot_format(data: dict[str, Any]) -> None:
    snap = data["snapshot"]
    assert set(snap) >= {"segments", "device_traces", "allocator_settings"}
    seg = snap["segments"][0]
    assert set(seg) >= {"device", "address", "total_size", "allocated_size", "active_size",
                        "requested_size", "stream", "segment_type", "blocks"}  # fmt: skip
    states = {b["state"] for s in snap["segments"] for b in s["blocks"]}
    assert states <= {"active_allocated", "active_pending_free", "inactive"}
    actions = {e["action"] for e in snap["device_traces"][0]}
    assert actions == {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                       "snapshot"}  # fmt: skip
    entry = next(
        e
        for e in snap["device_traces"][0]
        if e["action"] == "alloc" and e["user_metadata"][0] != "j"
    )
    assert set(entry) >= {"addr", "size", "stream", "time_us", "frames", "user_metadata"}
    assert entry["frames"][0]["name"] == "__torch_dispatch__"  # innermost first
    assert data["baseline"]["device_traces"] == [[]]  # taken before history was switched on


# -- conversion exactness --------------------------------------------------------------------


def test_peak_equals_the_allocators_peak(prof: Profile, data: dict[str, Any]) -> None:
    expected = data["expected"]
    assert prof.peak_bytes == expected["peak_allocated"]
    assert prof.timeline.baseline_bytes == expected["baseline_allocated"]
    assert end_bytes(prof) == expected["end_allocated"]
    assert prof.meta["sizes_replayed"] is True
    assert prof.meta["estimated_sizes"] == 0
    assert prof.meta["size_mismatches"] == 0 and prof.meta["inconsistencies"] == 0
    assert prof.meta["truncated"] is False
    assert prof.device == "cuda:0" and prof.source == "cuda_snapshot"


def test_every_allocation_has_its_block_size_label_and_role(
    prof: Profile, data: dict[str, Any]
) -> None:
    a = prof.allocations
    rows = rows_by_seq(prof)
    for want in data["expected"]["rows"]:
        i = rows[want["seq"]]
        got = {
            "size": int(a.size[i]),
            "category": CATEGORIES[a.category[i]],
            "phase": int(a.phase[i]),
            "module": prof.modules[a.module[i]],
            "op": prof.ops[a.op[i]],
        }
        assert got == {k: want[k] for k in got}, want
    # Block sizes are not the requests: the trace logs 3.5 MiB, the block is 4.375 MiB.
    sizes = {(r["requested"], r["size"]) for r in data["expected"]["rows"]}
    assert (3584 * 1024, 4587520) in sizes and (16384000, 16 * MIB) in sizes


def test_markers_are_filtered(prof: Profile, data: dict[str, Any]) -> None:
    trace = data["snapshot"]["device_traces"][0]
    marker_seqs = {i for i, e in enumerate(trace) if e["user_metadata"].startswith("jv-marker|")}
    assert len(marker_seqs) == 3 * data["expected"]["markers"]  # alloc + two frees each
    assert prof.meta["markers"] == data["expected"]["markers"]
    a = prof.allocations
    assert not marker_seqs & set(a.alloc_seq.tolist()) and not marker_seqs & set(
        a.free_seq.tolist()
    )
    assert len(a) == len(data["expected"]["rows"]) + len(data["expected"]["baseline_rows"])
    assert not any(op.startswith("jv-marker") for op in prof.ops)


def test_categories_at_the_peak(prof: Profile, data: dict[str, Any]) -> None:
    breakdown = prof.peak_breakdown()
    assert breakdown == {**dict.fromkeys(CATEGORIES, 0), **data["expected"]["peak_breakdown"]}
    assert sum(breakdown.values()) == prof.peak_bytes


def test_reserved_timeline_is_segment_arithmetic(prof: Profile, data: dict[str, Any]) -> None:
    expected = data["expected"]
    assert prof.segments.baseline == expected["baseline_reserved"]
    assert reserved_peak(prof) == expected["peak_reserved"]
    assert prof.segments.baseline + int(prof.segments.delta.sum()) == expected["end_reserved"]
    assert prof.meta["reserved_end"] == expected["end_reserved"]
    assert "reserved_mismatch" not in prof.meta
    assert (prof.segments.delta < 0).any()  # empty_cache released segments


def test_baseline_rows(prof: Profile, data: dict[str, Any]) -> None:
    a = prof.allocations
    base = a.alloc_seq < 0
    got = sorted(zip(a.size[base].tolist(), (CATEGORIES[c] for c in a.category[base]), strict=True))
    want = sorted((r["size"], r["category"]) for r in data["expected"]["baseline_rows"])
    assert got == want
    assert (a.free_seq[base] == -1).all()
    assert {prof.ops[o] for o in a.op[base]} == {"(before recording)"}
    # Parameters are charged to the module that owns them.
    params = base & (a.category == CATEGORY_INDEX["parameter"])
    assert {prof.modules[m] for m in a.module[params]} == {"MLP.fc1", "MLP.fc2"}


def test_roles_go_to_the_allocation_live_when_observed(prof: Profile, data: dict[str, Any]) -> None:
    trace = data["snapshot"]["device_traces"][0]
    rows = rows_by_seq(prof)
    saved, state = 19, 60  # nll_loss's saved total_weight; an Adam state later at its address
    assert trace[saved]["addr"] == trace[state]["addr"]
    a = prof.allocations
    assert CATEGORIES[a.category[rows[saved]]] == "activation"
    assert CATEGORIES[a.category[rows[state]]] == "optimizer_state"
    assert prof.modules[a.module[rows[state]]] == "Adam.step"  # its label wins over the owner


def test_role_placement_rules(data: dict[str, Any]) -> None:
    trace = data["snapshot"]["device_traces"][0]
    addr = trace[19]["addr"]  # also the address of row 60
    activation = CATEGORY_INDEX["activation"]
    # Unplaced (-1): the row at that address live at the end of the trace, else the latest.
    late = convert(data, roles=[[addr, activation, 0, -1]])
    rows = rows_by_seq(late)
    assert CATEGORIES[late.allocations.category[rows[60]]] == "activation"
    assert CATEGORIES[late.allocations.category[rows[19]]] == "temporary"
    # Marker 0 (before the trace): only rows live at the start qualify; here it falls back to
    # the first row at the address.
    early = convert(data, roles=[[addr, activation, 0, 0]])
    assert CATEGORIES[early.allocations.category[rows_by_seq(early)[19]]] == "activation"


def test_stacks_keep_user_frames_outermost_first(prof: Profile) -> None:
    rows = rows_by_seq(prof)
    a = prof.allocations
    assert prof.stack_of(int(a.stack[rows[3]])) == (
        Frame("/tmp/ipykernel_31337/1482649175.py", 12, "<module>"),
        Frame("/tmp/ipykernel_31337/1482649175.py", 5, "train_step"),
        Frame("/tmp/ipykernel_31337/2285013478.py", 9, "forward"),
    )
    assert prof.stack_of(int(a.stack[rows[24]])) == ()  # backward thread: only our frames


def test_stacks_stop_at_the_frame_that_started_recording(data: dict[str, Any]) -> None:
    cell = "/tmp/ipykernel_31337/1482649175.py"
    kernel = "/usr/local/lib/python3.11/site-packages/IPython/core/interactiveshell.py"
    # `with jv.record():` inside train_step: its callers (the cell, the kernel) are dropped.
    boundary = [(cell, 4, "train_step"), (cell, 12, "<module>"), (kernel, 3577, "run_code")]
    prof = convert(data, boundary=boundary)
    rows = rows_by_seq(prof)
    a = prof.allocations
    assert prof.stack_of(int(a.stack[rows[3]])) == (
        Frame(cell, 5, "train_step"),
        Frame("/tmp/ipykernel_31337/2285013478.py", 9, "forward"),
    )
    assert prof.stack_of(int(a.stack[rows[57]]))[0] == Frame(cell, 7, "train_step")  # optimizer
    # A boundary that does not match leaves stacks whole.
    other = convert(data, boundary=[(cell, 4, "elsewhere"), (cell, 12, "<module>")])
    assert len(other.stack_of(int(other.allocations.stack[rows[3]]))) == 3


def test_times_are_relative_microseconds(prof: Profile, data: dict[str, Any]) -> None:
    trace = data["snapshot"]["device_traces"][0]
    rows = rows_by_seq(prof)
    t0 = trace[0]["time_us"]
    for seq in (3, 50):
        assert prof.allocations.alloc_ns[rows[seq]] == (trace[seq]["time_us"] - t0) * 1000
    assert (np.diff(prof.timeline.time_ns) >= 0).all()


def test_op_falls_back_to_the_innermost_user_frame(data: dict[str, Any]) -> None:
    snapshot = copy.deepcopy(data["snapshot"])
    for entry in snapshot["device_traces"][0]:
        entry.pop("user_metadata")  # torch before 2.10 has no metadata (and no markers)
    prof = convert(data, snapshot=snapshot, roles=[])
    a = prof.allocations
    first = rows_by_seq(prof)[3]
    assert prof.ops[a.op[first]] == "forward" and a.phase[first] == 0
    markers = data["expected"]["markers"]
    assert prof.meta["markers"] == 0  # without metadata markers are plain 512-byte rows
    assert (
        len(a) == len(data["expected"]["rows"]) + len(data["expected"]["baseline_rows"]) + markers
    )


# -- without a baseline, and with a wrapped ring buffer ----------------------------------------


def test_without_baseline_blocks_alive_are_inferred(data: dict[str, Any]) -> None:
    expected = data["expected"]
    prof = convert(data, baseline=None)
    assert prof.timeline.baseline_bytes == expected["baseline_allocated"]
    assert end_bytes(prof) == expected["end_allocated"]
    bound = expected["peak_uncertainty_without_baseline"]
    assert expected["peak_allocated"] - bound <= prof.peak_bytes <= expected["peak_allocated"]
    assert prof.meta["estimated_sizes"] > 0 and prof.meta["truncated"] is False
    assert prof.segments.baseline == expected["baseline_reserved"]  # from the end state
    assert reserved_peak(prof) == expected["peak_reserved"]


@pytest.mark.parametrize("detect", ["max_entries", "baseline"])
def test_wrapped_ring_buffer(data: dict[str, Any], detect: str) -> None:
    want = data["wrapped"]
    snapshot = wrapped(data)
    if detect == "max_entries":
        prof = convert(data, snapshot=snapshot, baseline=None, max_entries=want["keep_last"])
    else:  # a free of a block that was neither in the baseline nor allocated in the trace
        prof = convert(data, snapshot=snapshot)
    assert prof.meta["truncated"] is True
    assert want["peak_allocated"] - want["peak_uncertainty"] <= prof.peak_bytes
    assert prof.peak_bytes <= want["peak_allocated"]
    assert end_bytes(prof) == want["end_allocated"]
    assert reserved_peak(prof) == want["peak_reserved"]
    before = prof.allocations.alloc_seq < 0
    assert (prof.allocations.free_seq[before] >= 0).any()  # blocks freed inside the window


# -- free_requested / free_completed -------------------------------------------------------------


def entry(action: str, addr: int, size: int, t: int) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "user_metadata": ""}  # fmt: skip


def test_free_completed_closes_and_free_requested_only_if_never_completed() -> None:
    base = 0x7000_0000_0000
    a, b, c = base, base + 1024, base + 3072
    trace = [
        entry("segment_alloc", base, 2 * MIB, 1),
        entry("alloc", a, 1000, 2),  # a 1024-byte block
        entry("alloc", b, 2048, 3),
        entry("free_requested", a, 1000, 4),  # used on another stream: free completes later
        entry("alloc", c, 4096, 5),
        entry("free_completed", a, 1000, 6),
        entry("free_requested", b, 2048, 7),  # still pending when the trace ends
    ]
    end_blocks = [
        {"address": a, "size": 1024, "requested_size": 0, "state": "inactive"},
        {"address": b, "size": 2048, "requested_size": 2048, "state": "active_pending_free"},
        {"address": c, "size": 4096, "requested_size": 4096, "state": "active_allocated"},
        {"address": c + 4096, "size": 2 * MIB - 7168, "requested_size": 0, "state": "inactive"},
    ]
    segment = {"device": 0, "address": base, "total_size": 2 * MIB, "segment_type": "small",
               "blocks": end_blocks}  # fmt: skip
    baseline: dict[str, Any] = {"segments": [], "device_traces": [[]]}
    prof = profile_from_snapshot(
        {"segments": [segment], "device_traces": [trace]}, baseline=baseline
    )
    al = prof.allocations
    rows = rows_by_seq(prof)
    assert al.free_seq[rows[1]] == 5  # closed by free_completed, not free_requested (3)
    assert al.free_seq[rows[2]] == 6  # never completed: closed at the request
    assert al.free_seq[rows[4]] == -1
    assert prof.peak_bytes == 1024 + 2048 + 4096
    assert prof.meta["sizes_replayed"] is True and prof.meta["estimated_sizes"] == 0


def test_expandable_segments_sizes_are_rounded_requests() -> None:
    base = 0x7000_0000_0000
    trace = [
        entry("segment_map", base, 20 * MIB, 1),
        entry("alloc", base, 19 * MIB + 100, 2),
        entry("free_requested", base, 19 * MIB + 100, 3),
        entry("free_completed", base, 19 * MIB + 100, 4),
        entry("segment_unmap", base, 20 * MIB, 5),
    ]
    snap = {"device_traces": [trace], "allocator_settings": {"expandable_segments": True}}
    prof = profile_from_snapshot(snap)
    assert prof.peak_bytes == 19 * MIB + 512
    assert prof.meta["expandable_segments"] is True and prof.meta["estimated_sizes"] == 0
    assert reserved_peak(prof) == 20 * MIB and prof.segments.baseline == 0


def test_round_size() -> None:
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    divisions = [4] * 16  # roundup_power2_divisions:4
    assert round_size(1200 * MIB, divisions) == 1280 * MIB  # the documented example
    assert round_size(1024 * MIB, divisions) == 1024 * MIB
    assert round_size(1000, divisions) == 1024  # below 512 * divisions: plain rounding


def test_nvml_is_optional() -> None:
    from jupyter_vram._capture.nvml import device_memory

    info = device_memory(0)  # never raises, with or without a driver
    if torch.cuda.is_available():
        assert info is None or info["used"] <= info["total"]
    else:
        assert info is None


# -- serialization -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cuda.json", "cuda.json.gz"])
def test_profile_round_trips(prof: Profile, tmp_path: Path, name: str) -> None:
    path = prof.save(tmp_path / name)
    back = Profile.load(path)
    assert back.to_dict() == prof.to_dict()
    assert back.peak_bytes == prof.peak_bytes and back.peak_breakdown() == prof.peak_breakdown()
    assert back.segments.baseline == prof.segments.baseline
    assert (back.segments.delta == prof.segments.delta).all()


# -- the recorder ------------------------------------------------------------------------------


def test_record_cuda_without_cuda_raises_cleanly() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with (
        pytest.raises(RecordingError, match=r"torch\.cuda\.is_available\(\) is False"),
        jv.record(device="cuda"),
    ):
        pass  # pragma: no cover - never entered
    assert not RECORDING_LOCK.locked()
    with jv.record(device="cpu") as rec:  # and recording still works
        torch.ones(8)
    assert rec.profile.event_count == 2


class FakeApi:
    """The private torch API surface, recorded instead of called."""

    def __init__(self, *, why: str | None = None, fail_snapshot: bool = False,
                 metadata: bool = True) -> None:  # fmt: skip
        self.why = why
        self.fail_snapshot = fail_snapshot
        self.metadata_ok = metadata
        self.calls: list[tuple[Any, ...]] = []
        self.metadata = "user label"
        self.labels: list[str] = []
        self.history = False

    def available(self) -> str | None:
        return self.why

    def metadata_supported(self) -> bool:
        return self.metadata_ok

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def start_history(self, *, context: str | None, max_entries: int) -> None:
        self.calls.append(("start", context, max_entries))
        self.history = True

    def stop_history(self) -> None:
        self.calls.append(("stop",))
        self.history = False

    def snapshot(self) -> dict[str, Any]:
        self.calls.append(("snapshot", self.history))
        if self.history and self.fail_snapshot:
            raise RuntimeError("snapshot failed")
        return {"segments": [], "device_traces": [[]]}

    def set_metadata(self, text: str) -> None:
        self.metadata = text
        self.labels.append(text)

    def get_metadata(self) -> str:
        return self.metadata

    def alloc_marker(self, device: torch.device, nbytes: int = 1) -> None:
        self.calls.append(("marker", self.metadata) if nbytes == 1 else ("marker", nbytes))

    def device_info(self, index: int) -> dict[str, Any]:
        return {"name": "Fake GPU", "total": 80 << 30}

    def workspace_sizes(self, index: int) -> dict[int, str] | None:
        return {32 << 20: "cuBLAS workspace"}


def fake_recorder(api: FakeApi) -> CudaSnapshotRecorder:
    rec = CudaSnapshotRecorder("cuda:0", max_entries=1234, labels="mode")
    rec._api = api  # type: ignore[assignment]
    return rec


def test_recorder_lifecycle_and_op_labels(mlp: nn.Module) -> None:
    api = FakeApi()
    rec = fake_recorder(api)
    rec.start()
    try:
        mlp(torch.randn(4, 256)).sum().backward()
    finally:
        prof = rec.stop()
    kinds = [c[0] for c in api.calls]
    assert kinds == ["marker", "snapshot", "start", "snapshot", "stop"]
    assert api.calls[1] == ("snapshot", False) and api.calls[3] == ("snapshot", True)
    assert api.calls[2] == ("start", "alloc", 1234)
    assert api.metadata == "user label"  # restored
    names = rec._modules.names
    labels = set(api.labels)
    fc1 = names.index("MLP.fc1")
    assert f"1|{fc1}|addmm" in labels  # forward, fc1, op
    assert any(re.fullmatch(rf"2\|{fc1}\|\w+", s) for s in labels)  # its backward ops
    assert prof.device == "cuda:0" and prof.device_info["name"] == "Fake GPU"
    assert prof.meta["ops"] is True and len(prof.allocations) == 0


def test_history_is_switched_off_even_if_the_snapshot_fails(mlp: nn.Module) -> None:
    api = FakeApi(fail_snapshot=True)
    rec = fake_recorder(api)
    rec.start()
    mlp(torch.randn(2, 256))
    with pytest.raises(RuntimeError, match="snapshot failed"):
        rec.stop()
    assert api.calls[-1] == ("stop",) and api.history is False
    assert api.metadata == "user label"


def test_failed_start_touches_nothing() -> None:
    api = FakeApi(why="no GPU here")
    rec = fake_recorder(api)
    with pytest.raises(RecordingError, match="no GPU here"):
        rec.start()
    prof = rec.stop()  # what jv.record does after a failed start
    assert api.calls == [] and len(prof.allocations) == 0


# -- on a real GPU ------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def history_is_off() -> bool:
    torch.empty(1024, device="cuda")  # would be logged if history were still on
    traces = torch.cuda.memory._snapshot()["device_traces"]
    return not any(traces)


@pytest.fixture
def cuda_mlp() -> Iterator[tuple[nn.Module, torch.optim.Optimizer]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1000)).cuda()
    yield model, torch.optim.Adam(model.parameters())
    torch.cuda.synchronize()


@pytest.mark.cuda
@cuda
def test_real_step_matches_the_allocator(cuda_mlp: tuple[nn.Module, torch.optim.Optimizer]) -> None:
    model, opt = cuda_mlp
    x = torch.randn(64, 1024, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with jv.record(device="cuda") as rec:
        nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
    prof = rec.profile
    max_allocated = torch.cuda.max_memory_allocated()
    # Markers are 512-byte blips the allocator counts and the profile drops.
    assert prof.peak_bytes <= max_allocated <= prof.peak_bytes + 512
    assert reserved_peak(prof) == torch.cuda.max_memory_reserved()
    assert prof.segments.baseline + int(prof.segments.delta.sum()) == torch.cuda.memory_reserved()
    assert end_bytes(prof) == torch.cuda.memory_allocated()
    assert prof.meta["sizes_replayed"] is True and prof.meta["estimated_sizes"] == 0
    assert prof.meta["size_mismatches"] == 0 and prof.meta["truncated"] is False
    live = prof.timeline.breakdown_at(len(prof.timeline) - 1)
    assert live["parameter"] > 0 and live["gradient"] > 0 and live["optimizer_state"] > 0
    phases = {prof.allocations.phase[i] for i in range(len(prof.allocations))}
    assert {1, 2, 3} <= phases
    assert prof.device_info["total"] > 0
    assert history_is_off() and not RECORDING_LOCK.locked()


@pytest.mark.cuda
@cuda
def test_real_error_switches_history_off() -> None:
    rec = jv.record(device="cuda")
    with pytest.raises(ValueError, match="boom"), rec:
        torch.ones(1 << 20, device="cuda")
        raise ValueError("boom")
    assert rec.profile.error == "ValueError: boom"
    assert rec.profile.peak_bytes >= 4 << 20
    assert history_is_off()


def test_profiler_labels_go_to_the_same_block_occurrence() -> None:
    """History entries get the label of the profiler's report for the same address and the
    same occurrence of it; markers keep theirs; frees are left alone."""
    from jupyter_vram._capture.cuda_convert import MARKER_PREFIX
    from jupyter_vram._capture.cuda_snapshot import label_from_profiler
    from jupyter_vram._capture.profiler_read import AllocEvent

    ops = ["(unknown)", "addmm", "mm", "empty"]
    events = [
        AllocEvent(10, 0xA00, 512, op=1, module=3, phase=1),
        AllocEvent(11, 0xB00, 1024, op=3, module=0, phase=0),  # the marker's own report
        AllocEvent(12, 0xA00, -512),
        AllocEvent(13, 0xA00, 2048, op=2, module=4, phase=2),
    ]
    entries = [
        {"action": "alloc", "addr": 0xA00, "size": 512},
        {"action": "alloc", "addr": 0xB00, "size": 512, "user_metadata": f"{MARKER_PREFIX}1"},
        {"action": "free_requested", "addr": 0xA00, "size": 512},
        {"action": "alloc", "addr": 0xA00, "size": 2048},
        {"action": "alloc", "addr": 0xC00, "size": 512},  # never reported: no label
    ]
    assert label_from_profiler(entries, events, ops) == 2
    assert [e.get("user_metadata") for e in entries] == [
        "1|3|addmm",
        f"{MARKER_PREFIX}1",
        None,
        "2|4|mm",
        None,
    ]


# -- torch without allocation labels (before 2.10) --------------------------------------------


def _entry(action: str, addr: int, size: int, t: int) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": []}  # fmt: skip


def _reused_address_trace() -> dict[str, Any]:
    """An activation at address A, a marker (263 bytes, freed at once: the role of the
    activation is seen there), the activation freed, and a later, unrelated block at A."""
    a, m = 0x7000_0000, 0x7000_2000
    trace = [
        _entry("alloc", a, 4096, 1),
        _entry("alloc", m, MARKER_FALLBACK_BYTES, 2),
        _entry("free_requested", m, MARKER_FALLBACK_BYTES, 3),
        _entry("free_completed", m, MARKER_FALLBACK_BYTES, 3),
        _entry("free_requested", a, 4096, 4),
        _entry("free_completed", a, 4096, 4),
        _entry("alloc", a, 4096, 5),
    ]
    return {"segments": [], "device_traces": [trace]}


def test_without_labels_markers_are_known_by_size_and_roles_land_on_their_block() -> None:
    """Torch before 2.10 has no ``_set_memory_metadata``: a role matched at the end of the
    trace lands on the last block at its address (the unrelated one), so markers are placed
    by their size instead and the activation keeps its own block."""
    activation = CATEGORIES.index("activation")
    roles = [(0x7000_0000, activation, 0, 1)]
    snap = _reused_address_trace()
    prof = profile_from_snapshot(snap, device_index=0, roles=roles,
                                 marker_size=MARKER_FALLBACK_BYTES, markers_emitted=1)  # fmt: skip
    df = allocations_frame(prof).sort_values("alloc_seq")
    assert list(zip(df["alloc_seq"], df["category"], strict=True)) == [
        (0, "activation"), (6, "temporary")]  # fmt: skip
    assert prof.meta["markers"] == 1  # the marker is no row
    at_end = [(0x7000_0000, activation, 0, -1)]  # what torch 2.4-2.9 got before
    old = allocations_frame(profile_from_snapshot(snap, device_index=0, roles=at_end))
    assert old.loc[old["category"] == "activation", "alloc_seq"].tolist() == [6]


def test_fallback_markers_count_from_the_end_of_a_truncated_trace() -> None:
    """Seven markers made, the ring buffer kept the last two: they are markers 6 and 7."""
    m = 0x7000_2000
    trace = [_entry("alloc", 0x100, 512, 0)]
    for t in (1, 2):
        trace += [_entry("alloc", m, MARKER_FALLBACK_BYTES, t),
                  _entry("free_requested", m, MARKER_FALLBACK_BYTES, t)]  # fmt: skip
    trace.append(_entry("alloc", 0x200, MARKER_FALLBACK_BYTES, 3))  # never freed: no marker
    assert markers_by_size(trace, MARKER_FALLBACK_BYTES, 7) == {1: 6, 3: 7}


def test_recorder_without_labels_emits_size_markers(mlp: nn.Module) -> None:
    api = FakeApi(metadata=False)
    rec = CudaSnapshotRecorder("cuda:0", max_entries=1234)  # profiler labels: no Python per op
    rec._api = api  # type: ignore[assignment]
    rec.start()
    try:
        mlp(torch.randn(4, 256)).sum().backward()
    finally:
        prof = rec.stop()
    markers = [c for c in api.calls if c[0] == "marker"]
    assert markers and set(markers) == {("marker", MARKER_FALLBACK_BYTES)}
    assert api.labels == []  # nothing was labelled
    assert prof.meta["marker_size"] == MARKER_FALLBACK_BYTES


class TraceApi(FakeApi):
    """A FakeApi whose allocator keeps a history: markers and the blocks a test allocates
    land in it, with the thread's metadata, as torch's history would have them."""

    def __init__(self, *, metadata: bool = True) -> None:
        super().__init__(metadata=metadata)
        self.trace: list[dict[str, Any]] = []
        self.metadata = ""
        self.t = 0

    def _log(self, action: str, addr: int, size: int) -> None:
        if self.history:
            self.t += 1
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                               "time_us": self.t, "frames": [],
                               "user_metadata": self.metadata})  # fmt: skip

    def alloc_marker(self, device: torch.device, nbytes: int = 1) -> None:
        super().alloc_marker(device, nbytes)
        for action in ("alloc", "free_requested", "free_completed"):
            self._log(action, 0xFFF000, nbytes)

    def user_block(self, addr: int, size: int, *, free: bool = False) -> None:
        self._log("alloc", addr, size)
        if free:
            self._log("free_requested", addr, size)
            self._log("free_completed", addr, size)

    def snapshot(self) -> dict[str, Any]:
        super().snapshot()
        return {"segments": [], "device_traces": [list(self.trace) if self.history else []]}


class FakeCudaTensor:
    """What the recorder reads of a tensor a role names: its device and storage address."""

    def __init__(self, addr: int) -> None:
        self.device = torch.device("cuda", 0)
        self._addr = addr

    def untyped_storage(self) -> Any:
        return type("Storage", (), {"data_ptr": lambda _: self._addr})()


@pytest.mark.parametrize("metadata", [True, False])
def test_role_markers_name_gradients_and_activations_at_reused_addresses(
    metadata: bool,
) -> None:
    """A gradient and an activation are reported while they live; each is then freed and its
    address reused by a block nobody names. The markers put each role on its own block, with
    labels (torch 2.10+) or by the markers' size (before)."""
    api = TraceApi(metadata=metadata)
    rec = CudaSnapshotRecorder("cuda:0", max_entries=1000)
    rec._api = api  # type: ignore[assignment]
    rec.start()
    try:
        for addr, category in ((0xA000, "activation"), (0xB000, "gradient")):
            api.user_block(addr, 4096)
            rec._on_role(FakeCudaTensor(addr), CATEGORY_INDEX[category], 0)  # type: ignore[arg-type]
            api._log("free_requested", addr, 4096)
            api._log("free_completed", addr, 4096)
            api.user_block(addr, 8192)  # the address reused by a block nobody names
    finally:
        prof = rec.stop()
    df = allocations_frame(prof).sort_values("alloc_seq")
    expected = [(4096, "activation"), (8192, "temporary"), (4096, "gradient"), (8192, "temporary")]
    assert list(zip(df["bytes"], df["category"], strict=True)) == expected
    assert prof.meta["markers"] == 2
