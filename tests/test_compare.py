"""Profile.compare and verdict on hand-built profiles whose answers are known by arithmetic."""

from __future__ import annotations

import math

import pytest

from jupyter_vram import Profile, verdict
from jupyter_vram._analysis.compare import activation_bytes_by_module, like_for_like
from jupyter_vram._capture.builder import ProfileBuilder
from jupyter_vram._model import CATEGORY_INDEX, PHASE_INDEX
from jupyter_vram._rerun import Variant

P, G, A, T, INPUT = (
    CATEGORY_INDEX[c] for c in ("parameter", "gradient", "activation", "temporary", "input")
)
FWD, BWD = PHASE_INDEX["forward"], PHASE_INDEX["backward"]


def run(activations: list[int], *, wall_ns: int, inputs: int = 64, grad_before: int = 0) -> Profile:
    """A weight of 1000 B (held before), an input, then one activation per block
    ``net.h.<i>`` (all live together), a 100 B temporary in ``net.h.0.mlp`` while they live,
    a 1000 B gradient in backward, then every activation freed."""
    b = ProfileBuilder()
    dev = b.devices("cpu")
    before = b.ops("(before recording)")
    mm, relu, add = b.ops("mm"), b.ops("relu"), b.ops("add")
    net = b.modules("net")
    b.add(1000, -1, 0, dev, before, net, -1, 0, P)
    if grad_before:
        b.add(grad_before, -1, 0, dev, before, net, -1, 0, G)
    seq = 0
    b.add(inputs, seq, seq, dev, add, net, -1, FWD, INPUT)
    handles = []
    for i, size in enumerate(activations):
        seq += 1
        handles.append(b.add(size, seq, seq, dev, relu, b.modules(f"net.h.{i}"), -1, FWD, A))
    seq += 1
    tmp = b.add(100, seq, seq, dev, mm, b.modules("net.h.0.mlp"), -1, FWD, T)
    seq += 1
    b.free(tmp, seq, seq)
    seq += 1
    b.add(1000, seq, seq, dev, mm, net, -1, BWD, G)
    for h in handles:
        seq += 1
        b.free(h, seq, seq)
    return Profile.of(b.build(device="cpu", source="test", wall_ns=wall_ns))


def test_by_category_holds_each_categorys_maximum_and_the_peak() -> None:
    base = run([400, 400, 400], wall_ns=1000)
    var = run([400], wall_ns=1500)
    frame = base.compare(var)
    assert list(frame.index) == [*CATEGORY_INDEX, "peak"]
    assert list(frame.columns) == ["baseline_bytes", "variant_bytes", "change_bytes", "change_pct"]
    act = frame.loc["activation"]
    assert (act["baseline_bytes"], act["variant_bytes"]) == (1200, 400)
    assert act["change_bytes"] == -800
    assert act["change_pct"] == pytest.approx(-800 / 1200 * 100)
    # peak: weight + input + activations + (the gradient after the temporary is gone)
    assert frame.loc["peak", "baseline_bytes"] == 1000 + 64 + 1200 + 1000
    assert frame.loc["peak", "variant_bytes"] == 1000 + 64 + 400 + 1000
    assert frame.loc["temporary", "change_bytes"] == 0
    assert math.isnan(frame.loc["buffer", "change_pct"])  # nothing to compare against
    assert frame.attrs["baseline_wall_ns"] == 1000 and frame.attrs["variant_wall_ns"] == 1500


def test_by_module_lists_the_movers_largest_change_first() -> None:
    base = run([100, 900, 300], wall_ns=1)
    var = run([100, 200, 250], wall_ns=1)
    frame = base.compare(var, by="module")
    assert list(frame.index) == ["net.h.1", "net.h.2"]  # h.0 and the rest did not move
    assert list(frame["change_bytes"]) == [-700, -50]
    ops = base.compare(var, by="op")
    # relu held all activations at once: 1300 -> 550
    assert ops.loc["relu", "baseline_bytes"] == 1300 and ops.loc["relu", "variant_bytes"] == 550
    with pytest.raises(ValueError, match="category"):
        base.compare(var, by="site")  # type: ignore[arg-type]


def test_activation_bytes_by_module_counts_submodules_into_their_parents() -> None:
    prof = run([100, 900], wall_ns=1)
    by_module = activation_bytes_by_module(prof)
    assert by_module["net.h.0"] == 100 and by_module["net.h.1"] == 900
    assert by_module["net"] == 1000 and by_module["net.h"] == 1000
    assert "net.h.0.mlp" not in by_module  # it held a temporary, not an activation


def test_verdict_in_words() -> None:
    base = run([1024**2] * 4, wall_ns=1000)
    var = run([1024**2], wall_ns=1270)
    var.meta["variant"] = Variant(
        "bf16", ("net.h.0", "net.h.1", "net.h.2", "net.h.3"), False, (), "In [3]"
    ).to_dict()
    line = verdict(base, var)
    peak_base = 1000 + 64 + 4 * 1024**2 + 1000
    peak_var = 1000 + 64 + 1024**2 + 1000
    pct = round(100 * (peak_var - peak_base) / peak_base)
    assert line == (
        f"checkpointing 4 blocks + bf16 autocast: activations 4.0 MiB -> 1.0 MiB, "
        f"peak 4.0 MiB -> 1.0 MiB ({pct:+d} %), time +27 %"
    )


def test_like_for_like_says_when_inputs_or_the_starting_state_differ() -> None:
    base = run([100], wall_ns=1)
    assert like_for_like(base, run([50], wall_ns=1)) == []
    notes = like_for_like(base, run([100], wall_ns=1, inputs=128, grad_before=1000))
    assert notes[0].startswith("inputs differ (64 B -> 128 B)")
    assert notes[1] == (
        "gradient held before the cell differs (0 B before the first run, 1000 B before the rerun)"
    )
    assert "inputs differ" in verdict(base, run([100], wall_ns=1, inputs=128))


def test_variant_is_saved_with_the_profile(tmp_path: object) -> None:
    from pathlib import Path

    prof = run([100], wall_ns=1)
    assert prof.variant is None
    variant = Variant("fp16", ("net.h.0",), True, ("state copy: 1.0 MiB",), "In [7]")
    prof.meta["variant"] = variant.to_dict()
    loaded = Profile.load(prof.save(Path(str(tmp_path)) / "p.json.gz"))
    assert loaded.variant == variant
