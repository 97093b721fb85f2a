"""OOM post-mortems and capacities: a CPU run forced past a capacity, checked by hand arithmetic.

The model: three residual blocks ``x + fc2(gelu(fc1(x)))`` (width d, hidden 4d), batch B, an
AdamW whose state exists before the run. In forward, a finished block keeps fc1's output z and
gelu's output g (B x 4d floats each, saved for backward) and its output (B x d, saved by the
next fc1); fc2's output is freed by the add. The capacity lets block ``K`` allocate its z and
refuses its gelu output (B x 4d floats): that request is the failure.
"""

from __future__ import annotations

import gc
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._analysis.oom import block_of
from jupyter_vram._capture.capacity import parse_capacity
from jupyter_vram._render.text import summary

from .conftest import CLEAN, ipython_shell, recording_state

B, D, K = 32, 64, 2
Z = B * 4 * D * 4  # one hidden activation (fc1 or gelu output), bytes
OUT = B * D * 4  # a block's output, bytes


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D, 4 * D)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def setup() -> dict[str, Any]:
    """Model, batch and an AdamW that has stepped once (its state exists before the run)."""
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(B, D)
    opt = torch.optim.AdamW(net.parameters())
    net(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return {"net": net, "x": x, "opt": opt, "torch": torch}


def hand_counts(ns: dict[str, Any]) -> dict[str, int]:
    params = [p for p in ns["net"].parameters()]
    p_bytes = sum(4 * p.numel() for p in params)
    # AdamW: exp_avg and exp_avg_sq per parameter, plus a float32 step scalar each
    state = sum(2 * 4 * p.numel() + 4 for p in params)
    x_bytes = B * D * 4
    activations = K * (2 * Z + OUT) + Z  # K finished blocks, then block K's fc1 output
    live = p_bytes + state + x_bytes + activations
    return {"params": p_bytes, "state": state, "x": x_bytes, "act": activations, "live": live}


def capacity_for(ns: dict[str, Any]) -> int:
    return hand_counts(ns)["live"] + Z - 1  # gelu's output in block K is one byte too many


def test_parse_capacity() -> None:
    assert parse_capacity("6GiB") == 6 * 2**30
    assert parse_capacity("6GB") == 6 * 10**9
    assert parse_capacity("512MiB") == 512 * 2**20
    assert parse_capacity("1.5 KiB") == 1536
    assert parse_capacity("4096") == 4096
    assert parse_capacity(4096) == 4096
    for bad in ("6 parsecs", "-1", "0", "", "GiB", True, None):
        with pytest.raises(ValueError, match="6GiB"):
            parse_capacity(bad)  # type: ignore[arg-type]


def test_capacity_raises_and_post_mortem_by_hand(tmp_path: Path) -> None:
    ns = setup()
    counts = hand_counts(ns)
    caught: list[BaseException] = []
    rec = jv.record("cpu", namespace=ns, capacity=capacity_for(ns))
    with pytest.raises(torch.OutOfMemoryError) as info, rec:
        try:
            ns["net"](ns["x"]).sum().backward()
        except torch.OutOfMemoryError as error:
            caught.append(error)
            raise
    assert recording_state() == CLEAN
    assert info.value is caught[0]  # the same exception object, unchanged
    assert "Tried to allocate 32.0 KiB" in str(info.value)
    oom = rec.profile.oom
    assert oom is not None
    assert oom.requested_bytes == Z
    assert oom.op == "gelu" and oom.module == f"Net.blocks.{K}.act" and oom.phase == "forward"
    assert oom.live_bytes == counts["live"]
    assert oom.shortfall_bytes == 1
    # the peak is what was live: the refused gelu output (made, then dropped by the guard)
    # is in the post-mortem, not in the profile. Block K's fc1 output is the last thing live
    # before it; earlier blocks peaked lower (their fc2 output, B x D, is less than Z).
    prof = rec.profile
    assert prof.peak_bytes == counts["live"] <= capacity_for(ns)
    assert prof.peak_breakdown() == oom.live_by_category
    assert prof.peak_breakdown()["temporary"] == 0
    a = prof.allocations
    refused = [
        r for r in range(len(a))
        if prof.modules[int(a.module[r])] == f"Net.blocks.{K}.act" and a.size[r] == Z
    ]  # fmt: skip
    assert refused == []
    live = oom.live_by_category
    assert live["parameter"] == counts["params"]
    assert live["optimizer_state"] == counts["state"]
    assert live["activation"] == counts["act"]
    assert live["input"] == counts["x"]
    saved = {s.action: s.bytes_saved for s in oom.suggestions}
    # checkpointing: K finished blocks keep z and g besides their output; one is recomputed
    assert saved["activation checkpointing of each block"] == (K - 1) * 2 * Z
    # autocast: every activation here comes from addmm / gelu / add: half of them
    assert saved["mixed precision (autocast to bf16 / fp16)"] == counts["act"] // 2
    assert saved["Adafactor"] == counts["state"]
    assert saved["8-bit AdamW (bitsandbytes)"] == counts["state"] * 3 // 4
    assert saved["SGD with momentum"] == counts["state"] // 2
    # batch: activations + input + the request scale with it. Per sample (floats of 4 bytes):
    # K finished blocks keep 4D + 4D + D each, block K its fc1 output 4D, x D, the request 4D
    assert oom.batch_size == B  # x's first dimension: x was the run's input
    per_sample = 4 * (K * (4 * D + 4 * D + D) + 4 * D + D + 4 * D)
    assert B * per_sample == counts["act"] + counts["x"] + Z
    # the capacity is one byte short of batch B, so B - 1 samples fit; one sample saved
    batch = next(s for s in oom.suggestions if s.action.startswith("a smaller batch"))
    assert batch.action == f"a smaller batch: batch size {B - 1} (now {B})"
    assert batch.bytes_saved == per_sample
    assert "linearly" in batch.reason
    assert not any("offload" in s.action for s in oom.suggestions)  # on CPU: nowhere to go
    ranked = [s.bytes_saved for s in oom.suggestions]
    assert ranked == sorted(ranked, reverse=True)
    assert all(s.enough for s in oom.suggestions)  # the shortfall is one byte
    assert {s.toggle for s in oom.suggestions} >= {"checkpointing", "AMP"}
    text = summary(rec.profile)
    assert "OUT OF MEMORY: a request for 32.0 KiB" in text
    # saved and loaded, the post-mortem is the same
    again = jv.Profile.load(rec.profile.save(tmp_path / "oom.json.gz")).oom
    assert again is not None and again.suggestions == oom.suggestions
    assert (again.op, again.module, again.phase) == (oom.op, oom.module, oom.phase)


@pytest.mark.parametrize("refused", ["output", "mean"])
def test_refused_outputs_are_not_in_the_peak(refused: str) -> None:
    """LayerNorm(D) on x (B x D floats) under no_grad: one op, native_layer_norm, makes its
    output (B x D floats) and the mean and rstd (B floats each), which the guard counts in
    that order. Held before: x and the weight and bias, B*D*4 + 2*D*4 bytes. A capacity one
    byte short of the output refuses it: the op's three outputs are dropped, and the peak is
    what was held before. A capacity 4 bytes past the output refuses the mean: the output was
    in use then (the post-mortem's live bytes and the peak), the mean and rstd were not."""
    b, d = 64, 256
    torch.manual_seed(0)
    ns = {"x": torch.randn(b, d), "ln": nn.LayerNorm(d)}
    held = b * d * 4 + 2 * d * 4
    capacity = held + b * d * 4 + (4 if refused == "mean" else -1)
    rec = jv.record("cpu", namespace=ns, capacity=capacity)
    with pytest.raises(torch.OutOfMemoryError), rec, torch.no_grad():
        ns["y"] = ns["ln"](ns["x"])
    oom = rec.profile.oom
    assert oom is not None and oom.op == "native_layer_norm"
    assert (oom.module, oom.phase) == ("LayerNorm", "forward")
    live = held + (b * d * 4 if refused == "mean" else 0)
    assert oom.requested_bytes == (b * 4 if refused == "mean" else b * d * 4)
    assert rec.profile.peak_bytes == oom.live_bytes == live <= capacity
    assert oom.shortfall_bytes == live + oom.requested_bytes - capacity
    a = rec.profile.allocations
    made = sorted(int(n) for n in a.size[a.alloc_seq >= 0])
    assert made == ([b * d * 4] if refused == "mean" else [])  # mean and rstd: gone


class Mlp(nn.Sequential):
    def __init__(self, d: int, h: int) -> None:
        super().__init__(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, d))


