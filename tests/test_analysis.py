"""Analysis on a hand-built profile whose answers are known by arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from jupyter_vram._analysis.flame import flame_tree, icicle_layout
from jupyter_vram._analysis.groups import live_at_peak
from jupyter_vram._analysis.tables import allocations_frame, top_sites
from jupyter_vram._capture.builder import ProfileBuilder
from jupyter_vram._model import CATEGORY_INDEX, PHASE_INDEX, Frame, Profile
from jupyter_vram._render.text import summary
from jupyter_vram._units import format_bytes

P, G, A, T = (CATEGORY_INDEX[c] for c in ("parameter", "gradient", "activation", "temporary"))
FWD, BWD = PHASE_INDEX["forward"], PHASE_INDEX["backward"]


@pytest.fixture
def profile() -> Profile:
    """baseline: weight 1000 B. Then (seq): 0 alloc act 300 (net.fc1, forward),
    1 alloc tmp 50 (net.fc1), 2 free tmp, 3 alloc grad 1000 (net.fc1, backward),
    4 alloc tmp 200 (net.fc2, backward), 5 free act, 6 free tmp 200. Peak after seq 4: 2550."""
    b = ProfileBuilder()
    fc1, fc2 = b.modules("net.fc1"), b.modules("net.fc2")
    mm, relu = b.ops("mm"), b.ops("relu")
    s1 = b.intern_stack((Frame("/u/train.py", 10, "<module>"), Frame("/u/model.py", 5, "forward")))
    s2 = b.intern_stack((Frame("/u/train.py", 11, "<module>"),))
    dev = b.devices("cpu")
    b.add(1000, -1, 0, dev, b.ops("(before recording)"), fc1, -1, 0, P)
    act = b.add(300, 0, 10, dev, relu, fc1, s1, FWD, A)
    tmp = b.add(50, 1, 20, dev, mm, fc1, s1, FWD, T)
    b.free(tmp, 2, 30)
    b.add(1000, 3, 40, dev, mm, fc1, s2, BWD, G)
    tmp2 = b.add(200, 4, 50, dev, mm, fc2, s2, BWD, T)
    b.free(act, 5, 60)
    b.free(tmp2, 6, 70)
    # an allocation on another device never counts towards the cpu peak
    b.add(10**9, 7, 80, b.devices("meta"), mm, fc2, s2, FWD, T)
    return b.build(device="cpu", source="test", wall_ns=100)


def test_peak_and_breakdown(profile: Profile) -> None:
    assert profile.peak_bytes == 1000 + 300 + 1000 + 200
    assert profile.peak_breakdown() == {
        "parameter": 1000, "frozen_parameter": 0, "quant_state": 0, "buffer": 0,
        "gradient": 1000, "optimizer_state": 0, "input": 0, "activation": 300, "kv_cache": 0,
        "temporary": 200, "other": 0,
    }  # fmt: skip
    t = profile.timeline
    assert t.baseline_bytes == 1000
    assert list(t.total) == [1300, 1350, 1300, 2300, 2500, 2200, 2000]
    assert t.seq_at(t.peak_index) == 4
    assert profile.event_count == 8  # the meta allocation is an event, just not a cpu one


def test_categories_over_time_sum_to_total(profile: Profile) -> None:
    by_cat = profile.timeline.by_category()
    assert (by_cat.sum(axis=1) == profile.timeline.total).all()
    assert list(by_cat[:, A]) == [300, 300, 300, 300, 300, 0, 0]


def test_index_at_time(profile: Profile) -> None:
    t = profile.timeline
    assert t.index_at_time(5) == -1
    assert t.index_at_time(45) == 3
    assert t.breakdown_at(t.index_at_time(35))["temporary"] == 0


def test_live_at_peak_groups(profile: Profile) -> None:
    by_module = {g.label: g.bytes for g in live_at_peak(profile, "module")}
    assert by_module == {"net.fc1": 2300, "net.fc2": 200}
    by_op = {g.label: (g.bytes, g.count) for g in live_at_peak(profile, "op")}
    assert by_op == {"mm": (1200, 2), "(before recording)": (1000, 1), "relu": (300, 1)}
    site = {g.label: g.bytes for g in live_at_peak(profile, "site")}
    assert site == {"<module> (train.py:11)": 1200, "forward (model.py:5)": 300,
                    "(alive before the run)": 1000}  # fmt: skip


def test_flame_tree_module_peak(profile: Profile) -> None:
    root = flame_tree(profile, "module", "peak")
    assert root.bytes == profile.peak_bytes
    fc1 = root.find(["net", "fc1"])
    assert fc1 is not None and fc1.bytes == 1300
    assert fc1.by_category[A] == 300 and fc1.by_category[P] == 1000
    bwd = root.find(["[backward]", "net"])
    assert bwd is not None and bwd.bytes == 1200
    assert [c.name for c in bwd.sorted_children()] == ["fc1", "fc2"]
    assert sum(c.bytes for c in root.children.values()) == root.bytes


def test_icicle_layout_places_children_side_by_side_inside_their_parent() -> None:
    # root 200 -> a 120 (-> a1 80, a2 40), b 50 (-> b1 50); the root's 30 own bytes are a gap
    parents = [-1, 0, 1, 1, 0, 4]
    layout = icicle_layout(parents, [200, 120, 80, 40, 50, 50])
    assert layout.depth == [0, 1, 2, 2, 1, 2]
    assert layout.width == pytest.approx([1, 0.6, 0.4, 0.2, 0.25, 0.25])
    # a at the left; a2 right of a1; b right of a (0.6); b1 under b
    assert layout.x == pytest.approx([0, 0, 0, 0.4, 0.6, 0.6])
    empty = icicle_layout([-1, 0], [0, 0])  # nothing live: the root still spans the width
    assert (empty.x, empty.width, empty.depth) == ([0, 0], [1, 0], [0, 1])


def test_flame_tree_stack_cumulative(profile: Profile) -> None:
    root = flame_tree(profile, "stack", "cumulative")
    assert root.bytes == 300 + 50 + 1000 + 200  # allocations made during the run, on cpu
    train11 = root.find(["<module> (train.py:11)"])
    assert train11 is not None and train11.bytes == 1200 and train11.count == 2
    fwd = root.find(["<module> (train.py:10)", "forward (model.py:5)", "mm"])
    assert fwd is not None and fwd.bytes == 50


def test_top_sites(profile: Profile) -> None:
    sites = top_sites(profile)
    first = sites.iloc[0]
    assert (first["site"], first["op"]) == ("<module> (train.py:11)", "mm")
    assert first["live_at_peak_bytes"] == 1200 and first["allocated_bytes"] == 1200
    assert first["allocations"] == 2 and first["largest_bytes"] == 1000
    assert first["category"] == "gradient"
    assert sites["live_at_peak_bytes"].sum() == profile.peak_bytes - 1000
    cumulative = top_sites(profile, by="allocated")
    assert list(cumulative["allocated_bytes"]) == sorted(
        cumulative["allocated_bytes"], reverse=True
    )


@pytest.mark.parametrize("first_seen", ["late stack first", "early stack first"])
def test_sites_with_the_same_bytes_come_in_the_order_of_their_op_names(first_seen: str) -> None:
    """Four sites of 64 B each (ops "mm", "clone", "addmm", "_softmax", all live at the peak)
    and one of 64 B freed before it: the tied ones list by op name whatever order their stacks
    were first seen in (a sampled line changes that order from run to run), after the
    larger site and before the freed one."""
    b = ProfileBuilder()
    lines = (1, 2, 3, 4) if first_seen == "early stack first" else (4, 3, 2, 1)
    at = {line: b.intern_stack((Frame("/u/m.py", line, "forward"),)) for line in lines}
    dev, net = b.devices("cpu"), b.modules("net")
    gone = b.add(64, 0, 0, dev, b.ops("bmm"), net, at[1], FWD, T)
    b.free(gone, 1, 1)
    big = b.add(128, 2, 2, dev, b.ops("ones"), net, at[4], FWD, A)
    for seq, (op, line) in enumerate((("mm", 1), ("clone", 2), ("addmm", 3), ("_softmax", 4)), 3):
        b.add(64, seq, seq, dev, b.ops(op), net, at[line], FWD, A)
    b.add(1, 7, 7, dev, b.ops("zeros"), net, at[2], FWD, A)  # the peak: after the free
    prof = b.build(device="cpu", source="test", wall_ns=10)
    assert big == 1 and prof.peak_bytes == 128 + 4 * 64 + 1
    sites = top_sites(prof)
    assert list(zip(sites["op"], sites["site"], strict=True)) == [
        ("ones", "forward (m.py:4)"),
        ("_softmax", "forward (m.py:4)"),
        ("addmm", "forward (m.py:3)"),
        ("clone", "forward (m.py:2)"),
        ("mm", "forward (m.py:1)"),
        ("zeros", "forward (m.py:2)"),
        ("bmm", "forward (m.py:1)"),
    ]


def test_a_site_is_named_by_the_category_of_its_bytes_at_the_peak() -> None:
    """One site (same stack and op) makes two 4000 B temporaries, then a 100 B tensor that
    becomes a gradient; the peak (seq 5: 100 + 5000) holds only the gradient of it: its row
    says gradient, although temporaries are 8,000 of its 8,100 allocated bytes. A site with
    nothing live at the peak keeps the category of most of its allocated bytes."""
    b = ProfileBuilder()
    fc = b.modules("net.fc")
    zeros, ones = b.ops("zeros"), b.ops("ones")
    here = b.intern_stack((Frame("/u/train.py", 3, "<module>"),))
    there = b.intern_stack((Frame("/u/train.py", 7, "<module>"),))
    dev = b.devices("cpu")
    for seq in (0, 2):
        row = b.add(4000, seq, seq, dev, zeros, fc, here, FWD, T)
        b.free(row, seq + 1, seq + 1)
    b.add(100, 4, 4, dev, zeros, fc, here, BWD, G)
    late = b.add(5000, 5, 5, dev, ones, fc, there, BWD, T)
    b.free(late, 6, 6)
    act = b.add(300, 7, 7, dev, ones, fc, here, FWD, A)
    b.free(act, 8, 8)
    prof = b.build(device="cpu", source="test", wall_ns=10)
    assert prof.peak_bytes == 5100
    for by in ("peak", "allocated"):
        rows = {
            (r["site"], r["op"]): (r["live_at_peak_bytes"], r["allocated_bytes"], r["category"])
            for r in top_sites(prof, by=by).to_dict("records")
        }
        assert rows == {
            ("<module> (train.py:3)", "zeros"): (100, 8100, "gradient"),
            ("<module> (train.py:7)", "ones"): (5000, 5000, "temporary"),
            ("<module> (train.py:3)", "ones"): (0, 300, "activation"),
        }


def test_dataframe(profile: Profile) -> None:
    df = allocations_frame(profile)
    assert len(df) == len(profile.allocations)
    assert df["bytes"][df["live_at_peak"]].sum() == profile.peak_bytes
    assert set(df.columns) >= {"op", "module", "phase", "category", "bytes", "site", "alloc_ms"}


def test_empty_profile() -> None:
    prof = ProfileBuilder().build(device="cpu", source="test", wall_ns=0)
    assert prof.peak_bytes == 0
    assert sum(prof.peak_breakdown().values()) == 0
    assert flame_tree(prof).bytes == 0
    assert top_sites(prof).empty
    assert "peak 0 B" in summary(prof)


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 2**30) == "3.0 GiB"
    assert format_bytes(-2048) == "-2.0 KiB"


def test_summary_mentions_the_numbers(profile: Profile) -> None:
    text = summary(profile)
    assert "peak 2.4 KiB" in text and "backward phase" in text
    assert "gradient" in text and "net.fc1" in text


def test_summary_keeps_sites_aligned_after_a_long_op_name() -> None:
    """A 26-letter op name (``_log_softmax_backward_data``) pushes every site of the list to
    the same column, one space after it."""
    b = ProfileBuilder()
    dev, net = b.devices("cpu"), b.modules("net")
    here = b.intern_stack((Frame("/u/train.py", 3, "<module>"),))
    for seq, op in enumerate(("_log_softmax_backward_data", "mm")):
        b.add(100 - seq, seq, seq, dev, b.ops(op), net, here, BWD, T)
    lines = summary(b.build(device="cpu", source="test", wall_ns=10)).splitlines()
    start = lines.index("top allocation sites (live at the peak):")
    rows = lines[start + 1 : start + 3]
    assert [row.index("<module>") for row in rows] == [2 + 12 + 2 + 26 + 1] * 2, rows


def test_timeline_is_sorted_by_sequence(profile: Profile) -> None:
    assert np.all(np.diff(profile.timeline.seq) > 0)
