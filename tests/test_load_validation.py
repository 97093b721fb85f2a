"""Bad profile files: every class of damage is one ProfileFileError naming the problem."""

from __future__ import annotations

import copy
import gzip
import json
import os
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import jupyter_vram as jv
from jupyter_vram import Profile, ProfileFileError
from jupyter_vram._model import CATEGORIES


@pytest.fixture(scope="module")
def good() -> dict[str, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    with jv.record() as rec:
        model(torch.randn(2, 16)).sum().backward()
    data = rec.profile.to_dict()
    # the checks below need a non-empty stack table and several rows
    assert data["stacks"] and data["frames"] and len(data["allocations"]["size"]) >= 4
    return data


def write(tmp_path: Path, data: Any, name: str = "p.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_error_is_a_value_error_exported_from_the_package() -> None:
    assert issubclass(jv.ProfileFileError, ValueError)


def test_good_file_still_loads(good: dict[str, Any], tmp_path: Path) -> None:
    loaded = Profile.load(write(tmp_path, good))
    assert loaded.to_dict()["allocations"] == good["allocations"]


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value

    return edit


def _row0(column: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d["allocations"][column][0] = value

    return edit


def _free_before_alloc(d: dict[str, Any]) -> None:
    a = d["allocations"]
    row = next(i for i, f in enumerate(a["free_seq"]) if f >= 0 and a["alloc_seq"][i] >= 0)
    a["free_seq"][row], a["alloc_seq"][row] = a["alloc_seq"][row], a["free_seq"][row]


def _drop_column_row(d: dict[str, Any]) -> None:
    d["allocations"]["op"].pop()


CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "size is a string": (_row0("size", "12"), "'size' must be a list of integers"),
    "size is a float": (_row0("size", 1.5), "'size' must be a list of integers"),
    "size is 1e30": (_row0("size", 1e30), "'size' must be a list of integers"),
    "size past int64": (_row0("size", 2**70), "'size' must be a list of integers"),
    "negative size": (_row0("size", -4096), "'size' of row 0 is -4096, out of range"),
    "petabyte size": (_row0("size", 2**60), "'size' of row 0 .* out of range"),
    "column not a list": (_set(("allocations", "op"), 3), "'op' must be a list"),
    "column missing": (lambda d: d["allocations"].pop("phase"), "'phase' must be a list"),
    "ragged columns": (_drop_column_row, "different lengths"),
    "nested column": (_row0("stack", [0]), "'stack' must be a list of integers"),
    "op id out of range": (_row0("op", 10**6), "'op' of row 0 is 1000000, out of range"),
    "module id negative": (_row0("module", -1), "'module' of row 0 is -1, out of range"),
    "device id out of range": (_row0("device", 7), "'device' of row 0 is 7"),
    "stack id pointing nowhere": (_row0("stack", 999), "'stack' of row 0 is 999"),
    "category id out of range": (
        _row0("category", len(CATEGORIES)),
        f"'category' of row 0 is {len(CATEGORIES)}",
    ),
    "phase id out of range": (_row0("phase", 4), "'phase' of row 0 is 4"),
    "seq below -1": (_row0("alloc_seq", -5), "'alloc_seq' of row 0 is -5"),
    "free before alloc": (_free_before_alloc, "freed .* before it is allocated"),
    "frame id pointing nowhere": (
        lambda d: d["stacks"][0].append(len(d["frames"]) + 3),
        "stack 0 points to a frame that does not exist",
    ),
    "stack not a list": (_set(("stacks", 0), "x"), "stack 0 must be a list of frame ids"),
    "frame malformed": (_set(("frames", 0), ["f.py", "12", "fn"]), "frame 0 must be"),
    "frames not a list": (_set(("frames",), {}), "'frames' must be a list"),
    "ops not strings": (_set(("ops", 0), 5), "'ops' must be a list of strings"),
    "device not in table": (_set(("device",), "cuda:9"), "'cuda:9' is not in its devices"),
    "device not a string": (_set(("device",), 0), "'device' must be a string"),
    "segments wrong type": (_set(("segments",), [1, 2]), "'segments' must be a JSON object"),
    "segment lengths": (
        _set(("segments",), {"seq": [1, 2], "delta": [4096], "baseline": 0}),
        "different lengths",
    ),
    "negative baseline": (_set(("segments", "baseline"), -1), "'baseline' = -1 is out of range"),
    "wall_ns float": (_set(("wall_ns",), 1e30), "'wall_ns' must be an integer"),
    "event_count negative": (_set(("event_count",), -3), "'event_count' = -3"),
    "device_info bytes": (_set(("device_info",), {"total": "16GB"}), "'total' must be an int"),
    "meta not object": (_set(("meta",), [1]), "'meta' must be a JSON object"),
    "estimate batch": (
        _set(("meta",), {"estimate": {"batch_size": 0}}),
        "meta.estimate: 'batch_size' = 0 is out of range",
    ),
    "allocator model": (
        _set(("meta",), {"allocator_model": {"peak_reserved": "big"}}),
        "'peak_reserved' must be an integer",
    ),
    "error not text": (_set(("error",), {"x": 1}), "'error' must be a string"),
    "categories changed": (_set(("categories",), ["a"]), "unknown categories"),
    "schema": (_set(("schema",), "other"), "not a jupyter_vram profile"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_document(good: dict[str, Any], tmp_path: Path, case: str) -> None:
    edit, message = CASES[case]
    data = copy.deepcopy(good)
    edit(data)
    path = write(tmp_path, data)
    with pytest.raises(ProfileFileError, match=message) as info:
        Profile.load(path)
    assert str(info.value).startswith(str(path))


def test_nan_and_infinity(good: dict[str, Any], tmp_path: Path) -> None:
    for constant in ("NaN", "Infinity", "-Infinity"):
        text = json.dumps(good).replace('"wall_ns": ', f'"wall_ns": {constant}, "x": ', 1)
        with pytest.raises(ProfileFileError, match=f"JSON holds {constant}"):
            Profile.load(write(tmp_path, text))
    # 1e400 parses as a float infinity, which no integer column takes
    text = json.dumps(good).replace('"size": [', '"size": [1e400, ', 1)
    with pytest.raises(ProfileFileError, match="'size' must be a list of integers"):
        Profile.load(write(tmp_path, text))


def test_deep_nesting(tmp_path: Path) -> None:
    text = '{"schema": "jupyter_vram.profile", "meta": ' + "[" * 200_000 + "]" * 200_000 + "}"
    with pytest.raises(ProfileFileError, match="nested too deeply"):
        Profile.load(write(tmp_path, text))


def test_not_json_and_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(ProfileFileError, match="invalid JSON"):
        Profile.load(write(tmp_path, "{not json"))
    with pytest.raises(ProfileFileError, match="not a jupyter_vram profile"):
        Profile.load(write(tmp_path, "[1, 2, 3]"))
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileFileError):
        Profile.load(tmp_path / "bin.json")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileFileError, match="cannot read the file"):
        Profile.load(tmp_path / "nowhere.json.gz")


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    """A device (``/dev/zero`` reads forever), a FIFO (blocks until a writer comes) and a
    folder are refused before a byte is read, by Profile.load and Profile.from_snapshot."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = {
        "/dev/zero": "a device, FIFO or socket",
        str(fifo): "a device, FIFO or socket",
        str(tmp_path): "a folder",
    }
    for path, kind in cases.items():
        for load in (Profile.load, Profile.from_snapshot):
            errors: list[BaseException] = []
            worker = threading.Thread(target=_capture, args=(load, path, errors), daemon=True)
            worker.start()
            worker.join(120)  # a FIFO opened the old way would block here for ever
            assert not worker.is_alive(), f"{load.__name__}({path}) blocked"
            assert len(errors) == 1 and isinstance(errors[0], ProfileFileError), errors
            assert str(errors[0]) == f"{path}: not a regular file ({kind}): only files are read"


def _capture(load: Callable[[str], Any], path: str, errors: list[BaseException]) -> None:
    try:
        load(path)
    except BaseException as error:  # noqa: BLE001 - the test looks at it
        errors.append(error)


def test_plain_reads_stop_past_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain (not gzip) file is read to one byte past ``max_bytes`` at most, whatever its
    size said: here a file that never ends (``/dev/zero`` behind a regular file's name)."""
    from jupyter_vram._model import files

    path = write(tmp_path, "{}")
    monkeypatch.setattr(files, "open_regular_file", lambda _: open("/dev/zero", "rb"))  # noqa: SIM115
    tracemalloc.start()
    try:
        with pytest.raises(ProfileFileError, match="file is over the 4,096-byte limit"):
            Profile.load(path, max_bytes=4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_corrupt_and_truncated_gzip(good: dict[str, Any], tmp_path: Path) -> None:
    packed = gzip.compress(json.dumps(good).encode())
    corrupt = bytearray(packed)
    for i in range(20, min(60, len(corrupt) - 8)):
        corrupt[i] ^= 0x5A
    (tmp_path / "c.json.gz").write_bytes(bytes(corrupt))
    with pytest.raises(ProfileFileError, match="corrupt gzip data"):
        Profile.load(tmp_path / "c.json.gz")
    (tmp_path / "t.json.gz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ProfileFileError, match="gzip data is truncated"):
        Profile.load(tmp_path / "t.json.gz")
    # a wrong checksum in the trailer is corruption too
    (tmp_path / "k.json.gz").write_bytes(packed[:-8] + bytes(8))
    with pytest.raises(ProfileFileError, match="corrupt gzip data"):
        Profile.load(tmp_path / "k.json.gz")


def test_gzip_of_several_members_loads(good: dict[str, Any], tmp_path: Path) -> None:
    text = json.dumps(good).encode()
    half = len(text) // 2
    (tmp_path / "m.json.gz").write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    assert Profile.load(tmp_path / "m.json.gz").to_dict()["allocations"] == good["allocations"]


def test_gzip_bomb_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    # 24 gzip members of 64 MiB of zeros each: a 1.5 MB file that inflates to 1.5 GiB,
    # past the default 1 GiB limit
    member = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(member * 24)
    assert path.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ProfileFileError, match="inflates past the 1,073,741,824-byte limit"):
            Profile.load(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"loading the bomb held {peak:,} bytes"
    # a caller's own limit applies too, and a plain file over it is not even read
    with pytest.raises(ProfileFileError, match="1,000-byte limit"):
        Profile.load(path, max_bytes=1000)
    (tmp_path / "big.json").write_bytes(b" " * 5000)
    with pytest.raises(ProfileFileError, match="file is 5,000 bytes, over the 1,000-byte"):
        Profile.load(tmp_path / "big.json", max_bytes=1000)


def test_show_prints_one_line_without_a_traceback(good: dict[str, Any], tmp_path: Path) -> None:
    data = copy.deepcopy(good)
    data["stacks"][0].append(10**6)
    path = write(tmp_path, data, "bad.json")
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_vram", "show", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert lines[0].startswith(f"error: {path}: stack 0 points to a frame that does not exist")
