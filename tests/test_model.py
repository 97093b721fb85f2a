"""Profile serialization and validation."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import jupyter_vram as jv
from jupyter_vram import Profile
from jupyter_vram._model import Allocations


@pytest.fixture
def recorded() -> Profile:
    model = torch.nn.Linear(32, 16)
    with jv.record() as rec:
        model(torch.randn(4, 32)).sum().backward()
    return rec.profile


@pytest.mark.parametrize("name", ["p.json", "p.json.gz"])
def test_round_trip(recorded: Profile, tmp_path: Path, name: str) -> None:
    path = recorded.save(tmp_path / name)
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"
    loaded = Profile.load(path)
    assert loaded.peak_bytes == recorded.peak_bytes
    assert loaded.peak_breakdown() == recorded.peak_breakdown()
    for column in ("size", "alloc_seq", "free_seq", "module", "stack", "category"):
        assert np.array_equal(
            getattr(loaded.allocations, column), getattr(recorded.allocations, column)
        )
    assert loaded.stacks == recorded.stacks and loaded.frames == recorded.frames
    assert loaded.to_dataframe().equals(recorded.to_dataframe())


def test_newer_schema_is_refused(recorded: Profile, tmp_path: Path) -> None:
    data = recorded.to_dict()
    data["version"] = 99
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="schema version 99"):
        Profile.load(path)


def test_not_a_profile(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not a jupyter_vram profile"):
        Profile.load(tmp_path / "a.json")
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(b"not json"))
    with pytest.raises(ValueError, match="invalid JSON"):
        Profile.load(tmp_path / "b.json.gz")


def test_inconsistent_columns_are_refused() -> None:
    columns = {name: [0] for name in Allocations.__dataclass_fields__}
    columns["size"] = [1, 2]
    with pytest.raises(ValueError, match="different lengths"):
        Allocations.from_columns(columns)
    good = {name: [0] for name in Allocations.__dataclass_fields__}
    good["op"] = [5]
    with pytest.raises(ValueError, match="'op' points outside"):
        Profile(Allocations.from_columns(good), device="cpu", source="t", devices=["cpu"],
                ops=["x"], modules=[""], frames=[], stacks=[])  # fmt: skip


def test_repr(recorded: Profile) -> None:
    assert repr(recorded).startswith("<Profile cpu (allocator): peak ")


def test_top_sites_facade(recorded: Profile) -> None:
    sites = recorded.top_sites(5)
    assert 0 < len(sites) <= 5
    assert list(sites.columns)[:3] == ["site", "op", "live_at_peak_bytes"]


def test_users_hold_the_profile_with_its_conveniences(recorded: Profile, tmp_path: Path) -> None:
    """A recording, a loaded file, a pickled copy and a rebound data profile are all
    ``jv.Profile``; rebinding keeps the object (and so what is keyed by it)."""
    from jupyter_vram._capture.builder import ProfileBuilder
    from jupyter_vram._model import Profile as ProfileData

    assert type(recorded) is jv.Profile and isinstance(recorded, ProfileData)
    assert type(Profile.load(recorded.save(tmp_path / "p.json.gz"))) is jv.Profile
    copy = pickle.loads(pickle.dumps(recorded))
    assert type(copy) is jv.Profile and copy.to_dataframe().equals(recorded.to_dataframe())
    built = ProfileBuilder().build(device="cpu", source="test", wall_ns=0)
    assert type(built) is ProfileData and not hasattr(built, "to_dataframe")
    shown = jv.Profile.of(built)
    assert shown is built and type(shown) is jv.Profile and shown.to_dataframe().empty
    assert jv.Profile.of(shown) is shown
