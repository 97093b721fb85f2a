"""The saved profile (compact JSON) and the static HTML report, on a hand-built profile whose
numbers are known by arithmetic."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any

import pytest

from jupyter_vram._capture.builder import ProfileBuilder
from jupyter_vram._model import CATEGORIES, CATEGORY_INDEX, PHASE_INDEX, Frame, Profile
from jupyter_vram._render.figures import CRUMB_SEP
from jupyter_vram._render.mime import PROFILE_MIME, flame_payload, profile_payload
from jupyter_vram._render.static_report import report_html, static_report_html

if TYPE_CHECKING:
    from jupyter_vram._estimator.api import Estimate

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


def test_flame_saves_its_layout_in_millionths_of_the_peak(profile: Profile) -> None:
    f = profile_payload(profile)["flame"]
    # all, net span 10505 B; encoder 9000 (then its 6000 and 3000); decoder 1505 (mm 1500)
    assert f["depth"] == [0, 1, 2, 3, 3, 2, 3]
    assert f["x"] == [0, 0, 0, 0, 571157, 856735, 856735]  # relu at 6000/10505, decoder 9000
    assert f["width"] == [10**6, 10**6, 856735, 571157, 285578, 143265, 142789]


def test_flame_svg_of_a_profile_saved_without_the_layout_lays_it_out(profile: Profile) -> None:
    from jupyter_vram._render.svg_flame import flame_svg

    d = profile_payload(profile)
    old = {k: v for k, v in d["flame"].items() if k not in ("x", "width", "depth")}
    svgs = [flame_svg(f, d["categories"], d["colors"], d["peak_bytes"]) for f in (d["flame"], old)]
    saved, computed = (flame_blocks(svg) for svg in svgs)
    assert [b["title"] for b in saved] == [b["title"] for b in computed]
    for a, b in zip(saved, computed, strict=True):  # the same but for the last of 3 decimals
        assert a["y"] == b["y"]
        assert percent(a["x"]) == pytest.approx(percent(b["x"]), abs=1.1e-5)
        assert percent(a["width"]) == pytest.approx(percent(b["width"]), abs=1.1e-5)
    relu = computed[4]
    assert relu["title"].startswith(CRUMB_SEP.join(("all", "net", "encoder", "relu")))
    assert percent(relu["x"]) == pytest.approx(6000 / 10505, abs=1e-5)


def test_flame_node_cap_keeps_the_largest_and_a_tree(profile: Profile) -> None:
    from jupyter_vram._analysis.flame import flame_tree

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


# -- the static report ----------------------------------------------------------------------


class Blocks(HTMLParser):
    """The flame SVG's blocks: (x %, width %, title) of each nested <svg class='jvs-block'>."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[dict[str, Any]] = []
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg" and a.get("class") == "jvs-block":
            self.blocks.append({"x": a["x"], "y": a["y"], "width": a["width"], "title": ""})
        self._in_title = tag == "title" and bool(self.blocks)

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title and not self.blocks[-1]["title"]:
            self.blocks[-1]["title"] = data


def flame_blocks(page: str) -> list[dict[str, Any]]:
    start = page.index("<svg class='jvs-flame'")
    parser = Blocks()
    parser.feed(page[start:])
    return parser.blocks


def percent(value: str) -> float:
    assert value.endswith("%"), value
    return float(value[:-1]) / 100


def test_report_has_no_javascript(profile: Profile) -> None:
    page = static_report_html(profile)
    low = page.lower()
    assert "<script" not in low and "javascript:" not in low
    assert not re.search(r"\son[a-z]+\s*=", low)  # no event handler attributes


def test_flame_svg_widths_are_bytes_and_titles_name_the_path(profile: Profile) -> None:
    blocks = flame_blocks(static_report_html(profile))
    # 0.3 % of 10505 B is 31.5 B: the 5-byte net.decoder.tiny is not drawn
    paths = [
        ("all",), ("all", "net"), ("all", "net", "encoder"),
        ("all", "net", "encoder", "(before recording)"), ("all", "net", "encoder", "relu"),
        ("all", "net", "decoder"), ("all", "net", "decoder", "mm"),
    ]  # fmt: skip
    assert [b["title"].split("\n")[0] for b in blocks] == [CRUMB_SEP.join(p) for p in paths]
    by_title = {tuple(b["title"].split("\n")[0].split(CRUMB_SEP)): b for b in blocks}
    root = by_title[("all",)]
    assert percent(root["width"]) == 1.0 and root["y"] == "0"
    encoder = by_title[("all", "net", "encoder")]
    assert percent(encoder["width"]) == pytest.approx(9000 / 10505, abs=1e-5)
    assert "8.8 KiB (9,000 B)" in encoder["title"] and "85.7% of the peak" in encoder["title"]
    assert "parameter 67% · activation 33%" in encoder["title"]
    decoder = by_title[("all", "net", "decoder")]
    assert percent(decoder["x"]) == pytest.approx(9000 / 10505, abs=1e-5)  # right of encoder
    assert percent(decoder["width"]) == pytest.approx(1505 / 10505, abs=1e-5)
    relu = by_title[("all", "net", "encoder", "relu")]
    assert percent(relu["x"]) == pytest.approx(6000 / 10505, abs=1e-5)
    assert {b["y"] for b in blocks} == {"0", "20", "40", "60"}  # four levels, 20 px each


