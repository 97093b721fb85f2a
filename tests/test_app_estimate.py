"""The app on an estimate, without a kernel: the header says it is an estimate, the "Fit &
what-ifs" tab's buttons run real searches and what-ifs, errors stay in the tab, and a measured
profile shows its error against the estimate."""

from __future__ import annotations

import html
import logging
from typing import Any

import pandas as pd
import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram.app import ProfileApp
from jupyter_vram.app.estimate_view import (
    BADGE,
    TITLE,
    EstimateView,
    estimate_facts,
    what_if_fits,
    what_if_html,
)
from jupyter_vram.estimator import GPUS, Comparison, Estimate, EstimateError, estimate, find_gpu
from jupyter_vram.estimator.api import Allowance
from jupyter_vram.render.text import format_bytes

WIDTH = 16384  # wide enough that the smallest GPU's largest batch is a real number
SMALL_GPU = "GTX 1060 6GB"


def make_model() -> nn.Module:
    """A 2-layer MLP as two same-typed blocks (so activation checkpointing has blocks)."""
    return nn.Sequential(
        nn.Sequential(nn.Linear(64, WIDTH), nn.ReLU()),
        nn.Sequential(nn.Linear(WIDTH, 10), nn.ReLU()),
    )


@pytest.fixture(scope="module")
def est() -> Estimate:
    return estimate(make_model(), "32x64")


def test_header_says_estimate_and_tabs_work(est: Estimate) -> None:
    app = ProfileApp(est.profile, estimate=est)
    head = app.header.value
    assert BADGE in head
    assert format_bytes(est.peak_bytes) in head
    assert format_bytes(est.reserved_bytes) in head  # CUDA target: predicted reserved ...
    assert format_bytes(est.device_used_bytes) in head  # ... and device used
    assert est.settings.describe() in head
    assert "32x64" in head and "What is modelled" in head and "not modelled" in head
    assert app.tabs.get_title(5) == TITLE
    for i in range(5):  # flame graph, breakdown, timeline, top sites, allocator
        app.open_tab(i)
    assert isinstance(app.open_tab(5), EstimateView)
    assert app._repr_mimebundle_()["text/plain"].startswith("jupyter_vram estimate")


def test_show_takes_an_estimate(est: Estimate) -> None:
    app = jv.show(est)
    assert isinstance(app, ProfileApp) and app.tabs.get_title(5) == TITLE
    assert jv.estimate is estimate and jv.Estimate is Estimate  # the function, not the package


def test_estimate_profile_alone_has_no_fit_tab(est: Estimate) -> None:
    app = ProfileApp(est.profile)
    assert BADGE in app.header.value
    assert len(app.tabs.children) == 5


def test_gpu_table_shows_fits_at_once(est: Estimate) -> None:
    view = ProfileApp(est.profile, estimate=est).open_tab(5)
    assert isinstance(view, EstimateView)
    frame = view.fit_frame
    assert len(frame) == len(GPUS) == view.fit_table.value.count("<tr class='jv-fit-")
    assert list(frame["fits"]) == [est.fits(g) for g in GPUS]
    assert "max_batch_size" not in frame.columns and "largest batch" not in view.fit_table.value


def test_search_button_fills_largest_batch(est: Estimate) -> None:
    view = EstimateView(est, gpus=[SMALL_GPU])
    seen: list[str] = []
    view.search_progress.status.observe(lambda c: seen.append(c["new"]), "value")
    view.search_button.click()
    assert view.message.value == ""
    largest = int(view.fit_frame["max_batch_size"][0])
    assert largest == est.max_batch_size(SMALL_GPU)  # cached: no new runs
    assert 0 < largest < 1 << 16
    assert "largest batch" in view.fit_table.value and f"{largest:,}" in view.fit_table.value
    assert any("simulating batch" in s for s in seen)  # progress was shown as it went
    bar = view.search_progress.bar
    assert bar.value == bar.max and bar.bar_style == "success"
    assert not view.search_button.disabled


