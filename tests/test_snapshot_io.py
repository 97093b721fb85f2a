"""PyTorch allocator snapshots in and out: safe reading, round trips through
``torch.cuda._memory_viz``, devices kept apart, labels recovered from unlabelled snapshots."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.cuda import _memory_viz

import jupyter_vram as jv
from jupyter_vram._model import CATEGORY_INDEX, ProfileFileError
from jupyter_vram._snapshots.file import profile_from_snapshot_source, profiles_from_snapshot

H200 = Path(__file__).parent / "fixtures" / "h200"


def raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        gzip.decompress((H200 / f"{name}.snapshot.json.gz").read_bytes())
    )
    return data


class RunsCode:
    """Unpickling this runs a shell command that creates a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


class WritesFile:
    """Unpickling this calls open(marker, "w") (no shell involved)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("payload", [RunsCode, WritesFile])
def test_a_malicious_pickle_runs_nothing_and_says_why(tmp_path: Path, payload: type) -> None:
    marker = tmp_path / "pwned"
    evil = raw("mlp_step1")["snapshot"]
    evil["device_traces"][0][3]["user_metadata"] = payload(marker)  # hidden inside an entry
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(evil))
    with pytest.raises(ProfileFileError, match="plain data only") as info:
        jv.Profile.from_snapshot(path)
    assert str(path) in str(info.value)
    assert "system" in str(info.value) or "open" in str(info.value)
    assert not marker.exists()
    # the same bytes through plain pickle do run (so the test above can fail)
    pickle.loads(path.read_bytes())
    assert marker.exists()


def test_dump_snapshot_pickle_and_dict_give_the_same_profile(tmp_path: Path) -> None:
    snapshot = raw("gpt2_step1")["snapshot"]
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snapshot))  # what torch.cuda.memory._dump_snapshot writes
    from_file = jv.Profile.from_snapshot(path)
    from_dict = jv.Profile.from_snapshot(snapshot)
    assert from_file.peak_bytes == from_dict.peak_bytes > 0
    assert from_file.peak_breakdown() == from_dict.peak_breakdown()
    gz = tmp_path / "snap.pickle.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert jv.Profile.from_snapshot(gz).peak_bytes == from_file.peak_bytes


@pytest.mark.parametrize(
    "content", [pickle.dumps([1, 2, 3]), pickle.dumps({"a": 1}), b"\x80\x04garbage", b""]
)
def test_what_is_not_a_snapshot_is_one_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.pickle"
    path.write_bytes(content)
    with pytest.raises(ProfileFileError, match="not a memory snapshot"):
        jv.Profile.from_snapshot(path)


def live_blocks_in_flamegraph(lines: str) -> int:
    """Bytes of active blocks in _memory_viz's flame graph input ('stack... bytes' lines)."""
    total = 0
    for line in lines.splitlines():
        stack, _, size = line.rpartition(" ")
        if ";active_allocated;" in stack and not stack.endswith("<gaps>"):
            total += int(size)
    return total


def check_memory_viz_accepts(path: Path, live_end: int) -> None:
    with path.open("rb") as fh:
        data = pickle.load(fh)
    text = _memory_viz.segsum(data)  # asserts allocated + free == reserved per segment
    assert "total_allocated" in text
    assert "TOTAL MEM" in _memory_viz.trace(data)
    lines = _memory_viz.memory(data, format_flamegraph=lambda s: s)
    assert live_blocks_in_flamegraph(lines) == live_end
    html = _memory_viz.trace_plot(data)
    assert "snapshot.pickle" in html and "add_local_files" in html
    assert "snapshot.pickle" in _memory_viz.segment_plot(data)


def test_cuda_profile_round_trip_through_memory_viz(tmp_path: Path) -> None:
    original = jv.Profile.from_snapshot(raw("gpt2_step2"))  # with the recorder's roles
    a = original.allocations
    live_end = int(a.size[a.free_seq < 0].sum())
    path = original.to_snapshot(tmp_path / "out.pickle")
    check_memory_viz_accepts(path, live_end)
    again = jv.Profile.from_snapshot(path)
    assert again.peak_bytes == original.peak_bytes
    assert again.peak_breakdown() == original.peak_breakdown()
    assert len(again.allocations) == len(original.allocations)
    assert sorted(again.ops) == sorted(original.ops)
    df0, df1 = original.to_dataframe(), again.to_dataframe()
    cols = ["op", "module", "phase", "category", "bytes"]
    assert Counter(map(tuple, df0[cols].astype(str).values)) == Counter(
        map(tuple, df1[cols].astype(str).values)
    )
    # reserved memory: segment events and the reserved baseline survive
    assert again.segments.baseline == original.segments.baseline
    assert again.segments.delta.tolist() == original.segments.delta.tolist()


