"""One-shot check of CUDA recording on a GPU machine; also writes future test fixtures.

Usage: python bench/cuda_check.py OUT_DIR
Needs torch with CUDA, numpy and transformers; this repository is put on sys.path (no
IPython, ipywidgets or bokeh needed). Runs in about a minute and prints, per workload:
peak vs ``torch.cuda.max_memory_allocated()``, reserved peak vs ``max_memory_reserved()``,
end state vs ``memory_allocated()/memory_reserved()``, sizes replayed vs estimated, the
category breakdown at the peak and the recording overhead. Workloads: a 2-layer MLP Adam step
(first step, which creates the optimizer state, and a second one), a 2-layer GPT-2 AdamW step,
the same MLP step with a ring buffer too small for it (truncation), a child process with
``expandable_segments:True``, and a child process comparing ``jv.estimate`` (fake tensors,
allocator model) with the real step's ``max_memory_allocated`` / ``max_memory_reserved``.

Writes OUT_DIR/<name>.profile.json.gz and OUT_DIR/<name>.snapshot.json.gz (the raw snapshot,
baseline snapshot, roles and module table the recorder converted; frames are trimmed if the
file would exceed ~300 KB) and OUT_DIR/summary.json. Exit status 1 if a check failed.
"""

from __future__ import annotations

import gzip
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import jupyter_vram as jv  # noqa: E402
from jupyter_vram._capture.cuda_convert import profile_from_snapshot  # noqa: E402
from jupyter_vram._capture.cuda_snapshot import CudaSnapshotRecorder  # noqa: E402
from jupyter_vram._capture.stacks import FrameFilter  # noqa: E402
from jupyter_vram._model import Profile  # noqa: E402

MIB = 1 << 20
RAW_BUDGET = 300 * 1024
results: dict[str, dict[str, Any]] = {}
failures: list[str] = []


def check(name: str, label: str, ok: bool, detail: str = "") -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {label}{': ' + detail if detail else ''}")
    results.setdefault(name, {}).setdefault("checks", {})[label] = bool(ok)
    if not ok:
        failures.append(f"{name}: {label} {detail}")


def reserved_peak(prof: Profile) -> int:
    import numpy as np

    seg = prof.segments
    order = np.argsort(seg.seq, kind="stable")
    running = np.cumsum(seg.delta[order])
    return int(seg.baseline + max(0, int(running.max()) if len(running) else 0))


def history_is_off() -> bool:
    probe = torch.empty(4096, device="cuda")
    del probe
    return not any(torch.cuda.memory._snapshot()["device_traces"])


