"""Words and numbers the app shows: each one says what is true of the profile at hand.

The Allocator tab names what recorded the run (the CPU allocator sees buffers inside ops, the
tracker does not); the what-if table reads in a unit that keeps its rows apart; a change from
almost nothing is a factor, not '+6361500.0 %'; a rank's rerun note says it is a rank; an
estimate has a step, not a cell. Expected texts are written out by hand.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pandas as pd
import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._analysis.allocator import allocator_state
from jupyter_vram._analysis.compare import verdict
from jupyter_vram._app import ProfileApp
from jupyter_vram._app.compare_view import _change_cell
from jupyter_vram._app.estimate_view import what_if_html
from jupyter_vram._app.profile_app import notes_html, simulated_html
from jupyter_vram._model import Allocations
from jupyter_vram._render.compare_figures import change_text
from jupyter_vram._render.estimate_text import what_if_text
from jupyter_vram._render.html import header_facts
from jupyter_vram._render.mime import profile_payload
from jupyter_vram._render.static_report import static_report_html
from jupyter_vram._render.text import summary
from jupyter_vram._units import format_change, format_column

MIB, GIB = 1 << 20, 1 << 30


@pytest.fixture(scope="module")
def cpu_profile() -> Iterator[jv.Profile]:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    with jv.record("cpu") as rec:
        model(torch.randn(8, 64)).sum().backward()
    yield rec.profile


def text_of(fragment: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment)).replace("&#x27;", "'")


def test_allocator_tab_names_what_recorded_the_cpu_run(cpu_profile: jv.Profile) -> None:
    assert cpu_profile.source == "allocator"
    text = text_of(simulated_html(cpu_profile) + notes_html(allocator_state(cpu_profile)))
    assert "What the CPU allocator reported" in text
    assert "buffers an op makes and frees inside itself included" in text
    assert "tensor tracker" not in text and "not seen" not in text
    tracked = cpu_profile.replace(source="dispatch")  # recorded while the user's profiler ran
    text = text_of(simulated_html(tracked) + notes_html(allocator_state(tracked)))
    assert "What the tensor tracker reported" in text
    assert "buffers an op makes and frees inside itself are not seen by the tracker" in text


def test_columns_read_in_a_unit_that_keeps_rows_apart() -> None:
    # a small model's what-ifs: 230, 235 and 240 MiB all read 0.23 GiB
    assert format_column([230 * MIB, 235 * MIB, 240 * MIB]) == [
        "230.00 MiB",
        "235.00 MiB",
        "240.00 MiB",
    ]
    # device used, 1 GiB allowance + a little: 1.25 GiB and 1.25 GiB + 2 MiB
    assert format_column([1280 * MIB, 1282 * MIB]) == ["1,280.00 MiB", "1,282.00 MiB"]
    assert format_column([3 * GIB, 3 * GIB // 2]) == ["3.00 GiB", "1.50 GiB"]
    assert format_column([100, 2000]) == ["0.10 KiB", "1.95 KiB"]
    assert format_column([100, 200]) == ["100 B", "200 B"]


def test_what_if_table_of_a_small_model() -> None:
    rows = [
        ("as estimated: fp32", 230, 236, 1260, 0.0),
        ("bf16 autocast", 200, 206, 1230, -30 / 230),
        ("activation checkpointing", 215, 220, 1245, -15 / 230),
    ]
    frame = pd.DataFrame(
        [
            {"what_if": w, "kind": "simulated", "peak_bytes": p * MIB, "reserved_bytes": r * MIB,
             "predicted_device_bytes": u * MIB, "change": c, "note": ""}
            for w, p, r, u, c in rows
        ]
    )  # fmt: skip
    table = text_of(what_if_html(frame, None, 8))
    # peak and reserved are under 1 GiB: MiB; device used reads apart in GiB (1260 / 1024 =
    # 1.230, 1230 / 1024 = 1.201, 1245 / 1024 = 1.216)
    for (_, peak, reserved, _, _), used in zip(rows, ("1.23", "1.20", "1.22"), strict=True):
        assert f"{peak:.2f} MiB {reserved:.2f} MiB {used} GiB" in table
    assert "0.23 GiB" not in table
    assert "-13.0%" in table and "-6.5%" in table  # 30 / 230, 15 / 230
    text = what_if_text(frame)
    assert "230.00 MiB" in text and "1.23 GiB" in text and "-13.0%" in text


def test_a_change_from_almost_nothing_is_a_factor() -> None:
    # 20 B of activations before, 1,272,320 B after: 63,616 times as much
    assert format_change(20, 1_272_320) == "63,616x"
    assert change_text(20, 1_272_320) == "+1.2 MiB (63,616x)"
    assert "(63,616x)" in _change_cell(20, 1_272_320, "1.2 MiB")
    assert "%" not in _change_cell(20, 1_272_320, "1.2 MiB")
    assert format_change(100, 1250) == "12.5x"
    assert format_change(100, 150) == "+50.0 %" and format_change(100, 40, space="") == "-60.0%"
    assert format_change(0, 5) == "new"
    assert "(new)" in _change_cell(0, 4096, "4.0 KiB")


def test_verdict_of_a_peak_ten_times_higher(cpu_profile: jv.Profile) -> None:
    tenfold = cpu_profile.replace(allocations=_scaled(cpu_profile, 25))
    line = verdict(cpu_profile, tenfold)
    assert "(25.0x)" in line, line  # every size 25 times: the peak too


def _scaled(profile: jv.Profile, factor: int) -> Allocations:
    a = profile.allocations
    columns = {name: getattr(a, name) for name in a.__dataclass_fields__}
    return Allocations(**{**columns, "size": a.size * factor})


def test_a_rank_says_it_is_a_rank(cpu_profile: jv.Profile) -> None:
    rank = cpu_profile.replace(meta={**cpu_profile.meta, "rank": 1, "world_size": 2})
    reason = jv.rerun_unavailable(rank)
    assert reason == (
        "this is rank 1 of a distributed run (%%vram --nproc, jv.launch, torchrun): reruns "
        "apply to a single-process %%vram cell"
    )
    note = text_of(ProfileApp(rank).reruns.value)  # type: ignore[union-attr]
    assert "rank 1 of a distributed run" in note and "made by %%vram" not in note


def test_an_estimate_has_a_step_not_a_cell(cpu_profile: jv.Profile) -> None:
    estimate = cpu_profile.replace(source="estimate", error="RuntimeError: boom")
    labels = [label for label, _ in header_facts(estimate)]
    assert "before the step" in labels and "added by the step" in labels
    assert not any("cell" in label for label in labels)
    payload = profile_payload(estimate)
    assert not any("cell" in label for label, _ in payload["facts"])
    page = text_of(static_report_html(estimate))
    assert "before the step" in page and "The step raised RuntimeError: boom" in page
    assert "before the cell" not in page and "added by the cell" not in page
    assert "The cell raised" not in page
    text = summary(estimate)
    assert "before the step" in text and "the step raised RuntimeError: boom" in text
    plain = [label for label, _ in header_facts(cpu_profile)]
    assert "before the cell" in plain and "added by the cell" in plain