def test_cpu_profile_round_trip(tmp_path: Path) -> None:
    with jv.record("cpu") as rec:
        x = torch.ones(1000)  # 4,000 bytes (not a multiple of 512: sizes must stay exact)
        y = torch.ones(300, 10)  # 12,000 bytes
        z = x.sum() + y.sum()
        del y
    prof = rec.profile
    path = prof.to_snapshot(tmp_path / "cpu.pickle")
    a = prof.allocations
    check_memory_viz_accepts(path, int(a.size[a.free_seq < 0].sum()))
    again = jv.Profile.from_snapshot(path)
    assert again.device == "cpu"
    assert again.peak_bytes == prof.peak_bytes >= 16_000
    assert again.peak_breakdown() == prof.peak_breakdown()
    assert again.segments.seq.size == 0  # a CPU run reserves nothing beyond what it holds
    del x, z


def test_devices_are_kept_apart() -> None:
    one = raw("mlp_step1")["snapshot"]
    two = raw("gpt2_step1")["snapshot"]
    merged = {
        "segments": one["segments"] + [{**s, "device": 1} for s in two["segments"]],
        "device_traces": [one["device_traces"][0], two["device_traces"][0]],
    }
    with pytest.raises(ProfileFileError, match=r"cuda:0, cuda:1"):
        jv.Profile.from_snapshot(merged)
    first = jv.Profile.from_snapshot(merged, device=0)
    second = jv.Profile.from_snapshot(merged, device="cuda:1")
    assert first.peak_bytes == jv.Profile.from_snapshot(one).peak_bytes
    assert second.peak_bytes == jv.Profile.from_snapshot(two).peak_bytes
    assert second.device == "cuda:1"
    assert set(profiles_from_snapshot(merged)) == {"cuda:0", "cuda:1"}
    with pytest.raises(ProfileFileError, match="no cuda:2"):
        jv.Profile.from_snapshot(merged, device=2)


def test_unlabelled_snapshot_categories_agree_with_the_recorders_roles() -> None:
    """A real H200 GPT-2 step dumped without jupyter_vram's labels (no user metadata, no
    markers): phases come from frames and annotations, categories from phase and lifetime.
    The truth is the recorder's own roles (saved-tensor hooks, grads, optimizer state)."""
    data = raw("gpt2_step1")
    truth = jv.Profile.from_snapshot(data)
    snapshot = data["snapshot"]
    trace = [
        {**e, "user_metadata": ""}
        for e in snapshot["device_traces"][0]
        if not str(e.get("user_metadata", "")).startswith("jv-marker")
    ]
    guessed = jv.Profile.from_snapshot({**snapshot, "device_traces": [trace]})
    assert guessed.meta["categories_inferred"]
    made_t, made_g = truth.allocations.alloc_seq >= 0, guessed.allocations.alloc_seq >= 0
    pairs = Counter(
        zip(
            truth.allocations.category[made_t].tolist(),
            guessed.allocations.category[made_g].tolist(),
            strict=True,
        )
    )
    for name in ("gradient", "optimizer_state", "activation"):
        c = CATEGORY_INDEX[name]
        assert sum(n for (t, g), n in pairs.items() if t == c) > 0
        assert all(g == c for (t, g), n in pairs.items() if t == c), (name, pairs)
    agree = sum(n for (t, g), n in pairs.items() if t == g)
    assert agree / sum(pairs.values()) > 0.95
    # phases: optimizer allocations are the ones the recorder labelled optimizer
    phase_t = truth.allocations.phase[made_t].tolist()
    phase_g = guessed.allocations.phase[made_g].tolist()
    assert [p == 3 for p in phase_t] == [p == 3 for p in phase_g]


def unlabelled(snapshot: dict[str, Any]) -> dict[str, Any]:
    trace = [
        {**e, "user_metadata": ""}
        for e in snapshot["device_traces"][0]
        if not str(e.get("user_metadata", "")).startswith("jv-marker")
    ]
    return {**snapshot, "device_traces": [trace]}


