"""The Profile: one serializable record of every allocation a run made.

Every view of jupyter_vram (text summary, flame graph, breakdown, estimate) reads this one
data model, so it is columnar and compact: a run of a million events is a handful of numpy
arrays plus small string tables, and it round-trips through JSON without loss.

One row is one *allocation* (a storage, or a CUDA block): its size, the sequence numbers of its
alloc and free events, the op / module / phase / Python stack that made it and the category it
played. Sequence numbers are shared by alloc and free events of one run, so sorting by them
replays the run. Allocations that existed before recording started have ``alloc_seq == -1``
(the baseline); allocations still alive at the end have ``free_seq == -1``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import pandas as pd

    from .analysis.timeline import Timeline

SCHEMA_VERSION = 1

#: Category names, strongest role first: an allocation that played several roles (a parameter
#: that autograd also saved) takes the first one here.
CATEGORIES: tuple[str, ...] = (
    "parameter",
    "buffer",
    "gradient",
    "optimizer_state",
    "input",
    "activation",
    "temporary",
    "other",
)
CATEGORY_INDEX: dict[str, int] = {name: i for i, name in enumerate(CATEGORIES)}

PHASES: tuple[str, ...] = ("other", "forward", "backward", "optimizer")
PHASE_INDEX: dict[str, int] = {name: i for i, name in enumerate(PHASES)}

Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
Int8Array = npt.NDArray[np.int8]

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
        return f"{self.name} ({Path(self.filename).name}:{self.line})"


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
            from .analysis.timeline import replay

            self._timeline = replay(self)
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
        from .analysis.tables import allocations_frame

        return allocations_frame(self)

    def top_sites(
        self, limit: int = 20, *, by: Literal["peak", "allocated"] = "peak"
    ) -> pd.DataFrame:
        """Allocation sites (Python line + op) ranked by bytes live at the peak or allocated."""
        from .analysis.tables import top_sites

        return top_sites(self, limit, by=by)

    def to_html(self, path: str | Path, *, resources: Literal["inline", "cdn"] = "inline") -> Path:
        """Write a standalone interactive report (flame graphs, breakdown, timeline, sites).

        With the default inline resources the file works offline.
        """
        from .render.html import write_report

        return write_report(self, path, resources=resources)

    def stack_of(self, stack_id: int) -> tuple[Frame, ...]:
        if stack_id < 0:
            return ()
        return tuple(self.frames[i] for i in self.stacks[stack_id])

    def __repr__(self) -> str:
        from .render.text import format_bytes

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
        if data.get("schema") != "jupyter_vram.profile":
            raise ValueError("not a jupyter_vram profile")
        version = data.get("version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"profile schema version {version} is not supported (this jupyter_vram reads "
                f"version {SCHEMA_VERSION})"
            )
        if tuple(data["categories"]) != CATEGORIES or tuple(data["phases"]) != PHASES:
            raise ValueError("profile uses a different category or phase table")
        seg = data.get("segments") or {}
        return cls(
            Allocations.from_columns(data["allocations"]),
            device=data["device"],
            source=data["source"],
            devices=data["devices"],
            ops=data["ops"],
            modules=data["modules"],
            frames=[Frame(str(f), int(n), str(name)) for f, n, name in data["frames"]],
            stacks=data["stacks"],
            wall_ns=data.get("wall_ns", 0),
            event_count=data.get("event_count"),
            segments=SegmentEvents(
                np.asarray(seg.get("seq", []), np.int64),
                np.asarray(seg.get("delta", []), np.int64),
                int(seg.get("baseline", 0)),
            ),
            device_info=data.get("device_info"),
            error=data.get("error"),
            meta=data.get("meta"),
        )

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
    def load(cls, path: str | Path) -> Profile:
        """Read a profile written by :meth:`save` (gzip is detected from the content)."""
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not a jupyter_vram profile (invalid JSON: {exc})") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path} is not a jupyter_vram profile")
        return cls.from_dict(data)
