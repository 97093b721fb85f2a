"""Real transformer models built from configs (no download): names, phases, categories."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._analysis.groups import live_at_peak
from jupyter_vram._model import PHASES

from .conftest import owned_breakdown

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_profile() -> tuple[torch.nn.Module, jv.Profile]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64, attn_implementation="eager"
    )
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 512, (4, 32))

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    with jv.record() as rec:
        step()
    return model, rec.profile


def test_live_at_peak_names_real_submodules(gpt2_profile) -> None:  # type: ignore[no-untyped-def]
    _, prof = gpt2_profile
    names = {g.label for g in live_at_peak(prof, "module")}
    for block in ("h.0", "h.1"):
        assert f"GPT2LMHeadModel.transformer.{block}.attn.c_attn" in names
        assert f"GPT2LMHeadModel.transformer.{block}.mlp.c_fc" in names


def test_phases_and_modules_match(gpt2_profile) -> None:  # type: ignore[no-untyped-def]
    _, prof = gpt2_profile
    df = prof.to_dataframe()
    run = df[df["alloc_seq"] >= 0]
    assert set(run["phase"]) >= {"forward", "backward", "optimizer"}
    fwd = run[run["phase"] == "forward"]
    bwd = run[run["phase"] == "backward"]
    opt = run[run["phase"] == "optimizer"]
    assert fwd["module"].str.contains(r"transformer\.h\.0\.attn").any()
    assert (
        bwd["module"].str.contains(r"transformer\.h\.1\.attn").any()
    )  # backward charged to modules
    assert (opt["module"] == "AdamW.step").all()
    # forward allocations come before backward ones, which come before the optimizer's
    assert fwd["alloc_seq"].max() < bwd["alloc_seq"].min()
    assert bwd["alloc_seq"].max() < opt["alloc_seq"].min()


def test_gpt2_breakdown(gpt2_profile) -> None:  # type: ignore[no-untyped-def]
    model, prof = gpt2_profile
    param_bytes = 4 * sum(p.numel() for p in model.parameters())  # tied lm_head counted once
    n_params = len(list(model.parameters()))
    b = prof.peak_breakdown()
    assert sum(b.values()) == prof.peak_bytes
    t = prof.timeline
    assert owned_breakdown(prof, t.peak_index, "GPT2LMHeadModel")["parameter"] == param_bytes
    # just before the optimizer's first allocation every gradient and all the state are live
    phases = prof.allocations.phase[t.alloc_index]
    first_opt = int(np.flatnonzero(phases == PHASES.index("optimizer"))[0])
    before_step = owned_breakdown(prof, first_opt - 1, "GPT2LMHeadModel")
    assert before_step["gradient"] == param_bytes
    assert before_step["optimizer_state"] == 2 * param_bytes + 4 * n_params
    assert before_step["activation"] == 0
    activation_peak = prof.timeline.by_category()[:, jv.CATEGORIES.index("activation")].max()
    assert activation_peak > 0