def trim_frames(raw: dict[str, Any], level: int) -> dict[str, Any]:
    """Level 1: keep user frames and the innermost frame; level 2: drop all frames."""
    keep = FrameFilter().keep

    def trim(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if level >= 2 or not frames:
            return []
        return [frames[0]] + [f for f in frames[1:] if keep(str(f["filename"]))]

    def walk(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: (trim(v) if k == "frames" else walk(v)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [walk(v) for v in obj]
        return obj

    out: dict[str, Any] = walk(raw)
    out["frames_trimmed"] = level
    return out


def save_raw(raw: dict[str, Any], path: Path) -> int:
    for level in (0, 1, 2):
        data = raw if level == 0 else trim_frames(raw, level)
        payload = gzip.compress(json.dumps(data, separators=(",", ":"), default=list).encode(), 9)
        if len(payload) <= RAW_BUDGET or level == 2:
            path.write_bytes(payload)
            return level
    raise AssertionError("unreachable")


def record(name: str, step: Callable[[], None], out: Path, **kwargs: Any) -> Profile:
    """Record ``step`` once and compare the profile against the allocator's statistics."""
    print(f"\n== {name}")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    rec = CudaSnapshotRecorder(torch.device("cuda", 0), keep_raw=True, **kwargs)
    t0 = time.perf_counter()
    rec.start(sys._getframe())
    try:
        step()
        torch.cuda.synchronize()
    finally:
        prof = rec.stop()
    seconds = time.perf_counter() - t0
    max_alloc = torch.cuda.max_memory_allocated()
    max_res = torch.cuda.max_memory_reserved()
    end = prof.timeline.total_at(len(prof.timeline) - 1)
    end_res = prof.segments.baseline + int(prof.segments.delta.sum())
    m = prof.meta
    print(
        f"  rows {len(prof.allocations)}, trace events {m.get('trace_events')}, "
        f"markers {m.get('markers')}, recorded in {seconds:.2f} s"
    )
    print(f"  meta: { {k: v for k, v in m.items() if k not in ('torch',)} }")
    truncated = bool(m.get("truncated"))
    check(
        name,
        "end allocated == memory_allocated()",
        end == torch.cuda.memory_allocated(),
        f"{end} vs {torch.cuda.memory_allocated()}",
    )
    if truncated:
        check(
            name,
            "peak <= max_memory_allocated()",
            prof.peak_bytes <= max_alloc + 512,
            f"{prof.peak_bytes} vs {max_alloc}",
        )
    else:
        diff = max_alloc - prof.peak_bytes
        check(
            name,
            "peak == max_memory_allocated() (+ one 512 B marker at most)",
            0 <= diff <= 512,
            f"{prof.peak_bytes} vs {max_alloc} (diff {diff})",
        )
        check(
            name,
            "reserved peak == max_memory_reserved()",
            reserved_peak(prof) == max_res,
            f"{reserved_peak(prof)} vs {max_res}",
        )
        check(
            name,
            "end reserved == memory_reserved()",
            end_res == torch.cuda.memory_reserved(),
            f"{end_res} vs {torch.cuda.memory_reserved()}",
        )
        if m.get("expandable_segments"):
            # expandable segments grow in place: there are no segment-rounding rules to
            # replay, so block sizes come from the requests (the other checks still hold)
            print("  (expandable segments: block sizes taken from requests, not replayed)")
        else:
            check(
                name,
                "block sizes replayed exactly",
                m.get("sizes_replayed") is True
                and m.get("estimated_sizes") == 0
                and m.get("size_mismatches") == 0
                and m.get("inconsistencies") == 0,
            )
    check(name, "history switched off afterwards", history_is_off())
    breakdown = prof.peak_breakdown()
    print("  at peak: " + ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in breakdown.items() if v))
    phases = {int(p) for p in prof.allocations.phase}
    print(f"  phases seen: {sorted(phases)}; modules: {len(prof.modules)}; ops: {len(prof.ops)}")
    if m.get("labels") == "profiler" and "step" in name:
        check(
            name,
            "profiler labels name forward, backward and optimizer allocations",
            {1, 2, 3} <= phases and m.get("profiler_labels", 0) > 0 and len(prof.ops) > 3,
            f"phases {sorted(phases)}, labelled {m.get('profiler_labels')}, ops {len(prof.ops)}",
        )
    results[name].update(
        peak=prof.peak_bytes,
        max_memory_allocated=max_alloc,
        reserved_peak=reserved_peak(prof),
        max_memory_reserved=max_res,
        breakdown=breakdown,
        meta=m,
        seconds=seconds,
    )
    prof.save(out / f"{name}.profile.json.gz")
    if rec.raw is not None:
        level = save_raw(rec.raw, out / f"{name}.snapshot.json.gz")
        size = (out / f"{name}.snapshot.json.gz").stat().st_size
        print(f"  raw snapshot saved ({size / 1024:.0f} KiB, frames trimmed level {level})")
        again = profile_from_snapshot(
            rec.raw["snapshot"],
            baseline=rec.raw["baseline"],
            roles=rec.raw["roles"],
            modules=rec.raw["modules"],
            max_entries=rec.raw["max_entries"],
            boundary=rec.raw["boundary"],
        )
        same = again.peak_bytes == prof.peak_bytes and again.peak_breakdown() == breakdown
        check(name, "raw snapshot converts to the same profile", same)
    return prof


def overhead(name: str, step: Callable[[], None], repeats: int = 5) -> None:
    def timed(recorded: bool) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if recorded:
            with jv.record(device="cuda"):
                step()
                torch.cuda.synchronize()
        else:
            step()
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    bare = statistics.median(timed(False) for _ in range(repeats))
    rec = statistics.median(timed(True) for _ in range(repeats))
    print(
        f"  overhead {name}: bare {bare * 1e3:.1f} ms, recorded {rec * 1e3:.1f} ms "
        f"({rec / bare:.1f}x, conversion included)"
    )
    results.setdefault(name, {})["overhead"] = {"bare_s": bare, "recorded_s": rec}


def mlp_workload() -> tuple[Callable[[], None], nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1000)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, model


def gpt2_workload() -> Callable[[], None]:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=256,
        n_head=4,
        vocab_size=8192,
        n_positions=256,
        attn_implementation="eager",
    )
    model = transformers.GPT2LMHeadModel(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (8, 128), device="cuda")

    def step() -> None:
        model(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def child_expandable(out: Path) -> None:
    """Runs in a child process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."""
    step, _ = mlp_workload()
    record("mlp_expandable", step, out)
    (out / "summary_expandable.json").write_text(json.dumps(results, default=str, indent=1))
    sys.exit(1 if failures else 0)


def child_estimate(out: Path) -> None:
    """Runs in a fresh child process: jv.estimate(...) vs the allocator's own peak counters.

    The same canonical step the estimator simulates (jupyter_vram._estimator.step), on a real
    GPU: warm-up step, reset the peak counters, the measured step.
    """
    import transformers

    from jupyter_vram._estimator import estimate
    from jupyter_vram._estimator.inputs import make_batch_spec, with_default_labels
    from jupyter_vram._estimator.step import StepSettings, make_optimizer, training_step

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=8192,
                                     n_positions=256)  # fmt: skip
    cases = {
        "mlp_adam": (
            lambda: nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1000)),
            "64x1024",
            "adam",
        ),
        "gpt2_adamw": (lambda: transformers.GPT2LMHeadModel(config), "8x128", "adamw"),
        "gpt2_sgd": (lambda: transformers.GPT2LMHeadModel(config), "8x128", "sgd"),
    }
    for name, (build, inputs, optimizer) in cases.items():
        print(f"\n== estimate vs CUDA: {name}")
        settings = StepSettings(device="cuda", optimizer=optimizer)
        with torch.device("meta"):
            meta_model = build()
        est = estimate(meta_model, inputs, optimizer=optimizer)
        torch.manual_seed(0)
        model = build().cuda().train()
        spec = with_default_labels(model, make_batch_spec(model, inputs))
        args, kwargs = spec.build("cuda", torch.float32)
        opt = make_optimizer(settings, model)
        training_step(model, opt, args, kwargs, settings, "cuda")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        training_step(model, opt, args, kwargs, settings, "cuda")
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated()
        reserved = torch.cuda.max_memory_reserved()
        err = (est.peak_bytes - measured) / measured
        err_r = (est.reserved_bytes - reserved) / reserved
        results[f"estimate_{name}"] = {"estimated": est.peak_bytes, "measured": measured,
                                       "estimated_reserved": est.reserved_bytes,
                                       "measured_reserved": reserved}  # fmt: skip
        got = f"{est.peak_bytes / MIB:.2f} vs {measured / MIB:.2f} MiB ({err:+.2%})"
        check(name, "estimate vs max_memory_allocated within 5%", abs(err) <= 0.05, got)
        got = f"{est.reserved_bytes / MIB:.2f} vs {reserved / MIB:.2f} MiB ({err_r:+.2%})"
        check(name, "estimate vs max_memory_reserved within 10%", abs(err_r) <= 0.10, got)
        del model, opt, args, kwargs
        torch.cuda.empty_cache()
    (out / "summary_estimate.json").write_text(json.dumps(results, default=str, indent=1))
    sys.exit(1 if failures else 0)


