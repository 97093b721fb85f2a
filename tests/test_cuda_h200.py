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

from jupyter_vram.capture.cuda_convert import profile_from_snapshot
from jupyter_vram.model import CATEGORIES

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
        roles=raw["roles"],
        modules=raw["modules"],
        max_entries=raw["max_entries"],
        boundary=raw["boundary"],
    )


def test_fixtures_are_there() -> None:
    assert {"mlp_step1", "mlp_step2", "gpt2_step1", "gpt2_step2"} <= set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_real_snapshot_reproduces_the_allocator_statistics(name: str) -> None:
    truth = SUMMARY[name]
    prof = convert(name)
    assert prof.peak_bytes == truth["max_memory_allocated"]
    seg = prof.segments
    assert seg is not None
    reserved = seg.baseline + int(seg.delta.cumsum().max(initial=0))
    assert max(reserved, seg.baseline) == truth["max_memory_reserved"]
    assert prof.peak_breakdown() == {c: int(truth["breakdown"].get(c, 0)) for c in CATEGORIES}


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
