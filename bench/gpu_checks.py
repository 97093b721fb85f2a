"""The one prepared GPU run: everything about the CUDA path that only hardware can settle.

Whenever a GPU is at hand, run this first (about 5 minutes on one GPU, at most 8)::

    python bench/gpu_checks.py                 # every check; writes tests/fixtures/<gpu>/
    python bench/gpu_checks.py --only oom,nvml  # some checks
    python bench/gpu_checks.py --list
    python bench/gpu_checks.py --dry-run --out /tmp/x   # no GPU: the CPU side only

Needs torch with CUDA, numpy, pandas and transformers (nvidia-ml-py for the NVML checks;
IPython, ipywidgets and bokeh are not needed); this repository is put on sys.path. Each
check prints ``[ok]`` / ``[FAIL]`` lines and measured values; checks marked *fresh* run in a
child process of their own (nothing cached, no workspace made yet). Writes, under the output
folder (default ``tests/fixtures/<gpu>/``, e.g. ``h200``): ``gpu_checks.log`` (what was
printed), ``gpu_checks.json`` (every check's results and measured values) and small raw
snapshots (``<check>.snapshot.json.gz``, frames trimmed to stay under ~300 KB) for tests.
Exit status: 0 all passed, 1 a check failed, 2 no CUDA device (nothing checked).

``--dry-run`` runs what needs no GPU: the plumbing (registry, child processes, output files),
every estimator model built on the meta device, the three H200 estimates against the
committed numbers, the workspace sizes expected for an H200 and the nvidia-smi parsing.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402
from torch import nn  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
RAW_BUDGET = 300 * 1024


@dataclass
class Ctx:
    """One check's results: labelled pass/fail lines and measured values."""

    name: str
    out: Path
    dry: bool = False
    lines: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def ok(self, label: str, passed: bool, detail: str = "") -> bool:
        print(f"  [{'ok' if passed else 'FAIL'}] {label}{': ' + detail if detail else ''}")
        self.lines.append({"label": label, "ok": bool(passed), "detail": detail})
        return bool(passed)

    def note(self, key: str, value: Any) -> None:
        print(f"  {key}: {value}")
        self.data[key] = value


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Ctx], None]
    fresh: bool = False  # in a child process of its own
    dry: Callable[[Ctx], None] | None = None  # the part that runs without a GPU
    timeout_s: int = 120


CHECKS: dict[str, Check] = {}


Fn = Callable[[Ctx], None]


def check(
    name: str, *, fresh: bool = False, dry: Fn | None = None, timeout_s: int = 120
) -> Callable[[Fn], Fn]:
    """Register a check (``fresh``: in a child process; ``dry``: its part without a GPU)."""

    def register(fn: Fn) -> Fn:
        CHECKS[name] = Check(name, fn, fresh, dry, timeout_s)
        return fn

    return register


# -- helpers ---------------------------------------------------------------------------------


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1000))


def gpt2(layers: int = 2) -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=layers, n_embd=256, n_head=4, vocab_size=8192,
                                     n_positions=256)  # fmt: skip
    model: nn.Module = transformers.GPT2LMHeadModel(config)
    return model


def mlp_step() -> Callable[[], None]:
    torch.manual_seed(0)
    model = mlp().cuda()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 1024, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")

    def step() -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def gpt2_step() -> Callable[[], None]:
    torch.manual_seed(0)
    model = gpt2().cuda()
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 8192, (8, 128), device="cuda")

    def step() -> None:
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def save_raw(raw: dict[str, Any], path: Path) -> None:
    """The raw snapshot as a test fixture: frames trimmed until it fits RAW_BUDGET."""
    from cuda_check import trim_frames

    for level in (0, 1, 2):
        data = raw if level == 0 else trim_frames(raw, level)
        payload = gzip.compress(json.dumps(data, separators=(",", ":"), default=list).encode(), 9)
        if len(payload) <= RAW_BUDGET or level == 2:
            path.write_bytes(payload)
            return