def test_flame_svg_draws_at_most_its_cap_of_the_largest_blocks(profile: Profile) -> None:
    from jupyter_vram._render.svg_flame import flame_svg

    d = profile_payload(profile)
    svg = flame_svg(d["flame"], d["categories"], d["colors"], d["peak_bytes"], max_blocks=3)
    blocks = flame_blocks(svg)
    assert [b["title"].split("\n")[0] for b in blocks] == [
        CRUMB_SEP.join(p) for p in (("all",), ("all", "net"), ("all", "net", "encoder"))
    ]
    # 7 nodes in the saved tree, 3 drawn, and the 2 the saved profile already dropped
    assert "(6 smaller blocks not drawn)" in svg


def test_report_breakdown_tables_and_header(profile: Profile) -> None:
    page = static_report_html(profile)
    assert "At the peak: 10.3 KiB" in page
    # the category bar: parameter 6000 / 10505 of the width, first
    bar = page[page.index("<svg class='jvs-bar'") :]
    first = re.search(r"<svg class='jvs-part' x='0%' y='0' width='([\d.]+%)'", bar)
    assert first is not None
    assert percent(first.group(1)) == pytest.approx(6000 / 10505, abs=1e-5)
    assert "parameter: 5.9 KiB (6,000 B, 57.1% of the peak)" in bar
    modules = page[page.index("jvs-modules") :]
    assert re.search(r"<td>net\.encoder</td><td class='jvs-num'>8\.8 KiB</td>", modules)
    # sites read file:line first; the whole stack is the tooltip
    assert ">model.py:5 forward</td><td>relu</td><td class='jvs-num'>2.9 KiB</td>" in page
    assert "title='&lt;module&gt; (train.py:10)\nforward (model.py:5)'>" in page
    assert "jupyter_vram · cpu (tensor tracker)" in page
    assert "Estimate" not in page


def test_app_bundle_carries_the_report_and_the_saved_profile(profile: Profile) -> None:
    from jupyter_vram._app import ProfileApp

    bundle = ProfileApp(profile)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("jupyter_vram · cpu")
    assert bundle[PROFILE_MIME] == profile_payload(profile)
    assert bundle["text/html"] == report_html(profile_payload(profile))
    json.dumps(bundle[PROFILE_MIME])  # the display protocol sends it as JSON


def test_bundle_is_bounded_and_not_kept_by_the_app() -> None:
    """A 300k-event profile: both static views well under 150 KB, and displaying the app again
    and again keeps nothing (ipywidgets keeps displayed apps for the kernel's life)."""
    import gc
    import sys
    import tracemalloc
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from synthetic import synthetic_profile

    from jupyter_vram._app import ProfileApp

    big = synthetic_profile(300_000)
    app = ProfileApp(big)
    bundle = app._repr_mimebundle_()
    assert len(bundle["text/html"].encode()) < 150_000
    assert len(json.dumps(bundle[PROFILE_MIME], separators=(",", ":"))) < 150_000
    del bundle
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            app._repr_mimebundle_()
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 200_000, kept


def test_empty_and_baseline_only_profiles() -> None:
    """Nothing recorded, or nothing above what was alive before the cell (and an error)."""
    empty = ProfileBuilder().build(device="cpu", source="dispatch", wall_ns=10)
    d = profile_payload(empty)
    assert d["peak_bytes"] == 0 and d["flame"]["name"] == ["all"] and d["top_sites"] == []
    assert "Nothing was live at the peak." in report_html(d)
    b = ProfileBuilder()
    b.add(100, -1, 0, b.devices("cpu"), b.ops("(before recording)"), b.modules("net"), -1, FWD, P)
    held = b.build(device="cpu", source="dispatch", wall_ns=10, error="RuntimeError: boom")
    d = profile_payload(held)
    assert (d["peak_bytes"], d["peak_phase"], d["peak_x"]) == (100, "baseline", None)
    assert d["timeline"]["total"] == [100]
    page = report_html(d)
    assert "The cell raised RuntimeError: boom" in page
    assert "jvs-timeline" not in page  # one point: no curve to draw


@pytest.fixture(scope="module")
def est() -> Estimate:
    from torch import nn

    from jupyter_vram._estimator.entry import estimate

    return estimate(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)), "8x64")


