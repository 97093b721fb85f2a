"""jv.launch / torchrun recording: real ranks on CPU (gloo on 127.0.0.1), checked by hand.

Expected bytes come from the model itself (4 x numel of fp32 parameters, FSDP2's dim-0
shards by hand), never from the code under test. Every test checks that the ranks' processes
are gone and that nothing listens on the port they met on.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil  # type: ignore[import-untyped]
import pytest
import torch
import torch.distributed as dist
from torch import nn

import jupyter_vram as jv
from jupyter_vram._distributed import LaunchError
from jupyter_vram._distributed.launcher import free_port

REPO = Path(__file__).resolve().parents[1]
TINY: dict[str, Any] = {
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "vocab_size": 512,
    "n_positions": 64,
}


def tiny_gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**TINY))


def train_steps(mode: str, steps: int = 2) -> None:
    """Two AdamW steps of a tiny GPT-2 under DDP or FSDP2 (what each rank runs)."""
    gpt = tiny_gpt2()
    model: nn.Module = gpt
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(gpt)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in gpt.transformer.h:
            fully_shard(block)
        fully_shard(gpt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, TINY["vocab_size"], (2, 32))
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()


def children() -> set[int]:
    return {c.pid for c in psutil.Process().children(recursive=True)}


def assert_ranks_gone(pids: list[int], port: int | None, before: set[int]) -> None:
    for pid in pids:
        assert not psutil.pid_exists(pid), f"rank process {pid} outlived the launch"
    assert children() <= before, "a child process was left behind"
    if port is not None:
        listening = [
            c
            for c in psutil.net_connections(kind="tcp")
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
        ]
        assert not listening, f"something still listens on the ranks' port {port}"


def rows_of(profile: jv.Profile, kind: str) -> np.ndarray:
    return np.asarray(profile.meta.get("kinds", {}).get(kind, []), dtype=np.int64)


def live_at_peak(profile: jv.Profile) -> np.ndarray:
    return profile.timeline.live_mask(profile.timeline.peak_index)


@pytest.mark.slow
def test_ddp_two_ranks_hold_every_parameter_and_its_gradient_bucket() -> None:
    numel = sum(p.numel() for p in tiny_gpt2().parameters())
    before = children()
    profiles = jv.launch(train_steps, nproc=2, args=("ddp",), stacks=False, timeout=240)
    assert [p.meta["rank"] for p in profiles] == [0, 1]
    assert {p.meta["world_size"] for p in profiles} == {2}
    for profile in profiles:
        assert profile.error is None
        a = profile.allocations
        # every rank holds the whole model: 4 bytes per fp32 parameter, at the peak
        assert profile.peak_breakdown()["parameter"] == 4 * numel
        # DDP's reducer keeps one flat bucket per bucket, a gradient's worth in all
        buckets = rows_of(profile, "ddp_gradient_bucket")
        assert len(buckets) >= 1
        assert profile.meta["ddp_bucket_sizes"] == [4 * numel]  # one bucket (25 MiB cap)
        assert set(a.size[buckets].tolist()) == {4 * numel}
        assert set(a.category[buckets].tolist()) == {jv.CATEGORIES.index("gradient")}
        # the rebuilt bucket is alive at the peak: it is part of the peak's gradient bytes
        at_peak = live_at_peak(profile)
        assert int(a.size[buckets][at_peak[buckets]].sum()) == 4 * numel
        assert profile.peak_breakdown()["gradient"] >= 4 * numel
    assert_ranks_gone([p.meta["pid"] for p in profiles], profiles[0].meta["master_port"], before)


@pytest.mark.slow
def test_fsdp2_two_ranks_hold_half_the_parameters_outside_the_all_gather() -> None:
    model = tiny_gpt2()
    world = 2
    # FSDP2 shards each parameter on dim 0, padded to a multiple of the world size
    shard_bytes = sum(
        4 * math.ceil(p.shape[0] / world) * (p.numel() // p.shape[0]) for p in model.parameters()
    )
    numel = sum(p.numel() for p in model.parameters())
    assert shard_bytes == 4 * numel // world  # this config divides evenly
    block_bytes = 4 * sum(p.numel() for p in model.transformer.h[0].parameters())
    before = children()
    profiles = jv.launch(train_steps, nproc=world, args=("fsdp",), stacks=False, timeout=240)
    for profile in profiles:
        assert profile.error is None
        a = profile.allocations
        sharded = rows_of(profile, "fsdp_sharded_parameter")
        assert int(a.size[sharded].sum()) == shard_bytes
        at_peak = live_at_peak(profile)
        assert int(a.size[sharded][at_peak[sharded]].sum()) == shard_bytes
        # inside the all-gather each block is whole again: its unsharded parameters, per
        # forward of each of the two steps
        unsharded = rows_of(profile, "fsdp_unsharded_parameter")
        module = np.asarray(profile.modules, dtype=object)[a.module[unsharded]]
        forward = a.phase[unsharded] == 1
        in_block = np.array([str(m).endswith("transformer.h.0") for m in module], dtype=bool)
        assert int(a.size[unsharded][forward & in_block].sum()) == 2 * block_bytes
        for kind in ("all_gather_buffer", "reduce_scatter_buffer", "fsdp_sharded_gradient"):
            assert len(rows_of(profile, kind)) > 0, kind
        # sharded gradients: half of every parameter's gradient, per step
        grads = rows_of(profile, "fsdp_sharded_gradient")
        assert int(a.size[grads].max()) <= shard_bytes
    assert_ranks_gone([p.meta["pid"] for p in profiles], profiles[0].meta["master_port"], before)


def test_a_rank_that_raises_gives_its_partial_profile_and_error() -> None:
    numel = 25_000

    def step(n: int) -> None:  # a closure: travels by value, as a notebook's would
        kept = torch.ones(n)
        if dist.get_rank() == 1:
            raise ValueError(f"rank 1 gives up holding {kept.numel()} floats")
        dist.all_reduce(kept)  # rank 0 waits for a peer that left

    before = children()
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        jv.launch(step, nproc=2, args=(numel,), timeout=120)
    results = info.value.results
    assert [r.rank for r in results] == [0, 1]
    failed = results[1]
    assert failed.error is not None and "ValueError: rank 1 gives up holding 25000" in failed.error
    assert failed.profile is not None
    assert failed.profile.error is not None and "ValueError" in failed.profile.error
    assert failed.profile.peak_bytes >= 4 * numel  # the tensor it made before raising
    assert failed.profile.meta["rank"] == 1
    assert results[0].error is not None  # its collective lost the peer
    assert time.monotonic() - started < 120  # ended by the error, not by the launch timeout
    port = next((r.profile.meta["master_port"] for r in results if r.profile), None)
    assert_ranks_gone([r.pid for r in results], port, before)


def test_a_hung_collective_ends_at_the_timeout_and_leaves_nothing() -> None:
    def hang() -> None:
        if dist.get_rank() == 1:
            time.sleep(600)  # never joins the collective
        dist.all_reduce(torch.ones(10))

    timeout = 25.0
    before = children()
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        jv.launch(hang, nproc=2, timeout=timeout)
    elapsed = time.monotonic() - started
    assert timeout <= elapsed < 300  # the timeout ended it, not the hung rank's 600 s sleep
    results = info.value.results
    # the hung rank is killed: at the launch's timeout, or (whichever comes first under load)
    # 10 s after the other rank's collective timed out
    assert results[1].exitcode is None
    assert "timeout" in (results[1].error or "") or "after another rank failed" in (
        results[1].error or ""
    )
    assert results[0].error is not None
    assert_ranks_gone([r.pid for r in results], None, before)


def test_load_ranks_reads_rank_order_and_refuses_gaps(tmp_path: Path) -> None:
    with jv.record("cpu") as rec:
        torch.ones(100)
    for rank in (1, 0):
        rec.profile.replace(meta={"rank": rank, "world_size": 3}).save(
            tmp_path / f"rank{rank}.json.gz"
        )
    with pytest.raises(jv.ProfileFileError, match=r"rank\(s\) \[2\]"):
        jv.Profile.load_ranks(tmp_path)
    rec.profile.replace(meta={"rank": 2, "world_size": 3}).save(tmp_path / "rank2.json.gz")
    assert [p.meta["rank"] for p in jv.Profile.load_ranks(tmp_path)] == [0, 1, 2]
    with pytest.raises(jv.ProfileFileError, match="no such folder"):
        jv.Profile.load_ranks(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(jv.ProfileFileError, match="no rank<N>"):
        jv.Profile.load_ranks(tmp_path / "empty")


TWO_NODE_SCRIPT = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(1000 * (dist.get_rank() + 1))
dist.all_reduce(x[:1000])
assert float(x[0]) == dist.get_world_size()
dist.destroy_process_group()
print("args", sys.argv[1:])
"""


