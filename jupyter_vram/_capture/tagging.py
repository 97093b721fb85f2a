"""Who is allocating, and what role a tensor plays: module path, phase and category hints.

Roles come from identity, never from names: parameters and buffers of the modules that run,
their ``.grad``, the state tensors of optimizers that step, tensors autograd saves for backward
(saved-tensor hooks) and tensors passed into a top-level module. Every hook installed here is
removed in :meth:`Tagger.stop`, and nothing here holds a strong reference to a user object once
a hook returns.

One file of about 900 lines, on purpose: the profiler walk (:mod:`.profiler_read`) skips the
calls of this file's hooks and helpers by file and function name (its ``_BOOKKEEPING``), so
that what they allocate is never charged to the user; moving any of them to another module
would silently make their allocations the user's. The parts: finding tensors and the objects
that hold them (``iter_tensors`` .. ``live_objects``), the :class:`Tagger` and its hooks, the
KV-cache registry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import operator
import sys
import types
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from types import FrameType
from typing import Any, cast

import torch
from torch import nn
from torch.autograd.graph import Node
from torch.optim import Optimizer
from torch.optim import optimizer as optimizer_module
from torch.utils.hooks import RemovableHandle

from .._model import CATEGORY_INDEX, PHASE_INDEX
from .builder import Interner
from .distributed_roles import local_tensor
from .storage_watch import StorageWatch

PARAMETER = CATEGORY_INDEX["parameter"]
FROZEN_PARAMETER = CATEGORY_INDEX["frozen_parameter"]
QUANT_STATE = CATEGORY_INDEX["quant_state"]
KV_CACHE = CATEGORY_INDEX["kv_cache"]
BUFFER = CATEGORY_INDEX["buffer"]
GRADIENT = CATEGORY_INDEX["gradient"]
OPTIMIZER_STATE = CATEGORY_INDEX["optimizer_state"]
INPUT = CATEGORY_INDEX["input"]
ACTIVATION = CATEGORY_INDEX["activation"]

PHASE_OTHER = PHASE_INDEX["other"]
PHASE_FORWARD = PHASE_INDEX["forward"]
PHASE_BACKWARD = PHASE_INDEX["backward"]
PHASE_OPTIMIZER = PHASE_INDEX["optimizer"]

NODE_MODULE_KEY = "jupyter_vram.module"
RoleCallback = Callable[[torch.Tensor, int, int], None]  # tensor, category, module id


def iter_tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors inside args / outputs (tuples, lists, mappings such as model-output dicts),
    four levels deep at most. The one walker both recording and the estimator's step use."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth > 3:
        return
    elif isinstance(value, (tuple, list, Mapping)):
        # a tensor or a plain value inside is taken here: no generator each (an optimizer's
        # state is walked at every step)
        for item in value if isinstance(value, (tuple, list)) else value.values():
            if isinstance(item, torch.Tensor):
                yield item
            elif isinstance(item, (tuple, list, Mapping)):
                yield from iter_tensors(item, depth + 1)


def parameter_role(param: torch.Tensor) -> int:
    """``parameter`` for a weight that trains, ``frozen_parameter`` for one that does not."""
    return PARAMETER if param.requires_grad else FROZEN_PARAMETER


def _address(tensor: torch.Tensor) -> int:
    """A plain dense tensor's data pointer; -1 for anything else (a subclass, a sparse
    tensor, a functorch wrapper, which has no data pointer and raises)."""
    if (type(tensor) is torch.Tensor or type(tensor) is nn.Parameter) and (
        tensor.layout is torch.strided
    ):
        try:
            return int(tensor.data_ptr())
        except Exception:  # noqa: BLE001
            return -1
    return -1


def _state_tensors(opt: Optimizer) -> list[torch.Tensor]:
    """The tensors in an optimizer's state."""
    return [t for state in opt.state.values() for t in iter_tensors(state)]


#: model state noted (``Tagger._report_state``) past which the dead tensors' entries go
_PRUNE_AT = 4096
#: how deep the attributes of a quantised weight or a cache object are looked into
_STATE_DEPTH = 4
#: per class: is it a wrapper subclass (``__tensor_flatten__``: torchao-style)?
_FLATTENS: dict[type, bool] = {}


def _flattens(cls: type) -> bool:
    """Read from the classes' own dicts along the MRO: no metaclass code runs."""
    flag = _FLATTENS.get(cls)
    if flag is None:
        flag = cls not in (torch.Tensor, nn.Parameter) and any(
            "__tensor_flatten__" in type.__getattribute__(k, "__dict__")
            for k in type.__getattribute__(cls, "__mro__")
            if k is not torch.Tensor
        )
        _FLATTENS[cls] = flag
    return flag