def run_child(label: str, flag: str, out: Path, *, timeout: int,
              env: dict[str, str] | None = None) -> None:  # fmt: skip
    """Run this script again in a fresh process (``flag`` picks the part) and report it."""
    print(f"\n== {label} (child process)")
    child = subprocess.run(
        [sys.executable, __file__, str(out), flag],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    print(child.stdout[-4000:], child.stderr[-2000:])
    if child.returncode != 0:
        failures.append(f"{label} child failed")


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "cuda_check_out")
    out.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 2 and sys.argv[2] == "--child-expandable":
        child_expandable(out)
    if len(sys.argv) > 2 and sys.argv[2] == "--child-estimate":
        child_estimate(out)
    assert torch.cuda.is_available(), "this check needs a CUDA device"
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
    memory = torch.cuda.memory
    params = list(inspect.signature(memory._record_memory_history).parameters)
    print(
        f"_set_memory_metadata: {hasattr(memory, '_set_memory_metadata')}; "
        f"_record_memory_history params: {params}"
    )

    step, _ = mlp_workload()
    record("mlp_step1", step, out)  # creates Adam's state
    record("mlp_step2", step, out)
    record("mlp_no_stacks_no_ops", step, out, stacks=False, ops=False)
    record("mlp_mode_labels", step, out, labels="mode")
    record("mlp_truncated", step, out, max_entries=150)
    overhead("mlp", step)

    gstep = gpt2_workload()
    record("gpt2_step1", gstep, out)
    record("gpt2_step2", gstep, out)
    overhead("gpt2", gstep)

    # Public API path, and an error inside the block.
    torch.cuda.reset_peak_memory_stats()
    try:
        with jv.record(device="cuda") as rec:
            buf = torch.ones(1 << 20, device="cuda")
            raise ValueError("boom")
    except ValueError:
        pass
    print("\n== error inside jv.record(device='cuda')")
    check("error", "profile kept with the error", rec.profile.error == "ValueError: boom")
    check("error", "history switched off", history_is_off())
    del buf

    # Raw format facts this package relies on.
    first = next(
        e
        for e in json.loads(gzip.decompress((out / "mlp_step1.snapshot.json.gz").read_bytes()))[
            "snapshot"
        ]["device_traces"][0]
        if e["action"] == "alloc"
    )
    print(
        f"\nfirst alloc entry keys: {sorted(first)}; innermost frame: "
        f"{(first.get('frames') or [{}])[0]}"
    )

    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    run_child("expandable segments", "--child-expandable", out, env=env, timeout=240)
    try:
        import cloudpickle  # noqa: F401  (the estimator sends models with it)
    except ImportError:
        print("\n== estimate vs CUDA: skipped, cloudpickle is not installed here (bring its wheel)")
    else:
        run_child("estimate vs CUDA", "--child-estimate", out, timeout=300)

    (out / "summary.json").write_text(json.dumps(results, default=str, indent=1))
    print("\nFAILURES:\n  " + "\n  ".join(failures) if failures else "\nall checks passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
