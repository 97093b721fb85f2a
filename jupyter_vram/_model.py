"""The Profile: one serializable record of every allocation a run made.

Every view of jupyter_vram (text summary, flame graph, breakdown, estimate) reads this one
data model, so it is columnar and compact: a run of a million events is a handful of numpy
arrays plus small string tables, and it round-trips through JSON without loss.

One row is one *allocation* (a storage, or a CUDA block): its size, the sequence numbers of its
alloc and free events, the op / module / phase / Python stack that made it and the category it
played. Sequence numbers are shared by alloc and free events of one run, so sorting by them
replays the run. Allocations that existed before recording started have ``alloc_seq == -1``
(the baseline); allocations still alive at the end have ``free_seq == -1``.

The data model is the bottom of the package: at run time it imports no other jupyter_vram
module but the leaf ``_units``. Its conveniences (``peak_bytes``, ``peak_breakdown()``,
``to_dataframe()``, ``to_html()``, ``compare()``, ``leaks()``, ``from_snapshot()`` ...) are
declared here, where users look for them, and delegate to :class:`ProfileServices`: the
layers above (analysis, render, capture's snapshot files) provide them, and the package
installs them when it is imported (``jupyter_vram/_profile_services.py``, from
``jupyter_vram/__init__.py``; importing any ``jupyter_vram.*`` module imports the package
first). So the arrows run one way, the methods keep their names and signatures, and mypy
checks the services against the Protocol.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, Protocol

import numpy as np
import numpy.typing as npt

from ._units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

    from ._analysis.oom import OomReport
    from ._analysis.timeline import Timeline
    from ._rerun import Variant

SCHEMA_VERSION = 1

#: Category names, strongest role first: an allocation that played several roles (a parameter
#: that autograd also saved) takes the first one here.
#: ``parameter`` is a parameter that trains (requires grad), ``frozen_parameter`` one that
#: does not (a LoRA / QLoRA base model's weights); ``quant_state`` the tensors a quantised
#: weight carries besides its data (bitsandbytes' QuantState absmax and code tables, a tensor
#: subclass's scales); ``kv_cache`` a cache kept between generation steps (after
#: ``activation``: in a training step, keys and values autograd saved are activations).
CATEGORIES: tuple[str, ...] = (
    "parameter",
    "frozen_parameter",
    "quant_state",
    "buffer",
    "gradient",
    "optimizer_state",
    "input",
    "activation",
    "kv_cache",
    "temporary",
    "other",
)
CATEGORY_INDEX: dict[str, int] = {name: i for i, name in enumerate(CATEGORIES)}
#: Parameters, trainable or not: what a model's weights are.
PARAMETER_CATEGORIES: tuple[str, ...] = ("parameter", "frozen_parameter")
#: The category table of files written before ``frozen_parameter``, ``quant_state`` and
#: ``kv_cache`` existed (their rows keep their meaning: :func:`category_remap`).
LEGACY_CATEGORIES: tuple[str, ...] = (
    "parameter", "buffer", "gradient", "optimizer_state", "input", "activation", "temporary",
    "other",
)  # fmt: skip


def category_remap(names: Sequence[str]) -> npt.NDArray[np.int8]:
    """Index in a file's category table -> index in :data:`CATEGORIES` (files written by an
    older version name fewer categories, in another order). Raises :class:`ProfileFileError`
    for a name this version does not know."""
    unknown = [n for n in names if n not in CATEGORY_INDEX]
    if unknown:
        raise ProfileFileError(f"profile uses unknown categories {unknown[:3]!r:.80}")
    return np.array([CATEGORY_INDEX[n] for n in names], dtype=np.int8)


PHASES: tuple[str, ...] = ("other", "forward", "backward", "optimizer")
PHASE_INDEX: dict[str, int] = {name: i for i, name in enumerate(PHASES)}

Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
Int8Array = npt.NDArray[np.int8]


class ProfileFileError(ValueError):
    """A saved profile that cannot be read: the message names the file and the problem."""


#: Default limit on a profile file's JSON text (decompressed). A recorded step of a million
#: allocations is about 100 MB of JSON; parsing takes several times the text's size in memory.
MAX_FILE_BYTES = 1 << 30
MAX_BYTES = 1 << 50  # no single allocation, segment or baseline is a petabyte
MAX_SEQ = 1 << 62  # sequence numbers, times and counts: far from int64 overflow
_CHUNK = 1 << 20

_COLUMNS: dict[str, type[np.generic]] = {
    "size": np.int64,
    "alloc_seq": np.int64,
    "free_seq": np.int64,
    "alloc_ns": np.int64,
    "free_ns": np.int64,
    "device": np.int32,
    "op": np.int32,
    "module": np.int32,
    "stack": np.int32,
    "phase": np.int8,
    "category": np.int8,
}


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame of an allocation's stack."""

    filename: str
    line: int
    name: str

    def __str__(self) -> str:
        """``name (file:line)``; line 0 means "somewhere in this function" (an op reached
        through an operator, or a sampled stack whose neighbours' lines differ). The file's
        last part is cut from the string (``pathlib`` would intern every part of the path,
        growing the interpreter's table of interned strings with every stack shown)."""
        where = self.filename.rpartition("/")[2]
        return f"{self.name} ({where}:{self.line})" if self.line else f"{self.name} ({where})"