def quantisation_parts(
    tensor: torch.Tensor, depth: int = 0
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """What a (quantised) weight holds beyond its own storage: ``(data, state)``.

    Every tensor reachable from the weight's instance attributes is state: bitsandbytes keeps
    a ``Params4bit``'s absmax and code tables (and a nested QuantState's) in
    ``weight.quant_state``, where neither ``parameters()`` nor ``buffers()`` reach them. A
    wrapper subclass (torchao-style, ``__tensor_flatten__``) has no storage of its own: the
    largest tensor it holds is the weight's data, the rest (scales, zero points) is state.
    Read through instance dicts only (no ``__tensor_flatten__`` call, no ``getattr``): the
    weight's class is user code. Modules (a weight's back-reference to its layer) and torch's
    own objects are not entered. Never raises: an odd object gives nothing.
    """
    try:
        if type(tensor) is not torch.Tensor and local_tensor(tensor) is not None:
            return [], []  # a DTensor: its memory is its local shard (see storages_of)
        attrs = _instance_dict(tensor)
        if not attrs:
            return [], []
        state = _tensors_within(list(attrs.values()), {id(tensor)})
        if not state or not _flattens(type(tensor)):
            return [], state
        largest = max(state, key=_tensor_bytes)
        state = [t for t in state if t is not largest]
        if depth < _STATE_DEPTH and _flattens(type(largest)):
            data, more = quantisation_parts(largest, depth + 1)
            return data or [largest], state + more
        return [largest], state
    except Exception:  # noqa: BLE001 - an exotic subclass: nothing we can count
        return [], []


def _tensor_bytes(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.numel()) * int(tensor.element_size())
    except Exception:  # noqa: BLE001 - no size to read
        return 0


def _tensors_within(values: list[Any], seen: set[int]) -> list[torch.Tensor]:
    """Tensors inside ``values``: containers and plain objects (not modules, not torch's own
    objects, not classes or functions), ``_STATE_DEPTH`` levels deep at most."""
    found: list[torch.Tensor] = []
    todo = [(v, 0) for v in reversed(values)]
    while todo:
        value, depth = todo.pop()
        if id(value) in seen or depth > _STATE_DEPTH or type(value) in _ATOMS:
            continue
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found.append(value)
            continue
        if isinstance(value, (nn.Module, *_OPAQUE)):
            continue
        if isinstance(value, (list, tuple, set, frozenset)):
            items = list(value)[:LARGE]
        elif isinstance(value, dict):
            items = list(value.values())[:LARGE]
        elif type(value).__module__.split(".")[0] == "torch":
            continue  # devices, dtypes, modes: never a user's state
        else:
            attrs = _instance_dict(value)
            items = list(attrs.values()) if attrs else []
        todo.extend((v, depth + 1) for v in reversed(items))
    return found


def storages_of(tensor: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages holding a tensor's data: one for strided tensors, several for sparse ones
    (indices and values), none for tensors without plain storage (wrappers, nested, meta-less)."""
    layout = tensor.layout
    try:
        if type(tensor) is not torch.Tensor and type(tensor) is not nn.Parameter:
            shard = local_tensor(tensor)  # a DTensor's memory is its local shard
            if shard is not None:
                return storages_of(shard)
        if layout == torch.strided:
            return [tensor.untyped_storage()]
        if layout == torch.sparse_coo:
            return [tensor._indices().untyped_storage(), tensor._values().untyped_storage()]
        if layout in (torch.sparse_csr, torch.sparse_bsr):
            parts = (tensor.crow_indices(), tensor.col_indices(), tensor.values())
        elif layout in (torch.sparse_csc, torch.sparse_bsc):
            parts = (tensor.ccol_indices(), tensor.row_indices(), tensor.values())
        else:
            return []
        return [t.untyped_storage() for t in parts]
    except Exception:  # noqa: BLE001 - odd tensor subclasses: nothing we can count
        return []


def device_test(device_type: str) -> Callable[[torch.Tensor], bool]:
    """Whether a tensor is on ``device_type``: its flag where torch has one (a tenth of the
    cost of ``tensor.device.type``, which makes a device object: it counts at 300k tensors)."""
    flag = {"cpu": "is_cpu", "cuda": "is_cuda", "meta": "is_meta"}.get(device_type)
    if flag is not None:
        return operator.attrgetter(flag)
    return lambda t: t.device.type == device_type


def storages_on(
    tensor: torch.Tensor, device_type: str, on_device: Callable[[torch.Tensor], bool]
) -> Sequence[torch.UntypedStorage]:
    """:func:`storages_of` on ``device_type`` (``on_device``: its :func:`device_test`). A plain
    dense tensor, nearly every one, has one storage on its own device: found without the
    general walk, its device read from the tensor."""
    if (type(tensor) is torch.Tensor or type(tensor) is nn.Parameter) and (
        tensor.layout is torch.strided
    ):
        if not on_device(tensor):
            return ()
        try:
            return (tensor.untyped_storage(),)
        except Exception:  # noqa: BLE001 - a functorch wrapper: no storage of its own
            return ()
    return [s for s in storages_of(tensor) if s.device.type == device_type]


#: tensors the namespace holds outside modules and optimizers that a recording's start notes
#: one by one (memory from before the cell; each costs a few microseconds at the start)
BASELINE_TENSORS = 50_000
#: a container longer than this is looked into only where a sample of its items reaches a
#: tensor, module or optimizer (a list of 10M ints holds none, and walking it took seconds)
LARGE = 4_096
_SAMPLE = 32
_PROBE = 512  # objects a sample's probe may visit
#: types whose values hold no tensor
_ATOMS = frozenset(
    {int, float, complex, bool, str, bytes, bytearray, type(None), range, slice, memoryview}
)
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.MethodType, str, bytes)
_END = object()
Found = tuple[list[torch.Tensor], list[nn.Module], list[Optimizer]]
#: how deep and how far a namespace walk goes by default (the walk every recording shares)
WALK_DEPTH = 3
WALK_OBJECTS = 200_000
#: a walk: what it found, the variable each was reached from, the variables it sampled
_Walk = tuple[Found, dict[int, str], list[str]]
#: what a recording's start read of the namespaces it walked, shared by all that start:
#: (kind, id of the namespace, ...) -> (the namespace itself, what was read); the namespace is
#: kept and compared, so a temporary dict made later at the same address is not taken for it
_scans: ContextVar[dict[tuple[object, ...], tuple[object, Any]] | None] = ContextVar(
    "jv_namespace_scans", default=None
)


@contextlib.contextmanager
def one_scan() -> Iterator[None]:
    """Inside, :func:`reachable_objects` walks a namespace once: what a recording's start asks
    of it (the baseline, the leak baseline, the rerun start state) shares that walk."""
    if _scans.get() is not None:  # an outer one already shares its walks
        yield
        return
    token = _scans.set({})
    try:
        yield
    finally:
        _scans.reset(token)


def storage_watch() -> StorageWatch:
    """The weak references to storages that a recording's start makes, shared by all that
    start (the leak baseline's and the recorder's); a new watch outside :func:`one_scan`."""
    cache = _scans.get()
    if cache is None:
        return StorageWatch()
    hit = cache.get(("watch",))
    if hit is None:
        hit = cache[("watch",)] = (None, StorageWatch())
    return cast(StorageWatch, hit[1])


def reachable_objects(
    namespace: Mapping[str, Any] | None,
    *,
    max_depth: int = WALK_DEPTH,
    max_objects: int = WALK_OBJECTS,
    names: dict[int, str] | None = None,
    skip: Collection[int] = (),
    sampled: list[str] | None = None,
) -> Found:
    """Tensors, modules and optimizers reachable from a namespace's variables (a notebook's,
    or a module's globals), through containers and plain objects.

    Cost is proportional to what the code can name, not to the kernel's object count (a gc
    scan of a kernel with transformers imported costs ~70 ms), nor to the length of containers
    that hold no tensor: one longer than ``LARGE`` is walked only if a sample of its items
    reaches something (its variable goes to ``sampled`` when it is skipped). No user code
    runs: containers are read as the built-in types they are, objects through their instance
    dict (never ``getattr``, ``__getattr__`` or properties). A function's locals are not read:
    ``frame.f_locals`` would pin them in a cached dict after they are deleted. Anything that
    cannot be inspected is skipped; nothing here raises. ``names``, if given, receives
    ``id(object) -> the variable it was reached from`` for what is found; objects whose id is
    in ``skip`` are neither listed nor looked into.
    """
    if namespace is None:
        return ([], [], [])
    found, found_names, found_sampled = _walk_of(namespace, max_depth, max_objects, skip)
    if names is not None:
        names.update(found_names)
    if sampled is not None:
        sampled.extend(found_sampled)
    return found[0][:], found[1][:], found[2][:]


def _walk_of(
    namespace: Mapping[str, Any], max_depth: int, max_objects: int, skip: Collection[int]
) -> _Walk:
    """The namespace's walk: the one already made while this recording starts, if any."""
    cache = _scans.get() if not skip else None
    key = ("walk", id(namespace), max_depth, max_objects)
    hit = cache.get(key) if cache is not None else None
    if hit is not None and hit[0] is namespace:
        return cast(_Walk, hit[1])
    walk: _Walk = ([], [], []), {}, []
    _walk_namespace(namespace, max_depth, max_objects, walk, skip)
    if cache is not None:
        cache[key] = (namespace, walk)
    return walk


@dataclasses.dataclass
class BareStorages:
    """The storages on one device of the first ``BASELINE_TENSORS`` tensors a namespace holds
    outside modules and optimizers (walk order; one entry per storage, ``ends[i]`` entries for
    the first i + 1 tensors). A recording's start reads them once: its baseline, the leak
    baseline and the variables' sizes share them (each read a few microseconds a tensor)."""

    storages: list[torch.UntypedStorage] = dataclasses.field(default_factory=list)
    keys: list[int] = dataclasses.field(default_factory=list)  # one per storage, not per view
    ptrs: list[int] = dataclasses.field(default_factory=list)
    sizes: list[int] = dataclasses.field(default_factory=list)
    names: list[str] = dataclasses.field(default_factory=list)  # the variable reaching it
    ends: list[int] = dataclasses.field(default_factory=list)

    def entries_of_first(self, tensors: int) -> int:
        """How many entries the first ``tensors`` tensors have."""
        n = min(tensors, len(self.ends))
        return self.ends[n - 1] if n > 0 else 0


def bare_storages(namespace: Mapping[str, Any] | None, device_type: str) -> BareStorages:
    """:class:`BareStorages` of ``namespace`` (read once while a recording starts)."""
    if namespace is None:
        return BareStorages()
    cache = _scans.get()
    key = ("storages", id(namespace), device_type)
    hit = cache.get(key) if cache is not None else None
    if hit is not None and hit[0] is namespace:
        return cast(BareStorages, hit[1])
    (tensors, _, _), names, _ = _walk_of(namespace, WALK_DEPTH, WALK_OBJECTS, ())
    tensors = tensors[:BASELINE_TENSORS]
    held = _plain_storages(tensors, device_type)
    if held is None:
        held = _each_tensors_storages(tensors, device_type)
    held.names = _names_of_entries(tensors, held.ends, names)
    if cache is not None:
        cache[key] = (namespace, held)
    return held


def _plain_storages(tensors: list[torch.Tensor], device_type: str) -> BareStorages | None:
    """The storages of tensors that are all plain, dense and on ``device_type`` (nearly every
    list of them), read in C loops; None where one is not."""
    plain = {torch.Tensor, nn.Parameter}
    try:
        if not set(map(type, tensors)) <= plain:
            return None
        if set(map(operator.attrgetter("layout"), tensors)) - {torch.strided}:
            return None
        if not all(map(device_test(device_type), tensors)):
            return None
        storages = list(map(torch.Tensor.untyped_storage, tensors))
        return BareStorages(
            storages,
            list(map(operator.attrgetter("_cdata"), storages)),
            list(map(torch.UntypedStorage.data_ptr, storages)),
            list(map(torch.UntypedStorage.nbytes, storages)),
            ends=list(range(1, len(storages) + 1)),
        )
    except Exception:  # noqa: BLE001 - a functorch wrapper (no storage of its own): one by one
        return None


def _each_tensors_storages(tensors: list[torch.Tensor], device_type: str) -> BareStorages:
    held = BareStorages()
    on_device = device_test(device_type)
    for tensor in tensors:
        try:
            storages = storages_on(tensor, device_type, on_device)
            read = [(s, s._cdata, s.data_ptr(), s.nbytes()) for s in storages]
        except Exception:  # noqa: BLE001 - an odd tensor: nothing we can count
            read = []
        for storage, key, ptr, size in read:
            held.storages.append(storage)
            held.keys.append(key)
            held.ptrs.append(ptr)
            held.sizes.append(size)
        held.ends.append(len(held.keys))
    return held


def _names_of_entries(
    tensors: list[torch.Tensor], ends: list[int], names: Mapping[int, str]
) -> list[str]:
    """The variable each entry's tensor was reached from."""
    per_tensor = list(map(names.get, map(id, tensors), itertools.repeat("?")))
    if ends == list(range(1, len(ends) + 1)):  # a storage each
        return per_tensor
    out: list[str] = []
    start = 0
    for name, end in zip(per_tensor, ends, strict=True):
        out.extend([name] * (end - start))
        start = end
    return out


def names_from(tensors: Sequence[Any], start: int, names: Mapping[int, str]) -> set[str]:
    """The variables the walk reached ``tensors[start:]`` from (``tensors`` and ``names`` as
    :func:`reachable_objects` gives them). The walk takes one variable whole before the next,
    so each variable's tensors are one run: found by doubling steps, then halving, a few
    lookups a variable (one by one, a list of 250,000 tensors past the cap took 30 ms)."""

    def name_at(i: int) -> str:
        return names.get(id(tensors[i]), "?")

    found: set[str] = set()
    n = len(tensors)
    i = start
    while i < n:
        name = name_at(i)
        found.add(name)
        last, step = i, 1  # name_at(last) == name
        while last + step < n and name_at(last + step) == name:
            last += step
            step *= 2
        end = min(last + step, n)  # past the run: another name there, or the end
        while end - last > 1:
            middle = (last + end) // 2
            if name_at(middle) == name:
                last = middle
            else:
                end = middle
        i = end
    return found


def _walk_namespace(
    namespace: Mapping[str, Any],
    max_depth: int,
    max_objects: int,
    walk: _Walk,
    skip: Collection[int],
) -> None:
    found, names, sampled = walk
    seen: set[int] = set(skip)
    kind_of = _KindCache()
    budget = max_objects
    try:  # newest variable first, and so on down (the order callers have always seen)
        top = [(value, str(name)) for name, value in reversed(list(namespace.items()))]
    except Exception:  # noqa: BLE001 - an exotic mapping: nothing reachable
        return
    stack: list[tuple[Iterator[Any], int, str | None]] = [(iter(top), 0, None)]
    while stack and budget > 0:
        items, depth, root = stack[-1]
        try:
            item: Any = next(items, _END)
        except Exception:  # noqa: BLE001 - changed while we read it (another thread)
            item = _END
        if item is _END:
            stack.pop()
            continue
        obj: Any
        name: str
        obj, name = item if root is None else (item, root)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        budget -= 1
        cls = type(obj)
        kind = kind_of(cls)
        if kind >= 0:
            found[kind].append(obj)
            names[id(obj)] = name
            continue
        if depth < max_depth and cls not in _ATOMS:
            if (
                (cls is list or cls is tuple)
                and len(obj) > LARGE
                and _sample_is_tensors(obj, kind_of)
            ):
                ids = _new_tensors(obj, kind_of, seen)
                if ids is not None:  # as the walk below would take them, without a visit each
                    take = min(budget, len(ids))
                    found[0].extend(obj[::-1][:take])
                    ids = ids[::-1][:take]
                    seen.update(ids)
                    names.update(dict.fromkeys(ids, name))
                    budget -= take
                    continue
            inner = _inside(obj, cls, kind_of)
            if inner is _SKIPPED:
                sampled.append(name)
            elif inner is not None:
                stack.append((inner, depth + 1, name))


_SKIPPED: Any = iter(())


def _sample_is_tensors(items: list[Any] | tuple[Any, ...], kind_of: _KindCache) -> bool:
    """Whether a large list's sampled items (as ``_inside`` samples them) are all tensors:
    only then is every item looked at (a list of 10M numbers must cost a sample, not a pass)."""
    step = max(1, len(items) // _SAMPLE)
    try:
        return all(kind_of(type(items[i])) == 0 for i in (*range(0, len(items), step), -1))
    except IndexError:  # changed while we read it (another thread)
        return False


def _new_tensors(
    items: list[Any] | tuple[Any, ...], kind_of: _KindCache, seen: set[int]
) -> list[int] | None:
    """The ids of a large list's items when every item is a tensor, none seen before and none
    twice (a notebook's list of 300,000 tensors: walked one by one, each cell's start and end
    cost a quarter second); None otherwise."""
    try:
        if any(kind_of(cls) != 0 for cls in set(map(type, items))):
            return None
        ids = list(map(id, items))
        if len(set(ids)) != len(ids) or not seen.isdisjoint(ids):
            return None
        return ids
    except Exception:  # noqa: BLE001 - changed while we read it (another thread)
        return None


def _inside(obj: Any, cls: type, kind_of: _KindCache) -> Iterator[Any] | None:
    """What ``obj`` holds, to walk (None: nothing; ``_SKIPPED``: a large container whose
    sample reaches no tensor, module or optimizer)."""
    values: Any
    try:
        if cls is list or cls is tuple:
            n = len(obj)
            if n > LARGE and not _probe([obj[i] for i in range(0, n, n // _SAMPLE)], kind_of):
                return cast(Iterator[Any], _SKIPPED)
            return cast(Iterator[Any], reversed(obj))
        if cls is dict:
            values = obj.values()
        elif cls is set or cls is frozenset:
            values = obj
        elif issubclass(cls, _OPAQUE):
            return None
        else:
            attrs = _instance_dict(obj)
            return reversed(list(attrs.values())) if attrs is not None else None
        if len(values) > LARGE and not _probe(list(itertools.islice(values, _SAMPLE)), kind_of):
            return cast(Iterator[Any], _SKIPPED)
        items: list[Any] | Iterable[Any] = list(values) if len(values) <= LARGE else values
        return reversed(items) if isinstance(items, list) else iter(items)
    except Exception:  # noqa: BLE001 - exotic containers: skip
        return None


def _instance_dict(obj: Any) -> dict[str, Any] | None:
    """An object's own attributes, read without running its code (``object.__getattribute__``
    calls no ``__getattr__`` and no property of the class but one named ``__dict__``)."""
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - no instance dict (slots, C types)
        return None
    return attrs if type(attrs) is dict else None


def _probe(sample: list[Any], kind_of: _KindCache) -> bool:
    """Whether these items (a large container's sample) reach a tensor, module or optimizer
    within a few levels."""
    todo = [(item, 0) for item in sample]
    visits = _PROBE
    while todo and visits:
        obj, depth = todo.pop()
        visits -= 1
        cls = type(obj)
        if kind_of(cls) >= 0:
            return True
        if depth < 2 and cls not in _ATOMS:
            inner = _inside(obj, cls, kind_of)
            if inner is not None and inner is not _SKIPPED:
                todo.extend((item, depth + 1) for item in itertools.islice(inner, _SAMPLE))
    return False


def live_objects() -> tuple[list[torch.Tensor], list[nn.Module], list[Optimizer]]:
    """Every tensor, module and optimizer the garbage collector can see right now.

    Classifies by exact type through a per-type cache: a kernel holds hundreds of thousands of
    objects, and a plain isinstance() on each costs several times more.
    """
    found: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    kind_of = _KindCache()
    for obj in gc.get_objects():
        kind = kind_of(type(obj))
        if kind >= 0:
            found[kind].append(obj)
    return found


class _KindCache:
    """0 tensor, 1 module, 2 optimizer, -1 anything else; decided once per type."""

    def __init__(self) -> None:
        self._kinds: dict[type, int] = {}

    def __call__(self, cls: type) -> int:
        kind = self._kinds.get(cls)
        if kind is None:
            kind = self._kinds[cls] = _kind_of(cls)
        return kind


def _kind_of(cls: type) -> int:
    try:
        if issubclass(cls, torch.Tensor):
            return 0
        if issubclass(cls, nn.Module):
            return 1
        if issubclass(cls, Optimizer):
            return 2
    except TypeError:
        pass
    return -1


class Tagger:
    """Hooks that tell the recorder the module, phase and role behind each allocation.

    Only process-wide hooks are used (global module and optimizer hooks, default saved-tensor
    hooks): nothing is attached to a user object, so pickling, ``copy.deepcopy``, TorchScript
    and ``torch.save`` of a model never see us.

    ``saved_hooks``: ``"global"`` keeps saved-tensor hooks on for the whole recording;
    ``"per_call"`` pushes them when a top-level module call starts and pops them when an
    optimizer steps, the call's output needs no gradient, or recording stops (not inside
    backward: the engine runs on a copy of the thread's hook stack), and only when no other
    saved-tensor hooks are active and they are not disabled:
    ``torch.func`` transforms refuse to run under them, and a user's own ``save_on_cpu`` must
    keep working.
    ``on_enter`` / ``on_exit`` are called around every module call (recorders mark ranges).
    ``on_step(module id)`` is called as a top-level module call begins; True means the steps
    repeat (see ``steady``): every hook goes but one that watches module calls, and the call
    goes untagged. That one asks ``on_wake()`` at the next call of the same module (or of any
    module once ``wake_any`` is set) whether to put them all back, and tags that call.
    ``on_engine_call(True)`` / ``on_engine_call(False)`` are called as an optimizer step or a
    backward (seen at its first saved tensor) begins and ends: recorders sample the line that
    called it.
    ``tag_graph``: mark the autograd nodes each module call created, for recorders that ask
    for the module of a backward op while it runs.
    """

    def __init__(
        self,
        on_role: RoleCallback,
        modules: Interner,
        *,
        saved_hooks: str = "global",
        on_enter: Callable[[int], None] | None = None,
        on_exit: Callable[[], None] | None = None,
        on_step: Callable[[int], bool] | None = None,
        on_wake: Callable[[], bool] | None = None,
        on_engine_call: Callable[[bool], None] | None = None,
        tag_graph: bool = True,
    ) -> None:
        self._on_role = on_role
        self._modules = modules
        self._names: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()
        #: module path -> class name (``Sequential.3`` -> ``Conv2d``), for the profile's meta
        self.module_types: dict[str, str] = {}
        # id -> (weakref, name id): the per-call lookup without building a weakref each time
        self._fast_names: dict[int, tuple[weakref.ref[nn.Module], int]] = {}
        self._params = _WeakTensorMap()  # parameter -> owning module id
        #: id -> (the tensor, its address, its role) of model state noted (``_report_state``)
        self._reported: dict[int, tuple[weakref.ref[torch.Tensor], int, int]] = {}
        self._prune_at = _PRUNE_AT  # past this many, the entries of dead tensors go
        #: (optimizer id, what) -> the tensors and addresses of its last report (``_unchanged``)
        self._last_reports: dict[
            tuple[int, str], tuple[list[weakref.ref[torch.Tensor]], list[int]]
        ] = {}
        self._optimizers: weakref.WeakSet[Optimizer] = weakref.WeakSet()
        self.module_stack: list[int] = []
        self._first_node_seq: list[int] = []
        self._holding = False  # our per-call saved-tensor hooks are on the stack
        self.optimizer_depth = 0
        self.optimizer_module = 0
        self.forward_sticky = False
        self.backward_task = -1
        self._handles: list[RemovableHandle] = []
        self._saved_hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._per_call = saved_hooks == "per_call"
        self._on_enter = on_enter
        self._on_exit = on_exit
        self._on_step = on_step
        self._on_wake = on_wake
        self._on_engine_call = on_engine_call
        self._step_module: weakref.ref[nn.Module] | None = None  # while steps repeat
        self.wake_any = False
        self._tag_graph_enabled = tag_graph

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        for handle in self._handles:  # the watch of repeating steps, if on
            handle.remove()
        self._step_module = None
        self.wake_any = False
        self._handles = [
            nn.modules.module.register_module_forward_pre_hook(self._pre_forward),
            nn.modules.module.register_module_forward_hook(
                self._post_forward, with_kwargs=True, always_call=True
            ),
            optimizer_module.register_optimizer_step_pre_hook(self._pre_step),
            optimizer_module.register_optimizer_step_post_hook(self._post_step),
        ]
        if not self._per_call and _saved_hooks_allowed():
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._saved_hooks.__enter__()

    def stop(self) -> None:
        """Remove every hook; safe to call twice and after a failed start."""
        if self._saved_hooks is not None:
            hooks, self._saved_hooks = self._saved_hooks, None
            with contextlib.suppress(Exception):  # a user context was left open above ours
                hooks.__exit__(None, None, None)
        self._release_call_hooks(force=True)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.module_stack.clear()
        self._first_node_seq.clear()
        self._reported.clear()
        self._last_reports.clear()

    def _hold_call_hooks(self) -> None:
        """Push our saved-tensor hooks for a top-level module call, unless another context's
        hooks are active (a user's ``save_on_cpu`` must keep working) or they are disabled
        (``torch.func`` transforms refuse to run under them)."""
        if self._holding or not _saved_hooks_allowed() or _top_saved_hooks() is not None:
            return
        torch._C._autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
        self._holding = True

    def _release_call_hooks(self, *, force: bool = False) -> None:
        """Pop our saved-tensor hooks while they are on top. ``force`` (at stop) also lifts
        any user hooks a cell left open above ours and puts them back, in order."""
        if not self._holding:
            return
        above: list[tuple[Any, Any]] = []
        with contextlib.suppress(Exception):
            while True:
                top = _top_saved_hooks()
                if top is None:
                    break
                torch._C._autograd._pop_saved_tensors_default_hooks()
                if top[0] == self._pack:
                    self._holding = False
                    break
                if not force:  # not ours on top: leave the stack alone
                    torch._C._autograd._push_saved_tensors_default_hooks(*top)
                    break
                above.append(top)
        for pack, unpack in reversed(above):
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)

    # -- roles -----------------------------------------------------------------------------

    def adopt(self, modules: Iterable[nn.Module], optimizers: Iterable[Optimizer]) -> None:
        """Report the roles of tensors held by these modules (and all their submodules) and
        optimizers.

        Modules are named first (top-level ones by class name, submodules by their path), so
        parameters, buffers, gradients and optimizer state are charged to the module that owns
        the parameter. Objects that cannot be inspected (a half-constructed module, a
        ScriptModule that refuses) are skipped, never raised on.
        """
        trees: list[list[nn.Module]] = []
        inside: set[int] = set()
        for module in modules:
            try:
                subs = list(module.modules())
            except Exception:  # noqa: BLE001 - half-constructed or exotic module
                continue
            trees.append(subs)
            inside.update(id(c) for c in subs[1:])
        for subs in trees:
            if id(subs[0]) not in inside:
                self._name_tree(subs[0])
        for subs in trees:
            for module in subs:
                with contextlib.suppress(Exception):
                    self._report_module(module)
        for opt in optimizers:
            with contextlib.suppress(Exception):
                self._optimizers.add(opt)
                self._report_optimizer(opt)

    def _report_module(self, module: nn.Module) -> None:
        owner = self._names.get(module, 0)
        for p in module.parameters(recurse=False):
            self._params.add(p, owner)
            self._report_parameter(p, owner)
            if p.grad is not None:
                self._report_state(p.grad, GRADIENT, owner)
        for b in module.buffers(recurse=False):
            self._report_state(b, BUFFER, owner)
        attrs = _instance_dict(module) if _CACHE_TYPES else None
        if attrs:
            for t in cache_tensors(list(attrs.values())):
                self._on_role(t, KV_CACHE, owner)

    def _report_parameter(self, param: torch.Tensor, owner: int) -> None:
        """A weight, trainable or frozen, and what a quantised one carries beside it."""
        role = parameter_role(param)
        if not self._report_state(param, role, owner):
            return  # noted as it is already: so are the parts it carries
        data, state = quantisation_parts(param)
        for tensor in data:
            self._on_role(tensor, role, owner)
        for tensor in state:
            self._on_role(tensor, QUANT_STATE, owner)

    def _report_optimizer(self, opt: Optimizer, *, state_only: bool = False) -> None:
        """Note an optimizer's parameters, gradients and state. Each step calls this twice,
        and a step updates them in place: parameters and state that are the very tensors of
        the last report, at the same addresses, are not walked one by one again."""
        if not state_only:
            params = [p for group in opt.param_groups for p in group["params"]]
            roles = [parameter_role(p) for p in params]  # a frozen one is noted anew
            if not self._unchanged((id(opt), "params"), params, roles):
                for p in params:
                    owner = self._params.get(p)
                    self._params.add(p, owner)
                    self._report_parameter(p, owner)
            for p in params:
                if p.grad is not None:  # new tensors each step when zero_grad sets None
                    self._report_state(p.grad, GRADIENT, self._params.get(p))
        if self._unchanged((id(opt), "state"), _state_tensors(opt)):
            return
        for p, state in opt.state.items():
            owner = self._params.get(p) if isinstance(p, torch.Tensor) else 0
            for value in iter_tensors(state):
                self._report_state(value, OPTIMIZER_STATE, owner)

    def _unchanged(
        self, key: tuple[int, str], tensors: list[torch.Tensor], roles: list[int] | None = None
    ) -> bool:
        """Whether ``tensors`` are, one by one, the tensors last reported under ``key``, at
        the same addresses and in the same ``roles`` (then none needs noting again); if not,
        remembers them. Only plain tensors count as unchanged (a subclass may hold other
        tensors that change)."""
        addresses = [_address(t) for t in tensors] + (roles or [])
        last = self._last_reports.get(key)
        if (
            last is not None
            and last[1] == addresses
            and -1 not in addresses
            and all(ref() is t for ref, t in zip(last[0], tensors, strict=True))
        ):
            return True
        self._last_reports[key] = ([weakref.ref(t) for t in tensors], addresses)
        return False

    def _report_state(self, tensor: torch.Tensor, category: int, owner: int) -> bool:
        """Note a model's tensor in a role, unless this very tensor was noted in it already
        at the same address (False): each optimizer step reports the parameters, gradients
        and state it updates in place, and noting them all again cost a small training
        step more than the step itself. Only plain tensors are remembered (a subclass may
        hold other tensors that change)."""
        ptr = _address(tensor)
        plain = ptr >= 0
        if plain:
            seen = self._reported.get(id(tensor))
            if seen is not None and seen[0]() is tensor and seen[1] == ptr and seen[2] == category:
                return False
        self._on_role(tensor, category, owner)
        if plain:
            self._reported[id(tensor)] = (weakref.ref(tensor), ptr, category)
            if len(self._reported) > self._prune_at:  # each step's new gradients: bounded
                self._reported = {k: v for k, v in self._reported.items() if v[0]() is not None}
                self._prune_at = max(_PRUNE_AT, 2 * len(self._reported))
        return True

    def scan_gradients(self) -> None:
        """Report the ``.grad`` of every parameter seen so far (after backward, before step)."""
        for p, owner in self._params.items():
            if p.grad is not None:
                self._report_state(p.grad, GRADIENT, owner)

    def final_scan(self) -> None:
        self.scan_gradients()
        self.adopt((), list(self._optimizers))

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self._on_role(tensor, ACTIVATION, 0)
        return tensor

    def _unpack(self, tensor: torch.Tensor) -> torch.Tensor:
        """Saved tensors are unpacked by backward: the first one of a graph task marks its
        start (recorders without a per-op callback learn of backward here)."""
        try:
            task = torch._C._current_graph_task_id()
            if task != -1 and task != self.backward_task:
                self._backward_started(task)
        except Exception:  # noqa: BLE001 - bookkeeping must never break backward
            pass
        return tensor

    # -- phase and module ------------------------------------------------------------------

    def phase_and_module(self) -> tuple[int, int]:
        """The phase and module path id to charge an allocation made right now to."""
        if self.optimizer_depth:
            return PHASE_OPTIMIZER, self.optimizer_module
        task = torch._C._current_graph_task_id()
        if task != -1:
            if task != self.backward_task:
                self._backward_started(task)
            node = torch._C._current_autograd_node()
            module = _metadata(node).get(NODE_MODULE_KEY, 0) if node is not None else 0
            return PHASE_BACKWARD, module
        if self.module_stack:
            return PHASE_FORWARD, self.module_stack[-1]
        if _seeding_backward():
            return PHASE_BACKWARD, 0
        return (PHASE_FORWARD if self.forward_sticky else PHASE_OTHER), 0

    def _backward_started(self, task: int) -> None:
        self.backward_task = task
        self.forward_sticky = False
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_finished)
        except RuntimeError:  # not inside the engine after all: the next scan gets the grads
            return
        if self._on_engine_call is not None:
            self._on_engine_call(True)

    def _backward_finished(self) -> None:
        self.backward_task = -1
        if self._on_engine_call is not None:
            self._on_engine_call(False)
        with contextlib.suppress(Exception):
            self.scan_gradients()

    def _module_id(self, module: nn.Module) -> int:
        cached = self._fast_names.get(id(module))
        if cached is not None and cached[0]() is module:
            return cached[1]
        mid = self._names.get(module)
        if mid is not None:
            self._fast_names[id(module)] = (weakref.ref(module), mid)
            return mid
        if self.module_stack:
            # first seen as a child: a submodule created or attached after its parent was named
            parent = self._modules.names[self.module_stack[-1]]
            path = f"{parent}.{type(module).__name__}"
            mid = self._names[module] = self._modules(path)
            self.module_types[path] = type(module).__name__
            with contextlib.suppress(Exception):
                for sub in module.modules():
                    if sub is not module and sub not in self._names:
                        path = f"{parent}.{type(sub).__name__}"
                        self._names[sub] = self._modules(path)
                        self.module_types[path] = type(sub).__name__
                    self._report_module(sub)
            return mid
        self.adopt([module], ())
        return self._names.get(module, 0)

    def _name_tree(self, root: nn.Module) -> None:
        """Name a top-level module by its class and every submodule by its attribute path."""
        prefix = type(root).__name__
        for name, sub in root.named_modules():
            if sub not in self._names:
                path = f"{prefix}.{name}" if name else prefix
                self._names[sub] = self._modules(path)
                self.module_types[path] = type(sub).__name__

    def _pre_forward(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        try:
            top_level = not self.module_stack
            mid = self._module_id(module)
            # (a top-level call inside backward is a checkpoint's recompute: part of the step)
            stepping = top_level and torch._C._current_graph_task_id() == -1
            if stepping and self._on_step is not None and self._on_step(mid):
                self._watch_steps(module)
                return
            self.module_stack.append(mid)
            if self._on_enter is not None:
                self._on_enter(mid)
            first = 0
            if top_level or self._tag_graph_enabled:  # the hot path skips the walk otherwise
                # A top-level call inside backward is activation checkpointing recomputing a
                # block: its arguments are the activations the checkpoint kept, not inputs.
                role = INPUT
                if top_level and torch._C._current_graph_task_id() != -1:
                    role = ACTIVATION
                for t in iter_tensors(args):
                    if top_level:
                        self._on_role(t, role, 0)
                    if self._tag_graph_enabled and t.grad_fn is not None:
                        first = max(first, t.grad_fn._sequence_nr() + 1)
            self._first_node_seq.append(first)
            if top_level:
                self.forward_sticky = True
                if self._per_call:
                    self._hold_call_hooks()
        except Exception:  # noqa: BLE001 - bookkeeping must never break the user's forward
            pass

    def _watch_steps(self, module: nn.Module) -> None:
        """Steps repeat: every hook off but a watch for the next call of ``module``."""
        self.stop()
        self._step_module = weakref.ref(module)
        self._handles = [nn.modules.module.register_module_forward_pre_hook(self._watch)]

    def _watch(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        """While steps repeat: at a step's start (or any call, once ``wake_any``), all hooks
        back on if the recorder says so, and this call tagged as a top-level one."""
        try:
            step = self._step_module
            if not self.wake_any and (step is None or step() is not module):
                return
            if self._on_wake is None or not self._on_wake():
                return
            self.start()
        except Exception:  # noqa: BLE001 - bookkeeping must never break the user's forward
            return
        self._pre_forward(module, args)

    def _post_forward(self, module: nn.Module, args: tuple[Any, ...], *rest: Any) -> None:
        """``rest`` is (kwargs, output), or (output,) when the forward raised."""
        if not self.module_stack:
            return
        kwargs = rest[0] if len(rest) == 2 else {}
        output = rest[-1] if rest else None
        try:
            if len(self.module_stack) == 1:  # the top-level call ends
                # Keep saving roles until backward starts (a loss computed outside the model
                # saves tensors too), unless nothing here will ever be backpropagated.
                if self._holding and not any(t.requires_grad for t in iter_tensors(output)):
                    self._release_call_hooks()
                # positional inputs were reported before the call; keyword ones only reach here
                role = INPUT if torch._C._current_graph_task_id() == -1 else ACTIVATION
                for t in iter_tensors(kwargs):
                    self._on_role(t, role, 0)
                # a cache the call was given or returned (generate()'s past_key_values, a
                # forward with use_cache=True) holds its keys and values across calls
                for t in cache_tensors([kwargs, output, *args]):
                    self._on_role(t, KV_CACHE, 0)
                if _CACHE_TYPES:
                    self._report_held_caches(module)
        except Exception:  # noqa: BLE001 - bookkeeping must never break the user's forward
            pass
        module_id = self.module_stack.pop()
        first = self._first_node_seq.pop() if self._first_node_seq else 0
        try:
            if self._on_exit is not None:
                self._on_exit()
            if self._tag_graph_enabled and torch.is_grad_enabled():
                self._tag_graph(output, module_id, first)
        except Exception:  # noqa: BLE001
            pass

    def _report_held_caches(self, root: nn.Module) -> None:
        """Registered cache objects the called model's modules keep in their attributes."""
        for sub in root.modules():
            attrs = _instance_dict(sub)
            if attrs:
                for t in cache_tensors(list(attrs.values())):
                    self._on_role(t, KV_CACHE, self._names.get(sub, 0))

    @staticmethod
    def _tag_graph(output: Any, module_id: int, first_seq: int) -> None:
        """Mark autograd nodes this module call created, so backward ops can name it.

        Inner modules finish first and tag their nodes; an outer module tags only the nodes
        still untagged, and never walks past nodes created before it was called.
        """
        stack: list[Node] = [t.grad_fn for t in iter_tensors(output) if t.grad_fn is not None]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            if id(node) in seen or node._sequence_nr() < first_seq:
                continue
            seen.add(id(node))
            meta = _metadata(node)
            if NODE_MODULE_KEY not in meta:
                meta[NODE_MODULE_KEY] = module_id
            stack.extend(fn for fn, _ in node.next_functions if fn is not None)

    def _pre_step(self, opt: Optimizer, args: Any, kwargs: Any) -> None:
        self._release_call_hooks()
        self.optimizer_depth += 1
        self.forward_sticky = False
        with contextlib.suppress(Exception):  # bookkeeping must never break the user's step
            self.optimizer_module = self._modules(f"{type(opt).__name__}.step")
            self.adopt((), [opt])
        if self._on_engine_call is not None:
            self._on_engine_call(True)

    def _post_step(self, opt: Optimizer, args: Any, kwargs: Any) -> None:
        """The step made its state (on the first step); parameters and gradients were
        reported as it began, and a step updates them in place."""
        self.optimizer_depth = max(0, self.optimizer_depth - 1)
        if self._on_engine_call is not None:
            self._on_engine_call(False)
        with contextlib.suppress(Exception):  # bookkeeping must never break the user's step
            self._optimizers.add(opt)
            self._report_optimizer(opt, state_only=True)


#: Cache classes registered with :func:`register_cache` (transformers' own are known without).
_CACHE_TYPES: list[type] = []
#: per class: is it a cache (a transformers ``Cache`` or a registered type)?
_IS_CACHE: dict[type, bool] = {}


def register_cache(cache_type: type) -> type:
    """Count the tensors held by instances of ``cache_type`` as ``kv_cache``.

    transformers' ``Cache`` classes (DynamicCache, StaticCache, EncoderDecoderCache ...) are
    known already. Register your own cache class when a model keeps keys and values across
    calls in it: an instance passed to or returned by a model's call, or kept in a module's
    attribute, then counts as a cache. Returns the class, so it works as a decorator.
    """
    if not isinstance(cache_type, type):
        raise TypeError(
            f"register_cache takes a class (the type of your cache objects), not "
            f"{type(cache_type).__name__}: pass type(cache) for an instance"
        )
    if issubclass(cache_type, (torch.Tensor, nn.Module)) or cache_type in _ATOMS:
        raise TypeError(
            f"{cache_type.__name__} cannot be a cache type: a cache is an object that holds "
            "tensors (tensors, modules and plain values are counted as what they are)"
        )
    if cache_type not in _CACHE_TYPES:
        _CACHE_TYPES.append(cache_type)
        _IS_CACHE.clear()
    return cache_type


def unregister_cache(cache_type: type) -> None:
    """Undo :func:`register_cache` (an unknown class is ignored)."""
    if cache_type in _CACHE_TYPES:
        _CACHE_TYPES.remove(cache_type)
        _IS_CACHE.clear()


def is_cache(cls: type) -> bool:
    """Whether instances of ``cls`` are KV caches: a transformers ``Cache`` (by its module
    and name along the class's MRO, without importing transformers) or a registered type."""
    flag = _IS_CACHE.get(cls)
    if flag is None:
        flag = any(
            k.__name__ == "Cache" and k.__module__.startswith("transformers.")
            for k in getattr(cls, "__mro__", ())
        ) or any(issubclass(cls, k) for k in _CACHE_TYPES)
        _IS_CACHE[cls] = flag
    return flag


def cache_tensors(values: list[Any]) -> list[torch.Tensor]:
    """The tensors held by cache objects found in ``values`` (through tuples, lists and
    mappings such as a model's output, four levels deep at most); never raises."""
    found: list[torch.Tensor] = []
    try:
        todo = [(v, 0) for v in values]
        seen: set[int] = set()
        while todo:
            value, depth = todo.pop()
            cls = type(value)
            if cls in _ATOMS or isinstance(value, torch.Tensor) or id(value) in seen:
                continue
            seen.add(id(value))
            if is_cache(cls):
                found.extend(_with_wrapped(_tensors_within([value], set())))
            elif depth < 4 and isinstance(value, (tuple, list)):
                todo.extend((v, depth + 1) for v in value[:LARGE])
            elif depth < 4 and isinstance(value, Mapping):
                todo.extend((v, depth + 1) for v in list(value.values())[:LARGE])
    except Exception:  # noqa: BLE001 - bookkeeping must never break the user's forward
        return found
    return found


def _with_wrapped(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` and what their wrapper subclasses hold (a quantised cache's packed data,
    scales and shifts: the wrapper has no storage of its own)."""
    found = list(tensors)
    for tensor in tensors:
        if _flattens(type(tensor)):
            data, state = quantisation_parts(tensor)
            found.extend(data + state)
    return found


def _saved_hooks_allowed() -> bool:
    """False inside ``torch.func`` transforms (and wherever saved-tensor hooks are disabled)."""
    return torch._C._autograd._saved_tensors_hooks_get_disabled_error_message() is None


def _top_saved_hooks() -> tuple[Any, Any] | None:
    return cast(
        "tuple[Any, Any] | None", torch._C._autograd._top_saved_tensors_default_hooks(False)
    )


# `loss.backward()` creates the initial gradient (ones_like) in Python, before the engine runs.
_SEED_CODES = frozenset(
    fn.__code__ for fn in (getattr(torch.autograd, "_make_grads", None),) if fn is not None
)


def _seeding_backward(max_depth: int = 10) -> bool:
    """True while `torch.autograd.backward` is making the seed gradients of a backward pass."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(max_depth):
        if frame is None:
            return False
        if frame.f_code in _SEED_CODES:
            return True
        frame = frame.f_back
    return False


def _metadata(node: Node) -> dict[str, Any]:
    """An autograd node's free-form metadata dict (typed as a method in torch's stubs)."""
    return cast(dict[str, Any], node.metadata)


class _WeakTensorMap:
    """Tensor -> int by identity, without keeping tensors alive (weakref containers compare
    tensors with ``==``, which is elementwise)."""

    def __init__(self) -> None:
        self._refs: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}

    def add(self, tensor: torch.Tensor, value: int) -> None:
        key = id(tensor)
        entry = self._refs.get(key)
        if entry is not None and entry[0]() is tensor and (entry[1] or not value):
            return

        def forget(ref: weakref.ref[torch.Tensor], key: int = key) -> None:
            entry = self._refs.get(key)
            if entry is not None and entry[0] is ref:
                del self._refs[key]

        self._refs[key] = (weakref.ref(tensor, forget), value)

    def get(self, tensor: torch.Tensor) -> int:
        entry = self._refs.get(id(tensor))
        return entry[1] if entry is not None and entry[0]() is tensor else 0

    def items(self) -> Iterator[tuple[torch.Tensor, int]]:
        for ref, value in list(self._refs.values()):
            tensor = ref()
            if tensor is not None:
                yield tensor, value