def recorded(ctx: Ctx, fn: Callable[[], None], *, save: str | None = None, **kw: Any) -> Any:
    """``fn`` under the CUDA recorder; checks its peaks against the allocator's counters."""
    from cuda_check import reserved_peak

    import jupyter_vram as jv
    from jupyter_vram._capture.cuda_snapshot import CudaSnapshotRecorder

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    rec = CudaSnapshotRecorder(torch.device("cuda", 0), keep_raw=save is not None, **kw)
    rec.start(sys._getframe())
    try:
        fn()
        torch.cuda.synchronize()
    finally:
        prof = rec.stop()
    alloc, res = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    ctx.ok(
        "peak == max_memory_allocated", prof.peak_bytes == alloc, f"{prof.peak_bytes} vs {alloc}"
    )
    ctx.ok("reserved peak == max_memory_reserved", reserved_peak(prof) == res,
           f"{reserved_peak(prof)} vs {res}")  # fmt: skip
    if save is not None and rec.raw is not None:
        save_raw(rec.raw, ctx.out / f"{save}.snapshot.json.gz")
    return jv.Profile.of(prof)  # the recorder's data, as users hold it (to_dataframe ...)


def nvml_used(index: int = 0) -> dict[str, int] | None:
    from jupyter_vram._capture.nvml import device_memory

    return device_memory(index)


def fraction(index: int = 0) -> float:
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return float(getter(index)) if getter is not None else 1.0


# -- checks ----------------------------------------------------------------------------------


