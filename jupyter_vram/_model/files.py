"""Reading a saved profile safely: regular files only, a size limit that holds for gzip
too, and every field of the JSON document checked (types, ranges, ids pointing into their
tables) before a :class:`~jupyter_vram._model.profile.Profile` is built from it.
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .columns import (
    CATEGORIES,
    MAX_BYTES,
    MAX_SEQ,
    PHASES,
    Allocations,
    Int64Array,
    ProfileFileError,
)

_CHUNK = 1 << 20


def refuse_constant(name: str) -> Any:
    raise ProfileFileError(f"JSON holds {name}, which no profile field can take")


def open_regular_file(path: Path) -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file; ProfileFileError for
    a device (``/dev/zero`` reads forever), a FIFO (blocks until a writer comes), a socket or
    a folder. Opened without blocking, then checked on the open file itself, so a path that
    changes in between cannot slip through."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise ProfileFileError(f"cannot read the file ({exc.strerror or exc})") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
            raise ProfileFileError(f"not a regular file ({kind}): only files are read")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: Path, max_bytes: int) -> bytes | bytearray:
    """The file's bytes, gunzipped when it is gzip, refusing anything past ``max_bytes``
    (plain text is read to one byte past the limit at most, whatever the file claims)."""
    too_big = f"over the {max_bytes:,}-byte limit (raise it with Profile.load(path, max_bytes=...))"
    try:
        with open_regular_file(path) as fh:
            head = fh.read(2)
            if head != b"\x1f\x8b":
                size = os.fstat(fh.fileno()).st_size
                if size > max_bytes:
                    raise ProfileFileError(f"file is {size:,} bytes, {too_big}")
                text: bytes = head + fh.read(max(max_bytes + 1 - len(head), 0))
                if len(text) > max_bytes:  # it grew since
                    raise ProfileFileError(f"file is {too_big}")
                return text
            fh.seek(0)
            return _gunzip_limited(fh, max_bytes)
    except OSError as exc:
        raise ProfileFileError(f"cannot read the file ({exc.strerror or exc})") from exc


def _gunzip_limited(fh: Any, max_bytes: int) -> bytearray:
    """Inflate the gzip members read from ``fh``, refusing output past ``max_bytes``.

    A first pass only counts the inflated bytes (one chunk in memory at a time), so a small
    file that inflates to gigabytes is refused without holding any of it; the second pass
    keeps the text.
    """
    total = 0
    for chunk in _inflate(fh, max_bytes):
        total += len(chunk)
    fh.seek(0)
    out = bytearray()
    for chunk in _inflate(fh, total):
        out += chunk
    return out


def _inflate(fh: Any, max_bytes: int) -> Iterator[bytes]:
    """The inflated chunks of the gzip members in ``fh`` (ProfileFileError past the limit,
    on corrupt data or on a truncated member)."""
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    pending = b""
    in_member = False
    total = 0
    try:
        while True:
            if not pending:
                pending = fh.read(_CHUNK)
                if not pending:
                    break
            in_member = True
            room = max_bytes - total + 1  # one byte past the limit says it went over
            chunk = inflater.decompress(pending, min(room, _CHUNK))
            total += len(chunk)
            if total > max_bytes:
                raise ProfileFileError(
                    f"gzip data inflates past the {max_bytes:,}-byte limit (raise it with "
                    "Profile.load(path, max_bytes=...))"
                )
            yield chunk
            if inflater.eof:  # a member ended; gzip allows another to follow
                pending = inflater.unused_data
                inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
                in_member = False
            else:
                pending = inflater.unconsumed_tail
    except zlib.error as exc:
        raise ProfileFileError(f"corrupt gzip data ({exc})") from exc
    if in_member:
        raise ProfileFileError("gzip data is truncated")


class Checker:
    """Type and range checks of a profile document, each failure a ProfileFileError."""

    def mapping(
        self, data: Mapping[str, Any], key: str, *, required: bool = True
    ) -> Mapping[str, Any]:
        value = data.get(key)
        if value is None and not required:
            return {}
        if not isinstance(value, Mapping):
            raise ProfileFileError(f"{key!r} must be a JSON object")
        return value

    def list(self, data: Mapping[str, Any], key: str) -> list[Any]:
        value = data.get(key)
        if not isinstance(value, list):
            raise ProfileFileError(f"{key!r} must be a list")
        return value

    def string(self, data: Mapping[str, Any], key: str) -> str:
        value = data.get(key)
        if not isinstance(value, str):
            raise ProfileFileError(f"{key!r} must be a string")
        return value

    def strings(self, data: Mapping[str, Any], key: str) -> tuple[str, ...]:
        values = self.list(data, key)
        if not all(isinstance(v, str) for v in values):
            raise ProfileFileError(f"{key!r} must be a list of strings")
        return tuple(values)

    def integer(
        self, data: Mapping[str, Any], key: str, where: str, *, low: int, high: int,
        default: int | None = None,
    ) -> int:  # fmt: skip
        value = data.get(key, default)
        if type(value) is not int:
            raise ProfileFileError(f"{where}: {key!r} must be an integer")
        if not low <= value <= high:
            raise ProfileFileError(f"{where}: {key!r} = {value} is out of range")
        return value

    def frame(self, index: int, value: Any) -> tuple[str, int, str]:
        if (
            not isinstance(value, list)
            or len(value) != 3
            or not isinstance(value[0], str)
            or type(value[1]) is not int
            or not isinstance(value[2], str)
        ):
            raise ProfileFileError(f"frame {index} must be [filename, line, name]")
        if not 0 <= value[1] < 1 << 31:
            raise ProfileFileError(f"frame {index}: line {value[1]} is out of range")
        return value[0], value[1], value[2]

    def stack(self, index: int, value: Any, frames: int) -> tuple[int, ...]:
        if not isinstance(value, list) or not all(type(f) is int for f in value):
            raise ProfileFileError(f"stack {index} must be a list of frame ids")
        if value and (min(value) < 0 or max(value) >= frames):
            raise ProfileFileError(
                f"stack {index} points to a frame that does not exist ({frames} frames)"
            )
        return tuple(value)

    def column(
        self, data: Mapping[str, Any], key: str, where: str, *, low: int, high: int = MAX_SEQ,
        required: bool = True,
    ) -> Int64Array:  # fmt: skip
        values = data.get(key)
        if values is None and not required:
            return np.zeros(0, np.int64)
        if not isinstance(values, list):
            raise ProfileFileError(f"{where}: {key!r} must be a list of integers")
        try:
            array = np.asarray(values)
        except (ValueError, OverflowError, TypeError) as exc:
            raise ProfileFileError(f"{where}: {key!r} must be a list of integers") from exc
        if len(values) == 0:
            return np.zeros(0, np.int64)
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise ProfileFileError(f"{where}: {key!r} must be a list of integers")
        bad = (array < low) | (array > high)
        if bad.any():
            row = int(np.argmax(bad))
            raise ProfileFileError(
                f"{where}: {key!r} of row {row} is {int(array[row])}, out of range"
            )
        return array.astype(np.int64)

    def allocations(
        self, data: Mapping[str, Any], tables: Mapping[str, int], stacks: int
    ) -> Allocations:
        where = "allocations"
        limits = {
            "size": (0, MAX_BYTES),
            "alloc_seq": (-1, MAX_SEQ),
            "free_seq": (-1, MAX_SEQ),
            "alloc_ns": (-1, MAX_SEQ),
            "free_ns": (-1, MAX_SEQ),
            "device": (0, tables["device"] - 1),
            "op": (0, tables["op"] - 1),
            "module": (0, tables["module"] - 1),
            "stack": (-1, stacks - 1),
            "phase": (0, len(PHASES) - 1),
            "category": (0, tables.get("category", len(CATEGORIES)) - 1),
        }
        columns = {
            name: self.column(data, name, where, low=low, high=high)
            for name, (low, high) in limits.items()
        }
        if len({len(c) for c in columns.values()}) > 1:
            raise ProfileFileError("allocation columns have different lengths")
        a = Allocations.from_columns(columns)
        if int(a.size.sum(dtype=np.float64)) > MAX_SEQ:
            raise ProfileFileError("allocation sizes add up past any real memory")
        freed_first = (a.alloc_seq >= 0) & (a.free_seq >= 0) & (a.free_seq <= a.alloc_seq)
        if freed_first.any():
            row = int(np.argmax(freed_first))
            raise ProfileFileError(
                f"allocation {row} is freed (seq {int(a.free_seq[row])}) before it is "
                f"allocated (seq {int(a.alloc_seq[row])})"
            )
        return a

    def device_info(self, data: Mapping[str, Any]) -> dict[str, Any]:
        info = dict(self.mapping(data, "device_info", required=False))
        for key in ("allocated", "reserved", "device_used", "total", "used", "free"):
            if info.get(key) is not None:
                self.integer(info, key, "device_info", low=0, high=MAX_BYTES)
        if info.get("name") is not None and not isinstance(info["name"], str):
            raise ProfileFileError("device_info: 'name' must be a string")
        return info

    def meta(self, data: Mapping[str, Any]) -> dict[str, Any]:
        meta = dict(self.mapping(data, "meta", required=False))
        if meta.get("estimate") is not None:
            info = self.mapping(meta, "estimate")
            for key, low in (("batch_size", 1), ("parameters", 0), ("unit_parameter_bytes", 0)):
                if key in info:
                    self.integer(info, key, "meta.estimate", low=low, high=MAX_SEQ)
            settings = info.get("settings")
            if settings is not None and not isinstance(settings, Mapping):
                raise ProfileFileError("meta.estimate: 'settings' must be a JSON object")
        if meta.get("allocator_model") is not None:
            model = self.mapping(meta, "allocator_model")
            self.integer(model, "peak_reserved", "meta.allocator_model", low=0, high=MAX_SEQ)
        return meta
