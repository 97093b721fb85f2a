"""The ranks together: imbalance in words, peaks side by side, rank selector, two-rank
difference (RanksApp outside a browser), and `%%vram --nproc` in IPython."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._app.profile_app import ProfileApp
from jupyter_vram._app.ranks_view import RanksApp
from jupyter_vram._distributed.summary import imbalance, rank_peaks, ranks_text

from .conftest import ipython_shell

MIB = 1 << 20


def recorded(extra_mib: int, rank: int) -> jv.Profile:
    """A rank that holds 1 MiB, plus ``extra_mib`` MiB made while the 1 MiB is alive; the
    extra allocation is labelled as an all-gather buffer (as the recorder does for FSDP)."""
    with jv.record("cpu", stacks=False) as rec:
        kept = torch.empty(MIB // 4)
        if extra_mib:
            gathered = torch.empty(extra_mib * MIB // 4)
            del gathered
        del kept
    profile = rec.profile
    rows = np.flatnonzero(profile.allocations.size == extra_mib * MIB).tolist()
    kinds = {"all_gather_buffer": rows} if extra_mib else {}
    return profile.replace(meta={**profile.meta, "rank": rank, "world_size": 3, "kinds": kinds})


def test_imbalance_names_the_rank_the_excess_and_where_it_sits() -> None:
    profiles = [recorded(0, 0), recorded(3, 1), recorded(0, 2)]
    peaks = rank_peaks(profiles)
    assert [p.peak_bytes for p in peaks] == [MIB, 4 * MIB, MIB]
    assert peaks[1].roles["all-gather buffers"] == 3 * MIB
    assert imbalance(peaks).startswith("rank 1 peaks 3.0 MiB above the others, in its all-gather")
    balanced = [recorded(0, 0), recorded(0, 1)]
    assert imbalance(rank_peaks(balanced)) == "the 2 ranks peak within 0 B of each other"
    assert ranks_text(profiles).splitlines()[2].startswith("rank 1: peak 4.0 MiB")


def test_ranks_app_selects_a_rank_and_shows_two_ranks_difference() -> None:
    profiles = [recorded(0, 0), recorded(3, 1), recorded(0, 2)]
    app = RanksApp(profiles)
    assert "rank 1 peaks 3.0 MiB above the others" in app.summary.value
    assert [o[0] for o in app.selector.options] == ["rank 0", "rank 1", "rank 2"]
    peaks = app.peaks.value
    assert peaks.count('<div class="jv-rank-peak') == 4  # the box and three ranks
    assert f'data-rank="1" data-peak-bytes="{4 * MIB}"' in peaks
    (shown,) = app.detail.children
    assert isinstance(shown, ProfileApp)
    app.selector.value = 1
    (shown,) = app.detail.children
    assert isinstance(shown, ProfileApp) and "4.0 MiB" in shown.header.value
    # the default comparison: the highest rank against the lowest
    assert (app.diff_a.value, app.diff_b.value) == (1, 0)
    assert "<td>all-gather buffers</td><td class='jv-num'>3.0 MiB</td>" in app.difference.value
    app.diff_a.value = 2
    assert "all-gather" not in app.difference.value


def test_vram_nproc_runs_the_cells_main_on_each_rank() -> None:
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    shell.user_ns.pop("_vram", None)
    cell = (
        "import torch, torch.distributed as dist\n"
        "size = 5000\n"
        "def main():\n"
        "    x = torch.ones(size * (dist.get_rank() + 1))\n"
        "    dist.all_reduce(x[:size])\n"
    )
    shell.run_cell_magic("vram", "--nproc 2 --quiet --no-stacks", cell)
    profiles = shell.user_ns["_vram"]
    assert [p.meta["rank"] for p in profiles] == [0, 1]
    for profile in profiles:
        assert 4 * 5000 * (profile.meta["rank"] + 1) in profile.allocations.size.tolist()


def test_vram_nproc_without_main_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    shell.run_cell_magic("vram", "--nproc 2", "x = 1\n")
    assert "define `def main(): ...`" in capsys.readouterr().err