def test_what_ifs_button_fills_table(est: Estimate) -> None:
    view = EstimateView(est, gpus=[SMALL_GPU, "H200"])
    view.data_parallel.value = 4
    view.what_if_button.click()
    assert view.message.value == ""
    frame = view.what_if_frame
    assert frame is not None
    assert frame["what_if"][0].startswith("as estimated")
    table = view.what_if_table.value
    first = table.index("<tr class='jv-whatif-")
    assert "as estimated" in table[first : table.index("</tr>", first)]
    assert "+0.0%" in table and "simulated" in table and "arithmetic" in table
    assert "on 4 GPUs" in table and f"fits on {SMALL_GPU}" in table
    assert f"{frame['device_used_bytes'][0] / 2**30:.2f} GiB" in table
    for note in frame["note"]:  # variants that could not run say why, in their row
        assert not note or f"could not run: {html.escape(note)}" in table
    view.gpu_choice.value = "H200"
    assert "fits on H200" in view.what_if_table.value
    view.data_parallel.value = 2
    assert "compute again for 2" in view.what_if_progress.status.value


def test_what_if_row_that_could_not_run() -> None:
    nan = float("nan")
    frame = pd.DataFrame(
        [
            {"what_if": "as estimated: fp32", "kind": "simulated", "peak_bytes": 2**30,
             "reserved_bytes": 2**30, "device_used_bytes": 2**31, "change": 0.0, "note": ""},
            {"what_if": "activation checkpointing", "kind": "simulated", "peak_bytes": nan,
             "reserved_bytes": nan, "device_used_bytes": nan, "change": nan,
             "note": "nothing to checkpoint"},
            {"what_if": "ZeRO-1 on 8 GPUs (per GPU)", "kind": "arithmetic",
             "peak_bytes": 2**29, "reserved_bytes": 2**29, "device_used_bytes": 3 * 2**29,
             "change": -0.25, "note": ""},
        ]
    )  # fmt: skip
    table = what_if_html(frame, find_gpu("T4"), 8, [True, None, False])
    assert "could not run: nothing to checkpoint" in table
    assert "2.00 GiB" in table and "+0.0%" in table and "-25.0%" in table
    assert table.count("<td>yes</td>") == 1 and table.count("<td>no</td>") == 1
    assert "<td>-</td>" in table
    assert "<td>-</td>" in what_if_html(frame, find_gpu("T4"), 8)  # no answers given: none shown


@pytest.mark.parametrize("button", ["search_button", "what_if_button"])
def test_errors_are_shown_in_the_tab(
    est: Estimate, button: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise EstimateError("the estimator stopped: out of patience")

    view = EstimateView(est, gpus=[SMALL_GPU])
    monkeypatch.setattr(est, "gpu_table" if button == "search_button" else "what_ifs", fail)
    with caplog.at_level(logging.WARNING):
        getattr(view, button).click()
    assert "out of patience" in view.message.value and "jv-error" in view.message.value
    assert not getattr(view, button).disabled
    assert "Exception in callback" not in caplog.text


def test_comparison_banner(est: Estimate) -> None:
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64)
    for _ in range(2):  # the estimate is of a step with optimizer state
        with jv.record("cpu") as rec:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    comparison = est.compare(rec.profile)
    app = ProfileApp(rec.profile, comparison=comparison)
    head = app.header.value
    assert BADGE not in head
    assert (
        f"Estimated <b>{format_bytes(comparison.estimated_bytes)}</b> vs measured "
        f"<b>{format_bytes(comparison.measured_bytes)}</b>: error "
        f"<b>{100 * comparison.error:+.1f}%</b>"
    ) in head
    assert "jv-comparison-table" in head and "parameter" in head
    assert "error" in app._repr_mimebundle_()["text/plain"]


@pytest.mark.parametrize(("estimated", "sign", "verdict"), [(150, "+50.0%", "high"),
                                                          (50, "-50.0%", "low")])  # fmt: skip