def test_batch_suggestion_fits_and_one_more_does_not() -> None:
    """An MLP's inference, Linear(d, h) -> ReLU -> Linear(h, d), h > d, batch b: its peak is
    at ReLU, with x (b*d floats), fc1's output and ReLU's (b*h each) live besides the
    parameters: b * (d + 2h) * 4 bytes per batch. A capacity with room for 20 samples (and 100
    bytes more) refuses batch 32 at ReLU; the post-mortem suggests batch 20, which runs under
    the same capacity, and batch 21 does not."""
    d, h, b, fit = 64, 256, 32, 20
    torch.manual_seed(0)
    net = Mlp(d, h)
    params = sum(4 * p.numel() for p in net.parameters())
    per_sample = (d + 2 * h) * 4
    capacity = params + fit * per_sample + 100

    def run(batch: int) -> tuple[jv.Recording, bool]:
        """The recording of batch ``batch``, and whether it ran out of memory."""
        ns = {"net": net, "x": torch.randn(batch, d)}
        rec = jv.record("cpu", namespace=ns, capacity=capacity)
        try:
            with rec, torch.no_grad():
                ns["y"] = ns["net"](ns["x"])
        except torch.OutOfMemoryError:
            return rec, True
        return rec, False

    rec, failed = run(b)
    assert failed
    oom = rec.profile.oom
    assert oom is not None and oom.op == "relu" and oom.requested_bytes == b * h * 4
    assert oom.batch_size == b
    batch = next(s for s in oom.suggestions if s.action.startswith("a smaller batch"))
    assert batch.action == f"a smaller batch: batch size {fit} (now {b})"
    assert batch.bytes_saved == (b - fit) * per_sample
    rec, failed = run(fit)
    assert not failed and rec.profile.peak_bytes == params + fit * per_sample <= capacity
    assert run(fit + 1)[1]


