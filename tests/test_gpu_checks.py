"""bench/gpu_checks.py, the prepared GPU run, on a machine without a GPU: it lists every check
the CUDA path needs settled, refuses to pretend without a device, and its CPU side (the
plumbing, child processes, the expected workspace sizes) runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_checks.py"


@pytest.fixture(scope="module")
def gpu_checks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_checks", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_checks"] = module
    spec.loader.exec_module(module)
    return module


def test_every_hardware_question_has_a_check(gpu_checks: ModuleType) -> None:
    """The issue's list: capacity with a warm cache, OOM observer vs trace and end to end,
    record_stream frees, NVML vs nvidia-smi, context size, workspaces in a fresh process,
    profiler vs mode labels, a thread allocating, cudaMallocAsync, the offload rerun, the
    recording cost, the estimator on >= 10 models; and make-it-fit's plan and pytest marker."""
    assert set(gpu_checks.CHECKS) == {
        "capacity_warm_cache", "oom", "cross_stream", "nvml", "context_overhead",
        "workspaces", "labels_vs_mode", "thread_alloc", "malloc_async", "offload_rerun",
        "recording_cost", "estimator", "cuda_leaks", "make_it_fit",
    }  # fmt: skip
    assert len(gpu_checks._cases()) >= 10
    fresh = {n for n, c in gpu_checks.CHECKS.items() if c.fresh}
    assert {"oom", "workspaces", "malloc_async", "estimator", "context_overhead"} <= fresh


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_a_gpu_it_checks_nothing_and_says_so(
    gpu_checks: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpu_checks.main([]) == 2
    assert "no CUDA device: nothing checked" in capsys.readouterr().out


def test_dry_run_writes_its_log_and_results(gpu_checks: ModuleType, tmp_path: Path) -> None:
    rc = gpu_checks.main(["--dry-run", "--out", str(tmp_path), "--only", "nvml,workspaces,oom"])
    assert rc == 0
    results = json.loads((tmp_path / "gpu_checks.json").read_text())
    assert results["dry_run"] is True and results["failed"] == []
    checks = results["checks"]
    assert [x["label"] for x in checks["workspaces"]["lines"]] == [
        "torch 2.11 on an H200: 32 MiB + 1 MiB"  # ran in a child process
    ]
    assert checks["oom"]["data"] == {"skipped": "needs a CUDA device"}
    log = (tmp_path / "gpu_checks.log").read_text()
    assert "== workspaces (fresh process)" in log and "0 failed" in log


def test_unknown_check_names_are_refused(gpu_checks: ModuleType, tmp_path: Path) -> None:
    assert gpu_checks.main(["--dry-run", "--out", str(tmp_path), "--only", "nope"]) == 2