def test_comparison_sign(est: Estimate, estimated: int, sign: str, verdict: str) -> None:
    comparison = Comparison(estimated, 100, {"activation": estimated}, {"activation": 100})
    head = ProfileApp(est.profile, comparison=comparison).header.value
    assert f"error <b>{sign}</b> (the estimate is {verdict})" in head


def test_an_estimate_app_does_not_keep_its_estimate() -> None:
    """Like a profile's app: once a newer app exists and the user drops the estimate, it is
    freed; the old app keeps its text and tables and says why it cannot run more."""
    import gc
    import weakref

    from jupyter_vram.capture.builder import ProfileBuilder

    fresh = estimate(nn.Linear(64, 10), "4x64")
    refs = (weakref.ref(fresh), weakref.ref(fresh.profile))
    app = ProfileApp(fresh.profile, estimate=fresh)
    view = app.open_tab(5)
    assert isinstance(view, EstimateView) and view.estimate is fresh
    b = ProfileBuilder()
    b.add(100, 0, 0, b.devices("cpu"), b.ops("mm"), b.modules("m"), -1, 1, 0)
    newer = ProfileApp(b.build(device="cpu", source="test", wall_ns=1))
    del fresh
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert app.estimate is None and view.estimate is None and newer.profile is not None
    assert app.text().startswith("jupyter_vram estimate")
    assert "fits at batch 4" in view.fit_table.value
    assert view.find_largest_batches() is None
    assert "no longer in memory" in view.message.value


def with_reserved(est: Estimate, reserved: int) -> Estimate:
    """``est`` with another predicted reserved peak: the same step near a card's limit, no run
    (its profile used no flash attention, so every card's answer comes from this run)."""
    meta = dict(est.profile.meta)
    meta["allocator_model"] = {**meta["allocator_model"], "peak_reserved": reserved}
    return Estimate(est.profile.replace(meta=meta), est.settings, b"")


def near_limits(est: Estimate) -> list[int]:
    """Reserved peaks just inside and outside each card's limit, and between its usable and
    its total memory (where comparing against the total would say it fits)."""
    overhead = est.runtime_overhead.bytes
    values = set()
    for gpu in GPUS:
        base = gpu.usable_bytes - overhead - est.cublas_adjustment(gpu)
        values |= {base, base + 1, base - 1, gpu.memory_bytes - overhead - 1}
    return sorted(values)


def fits_column(table: str) -> list[str]:
    """The "fits on" cell of each row of a what-if table."""
    rows = table.split("<tr class='jv-whatif-")[1:]
    return [row[row.rindex("<td>") + 4 : row.rindex("</td>")] for row in rows]


def test_fit_answers_are_the_estimators(est: Estimate) -> None:
    """The header's smallest GPU, the GPU table and the what-if table's "fits on" column all
    say what Estimate.fits says, for every card, also where device used lies between a card's
    usable and total memory and where its cuBLAS workspaces differ from the simulated ones."""
    assert est.settings.flash_attention and not any("flash" in op for op in est.profile.ops)
    checked = 0
    for reserved in near_limits(est):
        near = with_reserved(est, reserved)
        assert near.device_used_bytes == reserved + near.runtime_overhead.bytes
        fits = {g.name: near.fits(g) for g in GPUS}
        first = next((g.name for g in GPUS if fits[g.name]), "none listed")
        assert dict(estimate_facts(near.profile, near))["smallest GPU it fits"] == first
        assert dict(estimate_facts(near.profile))["smallest GPU it fits"] == first  # alone
        view = EstimateView(near)
        assert dict(zip(view.fit_frame["gpu"], view.fit_frame["fits"], strict=True)) == fits
        frame = pd.DataFrame([
            {"what_if": "as estimated: " + near.settings.describe(), "kind": "simulated",
             "peak_bytes": near.peak_bytes, "reserved_bytes": near.reserved_bytes,
             "device_used_bytes": near.device_used_bytes, "change": 0.0, "note": ""},
        ])  # fmt: skip
        view.what_if_frame, view._what_if_gpus = frame, 8
        view._show_what_ifs()  # for the GPU chosen now; each change of choice shows it again
        for gpu in GPUS:
            view.gpu_choice.value = gpu.name
            assert view.message.value == ""
            assert view.what_if_fits == [fits[gpu.name]] == what_if_fits(near, frame, gpu)
            assert fits_column(view.what_if_table.value) == ["yes" if fits[gpu.name] else "no"]
            checked += 1
    # the cases are real: some card is refused though device used is within its total memory
    between = [
        (g, r)
        for r in near_limits(est)
        for g in GPUS
        if not with_reserved(est, r).fits(g) and with_reserved(est, r).used_on(g) <= g.memory_bytes
    ]
    assert between and checked == len(near_limits(est)) * len(GPUS)