def test_batch_suggestion_is_a_fraction_when_the_batch_is_unknown() -> None:
    """The input is made inside the run, so no notebook tensor tells the batch size."""
    d, h, b = 64, 256, 32
    net = Mlp(d, h)
    params = sum(4 * p.numel() for p in net.parameters())
    per_sample = (d + 2 * h) * 4
    capacity = params + 20 * per_sample
    rec = jv.record("cpu", namespace={"net": net}, capacity=capacity)
    with pytest.raises(torch.OutOfMemoryError), rec, torch.no_grad():
        net(torch.randn(b, d))
    oom = rec.profile.oom
    assert oom is not None and oom.batch_size is None
    batch = next(s for s in oom.suggestions if s.action.startswith("a smaller batch"))
    assert batch.action == f"a smaller batch: {20 / b:.0%} of it"
    assert batch.bytes_saved == (b - 20) * per_sample


def test_fits_under_capacity_and_no_oom_otherwise() -> None:
    ns = setup()
    with jv.record("cpu", namespace=ns, capacity="1GiB") as rec:
        ns["net"](ns["x"]).sum().backward()
    assert rec.profile.oom is None
    assert rec.profile.meta["capacity_bytes"] == 2**30
    assert recording_state() == CLEAN
    with pytest.raises(ValueError, match="6GiB"):
        jv.record("cpu", capacity="six gigs")


