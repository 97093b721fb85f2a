"""Predicted runs (analysis.fitting) on a hand-built training step whose peaks under each
change are worked out by hand below."""

from __future__ import annotations

import pytest

from jupyter_vram._analysis import fitting
from jupyter_vram._analysis.plan import Candidate, fewest_blocks, frontier
from jupyter_vram._capture.builder import ProfileBuilder
from jupyter_vram._model import CATEGORY_INDEX, PHASE_INDEX, Profile

P, S, G, A, T = (
    CATEGORY_INDEX[c]
    for c in ("parameter", "optimizer_state", "gradient", "activation", "temporary")
)
FWD, BWD, OPT = PHASE_INDEX["forward"], PHASE_INDEX["backward"], PHASE_INDEX["optimizer"]


@pytest.fixture
def step() -> Profile:
    """Before the run: weights 1000 B (net.h.0: 400, net.h.1: 400, net.head: 200) and
    optimizer state 2000. Forward (even seqs): h.0 saves a0=100 then its output a1=200; h.1
    saves b0=300 then b1=400; the head makes logits=500. Backward: gradients 1000 at 10,
    logits freed 12, b1 14, b0 16, a1 18, a0 20. Optimizer: a 600 B temporary 22..24.

    Plain peak at 10: 3000 + 100 + 200 + 300 + 400 + 500 + 1000 = 5500."""
    b = ProfileBuilder()
    h0, h1, head = b.modules("net.h.0"), b.modules("net.h.1"), b.modules("net.head")
    mm, relu, norm = b.ops("mm"), b.ops("relu"), b.ops("native_layer_norm")
    dev = b.devices("cpu")
    for module, size in ((h0, 400), (h1, 400), (head, 200)):
        b.add(size, -1, 0, dev, mm, module, -1, 0, P)
    b.add(2000, -1, 0, dev, mm, head, -1, 0, S)
    a0 = b.add(100, 0, 0, dev, relu, h0, -1, FWD, A)
    a1 = b.add(200, 2, 0, dev, mm, h0, -1, FWD, A)
    b0 = b.add(300, 4, 0, dev, norm, h1, -1, FWD, A)
    b1 = b.add(400, 6, 0, dev, mm, h1, -1, FWD, A)
    logits = b.add(500, 8, 0, dev, mm, head, -1, FWD, A)
    b.add(1000, 10, 0, dev, mm, head, -1, BWD, G)
    for row, seq in ((logits, 12), (b1, 14), (b0, 16), (a1, 18), (a0, 20)):
        b.free(row, seq, seq)
    tmp = b.add(600, 22, 0, dev, mm, head, -1, OPT, T)
    b.free(tmp, 24, 24)
    return b.build(device="cpu", source="test", wall_ns=100)


def test_the_hand_built_step_peaks_where_the_docstring_says(step: Profile) -> None:
    assert step.peak_bytes == 5500


def test_repeated_blocks_and_what_they_save(step: Profile) -> None:
    assert fitting.repeated_blocks(step) == ["net.h.0", "net.h.1"]
    acts = fitting.block_activations(step, ["net.h.0", "net.h.1"])
    assert acts["net.h.0"].inner_bytes == 100 and acts["net.h.0"].output_bytes == 200
    assert acts["net.h.1"].inner_bytes == 300 and acts["net.h.1"].recompute_seq == 16


def test_checkpointing_keeps_block_outputs_and_recomputes_the_rest(step: Profile) -> None:
    # a0 and b0 leave forward: at 10, 5500 - 100 - 300 = 5100; b0 comes back at 15 (after
    # logits and b1 went: 3000 + 1000 + 200 + 300 = 4500), a0 at 19
    both = fitting.checkpointed(step, ["net.h.0", "net.h.1"])
    assert both.peak_bytes == 5100
    only_h1 = fitting.checkpointed(step, ["net.h.1"])
    assert only_h1.peak_bytes == 5200
    assert step.peak_bytes == 5500  # a prediction is a new profile


def test_a_micro_batch_shrinks_what_follows_the_batch(step: Profile) -> None:
    # halves: activations 1500 -> 750; fixed 3000 + gradients 1000: peak 4750 at 10
    assert fitting.micro_batch(step, 2, accumulate=False).peak_bytes == 4750
    # a later micro-batch of an accumulation loop holds the gradients from its start:
    # the same 4750 at 10 (the gradients were counted there already), 3000 + 1000 before
    loop = fitting.micro_batch(step, 2)
    assert loop.peak_bytes == 4750
    assert loop.timeline.baseline_bytes == 4000
    with pytest.raises(ValueError):
        fitting.micro_batch(step, 0)