@pytest.mark.parametrize("name", sorted(p.name.split(".")[0] for p in H200.glob("*.json.gz")))
def test_column_conversion_matches_the_recorders_converter(name: str) -> None:
    """Snapshots from elsewhere are converted column-wise (for millions of entries); on the
    real H200 snapshots, every row (sizes, alloc/free order and times, stacks, ops) and the
    reserved memory match the recorder's entry-by-entry converter."""
    from jupyter_vram._capture.cuda_convert import profile_from_snapshot
    from jupyter_vram._snapshots.columns import columns_from_trace, profile_from_columns

    snapshot = unlabelled(raw(name)["snapshot"])
    ref = profile_from_snapshot(snapshot)
    new = profile_from_columns(columns_from_trace(snapshot["device_traces"][0]), snapshot, 0)
    for column in ("size", "alloc_seq", "free_seq", "alloc_ns", "free_ns", "stack", "category"):
        assert (
            getattr(new.allocations, column).tolist() == getattr(ref.allocations, column).tolist()
        )
    assert [new.ops[i] for i in new.allocations.op] == [ref.ops[i] for i in ref.allocations.op]
    assert new.frames == ref.frames
    assert new.segments.baseline == ref.segments.baseline
    assert new.segments.delta.tolist() == ref.segments.delta.tolist()
    assert new.peak_bytes == ref.peak_bytes


def big_snapshot_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "big_snapshot", Path(__file__).parent.parent / "bench" / "big_snapshot.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same_profiles(a: jv.Profile, b: jv.Profile) -> None:
    for column in ("size", "alloc_seq", "free_seq", "stack", "op", "phase", "category"):
        assert getattr(a.allocations, column).tolist() == getattr(b.allocations, column).tolist()
    assert a.frames == b.frames and a.ops == b.ops
    assert a.peak_bytes == b.peak_bytes and a.peak_breakdown() == b.peak_breakdown()


@pytest.mark.parametrize("source", ["generated", "gpt2_step2"])
def test_streaming_reader_gives_the_whole_loads_profile(tmp_path: Path, source: str) -> None:
    """The streaming reader (for big pickles) against pickle-then-convert, on a generated
    training run written as pickle.dump writes torch's snapshots, and on a real H200 snapshot
    pickled by pickle.dump itself (frame boundaries inside entries, nothing shared)."""
    path = tmp_path / "snap.pickle"
    if source == "generated":
        counts = big_snapshot_module().generate(path, 1.5, layers=4, seed=1, depth=12)
        assert counts["entries"] > 10_000
    else:
        path.write_bytes(pickle.dumps(unlabelled(raw(source)["snapshot"])))
    streamed = profile_from_snapshot_source(path, stream=True)
    whole = profile_from_snapshot_source(path, stream=False)
    same_profiles(streamed, whole)
    if source == "generated":  # by the generator's construction (4 layers, hidden 1024, fp32)
        weights = 4 * (1024 * 1024 * 4 * 3 + 1024 * 1024 * 4)
        breakdown = streamed.peak_breakdown()
        assert breakdown["gradient"] == weights  # made by the engine, kept
        assert breakdown["optimizer_state"] == 2 * weights  # Adam: two moments
        assert breakdown["other"] == weights  # the weights, alive before the trace


def test_streaming_reader_refuses_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = raw("mlp_step1")["snapshot"]
    evil["device_traces"][0][3]["user_metadata"] = RunsCode(marker)
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(evil))
    with pytest.raises(ProfileFileError, match="plain data only"):
        profile_from_snapshot_source(path, stream=True)
    assert not marker.exists()