@pytest.mark.slow
def test_two_torchrun_nodes_write_one_profile_per_rank(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TWO_NODE_SCRIPT)
    out = tmp_path / "ranks"
    port = free_port()
    before = children()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    procs = [
        subprocess.Popen(
            [
                *torchrun,
                "--nnodes=2",
                f"--node-rank={node}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=jv-test",
                "-m",
                "jupyter_vram.run",
                "--out",
                str(out),
                str(script),
                "--flag",
                str(node),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for node in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=180)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    profiles = jv.Profile.load_ranks(out)
    assert [p.meta["rank"] for p in profiles] == [0, 1]
    assert {p.meta["world_size"] for p in profiles} == {2}
    assert sorted(p.meta["node_rank"] for p in profiles) == [0, 1]
    for profile in profiles:
        # each rank made its own tensor: 4 bytes x 1000 x (rank + 1)
        sizes = profile.allocations.size.tolist()
        assert 4 * 1000 * (profile.meta["rank"] + 1) in sizes
    assert all("args ['--flag'" in o for o in outputs)
    assert_ranks_gone([p.pid for p in procs], port, before)


@pytest.mark.slow
def test_cli_run_nproc_per_node_records_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TWO_NODE_SCRIPT)
    out = tmp_path / "ranks"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "jupyter_vram._cli", "run", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*command, "--ranks-dir", str(out), str(script), "--flag", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    profiles = jv.Profile.load_ranks(out)
    assert [p.meta["rank"] for p in profiles] == [0, 1]
    for profile in profiles:
        assert 4 * 1000 * (profile.meta["rank"] + 1) in profile.allocations.size.tolist()
    assert f"{out}/rank1.json.gz: peak" in done.stdout