def test_autocast_halves_what_runs_in_16_bits_and_adds_weight_copies(step: Profile) -> None:
    # forward, in order: a0 (relu on the float32 input) stays 100, a1 (mm) 100, b0 (layer
    # norm) stays 300, b1 (mm) 200, logits (mm) 250. Weight copies (half of each module's
    # weights) from its first forward matmul to the end of backward: h.0 200, h.1 200, head
    # 100. At 10: 3000 + 100+100+300+200+250 + 500 + 1000 = 5450
    assert fitting.autocast(step).peak_bytes == 5450


def test_under_autocast_pointwise_ops_follow_the_output_made_before_them() -> None:
    # linear (16-bit) -> gelu (16-bit, follows) -> layer norm (float32) -> relu (float32,
    # follows): 400 -> 200, 400 -> 200, 400, 400
    b = ProfileBuilder()
    dev, net = b.devices("cpu"), b.modules("net")
    for seq, op in enumerate(("addmm", "gelu", "native_layer_norm", "relu")):
        b.add(400, seq, 0, dev, b.ops(op), net, -1, FWD, A)
    assert fitting.autocast(b.build(device="cpu", source="test", wall_ns=10)).peak_bytes == 1200


def test_under_autocast_a_float32_input_into_a_matmul_gets_a_16_bit_copy() -> None:
    # the input x (400, float32) goes into m1's addmm: a 200 B copy from 0 to m1's last
    # backward allocation (6); m2's layer norm output (400, float32) into m3's addmm: a 200 B
    # copy from 2 to m3's last backward allocation (4). Outputs: addmm 400 -> 200, layer norm
    # stays 400; backward temporaries 100 -> 50. At 4: x 400 + 200 + 400 + 200 + copies 400
    # + 50 = 1650 (without the copies it would be 1250)
    b = ProfileBuilder()
    dev = b.devices("cpu")
    m1, m2, m3 = b.modules("net.m1"), b.modules("net.m2"), b.modules("net.m3")
    addmm, norm = b.ops("addmm"), b.ops("native_layer_norm")
    b.add(400, -1, 0, dev, addmm, m1, -1, 0, CATEGORY_INDEX["input"])
    for seq, op, module in ((0, addmm, m1), (1, norm, m2), (2, addmm, m3)):
        b.add(400, seq, 0, dev, op, module, -1, FWD, A)
    for seq, module in ((4, m3), (6, m1)):
        b.free(b.add(100, seq, 0, dev, addmm, module, -1, BWD, T), seq + 1, seq + 1)
    plain = b.build(device="cpu", source="test", wall_ns=10)
    assert plain.peak_bytes == 1700
    assert fitting.autocast(plain).peak_bytes == 1650


def test_offload_and_paged_state(step: Profile) -> None:
    # saved tensors come back one before backward frees them: at 10, 3000 + 1000 = 4000;
    # at 11 logits come back (4500) and leave at 12; at the end the temporary: 4600
    assert fitting.offloaded(step).peak_bytes == 4600
    # paged state only counts from the optimizer step: 5500 - 2000 = 3500 at 10, and at 22
    # weights, gradients, state and the temporary: 1000 + 1000 + 2000 + 600 = 4600
    paged = fitting.paged_state(step)
    assert paged.peak_bytes == 4600
    assert paged.timeline.total_at(paged.timeline.index_at_seq(10)) == 3500


def test_frozen_weights_with_small_adapters(step: Profile) -> None:
    # no gradients, state or optimizer temporaries; adapters of 10 B: +10 parameter, +20 state,
    # +10 gradient from backward: 1000 + 10 + 20 + 1500 + 10 = 2540
    assert fitting.frozen(step, trainable_bytes=10).peak_bytes == 2540


def test_the_fewest_blocks_that_get_under_a_budget(step: Profile) -> None:
    # h.1 gives up the most (b0, 300): alone it brings the peak to 5200 (see above)
    assert fewest_blocks(step, ["net.h.0", "net.h.1"], 5200) == ("net.h.1",)
    assert fewest_blocks(step, ["net.h.0", "net.h.1"], 5100) == ("net.h.0", "net.h.1")
    assert fewest_blocks(step, ["net.h.0", "net.h.1"], 5099) == ()  # not even all of them


def test_the_frontier_drops_options_that_cost_more_and_save_no_more() -> None:
    def option(name: str, peak: int, cost: float) -> Candidate:
        return Candidate(name, {}, peak, False, cost, cost, "")

    ranked = [option("a", 900, 1.0), option("b", 950, 1.1), option("c", 800, 1.2),
              option("d", 800, 1.3), option("e", 700, 2.0)]  # fmt: skip
    assert [c.name for c in frontier(ranked)] == ["a", "c", "e"]
