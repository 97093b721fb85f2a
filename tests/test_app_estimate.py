"""The app on an estimate, without a kernel: the header says it is an estimate, the "Fit &
what-ifs" tab's buttons run real searches and what-ifs, errors stay in the tab, and a measured
profile shows its error against the estimate."""

from __future__ import annotations

import html
import logging
import re
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest
import torch
from bokeh.models.annotations import Span
from torch import nn

import jupyter_vram as jv
from jupyter_vram._app import ProfileApp
from jupyter_vram._app.estimate_view import (
    BADGE,
    TITLE,
    EstimateView,
    estimate_facts,
    what_if_html,
)
from jupyter_vram._app.timeline_view import TimelineView
from jupyter_vram._estimator import GPUS, Comparison, Estimate, EstimateError, estimate, find_gpu
from jupyter_vram._estimator.api import Allowance, model_weights, what_if_fits
from jupyter_vram._estimator.step import settings_text
from jupyter_vram._units import format_bytes

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
    assert format_bytes(est.predicted_device_bytes) in head  # ... and device used
    assert "weights fp32 (the model&#x27;s), no autocast, optimizer adamw" in head
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
    used = int(frame["predicted_device_bytes"][0])  # in GiB, or MiB where rows read alike
    assert f"{used / 2**30:.2f} GiB" in table or f"{used / 2**20:,.2f} MiB" in table
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
             "reserved_bytes": 2**30, "predicted_device_bytes": 2**31, "change": 0.0, "note": ""},
            {"what_if": "activation checkpointing", "kind": "simulated", "peak_bytes": nan,
             "reserved_bytes": nan, "predicted_device_bytes": nan, "change": nan,
             "note": "nothing to checkpoint"},
            {"what_if": "ZeRO-1 on 8 GPUs (per GPU)", "kind": "arithmetic",
             "peak_bytes": 2**29, "reserved_bytes": 2**29, "predicted_device_bytes": 3 * 2**29,
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
        f"<b>{format_bytes(comparison.measured_bytes)}</b>: difference "
        f"<b>{100 * comparison.relative_difference:+.1f}%</b>"
    ) in head
    assert "jv-comparison-table" in head and "parameter" in head
    assert "difference" in app._repr_mimebundle_()["text/plain"]


@pytest.mark.parametrize(("estimated", "sign", "verdict"), [(150, "+50.0%", "high"),
                                                          (50, "-50.0%", "low")])  # fmt: skip
def test_comparison_sign(est: Estimate, estimated: int, sign: str, verdict: str) -> None:
    comparison = Comparison(estimated, 100, {"activation": estimated}, {"activation": 100})
    head = ProfileApp(est.profile, comparison=comparison).header.value
    assert f"difference <b>{sign}</b> (the estimate is {verdict})" in head


