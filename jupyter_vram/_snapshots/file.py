"""PyTorch allocator snapshots in and out: ``_dump_snapshot`` pickles <-> Profiles.

Reading never executes code from the file: pickles go through :class:`SafeUnpickler`, which
refuses every class lookup, so a pickle can build only plain data (dicts, lists, strings,
numbers). The dict then goes through the same conversion the CUDA recorder uses
(:func:`jupyter_vram._capture.cuda_convert.profile_from_snapshot`).

Snapshots dumped outside jupyter_vram carry no labels of ours, so phases, modules and
categories are recovered from what the snapshot holds:

* phase, per allocation: its Python frames (``torch/optim`` -> optimizer, ``torch/autograd`` or
  ``Tensor.backward`` -> backward, ``nn.Module.__call__`` -> forward), the allocator's
  ``Optimizer.step`` / ``zero_grad`` annotations, and for allocations with no Python frames
  (the autograd engine's threads) the phase of the allocation before them;
* module: the allocation's ``user_metadata`` (``torch.cuda.memory._set_memory_metadata``);
* category, from phase and lifetime: made in forward and freed in backward -> activation, made
  in backward and kept past it -> gradient, made by the optimizer and kept -> optimizer state,
  anything else made during the trace -> temporary; blocks from before the trace -> other.
  ``meta["categories_inferred"]`` says so.

Writing (:func:`write_snapshot`) lays every allocation of a Profile at its own synthesized
address (a bump pointer that never reuses an address, so alloc / free pairs are unambiguous and
no two live blocks overlap), with its frames, and ``user_metadata`` ``"phase|module|op"``.
A ``"jupyter_vram"`` entry (ignored by PyTorch's viewers) keeps what a snapshot has no field
for: the module names, the category of every allocation and the exact sizes, so a written
snapshot re-reads to the same peak and categories.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from .._allocator_rules import MIN_BLOCK
from .._capture.cuda_convert import profile_from_snapshot
from .._model import (
    CATEGORIES,
    CATEGORY_INDEX,
    LEGACY_CATEGORIES,
    PHASE_INDEX,
    Profile,
    ProfileFileError,
    SegmentEvents,
    category_remap,
    open_regular_file,
)
from .columns import (
    TraceColumns,
    check_numbers,
    columns_from_trace,
    profile_from_columns,
    trace_numbers,
)
from .stream import UnsupportedPickle, read_snapshot_stream

__all__ = [
    "SafeUnpickler",
    "load_snapshot",
    "profile_from_snapshot_source",
    "profiles_from_snapshot",
    "snapshot_devices",
    "snapshot_from_profile",
    "write_snapshot",
]

EXTENSION = "jupyter_vram"  # the top-level key of what a written snapshot adds
_EXTENSION_VERSION = 1
_LABEL = re.compile(r"\d+\|\d+\|.+", re.DOTALL)
_BASE_ADDRESS = 0x7F00_0000_0000  # where written blocks start (a typical CUDA VA range)
_SEGMENT_BASE = 0x7E00_0000_0000  # where written segments of the trace start
_ALIGN = MIN_BLOCK  # written blocks are spaced as the allocator rounds them
#: Pickles from this size on are read by the streaming reader (bounded memory).
STREAM_MIN_BYTES = 32 << 20

FORWARD, BACKWARD, OPTIMIZER, OTHER_PHASE = (PHASE_INDEX[p] for p in ("forward", "backward",
                                             "optimizer", "other"))  # fmt: skip


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: every class or function lookup is refused.

    Code in a pickle runs only through callables it names (``GLOBAL`` / ``STACK_GLOBAL`` /
    extension codes, all resolved by :meth:`find_class`) or persistent ids (refused by the base
    class when no ``persistent_load`` is given). Refusing them all leaves dict, list, tuple,
    set, str, bytes, int, float, bool and None: everything an allocator snapshot holds.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise ProfileFileError(
            f"the pickle asks for {module}.{name}; a memory snapshot holds plain data only, so "
            "it was not loaded (nothing in it was run)"
        )


def _open_maybe_gzip(path: Path) -> IO[bytes]:
    """The file's bytes, through gzip when it is gzip; a regular file only (see
    :func:`open_regular_file`: a FIFO would block, a device read forever)."""
    fh = open_regular_file(path)
    if fh.read(2) == b"\x1f\x8b":
        fh.seek(0)
        return _OwnedGzip(fh)  # type: ignore[return-value]
    fh.seek(0)
    return fh


class _OwnedGzip(gzip.GzipFile):
    """A gzip reader that closes the file it reads, as when it opens the file itself."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """The snapshot dict in a ``_dump_snapshot`` pickle (optionally gzip), or in a JSON file.

    Raises :class:`ProfileFileError` for anything that is not a snapshot, and for pickles that
    name classes or functions (nothing from such a file runs).
    """
    path = Path(path)
    try:
        with _open_maybe_gzip(path) as fh:
            head = fh.peek(1)[:1] if hasattr(fh, "peek") else b""
            if head in (b"{", b"["):
                data = json.load(io.TextIOWrapper(fh, encoding="utf-8"))
            else:
                data = SafeUnpickler(fh).load()
    except ProfileFileError as exc:
        raise ProfileFileError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ProfileFileError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
            KeyError, AttributeError, RecursionError, MemoryError) as exc:  # fmt: skip
        raise ProfileFileError(f"{path}: not a memory snapshot ({type(exc).__name__}: "
                               f"{str(exc)[:200]})") from exc  # fmt: skip
    return _check_snapshot(data, str(path))


def _check_snapshot(data: object, where: str) -> dict[str, Any]:
    if isinstance(data, Mapping) and isinstance(data.get("snapshot"), Mapping):
        data = {**data}  # the recorder's raw form: snapshot + baseline, roles, modules...
        inner = data["snapshot"]
    else:
        inner = data
    if not isinstance(inner, Mapping) or not (
        isinstance(inner.get("segments"), list) or isinstance(inner.get("device_traces"), list)
    ):
        raise ProfileFileError(
            f"{where}: not a memory snapshot (expected a dict with 'segments' and "
            "'device_traces', as torch.cuda.memory._snapshot() returns)"
        )
    for key in ("segments", "device_traces"):
        value = inner.get(key)
        if value is not None and not isinstance(value, list):
            raise ProfileFileError(f"{where}: snapshot {key!r} must be a list")
    traces = inner.get("device_traces") or []
    for i, trace in enumerate(traces):
        if not isinstance(trace, list) or not all(isinstance(e, Mapping) for e in trace):
            raise ProfileFileError(f"{where}: device_traces[{i}] must be a list of dicts")
    for seg in inner.get("segments") or []:
        if not isinstance(seg, Mapping) or not isinstance(seg.get("blocks", []), list):
            raise ProfileFileError(f"{where}: every segment must be a dict with a blocks list")
    return {str(k): v for k, v in data.items()} if isinstance(data, Mapping) else {}


def snapshot_devices(snapshot: Mapping[str, Any]) -> list[int]:
    """CUDA device indices with trace entries or segments, ascending."""
    inner = snapshot.get("snapshot", snapshot)
    found = {i for i, trace in enumerate(inner.get("device_traces") or []) if trace}
    found |= {int(s.get("device", 0)) for s in inner.get("segments") or []}
    return sorted(found)


def _device_index(device: int | str | None, available: Sequence[int], where: str) -> int:
    if device is None:
        if len(available) > 1:
            names = ", ".join(f"cuda:{i}" for i in available)
            raise ProfileFileError(
                f"{where} holds several devices ({names}): pass device= to pick one, or use "
                "profiles_from_snapshot for all of them"
            )
        return available[0] if available else 0
    if isinstance(device, str):
        m = re.fullmatch(r"(?:cuda:)?(\d+)", device.strip())
        if m is None:
            raise ProfileFileError(f"device {device!r}: expected 'cuda:N' or an index")
        device = int(m[1])
    if device not in available:
        names = ", ".join(f"cuda:{i}" for i in available) or "none"
        raise ProfileFileError(f"{where} holds no cuda:{device} (devices with memory: {names})")
    return device


def profile_from_snapshot_source(
    source: str | Path | Mapping[str, Any],
    *,
    device: int | str | None = None,
    stream: bool | None = None,
    progress: Callable[[int], None] | None = None,
) -> Profile:
    """The Profile of one device of a snapshot (a path, or a ``_snapshot()`` dict).

    ``device``: an index or ``"cuda:N"``; ``None`` takes the only device that holds memory
    and refuses a snapshot with several (their traces are separate runs of separate
    allocators, so they are never merged). ``stream``: read a pickle with the streaming reader
    (None: when it is at least ``STREAM_MIN_BYTES``); ``progress`` is then called with the
    bytes read so far, every 16 MiB.
    """
    if isinstance(source, Mapping):
        where = "the snapshot"
        data = _check_snapshot(source, where)
    else:
        where = str(source)
        if stream if stream is not None else _is_big_pickle(Path(source)):
            try:
                return _from_stream(Path(source), device, progress)
            except UnsupportedPickle:
                pass  # an old text-protocol pickle: read it whole
        data = load_snapshot(source)
    index = _device_index(device, snapshot_devices(data), where)
    return _convert(data, index, where)


def _is_big_pickle(path: Path) -> bool:
    """A pickle of at least STREAM_MIN_BYTES (smaller ones load faster whole, in C)."""
    try:
        with _open_maybe_gzip(path) as fh:
            if fh.read(1) != b"\x80":
                return False
        return path.stat().st_size >= STREAM_MIN_BYTES
    except (OSError, ProfileFileError):  # load_snapshot says what is wrong with the file
        return False


def _from_stream(
    path: Path, device: int | str | None, progress: Callable[[int], None] | None = None
) -> Profile:
    """Read with :mod:`.stream` (trace entries straight to columns)."""
    where = str(path)
    try:
        with _open_maybe_gzip(path) as fh:
            rest, traces = read_snapshot_stream(fh, progress)
    except ProfileFileError as exc:
        raise ProfileFileError(f"{where}: {exc}") from None
    except OSError as exc:
        raise ProfileFileError(f"{where}: cannot read the file ({exc.strerror or exc})") from exc
    except (EOFError, zlib.error) as exc:  # a gzip file cut short or damaged
        raise ProfileFileError(f"{where}: cannot read the file ({exc})") from exc
    except OverflowError as exc:  # a number past the int64 columns
        raise ProfileFileError(f"{where}: {_TOO_LARGE} ({exc})") from exc
    if EXTENSION in rest or isinstance(rest.get("snapshot"), Mapping):
        raise UnsupportedPickle("written by jupyter_vram: read it whole")
    columns = [t if isinstance(t, TraceColumns) else columns_from_trace(t) for t in traces]
    found = {i for i, c in enumerate(columns) if len(c)}
    found |= {int(s.get("device", 0)) for s in rest.get("segments") or [] if isinstance(s, Mapping)}
    index = _device_index(device, sorted(found), where)
    cols = columns[index] if index < len(columns) else TraceColumns()
    try:
        return _infer_categories(profile_from_columns(cols, rest, index), False)
    except ProfileFileError as exc:
        raise ProfileFileError(f"{where}: {exc}") from exc


def profiles_from_snapshot(source: str | Path | Mapping[str, Any]) -> dict[str, Profile]:
    """One Profile per device of a snapshot: ``{"cuda:0": ..., "cuda:1": ...}``."""
    data = source if isinstance(source, Mapping) else load_snapshot(source)
    data = _check_snapshot(data, "the snapshot")
    return {f"cuda:{i}": _convert(data, i, "the snapshot") for i in snapshot_devices(data)}


#: What an entry too large for 64 bits says (Python ints have no limit; the columns do).
_TOO_LARGE = "a size, address or time in the snapshot is too large"


def _convert(data: Mapping[str, Any], index: int, where: str) -> Profile:
    try:
        inner = data["snapshot"] if isinstance(data.get("snapshot"), Mapping) else data
        traces = inner.get("device_traces") or []
        check_numbers(*trace_numbers(traces[index] if index < len(traces) else []))
        if isinstance(data.get("snapshot"), Mapping):  # the recorder's raw form
            return profile_from_snapshot(
                data["snapshot"],
                device_index=index,
                baseline=data.get("baseline"),
                roles=_raw_roles(data),
                modules=data.get("modules") or ("",),
                max_entries=data.get("max_entries"),
                boundary=data.get("boundary") or (),
            )
        ext = data.get(EXTENSION)
        if isinstance(ext, Mapping) and ext.get("version") == _EXTENSION_VERSION:
            return _from_written(data, ext, index)
        return _from_foreign(data, index)
    except ProfileFileError as exc:
        raise ProfileFileError(f"{where}: {exc}") from exc
    except OverflowError as exc:
        raise ProfileFileError(f"{where}: {_TOO_LARGE} ({exc})") from exc
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise ProfileFileError(
            f"{where}: snapshot entries are malformed ({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc


def _raw_roles(data: Mapping[str, Any]) -> list[tuple[int, int, int, int]]:
    """The raw form's roles, their categories in this version's table: a dump names its table
    (``category_names``); one made before the table grew is in the legacy table."""
    remap = category_remap(_category_names(data))
    out = []
    for r in data.get("roles") or ():
        addr, cat, module, marker = (int(v) for v in r[:4])
        known = int(remap[cat]) if 0 <= cat < len(remap) else CATEGORY_INDEX["other"]
        out.append((addr, known, module, marker))
    return out


def _category_names(data: Mapping[str, Any]) -> Sequence[str]:
    names = data.get("category_names") or LEGACY_CATEGORIES
    if not isinstance(names, (list, tuple)) or not all(isinstance(c, str) for c in names):
        raise ProfileFileError("the snapshot's category names are not strings")
    return names


# -- snapshots dumped elsewhere ----------------------------------------------------------------


def _from_foreign(snapshot: Mapping[str, Any], index: int) -> Profile:
    traces = snapshot.get("device_traces") or []
    trace = traces[index] if index < len(traces) else []
    if any(_LABEL.fullmatch(str(e.get("user_metadata") or "")) for e in trace[:1000]):
        # dumped from a jupyter_vram recording: its labels name phases and ops
        return _infer_categories(profile_from_snapshot(snapshot, device_index=index), True)
    cols = columns_from_trace(trace)
    return _infer_categories(profile_from_columns(cols, snapshot, index), False)


def _phase_at(prof: Profile, seqs: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The phase of the latest allocation at or before each sequence number."""
    a = prof.allocations
    made = a.alloc_seq >= 0
    order = np.argsort(a.alloc_seq[made], kind="stable")
    at = a.alloc_seq[made][order]
    phases = a.phase[made][order]
    i = np.searchsorted(at, seqs, side="right") - 1
    return np.where(i >= 0, phases[np.maximum(i, 0)], OTHER_PHASE)


