"""Displayed apps keep what their views show, not their Profile: ipywidgets keeps every
displayed widget for the life of the kernel, so an app holding its profile would keep every
profile ever shown (~100 MB for a 700k-allocation cell)."""

from __future__ import annotations

import gc
import sys
import tracemalloc
import weakref
from pathlib import Path

import ipywidgets as w

from jupyter_vram._app import ProfileApp
from jupyter_vram._app.flame_view import FlameView
from jupyter_vram._app.holder import GONE
from jupyter_vram._app.timeline_view import TimelineView
from jupyter_vram._model import Profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from synthetic import synthetic_profile

BUDGET = 5 * 2**20  # bytes an app may keep, whatever its profile's size


def _use_every_view(app: ProfileApp) -> None:
    """Open every tab and use what keeps state: zoom, switch trees, pick a moment, re-sort."""
    for i in range(len(app.tabs.children)):
        app.open_tab(i)
    flame = app.tabs.children[0]
    assert isinstance(flame, FlameView)
    flame.zoom(tuple(flame.source.data["path"][1].split("\x1f")))
    flame.hierarchy.value = "Python stack"
    flame.mode.value = "cumulative allocated"
    timeline = app.tabs.children[2]
    assert isinstance(timeline, TimelineView)
    timeline.pick(len(timeline.source.data["x"]) // 2)
    sites = app.tabs.children[3]
    bar = sites.children[0]  # the sort dropdown beside the CSV export link
    sort = bar.children[0] if isinstance(bar, w.HBox) else bar
    assert isinstance(sort, w.Dropdown)
    sort.value = "allocations"


def _warm_up() -> None:
    """One-time costs (imports, interned names, caches of the libraries) are not an app's."""
    warm = synthetic_profile(20_000, seed=7)
    _use_every_view(ProfileApp(warm))
    ProfileApp(synthetic_profile(2_000, seed=8))
    gc.collect()


def test_a_displayed_app_keeps_its_views_not_its_profile() -> None:
    """Measured in a fresh process: tracemalloc counts every allocation of the process, and
    what earlier tests in a shared one leave running (shells, threads, caches) would count."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    code = "import tests.test_app_memory as t; t.measure_one_app()"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def measure_one_app() -> None:
    _warm_up()
    big = synthetic_profile(400_000)
    assert big.timeline.peak_bytes > 0  # the replay belongs to the profile: made before
    ref = weakref.ref(big)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        app = ProfileApp(big)
        _use_every_view(app)
        assert app.profile is big
        built = tracemalloc.get_traced_memory()[0] - before
        # a newer app takes the latest-profile slot (as the next %%vram would), then the
        # user's last reference goes
        newer = ProfileApp(synthetic_profile(2_000))
        del big
        gc.collect()
        assert ref() is None, gc.get_referrers(ref())
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert built > kept  # the analysis made for the views was freed with the profile
    assert kept < BUDGET + 2 * 2**20, f"{kept / 2**20:.1f} MiB kept"  # + the newer, small app
    # the old app still shows what it showed, and says why it cannot show more
    assert app.profile is None
    assert isinstance(app.tabs.children[0], FlameView)
    app.tabs.children[0].reset.click()
    assert GONE in app.tabs.children[0].crumbs.value
    app.tabs.children[2].pick(0)
    assert GONE in app.tabs.children[2].moment.value
    assert "peak allocated" in app.header.value
    assert newer.profile is not None


def test_each_app_alone_stays_under_the_budget() -> None:
    """Apps of 30 runs: each is small, and only the latest profile survives."""
    refs = []
    apps = []
    _warm_up()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seed in range(4):
            prof: Profile | None = synthetic_profile(100_000, seed=seed)
            assert prof is not None
            refs.append(weakref.ref(prof))
            apps.append(ProfileApp(prof))
            prof = None
            gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert [r() is None for r in refs] == [True, True, True, False]  # the latest stays
    latest = refs[-1]()
    assert latest is not None
    profile_bytes = sum(
        getattr(latest.allocations, f).nbytes for f in latest.allocations.__dataclass_fields__
    )
    assert kept - profile_bytes < 4 * BUDGET, f"{(kept - profile_bytes) / 2**20:.1f} MiB"
