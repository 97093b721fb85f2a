"""Who keeps a cell's memory alive: notebook variables, ``Out[n]`` / ``_``, the last error's
traceback, closures, reference cycles, found by walking what the notebook can name.

Everything returned is plain data (storage ids, names, object ids): no tensor is kept. Roots are
walked top-down (cost proportional to what the notebook names); storages no root reaches are
looked for among the garbage collector's tensors, and what holds them with ``gc.get_referrers``.
Both searches are bounded by work, never by time (:data:`MAX_TENSORS` looked at,
:data:`MAX_SCANS` referrer scans): the same kernel state gives the same answer on a fast
machine and on a loaded one. Releasing drops the named references and nothing else, and only
when asked.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
import sys
import traceback
import types
import weakref
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

from .capacity import held_storages
from .stacks import FrameFilter, cell_name
from .tagging import (
    BASELINE_TENSORS,
    one_scan,
    reachable_objects,
    storage_watch,
    storages_of,
)

#: Garbage-collected tensors looked at for storages the notebook's names do not reach (a
#: notebook rarely holds this many; each costs microseconds).
MAX_TENSORS = 200_000
#: what stopped the search for what a run left alive (see :func:`made_by_run`)
NAMES_BOUND = "names"
COLLECTOR_BOUND = "collector"
#: ``gc.get_referrers`` calls (each one scans every object the collector tracks) spent on what
#: holds one unnamed storage, and on all of them in one search.
MAX_SCANS = 64
MAX_SCANS_IN_ALL = 256
NOT_FOUND = "not found within the search's bounds"

#: IPython's own names: not the user's variables (``_`` and ``_N`` are outputs, below).
_INTERNAL = frozenset({"In", "Out", "exit", "quit", "get_ipython", "_ih", "_oh", "_dh", "_vram"})
_OUTPUT_ALIASES = ("_", "__", "___")


@dataclass(frozen=True)
class Holder:
    """One reference that keeps memory alive: ``kind`` is variable, output, traceback,
    closure, cycle, global or unknown; ``object_id`` is ``id()`` of the object it holds."""

    kind: str
    name: str
    object_id: int = 0

    @property
    def releasable(self) -> bool:
        return self.kind in ("variable", "output", "traceback", "cycle")


@dataclass(frozen=True)
class HeldStorage:
    key: int  # the storage's id (``_cdata``), never the storage
    nbytes: int
    holders: tuple[Holder, ...]


class SizeMatcher:
    """Which of a run's never-freed allocation sizes a live storage of ``n`` bytes can be, and
    how many of each are still unclaimed. On the CPU a row is the storage's own size. On CUDA a
    row is a caching-allocator block: the request rounded up to 512 bytes, or up to 1 MiB more
    when the block kept a remainder too small to split off."""

    SLACK = 1 << 20

    def __init__(self, counts: Mapping[int, int], cuda: bool) -> None:
        self.left = {size: n for size, n in counts.items() if n > 0}
        self.cuda = cuda

    def copy(self) -> SizeMatcher:
        return SizeMatcher(self.left, self.cuda)

    def match(self, n: int) -> int | None:
        """The smallest unclaimed row size a storage of ``n`` bytes fits (None: none)."""
        if not self.cuda:
            return n if self.left.get(n, 0) > 0 else None
        low = -(-n // 512) * 512
        fits = [s for s, k in self.left.items() if k > 0 and low <= s <= low + self.SLACK]
        return min(fits) if fits else None

    def take(self, size: int) -> None:
        self.left[size] -= 1

    def empty(self) -> bool:
        return all(k <= 0 for k in self.left.values())


class RowMatcher:
    """Which of a run's never-freed allocations a live storage is. Where the capture gave the
    rows' addresses, the row allocated at the storage's address (``data_ptr``) that its bytes
    fit: exact, even among many rows of one size. Rows without an address (a capture that had
    none) are matched by size only (:class:`SizeMatcher`): a guess, said so in the leak row."""

    def __init__(self, at: Mapping[int, tuple[int, int]], sizes: SizeMatcher) -> None:
        self.at = dict(at)  # address -> (row, bytes) of the rows not yet claimed
        self.sizes = sizes  # the rows without an address, by size

    def copy(self) -> RowMatcher:
        return RowMatcher(self.at, self.sizes.copy())

    def claim(self, ptr: int, nbytes: int) -> int | None:
        """Claim the row a storage is: its row (>= 0) when one was allocated at ``ptr``, -1
        when only a size of the rows without an address fits it, None when nothing does."""
        hit = self.at.get(ptr)
        if hit is not None and 0 < nbytes <= hit[1]:  # CUDA blocks are rounded up
            del self.at[ptr]
            return hit[0]
        size = self.sizes.match(nbytes)
        if size is None:
            return None
        self.sizes.take(size)
        return -1

    def empty(self) -> bool:
        return not self.at and self.sizes.empty()


def storage_keys(namespace: Mapping[str, Any] | None, device_type: str) -> dict[int, Any]:
    """Weak references to the storages the notebook reaches now (memory from before a cell).

    Every recording calls this, so it reads no frame's locals (``frame.f_locals`` leaves a
    cached copy on the frame): memory only an old traceback holds is not in it. The namespace
    is walked as the recorder walks it (one walk, shared while a recording starts; as many
    bare tensors as it notes), and the references are the recorder's (one per storage); the
    closures of its functions are walked apart."""
    closures = {
        name: value for kind, name, value in roots(namespace, tracebacks=False) if kind == "closure"
    }
    storages = [*held_storages(namespace, device_type, limit=BASELINE_TENSORS)]
    storages += held_storages(closures, device_type, limit=BASELINE_TENSORS)
    keys = list(map(operator.attrgetter("_cdata"), storages))
    watch = storage_watch()
    watch.watch(storages, keys)
    refs = watch.refs
    return {key: refs[key] for key in keys if key in refs}


def _tracebacks() -> list[types.TracebackType]:
    found: dict[int, types.TracebackType] = {}
    candidates: list[Any] = [getattr(sys, "last_traceback", None)]
    for name in ("last_value", "last_exc"):
        candidates.append(getattr(getattr(sys, name, None), "__traceback__", None))
    shell = _shell()
    result = getattr(shell, "last_execution_result", None)
    for name in ("error_in_exec", "error_before_exec"):
        candidates.append(getattr(getattr(result, name, None), "__traceback__", None))
    for tb in candidates:
        if isinstance(tb, types.TracebackType):
            found.setdefault(id(tb), tb)
    return list(found.values())


def _shell() -> Any:
    module = sys.modules.get("IPython.core.getipython")
    return module.get_ipython() if module is not None else None


def roots(
    namespace: Mapping[str, Any] | None, *, tracebacks: bool = True
) -> Iterator[tuple[str, str, Any]]:
    """(kind, name, value) of everything the notebook names that can hold memory (with
    ``tracebacks``, the locals of the last error's frames too)."""
    if namespace is None:
        return
    items = list(namespace.items())
    outputs = namespace.get("Out")
    if isinstance(outputs, dict):
        for n, value in list(outputs.items()):
            yield "output", f"Out[{n}]", value
    for name, value in items:
        if name in _INTERNAL or not isinstance(name, str):
            continue
        if name in _OUTPUT_ALIASES or (name.startswith("_") and name[1:].isdigit()):
            yield "output", name, value
        elif isinstance(value, types.FunctionType):
            cells = value.__closure__ or ()
            for var, cell in zip(value.__code__.co_freevars, cells, strict=False):
                with contextlib.suppress(ValueError):  # an empty cell
                    yield "closure", f"{name} (free variable {var!r})", cell.cell_contents
        elif not name.startswith("_"):
            yield "variable", name, value
    if not tracebacks:
        return
    keep = FrameFilter().keep
    seen: set[int] = set()
    for tb in _tracebacks():
        walk: types.TracebackType | None = tb
        while walk is not None:
            frame = walk.tb_frame
            walk = walk.tb_next
            if id(frame) in seen or (frame.f_globals is namespace and frame.f_back is None):
                continue
            seen.add(id(frame))
            code = frame.f_code
            if code.co_name == "<module>":
                continue  # a cell's top level: its names are the notebook's variables
            if _machinery(frame):
                continue  # IPython's, the kernel's, ours: their locals are the notebook itself
            where = cell_name(code.co_filename) if keep(code.co_filename) else code.co_filename
            try:
                local_items = list(frame.f_locals.items())
            except Exception:  # noqa: BLE001 - a frame that cannot show its locals
                continue
            for var, value in local_items:
                yield "traceback", f"{code.co_name} ({where}) local {var!r}", value


#: Modules whose frames run the notebook (IPython's run_code, the kernel, our magics): a
#: traceback through them holds the shell and the namespace, never a tensor of the user's own.
_MACHINERY = ("IPython.", "ipykernel.", "jupyter_vram.", "traitlets.", "comm.", "tornado.")


def _machinery(frame: types.FrameType) -> bool:
    name = frame.f_globals.get("__name__")
    return isinstance(name, str) and name.startswith(_MACHINERY)


def tensor_objects() -> list[torch.Tensor]:
    """Every tensor the garbage collector tracks, filtered in C (``map`` / ``compress``): a
    Python loop over a notebook's few hundred thousand objects took ~0.2 s, this ~0.05 s."""
    kinds: set[type] = set()
    todo: list[type] = [torch.Tensor]
    while todo:
        kind = todo.pop()
        if kind not in kinds:
            kinds.add(kind)
            todo.extend(kind.__subclasses__())
    objects = gc.get_objects()
    try:
        return list(itertools.compress(objects, map(kinds.__contains__, map(type, objects))))
    finally:
        del objects


def made_by_run(
    namespace: Mapping[str, Any] | None,
    device_type: str,
    before: Mapping[int, Any],
    rows: RowMatcher,
    max_tensors: int = MAX_TENSORS,
    max_named: int = BASELINE_TENSORS,
) -> tuple[dict[int, Any], dict[int, int], str]:
    """Weak references (storage id -> weakref) to the storages alive as a run ends that it
    made: new since ``before`` and one of its never-freed allocations (``rows``: the one at
    the storage's address, else one of its size); and the row of each matched by address.
    Called as the run ends, so a storage made later (a same-size tensor of another cell, at
    the same address even) is never one of them.

    The notebook's names are walked first (no traceback frame's locals: see
    :func:`storage_keys`), the state of their modules and optimizers whole and their first
    ``max_named`` bare tensors, as recording's start walks them (each costs microseconds: a
    cell that keeps 300,000 tensors in a list would pay seconds); the garbage collector's
    tensors (the cell's last value, a traceback's locals, cycles) only for rows the names did
    not account for: listed in C (~0.05 s for 300,000 objects), then at most ``max_tensors``
    of them looked at (past the names' bound, a tenth of ``max_named``: what is left is then
    mostly the names' own tensors). The last item says which bound, if any, stopped the
    search (:data:`NAMES_BOUND`, :data:`COLLECTOR_BOUND`; "": every candidate was looked at)."""
    made: dict[int, Any] = {}
    exact: dict[int, int] = {}
    left = rows.copy()

    def claim(storage: Any) -> None:
        key = storage._cdata
        if key in made:
            return
        ref = before.get(key)
        if ref is not None and ref() is storage:
            return  # held before the run
        try:
            ptr = storage.data_ptr()
        except Exception:  # noqa: BLE001 - a storage without data (fake, lazy): no address
            ptr = 0
        row = left.claim(ptr, int(storage.nbytes()))
        if row is None:
            return
        try:
            made[key] = weakref.ref(storage)
        except TypeError:
            return
        if row >= 0:
            exact[key] = row

    with one_scan():  # the names' storages and their tensors: one walk
        walked = reachable_objects(namespace)[0]
        for storage in held_storages(namespace, device_type, limit=max_named):
            claim(storage)  # on the device already
    bound = NAMES_BOUND if len(walked) > max_named else ""
    if bound:  # the rows left are mostly the names' tensors past it: a look for others only
        max_tensors = min(max_tensors, max_named // 10)
    if left.empty():
        return made, exact, bound
    seen = set(map(id, walked))  # alive while ``walked`` is: looked at, or left to the bound
    tensors = tensor_objects()  # in C: bounded by the object count
    try:
        looked = 0
        for tensor in tensors:
            if id(tensor) in seen:
                continue
            looked += 1
            if looked > max_tensors:
                return made, exact, bound or COLLECTOR_BOUND
            for storage in storages_of(tensor):
                if storage.device.type == device_type:
                    claim(storage)
            if left.empty():
                break
    finally:
        del tensors, walked
    return made, exact, bound


def held(
    namespace: Mapping[str, Any] | None,
    device_type: str,
    made: Mapping[int, Any],
    max_tensors: int = MAX_TENSORS,
    max_scans: int = MAX_SCANS_IN_ALL,
) -> list[HeldStorage]:
    """The storages of ``made`` (storage id -> weakref, from :func:`made_by_run`) still alive,
    each with everything found holding it. A storage is one of them only if it is the very
    object the run left (the weakref gives it back), never another at the same id.

    The notebook's names (and the last error's frames) are walked first; for storages they do
    not reach, at most ``max_tensors`` of the garbage collector's tensors (listed in C first)
    are searched, and what holds each one found is walked with at most :data:`MAX_SCANS`
    referrer scans, ``max_scans`` in all. A storage alive that no Python object reaches is
    listed as held by something unknown (C++: an autograd graph, a library's cache)."""
    found: dict[int, tuple[int, list[Holder]]] = {}
    state = kept_state(namespace, device_type)
    made = {key: ref for key, ref in made.items() if key not in state}

    def ours(storage: Any) -> bool:
        ref = made.get(storage._cdata)
        return ref is not None and ref() is storage

    # what a holder reaches through the notebook itself (a traceback frame's ``self``, the
    # shell; a local bound to the namespace) is the notebook's names, listed as such
    notebook = _notebook_ids(namespace)
    for kind, name, value in roots(namespace):
        for storage in held_storages({"v": value}, device_type, skip=notebook):
            if ours(storage):
                entry = found.setdefault(storage._cdata, (int(storage.nbytes()), []))
                entry[1].append(Holder(kind, name, id(value)))
    alive = {key: ref() for key, ref in made.items()}
    left = {key for key, storage in alive.items() if storage is not None and key not in found}
    if not left:
        return [HeldStorage(k, n, tuple(h)) for k, (n, h) in found.items()]
    candidates: list[tuple[Any, int, int]] = []  # unnamed tensors: (tensor, storage id, bytes)
    tensors = tensor_objects()  # in C: bounded by the object count
    complete = True
    for looked, tensor in enumerate(tensors):
        if not left:
            break
        if looked >= max_tensors:
            complete = False
            break
        for storage in storages_of(tensor):
            key = storage._cdata
            if key in left and alive[key] is storage:
                left.discard(key)
                n = int(storage.nbytes())
                candidates.append((tensor, key, n))
                found[key] = (n, [])
    del tensors
    for key in left:  # alive, but no Python tensor found holding it
        storage = alive[key]
        reason = (
            "something Python cannot see (C++: an autograd graph, a library's cache)"
            if complete
            else f"{NOT_FOUND} (the first {max_tensors:,} tensors)"
        )
        found[key] = (int(storage.nbytes()), [Holder("unknown", reason, id(storage))])
    del alive
    ignore = {id(candidates)}
    scans = [max_scans]  # left for all the walks
    for i, (tensor, key, _) in enumerate(candidates):
        ignore.add(id(candidates[i]))
        found[key][1].append(_unnamed_holder(tensor, ignore, scans))
    del candidates
    return [HeldStorage(k, n, tuple(h)) for k, (n, h) in found.items()]


def _notebook_ids(namespace: Mapping[str, Any] | None) -> set[int]:
    """Ids of the notebook's own tables: its namespace, its ``Out`` history and the shell
    (which holds both, and the ``_`` aliases: what it reaches is named by them already)."""
    if namespace is None:
        return set()
    ids = {id(namespace)}
    outputs = namespace.get("Out")
    if isinstance(outputs, dict):
        ids.add(id(outputs))
    shell = _shell()
    if shell is not None:
        ids.add(id(shell))
        for name in ("user_ns_hidden", "displayhook", "history_manager"):
            part = getattr(shell, name, None)
            if part is not None:
                ids.add(id(part))
    return ids


def kept_state(namespace: Mapping[str, Any] | None, device_type: str) -> set[int]:
    """Storage ids of the state of the modules and optimizers the notebook keeps: their
    parameters, buffers, gradients and optimizer state. A run that makes them (a first
    optimizer step, a model built in the cell) leaves them to the notebook on purpose: they
    are not leaks, and releasing them would delete the user's model or optimizer."""
    return {storage._cdata for storage in held_storages(namespace, device_type, limit=0)}


def _unnamed_holder(target: Any, ignore: set[int], scans: list[int], limit: int = 2000) -> Holder:
    """What holds an object no notebook name reaches: a module global, a running frame, or
    nothing but itself (a reference cycle, which a garbage collection frees). At most
    :data:`MAX_SCANS` referrer scans, and no more than ``scans[0]`` left for all walks
    (taken from it), and ``limit`` objects seen."""
    mine = {id(sys._getframe(i)) for i in range(2)}
    globals_of = {id(vars(m)): name for name, m in list(sys.modules.items()) if m is not None}
    seen = {id(target)}
    todo = [target]
    mine_left = MAX_SCANS
    while todo:
        if mine_left <= 0 or scans[0] <= 0 or len(seen) > limit:
            return Holder("unknown", NOT_FOUND, id(target))
        mine_left -= 1
        scans[0] -= 1
        obj = todo.pop()
        for ref in gc.get_referrers(obj):
            if id(ref) in seen or id(ref) in mine or id(ref) in ignore or ref is todo:
                continue
            seen.add(id(ref))
            if id(ref) in globals_of:
                return Holder("global", f"global of module {globals_of[id(ref)]}", id(target))
            if isinstance(ref, types.FrameType):
                return _frame_holder(ref, id(target))
            todo.append(ref)
    return Holder("cycle", "a reference cycle (only garbage holds it)", id(target))


def _frame_holder(frame: types.FrameType, object_id: int) -> Holder:
    """A frame holding an object: the last error's traceback (named by its function, unless
    it is the notebook's machinery), or a function still running."""
    in_traceback = set()
    for tb in _tracebacks():
        walk: types.TracebackType | None = tb
        while walk is not None:
            in_traceback.add(id(walk.tb_frame))
            walk = walk.tb_next
    name = frame.f_code.co_name
    if id(frame) in in_traceback:
        where = "" if _machinery(frame) else f" ({name})"
        return Holder("traceback", f"the last error's traceback{where}", object_id)
    return Holder("unknown", f"a running function's locals ({name})", object_id)


def release(namespace: MutableMapping[str, Any] | None, holders: list[Holder]) -> list[str]:
    """Drop the references ``holders`` name (if they still hold the same objects); return what
    was done. Closures, globals and unknown holders are left alone (said so)."""
    done: list[str] = []
    shell = _shell()
    collect = False
    cleared_tracebacks = False
    for h in holders:
        if h.kind == "variable" and namespace is not None:
            if id(namespace.get(h.name)) == h.object_id:
                del namespace[h.name]
                done.append(f"deleted variable {h.name}")
        elif h.kind == "output" and namespace is not None:
            done.extend(_release_output(namespace, shell, h))
        elif h.kind == "traceback" and not cleared_tracebacks:
            cleared_tracebacks = True
            for tb in _tracebacks():
                traceback.clear_frames(tb)
                _sync_locals(tb)
            done.append("cleared the last error's traceback frames")
        elif h.kind == "cycle":
            collect = True
        elif h.kind in ("closure", "global", "unknown"):
            done.append(f"left {h.name}: delete or redefine it yourself")
    # Dropped references often leave the memory in reference cycles (a finished frame that
    # refers to itself keeps its callers, and their values, until the next collection).
    gc.collect()
    if collect:
        done.append("collected reference cycles (gc.collect())")
    return done


def _sync_locals(tb: types.TracebackType | None) -> None:
    """Python 3.11's ``frame.clear()`` leaves the frame's cached ``f_locals`` dict (made when
    its locals were read) holding the old values; reading ``f_locals`` again drops them."""
    while tb is not None:
        with contextlib.suppress(Exception):
            tb.tb_frame.f_locals  # noqa: B018 - read for its effect
        tb = tb.tb_next


def _release_output(namespace: MutableMapping[str, Any], shell: Any, h: Holder) -> list[str]:
    """An output and every alias of it: ``Out[n]``, ``_n``, ``_`` / ``__`` / ``___`` (also
    kept in IPython's hidden names, on its display hook and its last execution result)."""
    done: list[str] = []
    outputs = namespace.get("Out")
    if isinstance(outputs, dict):
        for n in [n for n, v in outputs.items() if id(v) == h.object_id]:
            del outputs[n]
            done.append(f"cleared Out[{n}]")
            if id(namespace.get(f"_{n}")) == h.object_id:
                del namespace[f"_{n}"]
    for name in [k for k, v in list(namespace.items()) if id(v) == h.object_id]:
        if name in _OUTPUT_ALIASES or (name.startswith("_") and name[1:].isdigit()):
            namespace[name] = ""
            done.append(f"cleared {name}")
    hidden = getattr(shell, "user_ns_hidden", None)  # IPython keeps the aliases here too
    if isinstance(hidden, dict):
        for name in [k for k, v in list(hidden.items()) if id(v) == h.object_id]:
            del hidden[name]
    hook = getattr(shell, "displayhook", None)
    for name in _OUTPUT_ALIASES:
        if hook is not None and id(getattr(hook, name, None)) == h.object_id:
            setattr(hook, name, "")
    result = getattr(shell, "last_execution_result", None)
    if result is not None and id(getattr(result, "result", None)) == h.object_id:
        result.result = None
    return done
