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
import pytest

from jupyter_vram._app import ProfileApp, holder
from jupyter_vram._app.flame_view import FlameView
from jupyter_vram._app.holder import GONE, KEPT_APPS, ProfileHandle
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
        # newer apps take the kept slots (as the next %%vram cells would), then the user's
        # last reference goes
        newer = [ProfileApp(synthetic_profile(2_000, seed=s)) for s in range(KEPT_APPS)][-1]
        del big
        gc.collect()
        assert ref() is None, gc.get_referrers(ref())
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert built > kept  # the analysis made for the views was freed with the profile
    # + the newer, small apps and their profiles
    assert kept < BUDGET + KEPT_APPS * 2 * 2**20, f"{kept / 2**20:.1f} MiB kept"
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
    """Apps of many runs: each is small, and only the last few profiles survive."""
    refs = []
    apps = []
    runs = KEPT_APPS + 3
    _warm_up()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seed in range(runs):
            prof: Profile | None = synthetic_profile(100_000, seed=seed)
            assert prof is not None
            refs.append(weakref.ref(prof))
            apps.append(ProfileApp(prof))
            prof = None
            gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    alive = [r() for r in refs]
    assert [p is None for p in alive] == [True] * 3 + [False] * KEPT_APPS  # the latest stay
    # what the kept profiles hold (their columns and the analyses the apps made of them)
    # is theirs; the apps beyond that stay under the budget each
    held = sum(
        getattr(p.allocations, f).nbytes
        for p in alive
        if p is not None
        for f in p.allocations.__dataclass_fields__
    )
    print(f"kept {kept / 2**20:.1f} MiB, columns {held / 2**20:.1f} MiB")
    assert kept - held < runs * BUDGET, f"{(kept - held) / 2**20:.1f} MiB"


def test_the_last_few_apps_keep_their_profiles_within_a_byte_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The apps of the last cells stay interactive (a leak two cells back can be released),
    but not without bound: at most KEPT_APPS, and a large profile only while it is the newest
    or fits the byte budget with the newer ones."""
    profiles = [synthetic_profile(2_000, seed=s) for s in range(KEPT_APPS + 2)]
    refs = [weakref.ref(p) for p in profiles]
    for p in profiles:
        ProfileHandle(p)
    del profiles, p
    gc.collect()
    assert [r() is not None for r in refs] == [False] * 2 + [True] * KEPT_APPS
    # a profile whose columns (8 x 5 + 4 x 4 + 1 x 2 = 58 bytes an allocation) pass the
    # budget is kept while it is the newest, and dropped with every older one by the next
    monkeypatch.setattr(holder, "KEPT_BYTES", 100_000)
    big = synthetic_profile(100_000 // 58 + 1, seed=1)
    big_ref = weakref.ref(big)
    ProfileHandle(big)
    del big
    gc.collect()
    assert big_ref() is not None and all(r() is None for r in refs)
    small = synthetic_profile(2_000, seed=2)
    ProfileHandle(small)
    gc.collect()
    assert big_ref() is None
