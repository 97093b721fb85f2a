"""Real CUDA snapshots recorded on an NVIDIA H200 (torch 2.11, CUDA 13) by bench/cuda_check.py.

The allocator's own statistics, read on the GPU right after each recording
(``max_memory_allocated`` / ``max_memory_reserved``), are the truth the conversion of the raw
snapshot (history, baseline, roles) must reproduce here, without a GPU.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from jupyter_vram._analysis.tables import allocations_frame
from jupyter_vram._capture.cuda_convert import profile_from_snapshot
from jupyter_vram._model import CATEGORIES
from jupyter_vram._snapshots.file import _raw_roles

HERE = Path(__file__).parent / "fixtures" / "h200"
SUMMARY = json.loads((HERE / "summary.json").read_text())
CASES = sorted(p.name.split(".")[0] for p in HERE.glob("*.snapshot.json.gz"))
CASES = [c for c in CASES if c in SUMMARY]


def convert(name: str):  # type: ignore[no-untyped-def]
    raw = json.loads(gzip.decompress((HERE / f"{name}.snapshot.json.gz").read_bytes()))
    return profile_from_snapshot(
        raw["snapshot"],
        device_index=raw.get("device_index", 0),
        baseline=raw["baseline"],
        roles=_raw_roles(raw),  # recorded in the category table of their day
        modules=raw["modules"],
        max_entries=raw["max_entries"],
        boundary=raw["boundary"],
    )


def test_fixtures_are_there() -> None:
    assert {"mlp_step1", "mlp_step2", "gpt2_step1", "gpt2_step2"} <= set(CASES)


#: BLAS workspaces each recording made (the process's first matmuls), by hand: torch 2.11 on
#: compute capability 9.0 gives each thread 32 MiB of cuBLAS workspace, and the forward's
#: cuBLASLt 1 MiB of its own. Only the first recording of the process made them (the others
#: start with them alive); the breakdowns in summary.json were taken before they were named,
#: so there they are the step's "temporary" memory.
WORKSPACES_MADE = {"mlp_step1": 2 * 32 * 2**20 + 2**20}


@pytest.mark.parametrize("name", CASES)
def test_real_snapshot_reproduces_the_allocator_statistics(name: str) -> None:
    truth = SUMMARY[name]
    prof = convert(name)
    expected = {c: int(truth["breakdown"].get(c, 0)) for c in CATEGORIES}
    made = WORKSPACES_MADE.get(name, 0)
    expected["temporary"] -= made
    expected["other"] += made
    assert prof.peak_breakdown() == expected
    if truth["meta"].get("truncated"):  # the ring buffer kept the end of the run only
        assert prof.meta["truncated"] and prof.peak_bytes <= truth["max_memory_allocated"]
        return
    assert prof.peak_bytes == truth["max_memory_allocated"]
    seg = prof.segments
    assert seg is not None
    reserved = seg.baseline + int(seg.delta.cumsum().max(initial=0))
    assert max(reserved, seg.baseline) == truth["max_memory_reserved"]


def test_the_first_cells_workspaces_are_named_not_temporary() -> None:
    """The H200's first MLP step: 97 MiB temporary at the peak, 65 MiB of it the cuBLAS /
    cuBLASLt workspaces its first ``addmm`` and backward's first ``mm`` made. They are named
    (op, category other) and listed with what made them; the rest stays temporary."""
    prof = convert("mlp_step1")
    made = prof.meta["blas_workspaces"]
    assert sorted((w["op"], w["bytes"]) for w in made) == [
        ("cuBLAS workspace", 32 * 2**20),
        ("cuBLAS workspace", 32 * 2**20),
        ("cuBLASLt workspace", 2**20),
    ]
    df = allocations_frame(prof)
    rows = df[df["op"].str.endswith("workspace")]
    assert set(rows["category"]) == {"other"} and (rows["free_seq"] < 0).all()
    assert prof.peak_breakdown()["temporary"] == 101_732_864 - 65 * 2**20
    from jupyter_vram._render.html import header_facts
    from jupyter_vram._render.text import summary

    assert "workspaces made by this run's first matmuls: 65.0 MiB" in summary(prof)
    facts = dict(header_facts(prof))
    assert facts["library workspaces"].startswith("65.0 MiB made by the first matmuls, kept")
    # the recording of the next step starts with them: nothing is made, nothing renamed
    assert "blas_workspaces" not in convert("mlp_step2").meta


def test_labels_without_a_dispatch_mode_name_phases_modules_and_ops() -> None:
    """The default labels (the profiler's reports, matched by address) against the old
    dispatch-mode labels on the same MLP step: the same phases, modules and ops."""
    by_profiler, by_mode = convert("mlp_step2"), convert("mlp_mode_labels")
    rows = []
    for prof in (by_profiler, by_mode):
        assert {int(p) for p in prof.allocations.phase} == {0, 1, 2, 3}
        df = allocations_frame(prof)
        rows.append(df[df["alloc_seq"] >= 0][["op", "module", "phase", "category", "bytes"]])
    a, b = (r.astype(str).reset_index(drop=True) for r in rows)
    assert a.drop(columns="op").equals(b.drop(columns="op"))
    # op names agree but where a kernel runs another op inside (relu's clamp_min on CUDA):
    # the profiler names the innermost op that allocated, the mode the op Python called
    differ = {(x, y) for x, y in zip(a["op"], b["op"], strict=True) if x != y}
    assert differ == {("clamp_min", "relu")}
    assert by_profiler.peak_breakdown() == by_mode.peak_breakdown()


def test_second_adam_step_holds_the_state_the_first_one_made() -> None:
    """By hand, for Linear(1024, 4096) + Linear(4096, 1000) in fp32, as the caching allocator
    counts blocks: 1024 x 4096 x 4 = 16 MiB; 4096 x 4 = 16 KiB; 4096 x 1000 x 4 = 15.625 MiB,
    which takes a whole 16 MiB block (the 384 KiB left of its 2 MiB-rounded segment is under
    the 1 MiB a large block must keep to be split); 1000 x 4 = 4,000 B, rounded up to 4,096.
    Adam's state is two moments of each."""
    params = 16 * 2**20 + 16 * 2**10 + 16 * 2**20 + 4096
    first, second = convert("mlp_step1"), convert("mlp_step2")
    assert second.peak_breakdown()["parameter"] == params
    assert second.peak_breakdown()["optimizer_state"] == 2 * params
    assert first.peak_bytes == second.peak_bytes
