"""The Make-it-fit tab outside a browser (ipywidgets' dummy comm): a budget typed in, the
ranked options as bars against the budget line, an option verified with its measured peak
beside the predicted one; an estimate's app planned for a GPU it does not fit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._app import ProfileApp
from jupyter_vram._app.fit_view import TITLE, FitView
from jupyter_vram._session import run_code
from jupyter_vram._units import format_bytes

from .conftest import MLP

STEP = "opt.zero_grad()\nloss = model(x).square().mean()\nloss.backward()\nopt.step()\n"


@pytest.fixture(autouse=True)
def forget() -> Any:
    yield
    from jupyter_vram import _session as session

    session._last_profile = None


def fit_tab(app: ProfileApp) -> FitView:
    titles = [app.tabs.get_title(i) for i in range(len(app.tabs.children))]
    view = app.open_tab(titles.index(TITLE))
    assert isinstance(view, FitView)
    return view


def test_a_budget_typed_in_plans_and_a_verified_option_shows_its_measured_peak() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(MLP(256, 512, 256) for _ in range(3)))
    ns = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
          "x": torch.randn(1024, 256)}  # fmt: skip
    run_code(STEP, ns, stacks=False)
    profile = run_code(STEP, ns, stacks=False).profile
    assert profile is not None
    app = ProfileApp(profile)
    view = fit_tab(app)
    budget = int(0.7 * profile.peak_bytes)
    view.budget.value = str(budget)
    view.plan_button.click()
    assert "cheapest that fits" in view.status.value
    rows = view.rows.children
    assert rows and all("jv-fit-line" in r.children[0].value for r in rows)  # budget line
    row = next(r for r in rows if not r.children[1].disabled)
    button = row.children[1]
    name = next(n for n, h in view._html.items() if h is row.children[0])
    option = jv.plan(profile, budget).option(name)
    before = [p.detach().clone() for p in model.parameters()]
    button.click()
    after = [p.detach() for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # the same change rerun by hand: the row shows what it measures
    by_hand = jv.rerun(
        profile,
        amp=option.changes.get("amp"),
        checkpoint=list(option.changes["checkpoint"]) if "checkpoint" in option.changes else None,
        micro_batch=option.changes.get("micro_batch"),
    )
    shown = row.children[0].value
    assert "measured" in shown and "jv-fit-measured" in shown
    if "micro_batch" not in option.changes:
        assert f"measured {format_bytes(by_hand.peak_bytes)}" in shown


def test_a_bad_budget_says_why() -> None:
    with jv.record() as rec:
        torch.ones(1000)
    view = fit_tab(ProfileApp(rec.profile))
    view.budget.value = "a lot"
    view.make_plan()
    assert "neither a size" in view.status.value and not view.rows.children


def test_an_estimate_app_plans_for_a_gpu_it_does_not_fit() -> None:
    # 8 layers of 16384 x 16384: 2.1 G parameters, 16 bytes each under AdamW: far past a T4
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Linear(16384, 16384) for _ in range(8)))
    est = jv.estimate(model, "8x16384", optimizer="adamw", device="cuda")
    assert not est.fits("T4")
    view = fit_tab(ProfileApp(est.profile, estimate=est, gpu="T4"))
    assert view.budget.value == "T4"  # planned at once for the GPU it does not fit
    assert "T4" in view.status.value and "the estimate adds" in view.status.value
    assert view.rows.children
    buttons = [r.children[1] for r in view.rows.children]
    assert all(b.disabled for b in buttons)  # an estimate has no cell to rerun
    assert any("an estimate has no cell" in b.tooltip for b in buttons)