def _infer_categories(prof: Profile, labelled: bool) -> Profile:
    """Categories from phase and lifetime (see the module docstring)."""
    a = prof.allocations
    if len(a) == 0:
        return prof
    made = a.alloc_seq >= 0
    freed = a.free_seq >= 0
    free_phase = np.where(freed, _phase_at(prof, a.free_seq), -1)
    category = a.category.copy()
    rules = (
        (a.phase == FORWARD) & freed & (free_phase == BACKWARD),
        (a.phase == FORWARD) & ~freed,
        (a.phase == BACKWARD) & (~freed | (free_phase != BACKWARD)),
        (a.phase == OPTIMIZER) & ~freed,
    )
    names = ("activation", "activation", "gradient", "optimizer_state")
    for rule, name in zip(rules, names, strict=True):
        category[made & rule] = CATEGORY_INDEX[name]
    allocations = type(a)(**{**{k: getattr(a, k) for k in a.__dataclass_fields__},
                             "category": category})  # fmt: skip
    meta = {**prof.meta, "categories_inferred": True, "labels_in_snapshot": labelled}
    return prof.replace(allocations=allocations, meta=meta)


# -- snapshots written by jupyter_vram -------------------------------------------------------------


def _from_written(snapshot: Mapping[str, Any], ext: Mapping[str, Any], index: int) -> Profile:
    """Re-read a snapshot :func:`write_snapshot` made: labels from the trace, exact sizes and
    categories from the extension (keyed by trace index, which the conversion keeps as seq)."""
    modules = [str(m) for m in ext.get("modules") or [""]]
    # files from before the category table grew name none: theirs was the legacy one
    remap = category_remap(_category_names(ext)).astype(np.int64)

    def known(cat: int) -> int:
        return int(remap[cat]) if 0 <= cat < len(remap) else CATEGORY_INDEX["other"]

    # blocks live throughout have no trace entry: their roles (address-keyed) place them
    roles = [(int(r[0]), known(int(r[1])), int(r[2]), 0) for r in ext.get("roles") or ()]
    prof = profile_from_snapshot(snapshot, device_index=index, modules=modules, roles=roles)
    trace = (snapshot.get("device_traces") or [])[index]
    n = len(trace)
    sizes = np.fromiter((int(e.get("size", 0)) for e in trace), np.int64, n)
    cats = np.frombuffer(str(ext.get("categories", "")).encode(), np.uint8).astype(np.int64)
    cats = cats - ord("0")
    if len(cats) != n:
        raise ProfileFileError("the jupyter_vram entry does not match the trace's length")
    a = prof.allocations
    # A row's own trace entry: its alloc, else (made before the trace) its free.
    seq = np.where(a.alloc_seq >= 0, a.alloc_seq, a.free_seq)
    in_trace = (seq >= 0) & (seq < n)
    size = a.size.copy()
    category = a.category.copy()
    size[in_trace] = sizes[seq[in_trace]]
    ok = in_trace & (cats[np.clip(seq, 0, n - 1)] >= 0) & (cats[np.clip(seq, 0, n - 1)] < len(
        remap))  # fmt: skip
    category[ok] = remap[cats[seq[ok]]]
    fields = {k: getattr(a, k) for k in a.__dataclass_fields__}
    fields.update(size=size, category=category.astype(np.int8))
    allocations = type(a)(**fields)
    changes: dict[str, Any] = {"allocations": allocations}
    if not ext.get("reserved", True):
        changes["segments"] = SegmentEvents()
    device = ext.get("device")
    if isinstance(device, str) and device and device != prof.device:
        devices = list(prof.devices)
        if device not in devices:
            devices.append(device)
        column = np.full(len(a), devices.index(device), np.int32)
        fields = {k: getattr(allocations, k) for k in a.__dataclass_fields__}
        fields["device"] = column
        changes.update(allocations=type(a)(**fields), device=device, devices=devices)
    meta = {k: v for k, v in prof.meta.items() if k not in ("size_mismatches", "estimated_sizes")}
    changes["meta"] = {**meta, **dict(ext.get("meta") or {})}
    changes["source"] = str(ext.get("source", prof.source))
    changes["wall_ns"] = int(ext.get("wall_ns", 0))
    return prof.replace(**changes)


