"""Words and numbers the app shows: each one says what is true of the profile at hand.

The Allocator tab names what recorded the run (the CPU allocator sees buffers inside ops, the
tracker does not); the what-if table reads in a unit that keeps its rows apart; a change from
almost nothing is a factor, not '+6361500.0 %'; a rank's rerun note says it is a rank; an
estimate has a step, not a cell. Expected texts are written out by hand.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._analysis.allocator import allocator_state
from jupyter_vram._app.profile_app import notes_html, simulated_html
from jupyter_vram._render.html import header_facts
from jupyter_vram._render.mime import profile_payload
from jupyter_vram._render.static_report import static_report_html
from jupyter_vram._render.text import summary

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