@dataclass(frozen=True)
class Allocations:
    """Column arrays, one entry per allocation (see the module docstring)."""

    size: Int64Array
    alloc_seq: Int64Array
    free_seq: Int64Array
    alloc_ns: Int64Array
    free_ns: Int64Array
    device: Int32Array
    op: Int32Array
    module: Int32Array
    stack: Int32Array
    phase: Int8Array
    category: Int8Array

    def __post_init__(self) -> None:
        lengths = {len(getattr(self, name)) for name in _COLUMNS}
        if len(lengths) > 1:
            raise ValueError(f"allocation columns have different lengths: {sorted(lengths)}")

    def __len__(self) -> int:
        return len(self.size)

    @classmethod
    def from_columns(cls, columns: Mapping[str, Sequence[int] | npt.NDArray[Any]]) -> Allocations:
        missing = set(_COLUMNS) - set(columns)
        if missing:
            raise ValueError(f"allocation columns missing: {sorted(missing)}")
        return cls(**{name: np.asarray(columns[name], dtype=dt) for name, dt in _COLUMNS.items()})

    @classmethod
    def empty(cls) -> Allocations:
        return cls.from_columns({name: [] for name in _COLUMNS})

    def to_columns(self) -> dict[str, list[int]]:
        return {name: getattr(self, name).tolist() for name in _COLUMNS}


@dataclass(frozen=True)
class SegmentEvents:
    """Reserved memory over time (CUDA caching allocator segments): +size / -size at a seq."""

    seq: Int64Array = field(default_factory=lambda: np.zeros(0, np.int64))
    delta: Int64Array = field(default_factory=lambda: np.zeros(0, np.int64))
    baseline: int = 0  # bytes reserved before recording started


class ProfileServices(Protocol):
    """What the layers above the data model do for :class:`Profile`'s conveniences."""

    def replay(self, profile: Profile) -> Timeline: ...
    def allocations_frame(self, profile: Profile) -> pd.DataFrame: ...
    def top_sites(
        self, profile: Profile, limit: int, by: Literal["peak", "allocated"]
    ) -> pd.DataFrame: ...
    def oom_report(self, profile: Profile) -> OomReport | None: ...
    def find_leaks(self, profile: Profile) -> pd.DataFrame: ...
    def write_report(
        self, profile: Profile, path: str | Path, resources: Literal["inline", "cdn"]
    ) -> Path: ...
    def variant(self, info: Mapping[str, Any]) -> Variant: ...
    def compare(
        self, baseline: Profile, other: Profile, by: Literal["category", "module", "op"]
    ) -> pd.DataFrame: ...
    def from_snapshot(
        self, source: str | Path | Mapping[str, Any], device: int | str | None
    ) -> Profile: ...
    def to_snapshot(self, profile: Profile, path: str | Path) -> Path: ...
    def load_ranks(self, folder: str | Path) -> list[Profile]: ...


_services: ProfileServices | None = None


def install_services(services: ProfileServices) -> None:
    """Provide :class:`Profile`'s conveniences (the package does it once, at import)."""
    global _services
    _services = services


def _the_services() -> ProfileServices:
    if _services is None:  # only if the package's __init__ was bypassed
        raise RuntimeError("jupyter_vram is not fully imported: `import jupyter_vram` first")
    return _services


