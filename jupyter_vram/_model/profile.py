"""The Profile: one serializable record of every allocation a run made.

Every view of jupyter_vram (text summary, flame graph, breakdown, estimate) reads this one
data model, so it is columnar and compact: a run of a million events is a handful of numpy
arrays plus small string tables, and it round-trips through JSON without loss.

One row is one *allocation* (a storage, or a CUDA block): its size, the sequence numbers of its
alloc and free events, the op / module / phase / Python stack that made it and the category it
played. Sequence numbers are shared by alloc and free events of one run, so sorting by them
replays the run. Allocations that existed before recording started have ``alloc_seq == -1``
(the baseline); allocations still alive at the end have ``free_seq == -1``.

The data model is the bottom of the package: it imports its siblings in ``_model/`` and the
leaf ``_units``, nothing else of jupyter_vram. It holds the data and what the columns alone give
(``timeline``, ``peak_bytes``, ``peak_breakdown()``, ``variant``, JSON files). The conveniences
that need the layers above (``to_dataframe()``, ``to_html()``, ``compare()``, ``leaks()``,
``from_snapshot()`` ...) belong to the profile users hold, ``jupyter_vram.Profile``, a subclass
in ``jupyter_vram/_profile.py``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._units import format_bytes
from .columns import (
    CATEGORIES,
    COLUMNS,
    MAX_BYTES,
    MAX_FILE_BYTES,
    MAX_SEQ,
    PHASES,
    Allocations,
    Frame,
    ProfileFileError,
    SegmentEvents,
    category_remap,
)
from .files import Checker, read_limited, refuse_constant
from .timeline import Timeline, replay
from .variant import Variant

if TYPE_CHECKING:
    from typing import Self

SCHEMA_VERSION = 1


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

    def replace(self, **changes: Any) -> Self:
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
        return type(self)(allocations, **fields)

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

    @property
    def device_index(self) -> int:
        """The profile's device in the ``device`` column (-1: it has no allocations table
        entry, which only an empty profile may lack)."""
        return self.devices.index(self.device) if self.device in self.devices else -1

    # -- what the columns give ------------------------------------------------------------

    @property
    def timeline(self) -> Timeline:
        """Live bytes per category after every event on the profile's device (cached)."""
        if self._timeline is None:
            self._timeline = replay(self.allocations, self.device_index)
        return self._timeline

    @property
    def peak_bytes(self) -> int:
        """Peak of live bytes on the profile's device during the run (baseline included)."""
        return self.timeline.peak_bytes

    def peak_breakdown(self) -> dict[str, int]:
        """Category -> bytes live at the peak; the values sum to ``peak_bytes``."""
        return self.timeline.breakdown_at(self.timeline.peak_index)

    @property
    def variant(self) -> Variant | None:
        """What a rerun changed (AMP dtype, checkpointed modules, offload, notes); None for a
        plain run. Saved with the profile (``meta["variant"]``)."""
        info = self.meta.get("variant")
        if not isinstance(info, Mapping):
            return None
        return Variant.from_dict(info)

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
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """A profile from :meth:`to_dict`'s output. Everything is checked first (types, value
        ranges, ids pointing into their tables, alloc before free): a bad document raises
        :class:`ProfileFileError` naming the first problem."""
        check = Checker()
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
            columns = {k: getattr(allocations, k) for k in COLUMNS}
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
    def load(cls, path: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> Self:
        """Read a profile written by :meth:`save` (gzip is detected from the content).

        The JSON text may be at most ``max_bytes`` long (after decompression; a gzip file is
        inflated in chunks and given up as soon as it passes the limit, so a small file that
        inflates to gigabytes costs no memory). Any problem with the file (unreadable, bad
        gzip, bad JSON, wrong types, values out of range, ids pointing nowhere) raises
        :class:`ProfileFileError`, a ``ValueError`` whose message names the file and the
        problem.
        """
        try:
            text = read_limited(Path(path), max_bytes)
            try:
                data = json.loads(text, parse_constant=refuse_constant)
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
