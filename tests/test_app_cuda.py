"""The app and the allocator analysis on a CUDA profile (converted from the snapshot fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_vram._analysis.allocator import allocator_state, reserved_at, reserved_peak
from jupyter_vram._app import ProfileApp
from jupyter_vram._app.timeline_view import TimelineView
from jupyter_vram._capture.cuda_convert import profile_from_snapshot
from jupyter_vram._model import Profile
from jupyter_vram._render.html import header_facts
from jupyter_vram._units import format_bytes

FIXTURE = Path(__file__).parent / "fixtures" / "cuda_snapshot_mlp.json"
GIB = 2**30
DEVICE = {"name": "NVIDIA H200", "total": 141 * GIB, "device_used": 1 * GIB}


@pytest.fixture(scope="module")
def data() -> dict:  # type: ignore[type-arg]
    return json.loads(FIXTURE.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def prof(data: dict) -> Profile:  # type: ignore[type-arg]
    return profile_from_snapshot(
        data["snapshot"], baseline=data["baseline"], roles=data["roles"],
        modules=data["modules"], device_info=DEVICE,
    )  # fmt: skip


def test_allocator_levels_and_gaps(prof: Profile, data: dict) -> None:  # type: ignore[type-arg]
    expected = data["expected"]
    state = allocator_state(prof)
    assert state.has_caching_allocator
    assert state.peak_allocated == expected["peak_allocated"]
    assert state.peak_reserved == expected["peak_reserved"] == reserved_peak(prof)
    assert state.end_reserved == expected["end_reserved"]
    assert state.end_allocated == expected["end_allocated"]
    cached = {g.label: g for g in state.gaps}["cached free blocks"]
    assert cached.bytes == state.peak_reserved - state.allocated_at_reserved_peak
    # the cached-free share is measured at the allocated peak, from the segment events alone
    seg = prof.segments
    peak_seq = int(prof.timeline.seq[prof.timeline.peak_index])
    reserved_then = seg.baseline + int(seg.delta[seg.seq <= peak_seq].sum())
    assert state.reserved_at_allocated_peak == reserved_then
    assert state.cached_free_share == pytest.approx(
        (reserved_then - expected["peak_allocated"]) / reserved_then
    )
    assert state.excess_reserved == expected["peak_reserved"] - expected["peak_allocated"]
    context = {g.label: g for g in state.gaps}["CUDA context and others"]
    assert context.bytes == GIB - expected["end_reserved"]
    assert reserved_at(prof, [-1])[0] == expected["baseline_reserved"]


def test_expandable_segments_advice_follows_fragmentation(prof: Profile) -> None:
    state = allocator_state(prof)
    advised = any("expandable_segments" in a for a in state.advice)
    excess = (state.peak_reserved or 0) - state.peak_allocated
    assert advised == (bool(state.stranded) and excess > 0.2 * (state.peak_reserved or 0)
                       and (state.peak_reserved or 0) >= 256 * 2**20)  # fmt: skip


def test_header_shows_reserved_and_device(prof: Profile, data: dict) -> None:  # type: ignore[type-arg]
    facts = dict(header_facts(prof))
    assert facts["peak allocated"] == format_bytes(data["expected"]["peak_allocated"])
    assert facts["peak reserved"] == format_bytes(data["expected"]["peak_reserved"])
    assert facts["device total"] == "141.0 GiB" and facts["device used"] == "1.0 GiB"
    assert "CUDA allocator" in facts["device"]


def test_app_tabs_on_a_cuda_profile(prof: Profile) -> None:
    app = ProfileApp(prof)
    for i in range(len(app.tabs.children)):
        app.open_tab(i)
    timeline = app.tabs.children[2]
    assert isinstance(timeline, TimelineView)
    reserved = [r for r in timeline.figure.renderers if "reserved" in r.data_source.data]
    assert reserved, "the timeline draws reserved memory on CUDA"
    allocator = app.tabs.children[4].value
    assert "reserved (peak)" in allocator and "cached free blocks" in allocator
    assert "Cached but free at the allocated peak" in allocator
    text = app._repr_mimebundle_()["text/plain"]
    assert text.startswith("jupyter_vram · cuda:0 (CUDA allocator)")


def test_reserved_at_follows_segment_events(prof: Profile, data: dict) -> None:  # type: ignore[type-arg]
    seg = prof.segments
    order = seg.seq.argsort(kind="stable")
    expected = seg.baseline + seg.delta[order].cumsum()
    assert list(reserved_at(prof, seg.seq[order])) == list(expected)
    assert max(reserved_at(prof, prof.timeline.seq)) <= data["expected"]["peak_reserved"]


def _with_device(prof: Profile, **info: int) -> Profile:
    return prof.replace(device_info={**DEVICE, **info})


def test_device_used_split_into_what_it_is(prof: Profile) -> None:
    """The question no tool answers: nvidia-smi shows 96 GiB used, PyTorch reserved 82 GiB.
    With 70 GiB allocated and NVML reporting 90 GiB for this process: 70 GiB tensors, 12 GiB
    cached free, 8 GiB of this process outside the allocator (context, libraries), 6 GiB
    other processes; the parts sum to what nvidia-smi shows."""
    state = allocator_state(_with_device(prof, device_used=96 * GIB, reserved=82 * GIB,
                                         allocated=70 * GIB, process_used=90 * GIB))  # fmt: skip
    parts = {g.label: g.bytes // GIB for g in state.device_parts}
    assert parts == {
        "tensors (allocated)": 70,
        "cached free in PyTorch's pool": 12,
        "this process outside PyTorch's allocator": 8,
        "other processes": 6,
    }
    assert sum(g.bytes for g in state.device_parts) == 96 * GIB
    from jupyter_vram._app.profile_app import allocator_html

    shown = allocator_html(state)  # the Allocator tab
    assert "Where the device's 96.0 GiB in use went" in shown
    assert "<td>other processes</td><td class='jv-num'>6.0 GiB</td>" in shown


def test_without_nvmls_process_figure_the_rest_is_one_part(prof: Profile) -> None:
    state = allocator_state(_with_device(prof, device_used=96 * GIB, reserved=82 * GIB,
                                         allocated=70 * GIB))  # fmt: skip
    parts = {g.label: g.bytes // GIB for g in state.device_parts}
    assert parts["outside PyTorch's reserved pool"] == 14
    assert sum(g.bytes for g in state.device_parts) == 96 * GIB


def test_a_first_cells_workspaces_are_their_own_part(prof: Profile) -> None:
    """2 x 32 MiB + 1 MiB of workspaces the run made come out of the tensors' part."""
    made = [{"op": "cuBLAS workspace", "bytes": 32 << 20}] * 2 + [
        {"op": "cuBLASLt workspace", "bytes": 1 << 20}]  # fmt: skip
    with_ws = _with_device(prof, device_used=GIB, reserved=512 << 20, allocated=256 << 20)
    with_ws = with_ws.replace(meta={**with_ws.meta, "blas_workspaces": made})
    parts = {g.label: g.bytes for g in allocator_state(with_ws).device_parts}
    assert parts["cuBLAS / cuBLASLt workspaces"] == 65 << 20
    assert parts["tensors (allocated)"] == (256 - 65) << 20