def test_an_estimate_app_does_not_keep_its_estimate() -> None:
    """Like a profile's app: once a newer app exists and the user drops the estimate, it is
    freed; the old app keeps its text and tables and says why it cannot run more."""
    import gc
    import weakref

    from jupyter_vram._app.holder import KEPT_APPS
    from jupyter_vram._capture.builder import ProfileBuilder

    fresh = estimate(nn.Linear(64, 10), "4x64")
    refs = (weakref.ref(fresh), weakref.ref(fresh.profile))
    app = ProfileApp(fresh.profile, estimate=fresh)
    view = app.open_tab(5)
    assert isinstance(view, EstimateView) and view.estimate is fresh
    b = ProfileBuilder()
    b.add(100, 0, 0, b.devices("cpu"), b.ops("mm"), b.modules("m"), -1, 1, 0)
    newer = [ProfileApp(b.build(device="cpu", source="test", wall_ns=1)) for _ in range(KEPT_APPS)][
        -1
    ]
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
        assert near.predicted_device_bytes == reserved + near.runtime_overhead.bytes
        fits = {g.name: near.fits(g) for g in GPUS}
        first = next((g.name for g in GPUS if fits[g.name]), "none listed")
        assert dict(estimate_facts(near.profile, near))["smallest GPU it fits"] == first
        assert dict(estimate_facts(near.profile))["smallest GPU it fits"] == first  # alone
        view = EstimateView(near)
        assert dict(zip(view.fit_frame["gpu"], view.fit_frame["fits"], strict=True)) == fits
        frame = pd.DataFrame([
            {"what_if": "as estimated: " + near.settings.describe(), "kind": "simulated",
             "peak_bytes": near.peak_bytes, "reserved_bytes": near.reserved_bytes,
             "predicted_device_bytes": near.predicted_device_bytes, "change": 0.0, "note": ""},
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
    monkeypatch.setattr("jupyter_vram._estimator.api._uses_flash", lambda profile: True)
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
    used = (
        f"≈ {format_bytes(est.predicted_device_bytes)} (includes a {format_bytes(allowance.bytes)}"
    )
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
    assert "Left out of the measurement: 5.0 MiB" in head and "difference <b>+10.0%</b>" in head
    banner = head[head.index('<div class="jv-comparison">') :]
    assert "includes" not in banner and "without them" not in banner


# -- the GPU asked about, the settings in words, the event axis ---------------------------------


def answer_line(head: str) -> str:
    found = re.findall(r"<div class='jv-gpu-answer jv-gpu-(?:yes|no)'>(.*?)</div>", head)
    assert len(found) == 1, found
    return html.unescape(found[0])


def test_the_gpu_asked_about_is_answered_first(est: Estimate) -> None:
    """--gpu: the app's first line answers it, by the estimator's rule checked by hand: device
    used at batch b (reserved + runtime allowance + the card's cuBLAS difference) within the
    card's usable memory, for b = 32 and the largest batch, and not for one more."""
    gpu = find_gpu(SMALL_GPU)
    extra = est.runtime_overhead.bytes + est.cublas_adjustment(gpu)

    def fits_at(batch: int) -> bool:
        return est.run(est.settings, batch).reserved_bytes + extra <= gpu.usable_bytes

    largest = est.max_batch_size(gpu)
    assert 32 < largest < 1 << 16 and fits_at(largest) and not fits_at(largest + 1)
    assert fits_at(32)
    app = ProfileApp(est.profile, estimate=est, gpu=SMALL_GPU)  # the app runs the search
    head = app.header.value
    assert answer_line(head) == f"{SMALL_GPU}: batch 32 fits; largest batch that fits: {largest:,}"
    assert head.index("jv-gpu-answer") < head.index(html.escape(BADGE))  # first, above all
    assert app.text().splitlines()[0] == answer_line(head)  # also without widgets


def test_the_answer_takes_the_callers_search(
    est: Estimate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search result handed in (the magic has one) is shown as it is, with no new search;
    a step that does not fit says so."""
    monkeypatch.setattr(est, "max_batch_size", lambda *a, **k: pytest.fail("searched again"))
    head = ProfileApp(est.profile, estimate=est, gpu="T4", largest_batch=78).header.value
    assert answer_line(head) == "T4: batch 32 fits; largest batch that fits: 78"
    too_big = with_reserved(est, find_gpu("H200").memory_bytes)  # more than any card holds
    assert not any(too_big.fits(g) for g in GPUS)
    head = ProfileApp(too_big.profile, estimate=too_big, gpu="T4", largest_batch=0).header.value
    assert answer_line(head) == (
        "T4: batch 32 does NOT fit; largest batch that fits: none (batch 1 does not fit)"
    )
    assert "jv-gpu-no" in head


def test_the_gpu_asked_about_is_highlighted_and_chosen(est: Estimate) -> None:
    app = ProfileApp(est.profile, estimate=est, gpu="T4", largest_batch=78)
    view = app.open_tab(5)
    assert isinstance(view, EstimateView)
    rows = re.findall(r"<tr class='jv-fit-[^']*'[^>]*>.*?</tr>", view.fit_table.value)
    chosen = [r for r in rows if "jv-chosen" in r]
    assert len(rows) == len(GPUS) and len(chosen) == 1
    assert chosen[0].startswith("<tr class='jv-fit-yes jv-chosen' title='the GPU asked about'>")
    assert _cells(chosen[0])[0] == "T4"
    assert view.gpu_choice.value == "T4"
    # without one: no row highlighted, "fits on" starts on the smallest card the step fits
    plain = EstimateView(est)
    assert "jv-chosen" not in plain.fit_table.value
    assert plain.gpu_choice.value == next(g.name for g in GPUS if est.fits(g))
    assert plain.gpu_choice.value != "T4"
    # a card outside a restricted table joins it
    view = EstimateView(est, gpus=[SMALL_GPU], gpu="T4")
    assert [g.name for g in view.gpus] == [SMALL_GPU, "T4"] and view.gpu_choice.value == "T4"


def _cells(row: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]


def test_magic_puts_the_gpu_answer_in_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """%vram_estimate --gpu: the answer is in the app's first line, not printed below it."""
    from IPython.core.magic_arguments import parse_argstring

    from jupyter_vram._magics import VramMagics
    from jupyter_vram._magics_estimate import run_estimate_magic

    shown: list[Any] = []
    printed: list[str] = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **k: shown.append(obj))
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    args = parse_argstring(VramMagics.vram_estimate, f"m --input 32x64 --gpu '{SMALL_GPU}'")
    result = run_estimate_magic(args, {"m": make_model()})
    assert result is not None
    app = next(s for s in shown if isinstance(s, ProfileApp))
    prefix = f"{SMALL_GPU}: batch 32 fits; largest batch that fits: "
    assert app.gpu_answer.startswith(prefix)
    largest = int(app.gpu_answer[len(prefix) :].replace(",", ""))
    gpu = find_gpu(SMALL_GPU)
    extra = result.runtime_overhead.bytes + result.cublas_adjustment(gpu)
    used = [result.run(result.settings, b).reserved_bytes + extra for b in (largest, largest + 1)]
    assert used[0] <= gpu.usable_bytes < used[1]  # by hand, from the search's own runs
    assert answer_line(app.header.value) == app.gpu_answer
    # printed: the progress lines only (no widget frontend here), not the answer
    assert printed and not any(p.startswith(f"{SMALL_GPU}: batch") for p in printed)


def test_settings_say_what_they_are(est: Estimate) -> None:
    """The header's settings in words; the model's weights dtype from the step: its four
    parameters alive before it, at 4 bytes each, rounded up to 512 B blocks (CUDA target):
    64 x 16384, 16384, 16384 x 10 and 10 elements: 4,194,304 + 65,536 + 655,360 + 512 B."""
    count = 64 * WIDTH + WIDTH + WIDTH * 10 + 10
    assert est.parameters == count
    assert est.profile.timeline.breakdown_at(-1)["parameter"] == 4_915_712
    assert model_weights(est.profile) == "fp32"
    head = ProfileApp(est.profile, estimate=est).header.value
    settings = re.findall(r'<span class="jv-label">settings</span> <b>(.*?)</b>', head)
    assert settings == [html.escape("weights fp32 (the model's), no autocast, optimizer adamw")]
    assert "model dtype" not in head
    # a parameter count that is no dtype's size: the dtype is not guessed
    meta = dict(est.profile.meta)
    meta["estimate"] = {**meta["estimate"], "parameters": 3 * count}  # about 4/3 bytes each
    assert model_weights(est.profile.replace(meta=meta)) is None
    s = est.settings
    assert settings_text(s) == "weights in the model's dtype, no autocast, optimizer adamw"
    assert settings_text(replace(s, dtype="bf16", amp="bf16", checkpoint=True), "fp32") == (
        "weights cast to bf16, autocast bf16, activation checkpointing, optimizer adamw"
    )
    assert settings_text(replace(s, inference=True, flash_attention=False), "16-bit") == (
        "weights 16-bit (the model's), no autocast, no optimizer (inference), "
        "no flash attention (pre-Ampere GPU)"
    )
    assert settings_text(replace(s, device="cpu", flash_attention=False), "fp32") == (
        "weights fp32 (the model's), no autocast, optimizer adamw"
    )


def test_estimate_timeline_counts_events_not_time(est: Estimate) -> None:
    """The fake run's wall time is no prediction: an estimate's timeline starts on the
    allocation-event axis (the peak at its event number); a measured one on wall time."""
    t = est.profile.timeline
    view = ProfileApp(est.profile, estimate=est).open_tab(2)
    assert isinstance(view, TimelineView)
    assert view.axis.value == "allocation events"
    assert view.source.data["x_end"][-1] == len(t)
    assert view.figure.xaxis[0].axis_label == "allocation / free event #"
    assert [s.location for s in view.figure.select({"type": Span})] == [t.peak_index + 1]
    # the moment shown says which event, not how many ms into the fake run
    assert f"(<span class='jv-when'>event {t.peak_index + 1:,}</span>)" in view.moment.value
    with jv.record("cpu", namespace={}) as rec:
        torch.ones(8)
    measured = ProfileApp(rec.profile).open_tab(2)
    assert isinstance(measured, TimelineView) and measured.axis.value == "wall time"
