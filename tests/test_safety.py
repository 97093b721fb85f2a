"""The kernel is sacred: errors, interrupts, nesting and odd cells leave everything working."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._capture import RecordingError
from jupyter_vram._session import last_profile, run_code

from .conftest import CLEAN, MLP, recording_state


def test_exception_keeps_partial_profile_and_propagates() -> None:
    rec = jv.record()
    with pytest.raises(ValueError, match="boom"), rec:
        a = torch.ones(1024)
        raise ValueError("boom")
    assert recording_state() == CLEAN
    prof = rec.profile
    assert prof.error == "ValueError: boom"
    assert prof.peak_bytes - prof.timeline.baseline_bytes == 4096
    assert a.sum() == 1024  # the user's data is intact


def test_keyboard_interrupt_switches_recording_off() -> None:
    rec = jv.record()
    with pytest.raises(KeyboardInterrupt), rec:
        torch.ones(10)
        raise KeyboardInterrupt
    assert recording_state() == CLEAN
    assert rec.profile.error is not None and rec.profile.error.startswith("KeyboardInterrupt")
    with jv.record() as again:  # and recording works afterwards
        torch.ones(10)
    assert again.profile.event_count == 2


def test_run_code_reports_partial_profile_on_error() -> None:
    seen: list[jv.Profile] = []
    ns: dict[str, object] = {"torch": torch}
    with pytest.raises(ZeroDivisionError):
        run_code("x = torch.ones(256)\n1 / 0", ns, on_profile=seen.append)
    assert len(seen) == 1 and seen[0].error is not None
    assert last_profile() is seen[0]
    assert ns["x"].shape == (256,)  # type: ignore[attr-defined]


def test_cell_without_torch() -> None:
    run = run_code("total = sum(range(10))\ntotal * 2", {})
    assert run.value == 90
    assert run.profile is not None
    assert run.profile.event_count == 0
    assert run.profile.peak_bytes == run.profile.timeline.baseline_bytes


def test_nested_recording_is_refused_cleanly() -> None:
    with jv.record() as outer:
        with pytest.raises(RecordingError, match="already recording"), jv.record():
            pass
        run = run_code("y = torch.ones(8)\ny.sum()", {"torch": torch})
        assert run.nested and run.profile is None and run.value == 8
    assert outer.profile.event_count > 0


def test_syntax_error_records_nothing() -> None:
    with pytest.raises(SyntaxError):
        run_code("def (:", {})


def test_recorder_keeps_no_user_tensor_alive() -> None:
    mlp = MLP()
    opt = torch.optim.Adam(mlp.parameters())
    with jv.record() as rec:
        x = torch.randn(8, 256)
        loss = mlp(x).sum()
        loss.backward()
        opt.step()
        scratch = torch.empty(4096)
    refs = [weakref.ref(t) for t in (x, loss, scratch, mlp.fc1.weight, mlp.fc1.weight.grad)]
    refs += [weakref.ref(mlp), weakref.ref(opt)]
    state_refs = [weakref.ref(v) for s in opt.state.values() for v in s.values()]
    del x, loss, scratch, mlp, opt
    gc.collect()
    alive = [r() for r in refs + state_refs if r() is not None]
    assert not alive
    assert rec.profile.peak_bytes > 0  # the profile itself survives


def test_dead_storage_frees_are_recorded_after_stop() -> None:
    with jv.record() as rec:
        kept = torch.ones(100)
    del kept
    gc.collect()
    # frees after recording stopped are not events of the run
    assert rec.profile.allocations.free_seq.max() == -1