def test_profile_alone_leaves_out_cards_it_cannot_answer(
    est: Estimate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A saved estimate's profile cannot simulate again: cards that would run another
    attention kernel than the simulated step's are named as not checked, never guessed."""
    monkeypatch.setattr("jupyter_vram.estimator.api._uses_flash", lambda profile: True)
    near = with_reserved(est, find_gpu("A10").usable_bytes // 2)
    answer = dict(estimate_facts(near.profile))["smallest GPU it fits"]
    no_flash = [g.name for g in GPUS if not g.flash_attention]
    first = next(g.name for g in GPUS if g.flash_attention and near.fits(g))
    assert (
        answer
        == f"{first} (not checked: {', '.join(no_flash)}, which run another attention kernel)"
    )


def test_header_uses_the_apps_estimate(est: Estimate) -> None:
    """ProfileApp builds its header from the profile; the fit comes from the estimate it
    holds."""
    t4 = find_gpu("T4")
    overhead = est.runtime_overhead.bytes + est.cublas_adjustment(t4)
    near = with_reserved(est, t4.memory_bytes - overhead - 1)  # within its total, not usable
    assert not near.fits(t4) and near.used_on(t4) <= t4.memory_bytes
    first = next(g.name for g in GPUS if near.fits(g))
    assert first == "V100 16GB"
    head = ProfileApp(near.profile, estimate=near).header.value
    assert f"smallest GPU it fits</span> <b>{html.escape(first)}</b>" in head


def test_runtime_allowance_is_marked_as_a_guess(
    est: Estimate, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowance = est.runtime_overhead
    assert allowance.guessed
    mark = "a guess, not measured per GPU"
    used = f"≈ {format_bytes(est.device_used_bytes)} (includes a {format_bytes(allowance.bytes)}"
    head = ProfileApp(est.profile, estimate=est).header.value
    assert html.escape(used) in head and mark in head
    assert mark in dict(estimate_facts(est.profile))["predicted device used"]  # profile alone
    intro = EstimateView(est, gpus=[SMALL_GPU]).fit_intro.value
    assert mark in intro and "jv-guess" in intro and html.escape(allowance.note) in intro

    measured = Allowance(allowance.bytes, guessed=False, note="measured on this card")
    monkeypatch.setattr(Estimate, "runtime_overhead", property(lambda self: measured))
    assert mark not in ProfileApp(est.profile, estimate=est).header.value
    intro = EstimateView(est, gpus=[SMALL_GPU]).fit_intro.value
    assert mark not in intro and "measured on this card" in intro


def test_comparison_banner_left_out_tensors(est: Estimate) -> None:
    """measured_bytes already leaves out the unrelated tensors: the banner says so, once."""
    comparison = Comparison(110, 100, {"activation": 110}, {"activation": 100},
                            left_out_bytes=5 << 20)  # fmt: skip
    head = ProfileApp(est.profile, comparison=comparison).header.value
    assert "Left out of the measurement: 5.0 MiB" in head and "error <b>+10.0%</b>" in head
    banner = head[head.index('<div class="jv-comparison">') :]
    assert "includes" not in banner and "without them" not in banner
