"""The saved profile (compact JSON) and the static HTML report, on a hand-built profile whose
numbers are known by arithmetic."""

from __future__ import annotations

import json

import pytest

from jupyter_vram.capture.builder import ProfileBuilder
from jupyter_vram.model import CATEGORIES, CATEGORY_INDEX, PHASE_INDEX, Frame, Profile
from jupyter_vram.render.mime import PROFILE_MIME, flame_payload, profile_payload

P, A, T = (CATEGORY_INDEX[c] for c in ("parameter", "activation", "temporary"))
FWD = PHASE_INDEX["forward"]


@pytest.fixture
def profile() -> Profile:
    """baseline: weight 6000 B (net.encoder). Then (seq): 0 alloc act 3000 (net.encoder relu),
    1 alloc act 1000 (net.decoder mm), 2 alloc tmp 5 (net.decoder.tiny add), 3 alloc tmp 500
    (net.decoder mm), 4 free the 500, 5 free the 3000. Peak after seq 3: 10505 B; end 7005 B."""
    b = ProfileBuilder()
    enc, dec, tiny = (
        b.modules("net.encoder"),
        b.modules("net.decoder"),
        b.modules("net.decoder.tiny"),
    )
    relu, mm, add = b.ops("relu"), b.ops("mm"), b.ops("add")
    s1 = b.intern_stack((Frame("/u/train.py", 10, "<module>"), Frame("/u/model.py", 5, "forward")))
    s2 = b.intern_stack((Frame("/u/train.py", 11, "<module>"), Frame("/u/model.py", 9, "decode")))
    dev = b.devices("cpu")
    b.add(6000, -1, 0, dev, b.ops("(before recording)"), enc, -1, FWD, P)
    act = b.add(3000, 0, 1_000_000, dev, relu, enc, s1, FWD, A)
    b.add(1000, 1, 2_000_000, dev, mm, dec, s2, FWD, A)
    b.add(5, 2, 3_000_000, dev, add, tiny, s2, FWD, T)
    tmp = b.add(500, 3, 4_000_000, dev, mm, dec, s2, FWD, T)
    b.free(tmp, 4, 5_000_000)
    b.free(act, 5, 6_000_000)
    types = {"net": "Net", "net.encoder": "Encoder", "net.decoder": "Decoder"}
    return b.build(device="cpu", source="dispatch", wall_ns=7_000_000, meta={"module_types": types})


def test_payload_header_and_breakdown(profile: Profile) -> None:
    d = profile_payload(profile)
    assert PROFILE_MIME == "application/vnd.jupyter-vram.profile+json"
    assert d["version"] == 1 and d["kind"] == "profile" and d["estimate"] is None
    assert d["peak_bytes"] == 6000 + 3000 + 1000 + 5 + 500
    assert d["baseline_bytes"] == 6000
    assert d["reserved_bytes"] is None  # a tracker has no allocator segments
    assert d["events"] == 6 and d["duration_s"] == pytest.approx(0.007)
    assert d["peak_x"] == pytest.approx(4.0)  # ms: seq 3 at 4,000,000 ns
    assert d["categories"] == list(CATEGORIES)
    expected = dict.fromkeys(CATEGORIES, 0) | {"parameter": 6000, "activation": 4000,
                                              "temporary": 505}  # fmt: skip
    assert d["breakdown"] == [expected[c] for c in CATEGORIES]
    assert ["peak allocated", "10.3 KiB"] in d["facts"]
    assert json.loads(json.dumps(d)) == d  # plain JSON, nothing numpy


def test_flame_is_the_module_tree_live_at_the_peak_pruned_at_a_thousandth(
    profile: Profile,
) -> None:
    f = profile_payload(profile)["flame"]
    assert f["min_bytes"] == 11  # ceil(0.001 * 10505)
    # depth first, largest child first; net.decoder.tiny (5 B) and its op are dropped
    assert f["name"] == ["all", "net", "encoder", "(before recording)", "relu", "decoder", "mm"]
    assert f["parent"] == [-1, 0, 1, 2, 2, 1, 5]
    assert f["bytes"] == [10505, 10505, 9000, 6000, 3000, 1505, 1500]
    assert f["count"] == [5, 5, 2, 1, 1, 3, 2]
    assert f["dropped"] == 2
    assert [CATEGORIES[c] for c in f["category"][2:5]] == ["parameter", "parameter", "activation"]
    assert f["mix"][2] == [[P, 6000], [A, 3000]]
    assert f["mix"][5] == [[A, 1000], [T, 505]]
    assert f["type"] == ["", "Net", "Encoder", "", "", "Decoder", ""]


def test_flame_node_cap_keeps_the_largest_and_a_tree(profile: Profile) -> None:
    from jupyter_vram.analysis.flame import flame_tree

    f = flame_payload(flame_tree(profile, "module", "peak"), 10505, max_nodes=4)
    assert f["name"] == ["all", "net", "encoder", "(before recording)"]
    assert f["dropped"] == 9 - 4  # the tree has 9 nodes
    assert all(p < i for i, p in enumerate(f["parent"]))


def test_timeline_steps_reach_the_peak_and_the_end(profile: Profile) -> None:
    t = profile_payload(profile)["timeline"]
    assert t["axis"] == "time"
    # live after each event: 9000, 10000, 10005, 10505, 10005, 7005
    assert max(t["total"]) == 10505 and t["total"][-1] == 7005
    assert set(t["by_category"]) == {"parameter", "activation", "temporary"}
    for i, total in enumerate(t["total"]):
        assert sum(col[i] for col in t["by_category"].values()) == total
    assert t["x"] == sorted(t["x"]) and t["x"][-1] == pytest.approx(6.0)
    assert "reserved" not in t


def test_top_modules_and_sites(profile: Profile) -> None:
    d = profile_payload(profile)
    assert [(m["name"], m["bytes"], m["count"]) for m in d["top_modules"]] == [
        ("net.encoder", 9000, 2), ("net.decoder", 1500, 2), ("net.decoder.tiny", 5, 1),
    ]  # fmt: skip
    sites = [
        (s["site"], s["op"], s["live_at_peak_bytes"], s["allocations"]) for s in d["top_sites"]
    ]
    assert sites == [
        ("forward (model.py:5)", "relu", 3000, 1),
        ("decode (model.py:9)", "mm", 1500, 2),
        ("decode (model.py:9)", "add", 5, 1),
    ]
    assert d["top_sites"][1]["largest_bytes"] == 1000
    assert d["top_sites"][0]["stack"] == "<module> (train.py:10) > forward (model.py:5)"