@check("capacity_warm_cache")
def capacity_warm_cache(ctx: Ctx) -> None:
    """After 2 GiB were cached, a 1 GiB capacity must refuse a 1.5 GiB request (PyTorch
    checks the fraction only for new segments: the cache must be emptied first)."""
    import jupyter_vram as jv

    big = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
    del big
    ctx.note("reserved before (cached)", torch.cuda.memory_reserved())
    info = nvml_used() or {}
    # what a GPU of this size would hold besides: the context (NVML's usage less reserved)
    # and the live tensors; the cached 2 GiB are not the process's to keep
    outside = int(info.get("process_used", 0)) - torch.cuda.memory_reserved() if info else 0
    capacity = max(outside, 0) + torch.cuda.memory_allocated() + GIB
    before = fraction()
    refused = False
    rec = jv.record("cuda", capacity=capacity)
    try:
        with rec:
            x = torch.empty(3 * GIB // 2, dtype=torch.uint8, device="cuda")
            del x
    except torch.OutOfMemoryError:
        refused = True
    ctx.ok("1.5 GiB refused under a 1 GiB capacity with a warm cache", refused)
    ctx.ok("memory fraction restored", fraction() == before, f"{fraction()} vs {before}")
    how = rec.profile.meta.get("capacity", {})
    ctx.note("capacity facts", how)
    ctx.ok("cache emptied first", how.get("cache_emptied") is True)
    ctx.ok("memory outside the allocator counted (NVML)", how.get("outside_allocator") is not None)


def _oom_request(ctx: Ctx) -> None:
    import jupyter_vram as jv

    keep = torch.ones(1, device="cuda")  # the context and one small segment
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    info = nvml_used() or {}
    outside = max(0, int(info.get("process_used", reserved)) - reserved)
    capacity = reserved + outside + 10 * MIB  # room for 10 MiB: a 3 MiB request needs 20
    before = fraction()
    with_error: list[BaseException] = []
    inside: list[BaseException] = []
    live_before = -1
    rec = jv.record("cuda", capacity=capacity)
    try:
        with rec:
            live_before = torch.cuda.memory_allocated()
            try:
                torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as error:
                inside.append(error)
                raise
    except torch.OutOfMemoryError as error:
        with_error.append(error)
    del keep
    ctx.ok("3 MiB request raised OutOfMemoryError", bool(with_error))
    ctx.ok("the same error object reaches the caller", inside[:1] == with_error[:1])
    ctx.ok("fraction restored", fraction() == before)
    oom = rec.profile.oom
    ctx.ok("post-mortem present, from the allocator", oom is not None and oom.source == "cuda")
    if oom is None:
        return
    message = str(with_error[0]) if with_error else ""
    ctx.note("message", message[:200])
    ctx.ok(
        "observer gives the 20 MiB segment", oom.segment_bytes == 20 * MIB, str(oom.segment_bytes)
    )
    ctx.ok("request is the trace's 3 MiB", oom.requested_bytes == 3 * MIB, str(oom.requested_bytes))
    ctx.ok("'Tried to allocate 20.00 MiB'", "Tried to allocate 20.00 MiB" in message)
    short = oom.shortfall_bytes or 0  # 20 MiB less the room (10 MiB, less what the
    # recorder itself took outside the allocator after the room was measured)
    ctx.ok("shortfall = 20 MiB segment - room", 9 * MIB <= short <= 20 * MIB, str(short))
    ctx.ok("the trace's oom entry placed the failure", bool(rec.profile.meta.get("oom")))
    ctx.ok("live at the failure == memory_allocated before the request",
           oom.live_bytes == live_before, f"{oom.live_bytes} vs {live_before}")  # fmt: skip


def _oom_step(ctx: Ctx) -> None:
    import jupyter_vram as jv

    torch.manual_seed(0)
    model = mlp().cuda()
    x = torch.randn(65536, 1024, device="cuda")  # 256 MiB in, 1 GiB per 4096-wide output
    rec = jv.record("cuda", capacity=(nvml_used() or {}).get("process_used", 0) + GIB)
    try:
        with rec:
            model(x).sum().backward()
    except torch.OutOfMemoryError:
        pass
    oom = rec.profile.oom
    ctx.ok("a model step's OOM has a post-mortem", oom is not None)
    if oom is not None:
        ctx.note("op, module, phase", (oom.op, oom.module, oom.phase))
        ctx.ok("the failing op is named", bool(oom.op))
        ctx.ok("placed by the trace's oom entry", bool(rec.profile.meta.get("oom")))
        ctx.note("suggestions", [s.action for s in oom.suggestions][:5])


@check("oom", fresh=True)
def oom(ctx: Ctx) -> None:
    """The OOM observer's value (the segment) vs the trace's request, and a step's OOM end to
    end: fraction restored, failure placed by the trace's oom entry."""
    _oom_request(ctx)
    torch.cuda.empty_cache()
    _oom_step(ctx)


@check("cuda_leaks")
def cuda_leaks(ctx: Ctx) -> None:
    """A tensor a recorded cell keeps is listed with its holder and released."""
    import weakref

    import jupyter_vram as jv

    ns: dict[str, Any] = {}
    with jv.record("cuda", namespace=ns) as rec:
        ns["kept"] = torch.ones(3 * MIB // 4 + 5, device="cuda")
    ref = weakref.ref(ns["kept"])
    leaks = rec.profile.leaks()
    ctx.ok("leak listed with its holder", list(leaks["holders"]) == ["kept"],
           str(leaks.to_dict("records"))[:300])  # fmt: skip
    jv.release_leaks(rec.profile)
    ctx.ok("leak released", ref() is None and "kept" not in ns)


@check("cross_stream")
def cross_stream(ctx: Ctx) -> None:
    """A block freed while another stream still uses it (record_stream): its free completes
    later; the recording must still match the allocator's counters."""

    def run() -> None:
        side = torch.cuda.Stream()
        x = torch.randn(4 * MIB, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x * 2
            torch.cuda._sleep(20_000_000)  # keep the side stream busy past the free
        x.record_stream(side)
        del x
        z = torch.empty(32 * MIB, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        del y, z

    prof = recorded(ctx, run, save="cross_stream")
    ctx.note("inconsistencies", prof.meta.get("inconsistencies"))
    ctx.ok("no inconsistency in the trace", not prof.meta.get("inconsistencies"))


def parse_smi(text: str) -> list[list[str]]:
    """nvidia-smi's ``--format=csv,noheader,nounits`` lines as stripped fields."""
    return [[f.strip() for f in line.split(",")] for line in text.strip().splitlines() if line]


def _smi(*query: str) -> list[list[str]] | None:
    try:
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_smi(out.stdout)


def _nvml_dry(ctx: Ctx) -> None:
    rows = parse_smi("00000000:19:00.0, 4263, 143771\n")
    ctx.ok("nvidia-smi csv parsed", rows == [["00000000:19:00.0", "4263", "143771"]])


@check("nvml", dry=_nvml_dry)
def nvml(ctx: Ctx) -> None:
    """NVML through the PCI bus id (this process's usage) vs nvidia-smi."""
    from jupyter_vram._capture.nvml import _pci_bus_id

    torch.ones(1, device="cuda")
    bus = _pci_bus_id(0)
    info = nvml_used()
    ctx.note("torch's PCI bus id", bus)
    ctx.note("NVML", info)
    gpus = _smi("--query-gpu=pci.bus_id,memory.used,memory.total")
    if gpus is None:
        ctx.ok("nvidia-smi ran", False)
        return
    ids = [g[0].upper() for g in gpus]
    ctx.ok("bus id is one nvidia-smi lists", bus is not None and bus.upper() in ids, str(ids))
    if info is None or bus is None or bus.upper() not in ids:
        return
    used = int(gpus[ids.index(bus.upper())][1]) * MIB
    ctx.ok("NVML used ~ nvidia-smi used (8 MiB)", abs(info["used"] - used) <= 8 * MIB,
           f"{info['used']} vs {used}")  # fmt: skip
    apps = _smi("--query-compute-apps=pid,used_memory") or []
    mine = [int(a[1]) * MIB for a in apps if a and a[0] == str(os.getpid())]
    ctx.note("nvidia-smi for this pid", mine)
    if "process_used" in info and mine:
        ctx.ok("process usage ~ nvidia-smi (2 MiB)", abs(info["process_used"] - mine[0]) <= 2 * MIB,
               f"{info['process_used']} vs {mine[0]}")  # fmt: skip


@check("context_overhead", fresh=True)
def context_overhead(ctx: Ctx) -> None:
    """What the CUDA context and libraries take outside the allocator, vs the estimator's
    1 GiB runtime allowance."""
    from jupyter_vram._estimator.api import RUNTIME_OVERHEAD_BYTES

    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    after_init = nvml_used() or {}
    reserved = torch.cuda.memory_reserved()
    step = mlp_step()
    step()
    torch.cuda.synchronize()
    after_step = nvml_used() or {}
    now = torch.cuda.memory_reserved()
    for label, info, res in (("after init", after_init, reserved),
                             ("after a matmul step", after_step, now)):  # fmt: skip
        if "process_used" in info:
            ctx.note(f"outside the allocator {label}", info["process_used"] - res)
    outside = after_step.get("process_used", 0) - torch.cuda.memory_reserved()
    ctx.ok("NVML reports this process", "process_used" in after_step)
    ctx.ok("the 1 GiB allowance covers it", 0 < outside <= RUNTIME_OVERHEAD_BYTES, str(outside))


def _expected_workspaces() -> list[tuple[str, int]]:
    from jupyter_vram._blas_workspaces import CUBLAS_LABEL, CUBLASLT_LABEL, blas_workspaces

    props = torch.cuda.get_device_properties(0)
    ws = blas_workspaces(torch.__version__, (props.major, props.minor), os.environ)
    made = [(CUBLAS_LABEL, ws.cublas_bytes)] * 2  # forward thread, autograd's thread
    if ws.cublaslt_separate:
        made.append((CUBLASLT_LABEL, ws.cublaslt_bytes))
    return sorted(made)


def _workspaces_dry(ctx: Ctx) -> None:
    from jupyter_vram._blas_workspaces import blas_workspaces

    ctx.note("H200 with this torch", blas_workspaces(torch.__version__, (9, 0)))
    ctx.ok("torch 2.11 on an H200: 32 MiB + 1 MiB", blas_workspaces("2.11", (9, 0)).sizes
           == {32 * MIB: "cuBLAS workspace", MIB: "cuBLASLt workspace"})  # fmt: skip


@check("workspaces", fresh=True, dry=_workspaces_dry)
def workspaces(ctx: Ctx) -> None:
    """A fresh process's first step makes the BLAS workspaces: named, sized as expected for
    this torch and GPU; the second step makes none."""
    step = mlp_step()
    first = recorded(ctx, step, save="workspaces_step1")
    made = sorted((w["op"], w["bytes"]) for w in first.meta.get("blas_workspaces", []))
    expected = _expected_workspaces()
    ctx.ok("workspace rows as expected", made == expected, f"{made} vs {expected}")
    ctx.note("first step at peak", first.peak_breakdown())
    second = recorded(ctx, step)
    ctx.ok("second step makes none", not second.meta.get("blas_workspaces"))


@check("labels_vs_mode")
def labels_vs_mode(ctx: Ctx) -> None:
    """The default labels (profiler) against the dispatch-mode labels on the same GPT-2 step:
    bytes per (phase, module) agree."""
    step = gpt2_step()
    step()
    groups = []
    for labels in ("profiler", "mode"):
        prof = recorded(ctx, step, labels=labels)
        df = prof.to_dataframe()
        df = df[df["alloc_seq"] >= 0]
        groups.append(df.groupby(["phase", "module"])["bytes"].sum())
    a, b = groups
    keys = sorted(set(a.index) | set(b.index))
    worst = max((abs(int(a.get(k, 0)) - int(b.get(k, 0))) for k in keys), default=0)
    ctx.note("groups", len(keys))
    ctx.ok("bytes per (phase, module) agree within 1 MiB", worst <= MIB, str(worst))


@check("thread_alloc")
def thread_alloc(ctx: Ctx) -> None:
    """A thread that allocates while a step is recorded: its block is in the profile."""
    step = mlp_step()
    step()

    def worker() -> None:
        t = torch.ones(2 * MIB, device="cuda")  # 8 MiB
        time.sleep(0.05)
        del t

    def run() -> None:
        thread = threading.Thread(target=worker)
        thread.start()
        step()
        thread.join()

    prof = recorded(ctx, run, save="thread_alloc")
    sizes = prof.to_dataframe()["bytes"]
    ctx.ok("the thread's 8 MiB block is a row", bool((sizes == 8 * MIB).any()))


@check("malloc_async", fresh=True)
def malloc_async(ctx: Ctx) -> None:
    """On the cudaMallocAsync backend recording is refused with what to do."""
    import jupyter_vram as jv
    from jupyter_vram._capture import RecordingError

    ctx.note("backend", torch.cuda.memory.get_allocator_backend())
    try:
        torch.cuda.memory._record_memory_history("all")
        ctx.note("_record_memory_history", "accepted")
        torch.cuda.memory._record_memory_history(None)
    except RuntimeError as error:
        ctx.note("_record_memory_history", f"RuntimeError: {error}"[:200])
    try:
        with jv.record("cuda"):
            torch.ones(1, device="cuda")
        ctx.ok("RecordingError raised", False, "recorded")
    except RecordingError as error:
        ctx.ok("RecordingError raised, naming the backend", "cudaMallocAsync" in str(error))


@check("offload_rerun")
def offload_rerun(ctx: Ctx) -> None:
    """jv.rerun(offload=True) of a GPT-2 cell lowers its peak."""
    import jupyter_vram as jv
    from jupyter_vram._session import run_code

    torch.manual_seed(0)
    ns: dict[str, Any] = {"model": gpt2(4).cuda(),
                          "ids": torch.randint(0, 8192, (16, 256), device="cuda")}  # fmt: skip
    source = "model(ids, labels=ids).loss.backward()\nmodel.zero_grad(set_to_none=True)\n"
    base = run_code(source, ns, device="cuda", stacks=False).profile
    variant = jv.rerun(base, offload=True)
    ctx.note("peaks (base, offload)", (base.peak_bytes, variant.peak_bytes))
    ctx.ok("offload lowers the peak", variant.peak_bytes < base.peak_bytes)


CUDA_MARKED_TESTS = """
import pytest
import torch


@pytest.mark.vram(max="1MiB", device="cuda")
def test_under():
    assert torch.zeros(1 << 16, device="cuda").sum() == 0  # 256 KiB


@pytest.mark.vram(max="1MiB", device="cuda")
def test_over():
    assert torch.zeros(1 << 19, device="cuda").sum() == 0  # 2 MiB
"""


def _marked_tests(ctx: Ctx, source: str) -> None:
    """The pytest marker in a child pytest on a temporary test file: one test under its
    limit passes, one over it fails naming its peak."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "test_marked.py").write_text(source)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "jupyter_vram.pytest_plugin", "-q",
             "-p", "no:cacheprovider", "test_marked.py"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
    out = done.stdout
    ctx.ok("pytest marker: over fails, under passes", "1 failed, 1 passed" in out, out[-300:])
    ctx.ok("the failure names the peak and the limit", "exceeded the limit 1.0 MiB" in out)


def _make_it_fit_dry(ctx: Ctx) -> None:
    _marked_tests(ctx, CUDA_MARKED_TESTS.replace(', device="cuda"', ""))


@check("make_it_fit", dry=_make_it_fit_dry, timeout_s=180)
def make_it_fit(ctx: Ctx) -> None:
    """jv.plan at 70 % of a GPT-2 step's CUDA peak: plan.best verified by a rerun within 5 %
    of its prediction and under the budget; the pytest marker on CUDA."""
    import jupyter_vram as jv
    from jupyter_vram._session import run_code

    torch.manual_seed(0)
    model = gpt2(4).cuda()
    ns: dict[str, Any] = {"model": model, "opt": torch.optim.AdamW(model.parameters()),
                          "ids": torch.randint(0, 8192, (8, 128), device="cuda")}  # fmt: skip
    source = "opt.zero_grad()\nloss = model(ids, labels=ids).loss\nloss.backward()\nopt.step()\n"
    run_code(source, ns, device="cuda", stacks=False)  # the optimizer state exists from now
    profile = run_code(source, ns, device="cuda", stacks=False).profile
    budget = int(0.7 * profile.peak_bytes)
    best = jv.plan(profile, budget).best
    ctx.ok("plan.best exists and is predicted to fit", best is not None and best.fits)
    if best is None:
        return
    best.verify()
    measured = best.measured_peak_bytes or 0
    error = (best.predicted_peak_bytes - measured) / max(measured, 1)
    ctx.note("best, predicted, measured, budget",
             (best.name, best.predicted_peak_bytes, measured, budget))  # fmt: skip
    ctx.ok("verified within 5 % of the prediction", abs(error) <= 0.05, f"{error:+.1%}")
    ctx.ok("verified under the budget", 0 < measured <= budget)
    _marked_tests(ctx, CUDA_MARKED_TESTS)


@check("recording_cost", timeout_s=180)
def recording_cost(ctx: Ctx) -> None:
    """Bare vs recorded wall time of real cells: an MLP step, a GPT-2 step, 2000 tiny ops."""
    import statistics

    import jupyter_vram as jv

    def tiny() -> None:
        x = torch.randn(256, device="cuda")
        for _ in range(2000):
            x = x * 1.0001 + 0.1

    for name, step in (("mlp", mlp_step()), ("gpt2", gpt2_step()), ("tiny ops", tiny)):
        step()

        def timed(record: bool, step: Callable[[], None] = step) -> float:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with jv.record("cuda") if record else contextlib.nullcontext():
                step()
                torch.cuda.synchronize()
            return time.perf_counter() - t0

        bare = statistics.median(timed(False) for _ in range(3))
        rec = statistics.median(timed(True) for _ in range(3))
        ctx.note(f"{name}: bare / recorded s", (round(bare, 4), round(rec, 4)))
    ctx.ok("recorded every cell", True)


# -- the estimator against the GPU -------------------------------------------------------------

#: The H200 fixture's cases (tests/test_estimate_h200.py): the issue's accuracy targets.
STRICT = {"mlp_adam": (mlp, "64x1024", "adam"),
          "gpt2_adamw": (gpt2, "8x128", "adamw"),
          "gpt2_sgd": (gpt2, "8x128", "sgd")}  # fmt: skip
#: bench/estimate_vs_measured.py's cases, measured here on the GPU.
MORE = ("gpt2", "bert", "vit", "t5", "llama", "resnet", "convnext", "distilbert", "opt",
        "lstm", "moe", "torch-encoder")  # fmt: skip


def _cases() -> list[tuple[str, Any, bool]]:
    """(name, case, strict): the cases as bench/estimate_vs_measured.py describes them."""
    from estimate_vs_measured import CASES, Case

    out = [(n, Case(n, b, i, optimizer=o), True) for n, (b, i, o) in STRICT.items()]
    return out + [(n, CASES[n], False) for n in MORE]


def _measure_cuda(case: Any) -> tuple[int, int]:
    """max_memory_allocated / reserved of the second of two training steps on the GPU."""
    from estimate_vs_measured import build, settings_of

    from jupyter_vram._estimator.inputs import make_batch_spec, parse_dtype, with_default_labels
    from jupyter_vram._estimator.step import make_optimizer, training_step
    from jupyter_vram._transforms.checkpointing import enable_checkpointing

    settings = settings_of(case, "cuda")
    model = build(case).cuda().train()
    if case.dtype:
        model.to(parse_dtype(case.dtype))
    if case.checkpoint:
        enable_checkpointing(model)
    spec = with_default_labels(model, make_batch_spec(model, case.inputs))
    args, kwargs = spec.build("cuda", parse_dtype(case.dtype) if case.dtype else torch.float32)
    opt = make_optimizer(settings, model)
    training_step(model, opt, args, kwargs, settings, "cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    training_step(model, opt, args, kwargs, settings, "cuda")
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    del model, opt, args, kwargs
    torch.cuda.empty_cache()
    return measured


def _estimate_dry(ctx: Ctx) -> None:
    """Every model builds on the meta device; the H200's three cases are within target."""
    from estimate_vs_measured import build

    fixture = json.loads((ROOT / "tests/fixtures/h200/summary_estimate.json").read_text())
    for name, case, strict in _cases():
        model = build(case, "meta")
        ctx.ok(f"{name} builds on meta", sum(p.numel() for p in model.parameters()) > 0)
        if strict:
            from jupyter_vram._estimator import estimate

            est = estimate(model, case.inputs, optimizer=case.optimizer, torch_version="2.11")
            truth = fixture[f"estimate_{name}"]
            _compare(ctx, name, est, truth["measured"], truth["measured_reserved"], True)


def _compare(ctx: Ctx, name: str, est: Any, alloc: int, res: int, strict: bool) -> None:
    err = (est.peak_bytes - alloc) / alloc
    err_r = (est.reserved_bytes - res) / res
    limits = (0.005, 0.02) if strict else (0.05, 0.10)
    ctx.data[name] = {"estimated": est.peak_bytes, "measured": alloc,
                      "estimated_reserved": est.reserved_bytes,
                      "measured_reserved": res}  # fmt: skip
    ctx.ok(f"{name} allocated within {limits[0]:.1%}", abs(err) <= limits[0], f"{err:+.3%}")
    ctx.ok(f"{name} reserved within {limits[1]:.0%}", abs(err_r) <= limits[1], f"{err_r:+.3%}")


@check("estimator", fresh=True, dry=_estimate_dry, timeout_s=300)
def estimator(ctx: Ctx) -> None:
    """jv.estimate (fake tensors on the CPU) vs the GPU's counters on 15 steps."""
    from estimate_vs_measured import build

    from jupyter_vram._estimator import estimate

    for name, case, strict in _cases():
        est = estimate(build(case, "meta"), case.inputs, optimizer=case.optimizer,
                       dtype=case.dtype, amp=case.amp, checkpoint=case.checkpoint)  # fmt: skip
        alloc, res = _measure_cuda(case)
        _compare(ctx, name, est, alloc, res, strict)


# -- running ---------------------------------------------------------------------------------


def gpu_slug() -> str:
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    words = [w for w in name.lower().replace("nvidia", "").split() if w]
    return "-".join(words) or "gpu"


def run_here(item: Check, out: Path, dry: bool) -> Ctx:
    ctx = Ctx(item.name, out, dry)
    fn = item.dry if dry else item.run
    if fn is None:
        ctx.note("skipped", "needs a CUDA device")
        return ctx
    try:
        fn(ctx)
    except Exception as error:  # noqa: BLE001 - a crashed check is a failed check
        ctx.ok("ran without an exception", False, f"{type(error).__name__}: {error}"[:500])
    return ctx


def run_child(item: Check, out: Path, dry: bool) -> Ctx:
    """``item`` in a fresh interpreter; its results come back as a JSON file."""
    if dry and item.dry is None:
        return run_here(item, out, dry)  # nothing to run: no child needed
    result = out / f".{item.name}.result.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", item.name, "--out", str(out)]
    env = dict(os.environ)
    if item.name == "malloc_async" and not dry:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    ctx = Ctx(item.name, out, dry)
    try:
        proc = subprocess.run(cmd + (["--dry-run"] if dry else []), env=env, timeout=item.timeout_s,
                              capture_output=True, text=True)  # fmt: skip
        print(proc.stdout, end="")
        if proc.returncode != 0 or not result.exists():
            ctx.ok("child process finished", False, proc.stderr[-1500:])
            return ctx
    except subprocess.TimeoutExpired:
        ctx.ok("child process finished", False, f"timed out after {item.timeout_s} s")
        return ctx
    data = json.loads(result.read_text())
    result.unlink()
    ctx.lines, ctx.data = data["lines"], data["data"]
    return ctx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", default="")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--child", default=None)
    args = parser.parse_args(argv)
    if args.list:
        for item in CHECKS.values():
            doc = (item.run.__doc__ or "").split("\n")[0]
            print(f"{item.name:20} {'fresh ' if item.fresh else ''}{doc}")
        return 0
    if args.child:  # inside run_child
        ctx = run_here(CHECKS[args.child], args.out, args.dry_run)
        (args.out / f".{args.child}.result.json").write_text(
            json.dumps({"lines": ctx.lines, "data": ctx.data}, default=str)
        )
        return 0
    if not torch.cuda.is_available() and not args.dry_run:
        print("no CUDA device: nothing checked (--dry-run runs the CPU side)")
        return 2
    out = args.out or (Path(tempfile.mkdtemp()) if args.dry_run
                       else ROOT / "tests" / "fixtures" / gpu_slug())  # fmt: skip
    return run_all(out, args.only, args.dry_run)


def run_all(out: Path, only: str, dry: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in only.split(",") if n] or list(CHECKS)
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        print(f"unknown checks: {', '.join(unknown)} (see --list)")
        return 2
    log = _Tee(out / "gpu_checks.log")
    started = time.perf_counter()
    results: dict[str, Any] = {"torch": torch.__version__, "dry_run": dry, "checks": {}}
    if torch.cuda.is_available():
        results["gpu"] = torch.cuda.get_device_name(0)
    with log:
        for name in names:
            item = CHECKS[name]
            print(f"\n== {name}{' (fresh process)' if item.fresh else ''}")
            t0 = time.perf_counter()
            ctx = run_child(item, out, dry) if item.fresh else run_here(item, out, dry)
            results["checks"][name] = {"lines": ctx.lines, "data": ctx.data,
                                       "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
        failed = [f"{n}: {x['label']}" for n, r in results["checks"].items()
                  for x in r["lines"] if not x["ok"]]  # fmt: skip
        results["failed"] = failed
        results["seconds"] = round(time.perf_counter() - started, 1)
        print(f"\n{len(failed)} failed in {results['seconds']} s; results in {out}")
        for line in failed:
            print(f"  FAIL {line}")
    (out / "gpu_checks.json").write_text(json.dumps(results, indent=1, default=str))
    return 1 if failed else 0


class _Tee:
    """Everything printed also goes to the log file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.file = self.path.open("w", encoding="utf-8")
        self.stdout = sys.stdout
        outer = self

        class Both:
            def write(self, text: str) -> int:
                outer.file.write(text)
                return outer.stdout.write(text)

            def flush(self) -> None:
                outer.file.flush()
                outer.stdout.flush()

        sys.stdout = Both()  # type: ignore[assignment]

    def __exit__(self, *args: object) -> None:
        sys.stdout = self.stdout
        self.file.close()


if __name__ == "__main__":
    sys.exit(main())