class Profile:
    """A recorded (or simulated) run: allocations plus the tables their ids point into.

    Treat it as immutable; analysis results are computed on first use and cached.
    """

    def __init__(
        self,
        allocations: Allocations,
        *,
        device: str,
        source: str,
        devices: Sequence[str],
        ops: Sequence[str],
        modules: Sequence[str],
        frames: Sequence[Frame],
        stacks: Sequence[Sequence[int]],
        wall_ns: int = 0,
        event_count: int | None = None,
        segments: SegmentEvents | None = None,
        device_info: Mapping[str, Any] | None = None,
        error: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.allocations = allocations
        self.device = device
        self.source = source
        self.devices: tuple[str, ...] = tuple(devices)
        self.ops: tuple[str, ...] = tuple(ops)
        self.modules: tuple[str, ...] = tuple(modules)
        self.frames: tuple[Frame, ...] = tuple(frames)
        self.stacks: tuple[tuple[int, ...], ...] = tuple(tuple(s) for s in stacks)
        self.wall_ns = int(wall_ns)
        if event_count is None:
            event_count = int(
                (allocations.alloc_seq >= 0).sum() + (allocations.free_seq >= 0).sum()
            )
        self.event_count = event_count
        self.segments = segments if segments is not None else SegmentEvents()
        self.device_info: dict[str, Any] = dict(device_info or {})
        self.error = error
        self.meta: dict[str, Any] = dict(meta or {})
        self._timeline: Timeline | None = None
        self._validate()

    def replace(self, **changes: Any) -> Profile:
        """A new Profile with some fields changed (``allocations``, ``devices``, ``meta``...)."""
        fields: dict[str, Any] = {
            "allocations": self.allocations,
            "device": self.device,
            "source": self.source,
            "devices": self.devices,
            "ops": self.ops,
            "modules": self.modules,
            "frames": self.frames,
            "stacks": self.stacks,
            "wall_ns": self.wall_ns,
            "event_count": self.event_count,
            "segments": self.segments,
            "device_info": self.device_info,
            "error": self.error,
            "meta": self.meta,
        }
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"Profile has no field(s) {sorted(unknown)}")
        fields.update(changes)
        allocations = fields.pop("allocations")
        return Profile(allocations, **fields)

    def _validate(self) -> None:
        a = self.allocations
        if len(a) == 0:
            return
        for name, table in (("device", self.devices), ("op", self.ops), ("module", self.modules)):
            col = getattr(a, name)
            if col.min() < 0 or col.max() >= len(table):
                raise ValueError(f"allocation column {name!r} points outside its table")
        if a.stack.min() < -1 or a.stack.max() >= len(self.stacks):
            raise ValueError("allocation column 'stack' points outside the stack table")
        if a.category.min() < 0 or a.category.max() >= len(CATEGORIES):
            raise ValueError("unknown category id")
        if a.phase.min() < 0 or a.phase.max() >= len(PHASES):
            raise ValueError("unknown phase id")
        if self.device not in self.devices:
            raise ValueError(f"profile device {self.device!r} has no allocations table entry")

    # -- analysis facade -------------------------------------------------------------------

    @property
    def timeline(self) -> Timeline:
        """Live bytes per category after every event on the profile's device (cached)."""
        if self._timeline is None:
            self._timeline = _the_services().replay(self)
        return self._timeline

    @property
    def peak_bytes(self) -> int:
        """Peak of live bytes on the profile's device during the run (baseline included)."""
        return self.timeline.peak_bytes

    def peak_breakdown(self) -> dict[str, int]:
        """Category -> bytes live at the peak; the values sum to ``peak_bytes``."""
        return self.timeline.breakdown_at(self.timeline.peak_index)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per allocation: op, module, phase, category, bytes, device, times, stack."""
        return _the_services().allocations_frame(self)

    def top_sites(
        self, limit: int = 20, *, by: Literal["peak", "allocated"] = "peak"
    ) -> pd.DataFrame:
        """Allocation sites (Python line + op) ranked by bytes live at the peak or allocated."""
        return _the_services().top_sites(self, limit, by)

    @property
    def oom(self) -> OomReport | None:
        """None, or the post-mortem of the ``torch.OutOfMemoryError`` that ended the run: the
        request, what was live by category and module, the allocator's state (CUDA) and
        suggestions ranked by the bytes they save. Saved with the profile (``meta``)."""
        return _the_services().oom_report(self)

    def leaks(self) -> pd.DataFrame:
        """Memory this run made that is still alive, with what holds it (variables, ``Out[n]``,
        the last traceback, closures, cycles); release with ``jv.release_leaks(profile)``."""
        return _the_services().find_leaks(self)

    def to_html(self, path: str | Path, *, resources: Literal["inline", "cdn"] = "inline") -> Path:
        """Write a standalone interactive report (flame graphs, breakdown, timeline, sites).

        With the default inline resources the file works offline.
        """
        return _the_services().write_report(self, path, resources)

    @property
    def variant(self) -> Variant | None:
        """What a rerun changed (AMP dtype, checkpointed modules, offload, notes); None for a
        plain run. Saved with the profile (``meta["variant"]``)."""
        info = self.meta.get("variant")
        if not isinstance(info, Mapping):
            return None
        return _the_services().variant(info)

    def compare(
        self, other: Profile, by: Literal["category", "module", "op"] = "category"
    ) -> pd.DataFrame:
        """This profile (the baseline) against ``other`` (a variant): bytes held at most per
        category and the peak (``by="category"``), or the modules / ops that moved most;
        columns baseline_bytes, variant_bytes, change_bytes, change_pct."""
        return _the_services().compare(self, other, by)

    def stack_of(self, stack_id: int) -> tuple[Frame, ...]:
        if stack_id < 0:
            return ()
        return tuple(self.frames[i] for i in self.stacks[stack_id])

    def __repr__(self) -> str:
        return (
            f"<Profile {self.device} ({self.source}): peak {format_bytes(self.peak_bytes)}, "
            f"{len(self.allocations)} allocations, {self.event_count} events>"
        )

    # -- serialization ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "jupyter_vram.profile",
            "version": SCHEMA_VERSION,
            "device": self.device,
            "source": self.source,
            "devices": list(self.devices),
            "ops": list(self.ops),
            "modules": list(self.modules),
            "frames": [[f.filename, f.line, f.name] for f in self.frames],
            "stacks": [list(s) for s in self.stacks],
            "categories": list(CATEGORIES),
            "phases": list(PHASES),
            "allocations": self.allocations.to_columns(),
            "wall_ns": self.wall_ns,
            "event_count": self.event_count,
            "segments": {
                "seq": self.segments.seq.tolist(),
                "delta": self.segments.delta.tolist(),
                "baseline": self.segments.baseline,
            },
            "device_info": self.device_info,
            "error": self.error,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """A profile from :meth:`to_dict`'s output. Everything is checked first (types, value
        ranges, ids pointing into their tables, alloc before free): a bad document raises
        :class:`ProfileFileError` naming the first problem."""
        check = _Checker()
        if not isinstance(data, Mapping) or data.get("schema") != "jupyter_vram.profile":
            raise ProfileFileError("not a jupyter_vram profile")
        version = data.get("version")
        if version != SCHEMA_VERSION:
            raise ProfileFileError(
                f"profile schema version {version!r:.40} is not supported (this jupyter_vram "
                f"reads version {SCHEMA_VERSION})"
            )
        if check.strings(data, "phases") != PHASES:
            raise ProfileFileError("profile uses a different phase table")
        names = check.strings(data, "categories")
        remap = None if names == CATEGORIES else category_remap(names)
        devices = check.strings(data, "devices")
        ops = check.strings(data, "ops")
        modules = check.strings(data, "modules")
        frames = [Frame(*check.frame(i, f)) for i, f in enumerate(check.list(data, "frames"))]
        stacks = [check.stack(i, s, len(frames)) for i, s in enumerate(check.list(data, "stacks"))]
        device = check.string(data, "device")
        if device not in devices:
            raise ProfileFileError(f"profile device {device!r:.80} is not in its devices table")
        allocations = check.allocations(
            check.mapping(data, "allocations"),
            {"device": len(devices), "op": len(ops), "module": len(modules),
             "category": len(names)},
            len(stacks),
        )  # fmt: skip
        if remap is not None:
            columns = {k: getattr(allocations, k) for k in _COLUMNS}
            allocations = Allocations.from_columns(
                {**columns, "category": remap[columns["category"]]}
            )
        seg = check.mapping(data, "segments", required=False)
        segments = SegmentEvents(
            check.column(seg, "seq", "segments", low=0, required=False),
            check.column(seg, "delta", "segments", low=-MAX_BYTES, required=False),
            check.integer(seg, "baseline", "segments", low=0, high=MAX_BYTES, default=0),
        )
        if len(segments.seq) != len(segments.delta):
            raise ProfileFileError("segments: 'seq' and 'delta' have different lengths")
        device_info = check.device_info(data)
        meta = check.meta(data)
        error = data.get("error")
        if error is not None and not isinstance(error, str):
            raise ProfileFileError("'error' must be a string or null")
        event_count = data.get("event_count")
        if event_count is not None:
            event_count = check.integer(data, "event_count", "profile", low=0, high=MAX_SEQ)
        try:
            return cls(
                allocations,
                device=device,
                source=check.string(data, "source"),
                devices=devices,
                ops=ops,
                modules=modules,
                frames=frames,
                stacks=stacks,
                wall_ns=check.integer(data, "wall_ns", "profile", low=0, high=MAX_SEQ, default=0),
                event_count=event_count,
                segments=segments,
                device_info=device_info,
                error=error,
                meta=meta,
            )
        except ValueError as exc:  # anything the constructor's own checks still catch
            raise ProfileFileError(str(exc)) from exc

    @classmethod
    def from_snapshot(
        cls, source: str | Path | Mapping[str, Any], *, device: int | str | None = None
    ) -> Profile:
        """A PyTorch allocator snapshot (a ``torch.cuda.memory._dump_snapshot`` pickle, or a
        ``_snapshot()`` dict) as the Profile of one device. Nothing in the file is run: a
        pickle that names any class or function is refused (:class:`ProfileFileError`).

        ``device`` (an index or ``"cuda:N"``) picks one device of a multi-device snapshot;
        ``None`` takes the only device that holds memory. Phases, modules and categories are
        recovered from the snapshot's frames, annotations and user metadata where it has them
        (``meta["categories_inferred"]``).
        """
        return _the_services().from_snapshot(source, device)

    def to_snapshot(self, path: str | Path) -> Path:
        """Write a pickle in ``_dump_snapshot``'s format that PyTorch's memory viewer and
        ``torch.cuda._memory_viz`` read, and :meth:`from_snapshot` reads back to the same
        peak and categories (addresses are synthesized: see ``_capture/snapshot_file.py``)."""
        return _the_services().to_snapshot(self, path)

    def save(self, path: str | Path) -> Path:
        """Write JSON; a path ending in ``.gz`` is gzip-compressed. Missing folders are made."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(self.to_dict(), separators=(",", ":")).encode()
        if path.suffix == ".gz":
            payload = gzip.compress(payload, compresslevel=6)
        path.write_bytes(payload)
        return path

    @classmethod
    def load_ranks(cls, folder: str | Path) -> list[Profile]:
        """The per-rank profiles a distributed recording wrote into ``folder`` (``rank<N>.json.gz``,
        from ``torchrun -m jupyter_vram.run``), in rank order."""
        return _the_services().load_ranks(folder)

    @classmethod
    def load(cls, path: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> Profile:
        """Read a profile written by :meth:`save` (gzip is detected from the content).

        The JSON text may be at most ``max_bytes`` long (after decompression; a gzip file is
        inflated in chunks and given up as soon as it passes the limit, so a small file that
        inflates to gigabytes costs no memory). Any problem with the file (unreadable, bad
        gzip, bad JSON, wrong types, values out of range, ids pointing nowhere) raises
        :class:`ProfileFileError`, a ``ValueError`` whose message names the file and the
        problem.
        """
        try:
            text = _read_limited(Path(path), max_bytes)
            try:
                data = json.loads(text, parse_constant=_refuse_constant)
            except ProfileFileError:
                raise
            except json.JSONDecodeError as exc:
                raise ProfileFileError(f"not a jupyter_vram profile (invalid JSON: {exc})") from exc
            except RecursionError as exc:
                raise ProfileFileError("JSON nested too deeply") from exc
            except (ValueError, UnicodeDecodeError) as exc:
                raise ProfileFileError(f"invalid JSON ({exc})") from exc
            del text
            return cls.from_dict(data)
        except ProfileFileError as exc:
            raise ProfileFileError(f"{path}: {exc}") from exc.__cause__


def _refuse_constant(name: str) -> Any:
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


def _read_limited(path: Path, max_bytes: int) -> bytes | bytearray:
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


class _Checker:
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