@pytest.mark.parametrize("seed", range(40))
def test_column_conversion_matches_the_recorders_converter_on_random_traces(seed: int) -> None:
    """Random allocs, frees (requested, completed, either missing), reuse of a few addresses,
    segment events and OOMs: every row as the recorder's entry-by-entry converter makes it."""
    import random

    from jupyter_vram._capture.cuda_convert import profile_from_snapshot
    from jupyter_vram._snapshots.columns import columns_from_trace, profile_from_columns

    rng = random.Random(seed)
    actions = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"]
    addresses = [rng.randrange(1 << 40) * 512 for _ in range(rng.randint(1, 6))]
    frames = [{"filename": "/x/torch/nn/modules/module.py", "line": 1, "name": "f"}]
    trace, time_us = [], 1000
    for _ in range(rng.randint(1, 80)):
        time_us += rng.randint(0, 3)
        trace.append({
            "action": rng.choices(actions, [5, 3, 3, 0.3, 0.3, 0.1])[0],
            "addr": rng.choice(addresses), "size": rng.randint(1, 5000), "stream": 0,
            "time_us": time_us, "frames": frames if rng.random() < 0.5 else [],
        })  # fmt: skip
    snapshot = {"device_traces": [trace], "segments": []}
    ref = profile_from_snapshot(snapshot)
    new = profile_from_columns(columns_from_trace(trace), snapshot, 0)
    for column in ("size", "alloc_seq", "free_seq", "alloc_ns", "free_ns", "stack", "category"):
        assert (
            getattr(new.allocations, column).tolist() == getattr(ref.allocations, column).tolist()
        )


def test_address_order_is_a_stable_sort_by_address_whatever_the_range() -> None:
    """The one-word sort (address offset and position packed) and its fallback (addresses too
    far apart to pack with the positions) both order as a stable argsort by address."""
    import numpy as np

    from jupyter_vram._snapshots.columns import _address_order

    rng = np.random.default_rng(0)
    cases = [
        rng.choice([0x7F00_0000_0000 + 512 * k for k in range(7)], 1000),  # packs
        rng.choice([-(1 << 63), (1 << 63) - 1, 0, 5], 1000),  # a range of 2**64: cannot
        rng.choice([1, (1 << 60) + 1, 3], 1000),  # 60 bits of range and 10 of position
        np.full(1000, 12345),
    ]
    for addr in cases:
        addr = addr.astype(np.int64)
        positions = np.flatnonzero(rng.random(len(addr)) < 0.8)
        order, key = _address_order(addr, positions, len(addr))
        expected = positions[np.argsort(addr[positions], kind="stable")]
        assert order.tolist() == expected.tolist()
        same = addr[expected][1:] == addr[expected][:-1]
        assert ((key[1:] == key[:-1]) == same).all()


def resolved(cols: Any) -> dict[str, list[Any]]:
    """A trace's columns with stack and metadata ids replaced by what they name."""

    def frames(sid: int) -> Any:
        if sid < 0:
            return None
        return tuple((f["filename"], f["line"], f["name"]) for f in cols.stacks[sid])

    return {
        "action": list(cols.action),
        "addr": list(cols.addr),
        "size": list(cols.size),
        "time_us": list(cols.time_us),
        "stack": [frames(s) for s in cols.stack],
        "meta": [cols.metas[m] for m in cols.meta],
    }


@pytest.mark.parametrize(("seed", "odd"), [(0, 0.3), (1, 0.3), (2, 0.02), (3, 0.02), (4, 0.005)])
def test_streaming_reader_reads_every_shape_of_entry(seed: int, odd: float) -> None:
    """Entries of many byte shapes in one trace, pickled by pickle.dump: integers of every
    width and sign (1 to 8 bytes, negative times), compile_context strings of any length,
    metadata strings, frame lists empty, of one frame, deep, shared by alloc and free or
    equal but separate, memo references past 256 and 65536: the streaming reader's columns
    are those of the whole load, entry for entry. ``odd``: how often a value is unusual (often:
    short runs of one shape; rarely: long runs, read in bulk)."""
    import io
    import random

    from jupyter_vram._snapshots.columns import columns_from_trace
    from jupyter_vram._snapshots.stream import read_snapshot_stream

    def fresh(value: Any) -> Any:
        """A new str object (torch makes one per entry; pickle then writes each inline)."""
        return (value + ".")[:-1] if isinstance(value, str) else value

    rng = random.Random(seed)
    files = [f"/src/f{i}.py" for i in range(40)]
    pool = [{"filename": rng.choice(files), "line": i, "name": f"fn{i}"} for i in range(300)]
    shapes: list[list[dict[str, Any]]] = [[]]
    shapes += [[rng.choice(pool)] for _ in range(5)]
    shapes += [rng.sample(pool, rng.randint(2, 60)) for _ in range(30)]
    ints = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**40 + 3, 2**63 - 1, -1, -300]
    metas = ["", "", "", "layer.1", "m" * 300]
    trace, live = [], []
    for _ in range(8000):
        if live and rng.random() < 0.45:
            entry = live.pop(rng.randrange(len(live)))
            free = {key: fresh(v) for key, v in entry.items()}  # its own strings, as torch's
            trace.append({**free, "action": "free_requested", "time_us": rng.choice(ints)})
            continue
        frames = rng.choice(shapes)
        entry = {
            "action": rng.choice(["alloc", "alloc", "segment_alloc", "oom"]),
            "addr": rng.choice(ints) if rng.random() < odd else 0x7F00_0000_0000 + 512 * len(trace),
            "size": rng.choice(ints) if rng.random() < odd else rng.randint(1, 1 << 20),
            "stream": rng.choice([0, 7, 2**33]) if rng.random() < odd else 0,
            "time_us": rng.choice(ints) if rng.random() < odd else 10**15 + len(trace),
            "compile_context": fresh(
                rng.choice(["", "ctx" * rng.randint(0, 30)]) if rng.random() < odd else "N/A"
            ),
            "user_metadata": fresh(rng.choice(metas) if rng.random() < odd else ""),
            "frames": list(frames) if rng.random() < 0.5 else frames,
        }
        trace.append(entry)
        live.append(entry)
    snapshot = {"device_traces": [trace], "segments": []}
    data = pickle.dumps(snapshot, protocol=rng.choice([4, 5]))
    _, traces = read_snapshot_stream(io.BytesIO(data))
    assert resolved(traces[0]) == resolved(
        columns_from_trace(pickle.loads(data)["device_traces"][0])
    )