@pytest.mark.slow  # an estimate runs in a subprocess (~10 s here)
def test_estimate_report_carries_its_summary(est: Estimate) -> None:
    from jupyter_vram._estimator.api import estimate_summary

    d = profile_payload(est.profile, est)
    assert d["kind"] == "estimate" and d["estimate"]["summary"] == estimate_summary(est)
    assert d["timeline"]["axis"] == "event"
    assert d["reserved_bytes"] == est.reserved_bytes
    page = static_report_html(est.profile, est)
    assert "Estimate · simulated on fake tensors, no GPU used" in page
    assert html.escape(estimate_summary(est)) in page
    assert "fits at this batch size" in page
    # the %vram_estimate --gpu output: the app's answer for that GPU heads the report
    from jupyter_vram._app import ProfileApp

    app = ProfileApp(est.profile, estimate=est, gpu="T4")
    bundle = app._repr_mimebundle_()
    assert bundle[PROFILE_MIME]["kind"] == "estimate"
    assert app.gpu_answer and html.escape(app.gpu_answer) in bundle["text/html"]
    assert bundle["text/html"].index(html.escape(app.gpu_answer)) < bundle["text/html"].index(
        "Flame graph"
    )


def test_real_h200_recording_reserved_and_allocated_match_the_gpus_statistics() -> None:
    """A GPT-2 training step recorded on an H200: the saved profile's peak allocated and
    reserved are the allocator's own max_memory_allocated / max_memory_reserved, read on the
    GPU; every timeline step holds no more allocated than reserved."""
    from .test_cuda_h200 import SUMMARY, convert

    truth = SUMMARY["gpt2_step2"]
    prof = convert("gpt2_step2")
    d = profile_payload(prof)
    assert d["peak_bytes"] == truth["max_memory_allocated"]
    assert d["reserved_bytes"] == truth["max_memory_reserved"]
    t = d["timeline"]
    assert len(t["reserved"]) == len(t["x"]) == len(t["total"])
    assert all(r >= a for r, a in zip(t["reserved"], t["total"], strict=True))
    assert max(t["total"]) == truth["max_memory_allocated"]
    assert max(t["reserved"]) <= truth["max_memory_reserved"]
    page = report_html(d)
    assert "peak reserved" in page and len(page.encode()) < 150_000


def test_what_the_recorder_left_out_is_one_line_each_in_every_header() -> None:
    """A profile whose recorder degraded something says so under the header of the app, of
    the static report (saved notebooks) and of the text summary, one line per warning."""
    from jupyter_vram._render.html import header_html
    from jupyter_vram._render.text import summary

    said = ["op names left out for 40% of the allocator's reports", "recorded the first 2 s"]
    b = ProfileBuilder()
    b.add(4096, 0, 0, b.devices("cpu"), b.ops("ones"), b.modules("m"), -1, 1, 0)
    profile = b.build(device="cpu", source="test", wall_ns=10, meta={"warnings": said})
    payload = profile_payload(profile)
    assert payload["warnings"] == said
    for page, tag in (
        (header_html(profile), "jv-warning"),
        (static_report_html(profile), "jvs-warning"),
    ):
        lines = re.findall(rf"<div class=.{tag}.>(.*?)</div>", page)
        assert [html.unescape(x) for x in lines] == said
    assert [x for x in summary(profile).splitlines() if x.startswith("warning: ")] == [
        f"warning: {w}" for w in said
    ]
    quiet = ProfileBuilder()
    quiet.add(4096, 0, 0, quiet.devices("cpu"), quiet.ops("ones"), quiet.modules("m"), -1, 1, 0)
    plain = quiet.build(device="cpu", source="test", wall_ns=10)
    assert not re.findall("class=.jv-warning", header_html(plain))
    assert not re.findall("class=.jvs-warning", static_report_html(plain))


def test_the_timeline_outline_steps_through_each_slice_and_marks_the_peak() -> None:
    """Four slices over 0-4 ms in a 1000 x 100 box: x scales by 250 per ms; a level is
    100 - 95 * bytes / peak (8 -> 81.0, 40 -> 5.0, 20 -> 52.5, 0 -> 100.0), each held from
    its x to the next one's; the peak at 1 ms is the dotted line at 250."""
    from jupyter_vram._render.svg_flame import timeline_svg

    svg = timeline_svg({"x": [0.0, 1.0, 2.5, 4.0], "total": [8, 40, 20, 0]}, 40, 1.0)
    steps = "0.0,81.0 250.0,81.0 250.0,5.0 625.0,5.0 625.0,52.5 1000.0,52.5 1000.0,100.0"
    assert f"points='0,100 {steps} 1000.0,100.0 1000,100'" in svg
    assert "<line x1='250.0' x2='250.0'" in svg
