"""CSV export from the app: the top sites (in the order the dropdown asks), the what-ifs and
the leaks each carry a download link whose CSV is the table's own numbers, exact."""

from __future__ import annotations

import csv
import io
import re
import urllib.parse

import pandas as pd
import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._app import ProfileApp
from jupyter_vram._app.estimate_view import EstimateView
from jupyter_vram._app.export import csv_link_html
from jupyter_vram._estimator import estimate


def download(link_html: str, filename: str) -> list[dict[str, str]]:
    found = re.search(
        rf"download='{re.escape(filename)}' href='data:text/csv;charset=utf-8,([^']*)'",
        link_html,
    )
    assert found is not None, link_html
    return list(csv.DictReader(io.StringIO(urllib.parse.unquote(found.group(1)))))


def test_a_link_holds_the_frame_as_csv() -> None:
    frame = pd.DataFrame({"site": ["a, 'b'", "c\nd"], "bytes": [2**40 + 1, 0]})
    rows = download(csv_link_html(frame, "t.csv"), "t.csv")
    assert rows == [{"site": "a, 'b'", "bytes": "1099511627777"}, {"site": "c\nd", "bytes": "0"}]
    assert csv_link_html(frame.iloc[:0], "t.csv") == ""


def test_top_sites_export_follows_the_sort() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(128, 256)
    x = torch.randn(32, 128)
    with jv.record() as rec:
        h = lin(x).relu()
        (h * 2).sum().backward()
    profile = rec.profile
    view = ProfileApp(profile).open_tab(3)
    row, _, _ = view.children
    sort, export = row.children
    rows = download(export.value, "top_sites.csv")
    expected = profile.top_sites(200)
    assert [r["op"] for r in rows] == list(expected["op"])
    assert [int(r["live_at_peak_bytes"]) for r in rows] == list(expected["live_at_peak_bytes"])
    assert int(rows[0]["live_at_peak_bytes"]) == max(int(r["live_at_peak_bytes"]) for r in rows)
    sort.value = "allocated"
    rows = download(export.value, "top_sites.csv")
    allocated = [int(r["allocated_bytes"]) for r in rows]
    assert allocated == sorted(allocated, reverse=True)
    assert allocated == list(profile.top_sites(200, by="allocated")["allocated_bytes"])


@pytest.mark.slow
def test_what_ifs_export_the_computed_table() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(64, 512), nn.ReLU()), nn.Linear(512, 10))
    est = estimate(model, "32x64")
    view = EstimateView(est, gpus=["T4"])
    assert view.what_if_export.value == ""  # nothing computed yet
    view.what_if_button.click()
    frame = view.what_if_frame
    assert frame is not None
    rows = download(view.what_if_export.value, "what_ifs.csv")
    assert [r["what_if"] for r in rows] == list(frame["what_if"])
    expected = ["" if pd.isna(v) else str(int(v)) for v in frame["peak_bytes"]]
    assert [r["peak_bytes"] for r in rows] == expected
    assert expected[0] == str(est.peak_bytes)  # "as estimated", to the byte
    fits = view.what_if_fits
    assert fits is not None
    assert [r["fits on T4"] for r in rows] == ["" if f is None else str(f) for f in fits]