def test_capacity_counts_frees() -> None:
    """Memory freed inside the run makes room again: 20 allocations of a quarter of the
    capacity, each dropped before the next, fit."""
    quarter = 1 << 20
    with jv.record("cpu", namespace={}, capacity=4 * quarter):
        for _ in range(20):
            t = torch.empty(quarter // 4)
            del t
    refused = pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 1\.0 MiB")
    with refused, jv.record("cpu", namespace={}, capacity=4 * quarter):
        kept = [torch.empty(quarter // 4) for _ in range(5)]
        del kept
    assert recording_state() == CLEAN


def test_magic_capacity_reraises_and_keeps_the_profile() -> None:
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    shell.run_line_magic("reset", "-f")  # tensors earlier tests left count as memory in use
    gc.collect()
    ns = setup()
    shell.user_ns.update(ns)
    shell.user_ns["cap"] = capacity_for(ns)
    cell = (
        "%%vram --quiet --capacity {cap}\n"
        "try:\n"
        "    net(x).sum().backward()\n"
        "except torch.OutOfMemoryError as error:\n"
        "    inner = error\n"
        "    raise\n"
    ).replace("{cap}", str(capacity_for(ns)))
    result = shell.run_cell(cell)
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
    assert result.error_in_exec is shell.user_ns["inner"]
    oom = shell.user_ns["_vram"].oom
    assert oom is not None and oom.requested_bytes == Z
    assert shell.user_ns["_vram"].peak_bytes == hand_counts(ns)["live"] <= capacity_for(ns)
    line = inspect.getsourcelines(Block.forward)[1] + 1  # the innermost line of user code
    assert oom.site == f"{__file__}:{line} (forward)"
    assert recording_state() == CLEAN
    for name in ("inner", "net", "x", "opt", "cap", "_vram"):
        shell.user_ns.pop(name, None)


def test_magic_bad_capacity_is_one_message(capsys: pytest.CaptureFixture[str]) -> None:
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    result = shell.run_cell("%%vram --capacity 6parsecs\nran = True\n")
    assert result.error_in_exec is None
    assert "ran" not in shell.user_ns
    err = capsys.readouterr().err
    assert "capacity '6parsecs' is not a size such as 6GiB" in err


def test_cuda_facts_expandable_segments() -> None:
    """A CUDA post-mortem's allocator state: 30 MiB reserved but free, 10 MiB free on the
    device, a 32 MiB request: cached + free covers it, so expandable segments would serve it."""
    ns = setup()
    with jv.record("cpu", namespace=ns) as rec:
        ns["net"](ns["x"]).sum().backward()
    mib = 1 << 20
    rec.profile.meta["oom_report"] = {
        "source": "cuda",
        "requested_bytes": 32 * mib,
        "segment_bytes": 32 * mib,  # 32 MiB >= 10 MiB: a segment of the request's size
        "capacity_bytes": 80 * 1024 * mib,
        "device_free_bytes": 10 * mib,
        "allocator": {"allocated": 100 * mib, "reserved": 130 * mib, "device_free": 10 * mib},
        "site": ["In[3]", 4, "<module>"],
    }
    oom = rec.profile.oom
    assert oom is not None
    assert oom.shortfall_bytes == 22 * mib
    assert oom.expandable_would_serve is True
    frag = next(s for s in oom.suggestions if "expandable_segments" in s.action)
    assert frag.bytes_saved == 30 * mib and frag.enough
    assert oom.site == "In[3]:4 (<module>)"


def test_cuda_shortfall_is_the_segment_the_request_needed() -> None:
    """A 4 KiB request (small pool) that no cached block served: the allocator asks the
    device for a 2 MiB segment and the device has 1 MiB free, so 1 MiB is missing, though
    the request is 4 KiB. Expandable segments would grow a segment by what the request needs:
    1 MiB reserved but free plus the 1 MiB free covers 4 KiB."""
    ns = setup()
    with jv.record("cpu", namespace=ns) as rec:
        ns["net"](ns["x"]).sum().backward()
    mib = 1 << 20
    rec.profile.meta["oom_report"] = {
        "source": "cuda",
        "requested_bytes": 4096,
        "segment_bytes": 2 * mib,
        "device_free_bytes": mib,
        "allocator": {"allocated": 99 * mib, "reserved": 100 * mib, "device_free": mib},
    }
    oom = rec.profile.oom
    assert oom is not None
    assert (oom.requested_bytes, oom.segment_bytes) == (4096, 2 * mib)
    assert oom.shortfall_bytes == mib
    assert oom.expandable_would_serve is True
    assert "a request for 4.0 KiB (a new 2.0 MiB segment)" in summary(rec.profile)


def test_block_of() -> None:
    assert block_of("GPT.h.3.attn.c_attn") == "GPT.h.3"
    assert block_of("Net.fc1") is None


def test_app_shows_the_post_mortem() -> None:
    from jupyter_vram._app import ProfileApp
    from jupyter_vram._app.oom_view import TITLE

    ns = setup()
    rec = jv.record("cpu", namespace=ns, capacity=capacity_for(ns))
    with pytest.raises(torch.OutOfMemoryError), rec:
        ns["net"](ns["x"]).sum().backward()
    app = ProfileApp(rec.profile)
    assert "Out of memory</b>: 32.0 KiB requested in Net.blocks.2.act" in app.header.value
    titles = [app.tabs.get_title(i) for i in range(len(app.tabs.children))]
    index = titles.index(TITLE)
    assert app.tabs.selected_index == index  # the post-mortem opens first
    view = app.tabs.children[index].value
    oom = rec.profile.oom
    assert oom is not None
    for s in oom.suggestions:
        assert s.action in view
    assert "OUT OF MEMORY" in app.text()


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, calls: list[Any], *, cached: int,
               live: int, process_used: int | None) -> None:  # fmt: skip
    """torch.cuda's answers on an 80 GiB device: ``cached`` bytes reserved until
    ``empty_cache``, ``live`` after; NVML's usage of this process (None: not reported)."""
    from types import SimpleNamespace

    from jupyter_vram._capture import nvml

    state = {"reserved": cached}
    total = 80 * 2**30
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=total)
    )
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda i: 0.5)
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, i: calls.append((f, i))
    )

    def empty_cache() -> None:
        calls.append("empty_cache")
        state["reserved"] = live

    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: state["reserved"])
    info = {"total": total, "used": total // 2, "free": total // 2}
    if process_used is not None:
        info["process_used"] = process_used
    monkeypatch.setattr(nvml, "device_memory", lambda i: info)


def test_cuda_capacity_sets_and_restores_the_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU here: the calls the CUDA capacity makes, with torch.cuda's answers faked.
    20 GiB cached before, 1 GiB held by live tensors: the cache is emptied before the
    fraction is set (PyTorch checks the fraction only for new segments); NVML reports 1.5 GiB
    for this process, so 0.5 GiB is outside the allocator (context) and comes off: the
    allocator may reserve 6 - 0.5 = 5.5 GiB of the 80."""
    from jupyter_vram._capture.capacity import CudaCapacity

    gib = 2**30
    calls: list[Any] = []
    _fake_cuda(monkeypatch, calls, cached=20 * gib, live=gib, process_used=3 * gib // 2)
    limit = CudaCapacity(6 * gib, torch.device("cuda", 0))
    limit.start()
    limit.stop()
    limit.stop()  # twice: restores once
    assert calls == ["empty_cache", (5.5 / 80, 0), (0.5, 0)]
    assert limit.facts == {"bytes": 6 * gib, "allocator_limit": 11 * gib // 2,
                           "reserved_at_start": gib, "outside_allocator": gib // 2,
                           "cache_emptied": True}  # fmt: skip
    with pytest.raises(ValueError, match="more than this device has"):
        CudaCapacity(100 * gib, torch.device("cuda", 0)).start()


def test_cuda_capacity_below_what_the_process_holds_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1 GiB of live tensors and 0.5 GiB of context do not fit a 1.25 GiB device."""
    from jupyter_vram._capture.capacity import CudaCapacity

    gib = 2**30
    calls: list[Any] = []
    _fake_cuda(monkeypatch, calls, cached=4 * gib, live=gib, process_used=3 * gib // 2)
    with pytest.raises(ValueError, match="less than this process already holds"):
        CudaCapacity(5 * gib // 4, torch.device("cuda", 0)).start()
    assert calls == ["empty_cache"]  # the fraction is left alone


def test_cuda_capacity_without_nvml_counts_the_allocator_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jupyter_vram._capture.capacity import CudaCapacity
    from jupyter_vram._render.html import capacity_text

    gib = 2**30
    calls: list[Any] = []
    _fake_cuda(monkeypatch, calls, cached=gib, live=gib, process_used=None)
    limit = CudaCapacity(8 * gib, torch.device("cuda", 0))
    limit.start()
    limit.stop()
    assert calls == ["empty_cache", (8 / 80, 0), (0.5, 0)]
    meta = {"capacity_bytes": 8 * gib, "capacity": limit.facts}
    assert capacity_text(meta) == "8.0 GiB (cache emptied first, context not counted (no NVML))"


def test_cuda_post_mortem_capacity_is_what_the_process_could_reach() -> None:
    """No fraction set: the observer's limit is the device total (80 GiB), but with 60 GiB
    reserved and 2 GiB free the process could reach 62 GiB; the rest is the CUDA context and
    other processes."""
    from jupyter_vram._capture.oom import _reachable_capacity

    gib = 2**30
    state = {"reserved": 60 * gib, "device_free": 2 * gib}
    facts: dict[str, Any] = {"source": "cuda", "capacity_bytes": 80 * gib,
                             "device_free_bytes": 2 * gib, "allocator": state}  # fmt: skip
    _reachable_capacity(facts)
    assert facts["capacity_bytes"] == 62 * gib and facts["device_limit_bytes"] == 80 * gib


def test_oom_observer_forwards_to_the_running_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_vram._capture import oom as oom_capture

    attached: list[Any] = []
    monkeypatch.setattr(oom_capture, "_attached", False)
    monkeypatch.setattr(oom_capture, "_listener", None)  # put back even if this test fails
    monkeypatch.setattr(
        torch._C, "_cuda_attach_out_of_memory_observer", attached.append, raising=False
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    watch = oom_capture.OomWatch("cuda:0")
    watch.start()
    oom_capture.OomWatch("cuda:0").start()  # a second recording does not attach again
    assert len(attached) == 1
    watch.start()
    observer = attached[0]
    # a 3 MiB request: malloc() gives the observer get_allocation_size(3 MiB) = the 20 MiB
    # segment it tried to get (as "Tried to allocate" says); the trace's oom entry the request
    mib = 2**20
    observer(0, 20 * mib, 40 * 2**30, mib)  # device, segment, limit, device free
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB.")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    trace = [{"seq": 7, "size": 3 * mib, "device_free": mib}]
    facts = watch.facts(error, trace_ooms=trace)
    assert facts["source"] == "cuda"
    assert facts["requested_bytes"] == 3 * mib and facts["segment_bytes"] == 20 * mib
    assert facts["capacity_bytes"] == 40 * 2**30 and facts["device_free_bytes"] == mib
    untraced = watch.facts(error)  # no oom entry: the request is not known
    assert untraced["requested_bytes"] is None and untraced["segment_bytes"] == 20 * mib
    watch.stop()
    observer(0, 1, 1, 1)  # no recording listens any more
    assert len(watch.observed) == 1
    assert oom_capture.requested_in_message("Tried to allocate 20.00 MiB") == 20 * 2**20
    assert oom_capture.requested_in_message("no size here") is None


def test_malformed_post_mortem_reads_as_missing_facts() -> None:
    """A saved profile's post-mortem is only numbers and names: odd values are skipped, and
    the summary still renders."""
    with jv.record("cpu", namespace={}) as rec:
        torch.ones(1000)
    rec.profile.meta["oom_report"] = {
        "requested_bytes": "lots",
        "site": ["In[1]"],
        "allocator": {"reserved": "x", "allocated": 5},
        "optimizers": [3, "AdamW"],
    }
    rec.profile.meta["oom"] = [{"seq": "late"}]
    oom = rec.profile.oom
    assert oom is not None
    assert oom.requested_bytes is None and oom.site is None
    assert oom.allocator == {"allocated": 5} and oom.optimizers == ["AdamW"]
    assert "OUT OF MEMORY: a request for ?" in summary(rec.profile)