def snapshot_from_profile(profile: Profile) -> dict[str, Any]:
    """A ``torch.cuda.memory._snapshot()``-shaped dict of a Profile (see the module docstring).

    Events are ordered by the profile's sequence numbers; each freed allocation gets a
    ``free_requested`` and a ``free_completed`` at its free. Reserved memory: the profile's
    segment events become ``segment_alloc`` / ``segment_free`` entries; at the end, each live
    block sits in a segment of its own and one inactive segment holds the rest of what is
    reserved (so the allocator's own accounting, allocated + free == reserved, holds).
    A profile without reserved memory (a CPU run) gets no segment events.
    """
    a = profile.allocations
    rows = np.flatnonzero(a.device == profile.devices.index(profile.device))
    m = re.fullmatch(r"cuda:(\d+)", profile.device)
    index = int(m[1]) if m else 0
    writer = _TraceWriter(profile, rows)
    for seq, _, kind, i in _events(profile, rows):
        if kind in ("segment_alloc", "segment_free"):
            writer.segment(kind, i, seq)
        else:
            writer.row(kind, i)
    live = [r for r in rows.tolist() if a.free_seq[r] < 0]
    segments, has_reserved = writer.end_segments(index, live)
    traces: list[list[dict[str, Any]]] = [[] for _ in range(index)] + [writer.trace]
    roles = [[writer.addr_of[r], int(a.category[r]), int(a.module[r])] for r in live
             if a.alloc_seq[r] < 0]  # fmt: skip
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {"expandable_segments": False},
        "external_annotations": [],
        EXTENSION: {
            "version": _EXTENSION_VERSION,
            "device": profile.device,
            "source": profile.source,
            "modules": list(profile.modules),
            "categories": "".join(c if c != "-" else "/" for c in writer.categories),
            "category_names": list(CATEGORIES),
            "roles": roles,
            "reserved": has_reserved,
            "wall_ns": profile.wall_ns,
            "meta": _plain(profile.meta),
        },
    }