@pytest.mark.parametrize("collide", [False, True])
def test_known_frame_lists_are_matched_byte_for_byte(
    monkeypatch: pytest.MonkeyPatch, collide: bool
) -> None:
    """The bulk reader's table of frame lists finds a list only where every byte is that of
    a known one: not a prefix of it, not one that extends it, not on a hash alone (every
    hash made equal), whatever bytes follow it in the buffer."""
    import numpy as np

    from jupyter_vram._snapshots import bulk

    if collide:
        monkeypatch.setattr(bulk, "_hash", lambda words, sizes: np.zeros(len(sizes), np.uint64))
    known = {
        b"]\x94(h\x01h\x02e": 7,
        b"]\x94h\x09a": 3,
        b"]\x94(" + b"j\x00\x01\x00\x00" * 30 + b"e": 5,
    }
    table = bulk._ListTable()
    table.update(known)
    lists = [
        *known,
        b"]\x94(h\x01e",  # a prefix of one
        b"]\x94(h\x01h\x02h\x03e",  # one that extends one
        b"]\x94(h\x01h\x03e",  # one byte different
    ]
    buf, pos, end = b"", [], []
    for g in lists * 3:
        pos.append(len(buf))
        buf += g
        end.append(len(buf))
        buf += bytes(range(200, 200 + len(buf) % 40))  # whatever follows
    buf += bytes(600)
    found = table.find(
        np.frombuffer(buf, np.uint8), np.asarray(pos, np.int64), np.asarray(end, np.int64)
    )
    expected = [known.get(g, -1) for g in lists] * 3
    if collide:  # one of the colliding lists is found by its hash; the others by the dict
        assert all(f in (e, -1) for f, e in zip(found.tolist(), expected, strict=True))
        assert (found >= 0).any()
    else:
        assert found.tolist() == expected


def test_read_ahead_thread_ends_with_the_read(tmp_path: Path) -> None:
    """The streaming reader reads the file in a second thread: a gzip'd snapshot reads to the
    same Profile, a file that fails mid-way is one clear error, and no thread is left."""
    import threading

    def ahead() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "snapshot read-ahead"]

    path = tmp_path / "snap.pickle"
    big_snapshot_module().generate(path, 1.5, layers=4, seed=2, depth=12)
    gz = tmp_path / "snap.pickle.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    same_profiles(
        profile_from_snapshot_source(gz, stream=True),
        profile_from_snapshot_source(path, stream=False),
    )
    assert not ahead()
    broken = tmp_path / "broken.pickle.gz"
    broken.write_bytes(gz.read_bytes()[: len(gz.read_bytes()) // 2])  # gzip ends mid-stream
    with pytest.raises(ProfileFileError, match=str(broken)):
        profile_from_snapshot_source(broken, stream=True)
    assert not ahead()