def _events(profile: Profile, rows: np.ndarray[Any, Any]) -> list[tuple[int, int, str, int]]:
    """(seq, order within a seq, kind, row or segment index) of every event, in order: at one
    seq a segment is mapped before an alloc, a free comes before the segment's unmap."""
    a = profile.allocations
    events: list[tuple[int, int, str, int]] = []
    for row in rows.tolist():
        if a.alloc_seq[row] >= 0:
            events.append((int(a.alloc_seq[row]), 1, "alloc", row))
        if a.free_seq[row] >= 0:
            events.append((int(a.free_seq[row]), 2, "free", row))
    seg = profile.segments
    for i in range(len(seg.seq)):
        kind = "segment_alloc" if seg.delta[i] > 0 else "segment_free"
        events.append((int(seg.seq[i]), 0 if kind == "segment_alloc" else 3, kind, i))
    events.sort()
    return events


class _TraceWriter:
    """The trace entries of one device's rows, with the category of each (``-`` for segment
    events): every row at its own synthesized address, segments at addresses of their own."""

    def __init__(self, profile: Profile, rows: np.ndarray[Any, Any]) -> None:
        self.profile = profile
        a = profile.allocations
        step = np.maximum((a.size[rows] + _ALIGN - 1) // _ALIGN * _ALIGN, _ALIGN)
        addresses = _BASE_ADDRESS + np.concatenate(([0], np.cumsum(step)[:-1])).astype(np.int64)
        self.addr_of = dict(zip(rows.tolist(), addresses.tolist(), strict=True))
        self.frame_dicts = [{"filename": f.filename, "line": f.line, "name": f.name}
                            for f in profile.frames]  # fmt: skip
        self.stack_lists: dict[int, list[dict[str, Any]]] = {}
        self.trace: list[dict[str, Any]] = []
        self.categories: list[str] = []
        self.seg_free: dict[int, list[int]] = {}  # size -> addresses of trace segments, last first
        self.seg_next = _SEGMENT_BASE

    def frames_of(self, stack: int) -> list[dict[str, Any]]:
        """A stack's frame dicts, innermost first; one list per stack, shared by its entries."""
        found = self.stack_lists.get(stack)
        if found is None:
            found = self.stack_lists[stack] = [self.frame_dicts[i] for i in reversed(
                self.profile.stacks[stack])] if stack >= 0 else []  # fmt: skip
        return found

    def entry(self, action: str, addr: int, size: int, ns: int, **extra: Any) -> None:
        time_us = max(ns, 0) // 1000
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                           "time_us": time_us, "compile_context": "N/A", **extra})  # fmt: skip

    def segment(self, kind: str, i: int, seq: int) -> None:
        """A segment event: a new address when mapped; unmapped, the last one of its size."""
        size = abs(int(self.profile.segments.delta[i]))
        ns = _ns_near(self.profile, seq)
        if kind == "segment_alloc":
            addr, self.seg_next = self.seg_next, self.seg_next + max(size, _ALIGN)
            self.seg_free.setdefault(size, []).append(addr)
        else:
            pool = self.seg_free.get(size)
            addr = pool.pop() if pool else self.seg_next
            if not pool:
                self.seg_next += max(size, _ALIGN)
        self.entry(kind, addr, size, ns, frames=[])
        self.categories.append("-")

    def row(self, kind: str, row: int) -> None:
        """A row's alloc, or its free (a ``free_requested`` and a ``free_completed``)."""
        a, ops = self.profile.allocations, self.profile.ops
        label = f"{int(a.phase[row])}|{int(a.module[row])}|{ops[int(a.op[row])]}"
        frames = self.frames_of(int(a.stack[row]))
        size = int(a.size[row])
        addr = self.addr_of[row]
        cat = chr(ord("0") + int(a.category[row]))  # one character each, also past 9
        if kind == "alloc":
            self.entry("alloc", addr, size, int(a.alloc_ns[row]), user_metadata=label,
                       frames=frames)  # fmt: skip
            self.categories.append(cat)
        else:
            ns = int(a.free_ns[row])
            for action in ("free_requested", "free_completed"):
                self.entry(action, addr, size, ns, user_metadata=label, frames=frames)
                self.categories.append(cat)

    def end_segments(self, index: int, live: list[int]) -> tuple[list[dict[str, Any]], bool]:
        """The segments at the end: one per live block, one inactive for the rest of what is
        reserved; and whether the profile has reserved memory at all."""
        a, seg = self.profile.allocations, self.profile.segments
        segments: list[dict[str, Any]] = []
        for r in live:
            size = int(a.size[r])
            frames = self.frames_of(int(a.stack[r]))
            block = {"address": self.addr_of[r], "size": size, "requested_size": size,
                     "state": "active_allocated", "frames": frames}  # fmt: skip
            segments.append(_segment(index, self.addr_of[r], size, size, [block]))
        has_reserved = len(seg.seq) > 0 or seg.baseline > 0
        live_bytes = sum(int(a.size[r]) for r in live)
        reserved_end = seg.baseline + int(seg.delta.sum()) if has_reserved else live_bytes
        spare = reserved_end - live_bytes
        if spare > 0:
            block = {"address": self.seg_next, "size": spare, "requested_size": 0,
                     "state": "inactive", "frames": []}  # fmt: skip
            segments.append(_segment(index, self.seg_next, spare, 0, [block]))
        return segments, has_reserved


def _segment(device: int, address: int, total: int, allocated: int,
             blocks: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    return {"device": device, "address": address, "total_size": total,
            "allocated_size": allocated, "active_size": allocated, "requested_size": allocated,
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": blocks}  # fmt: skip


def _ns_near(profile: Profile, seq: int) -> int:
    """The time of the allocation event at or just before ``seq`` (segments carry none)."""
    a = profile.allocations
    before = a.alloc_seq <= seq
    return int(a.alloc_ns[before].max(initial=0))


def _plain(value: Any) -> Any:
    """JSON-like data only, so the snapshot unpickles under :class:`SafeUnpickler`."""
    return json.loads(json.dumps(value, default=str))


def write_snapshot(profile: Profile, path: str | Path) -> Path:
    """Pickle :func:`snapshot_from_profile` to ``path`` (what ``_dump_snapshot`` writes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        pickle.dump(snapshot_from_profile(profile), fh, protocol=4)
    return path
