"""Notebook state a rerun could change, copied to host memory and put back in place.

A rerun runs a cell a second time; everything the cell can touch must be as the first run
left it afterwards. What is protected: for every ``nn.Module`` and optimizer reachable from
the namespace, the parameters (values, ``requires_grad``, the ``Parameter`` objects a module
holds), buffers (BatchNorm running statistics), ``.grad``, train/eval mode, the optimizer's
state (all tensors, step counters) and ``param_groups``; LR schedulers and gradient scalers
(their ``state_dict``); tensors the cell names; the torch (CPU and CUDA), Python ``random``
and numpy random streams. Copies live in host memory so they do not show in a device
measurement. Restoring writes values back into the same tensors (``copy_``) wherever their
shape, dtype and device are unchanged, and rebinds only what the cell replaced.

Device tensors the cell frees are not kept alive here (no reference to a ``.grad`` or an
optimizer state tensor is held while the cell runs): a rerun that calls ``zero_grad()`` frees
the gradients as the first run did. Their values come back from the host copies.
"""

from __future__ import annotations

import random
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim import Optimizer

from .._capture.tagging import reachable_objects
from .checkpointing import SWITCH_ATTRS


@dataclass(frozen=True)
class RandomState:
    """The torch CPU / CUDA, Python ``random`` and numpy global random streams."""

    torch_cpu: torch.Tensor
    torch_cuda: tuple[torch.Tensor, ...]  # one per device; () when CUDA is not initialized
    python: Any
    numpy: Any

    @classmethod
    def take(cls) -> RandomState:
        cuda: tuple[torch.Tensor, ...] = ()
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            cuda = tuple(torch.cuda.get_rng_state_all())
        return cls(torch.get_rng_state(), cuda, random.getstate(), np.random.get_state())

    def put(self) -> None:
        """Set every stream back to this state."""
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda:
            torch.cuda.set_rng_state_all(list(self.torch_cuda))
        random.setstate(self.python)
        np.random.set_state(self.numpy)


@dataclass(frozen=True)
class StartState:
    """What a cell started from, taken cheaply before every `%%vram` run (no tensor copies):
    the random streams, the variables that existed, the parameters without ``.grad`` and the
    parameters each optimizer held state for. A rerun starts from the same point (:meth:`put`),
    so the first run's gradients, optimizer state and bindings do not sit in its measurement.
    """

    random: RandomState
    names: frozenset[str]
    no_grad: tuple[weakref.ref[torch.Tensor], ...]
    with_grad: tuple[weakref.ref[torch.Tensor], ...]
    optimizer_state: tuple[tuple[weakref.ref[Optimizer], frozenset[int]], ...]

    @classmethod
    def take(cls, namespace: Mapping[str, Any]) -> StartState:
        modules, optimizers = protected_objects(namespace)
        no_grad: list[weakref.ref[torch.Tensor]] = []
        with_grad: list[weakref.ref[torch.Tensor]] = []
        seen: set[int] = set()
        for module in modules:
            for param in module._parameters.values():
                if param is not None and id(param) not in seen:
                    seen.add(id(param))
                    (no_grad if param.grad is None else with_grad).append(weakref.ref(param))
        states = tuple(
            (weakref.ref(opt), frozenset(id(p) for p in opt.state)) for opt in optimizers
        )
        return cls(
            RandomState.take(), frozenset(namespace), tuple(no_grad), tuple(with_grad), states
        )

    def put(self, namespace: dict[str, Any], bound: frozenset[str]) -> list[str]:
        """Drop what the first run created (gradients, optimizer state, the names in
        ``bound`` it added to ``namespace``, a copy), give back zero gradients it started with
        and no longer exist, and set the random streams; returns what changed, in words.
        Call only with a :class:`StateCopy` taken, to restore."""
        dropped: list[str] = []
        grads = 0
        for ref in self.no_grad:
            param = ref()
            if param is not None and param.grad is not None:
                param.grad = None
                grads += 1
        if grads:
            dropped.append(f"without the .grad of {grads} parameters")
        zeros = 0
        for ref in self.with_grad:  # the first run started with them: same memory, zeros
            param = ref()
            if param is not None and param.grad is None:
                param.grad = torch.zeros_like(param)
                zeros += 1
        if zeros:
            dropped.append(f"with a zero .grad for {zeros} parameters that had one")
        for opt_ref, had in self.optimizer_state:
            opt = opt_ref()
            if opt is None:
                continue
            new = [p for p in opt.state if id(p) not in had]
            for p in new:
                del opt.state[p]
            if new:
                dropped.append(f"without {type(opt).__name__} state of {len(new)} parameters")
        names = sorted(n for n in bound if n in namespace and n not in self.names)
        for name in names:
            del namespace[name]
        if names:
            dropped.append("without the names " + ", ".join(names))
        self.random.put()
        return dropped


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy in host memory, detached (a CPU tensor is cloned: the original may change)."""
    return tensor.detach().to("cpu", copy=True)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype


def _put_values(target: torch.Tensor, saved: torch.Tensor) -> None:
    """Write ``saved`` into ``target`` in place, bypassing autograd and version checks."""
    with torch.no_grad():
        target.data.copy_(saved)


@dataclass
class _TensorCopy:
    """A tensor's values and where it lived; restored into whatever holds its place then."""

    values: torch.Tensor
    device: torch.device

    @classmethod
    def of(cls, tensor: torch.Tensor) -> _TensorCopy:
        return cls(_host_copy(tensor), tensor.device)

    def into(self, current: torch.Tensor | None) -> torch.Tensor:
        """``current`` with the saved values (in place), or a new tensor when it cannot be."""
        if (
            current is not None
            and _same_layout(current, self.values)
            and current.device == self.device
        ):
            _put_values(current, self.values)
            return current
        return self.values.to(self.device, copy=True)


@dataclass
class _ParameterState:
    parameter: nn.Parameter
    values: _TensorCopy
    requires_grad: bool
    grad: _TensorCopy | None


@dataclass
class _ModuleState:
    module: nn.Module
    training: bool
    parameters: dict[str, nn.Parameter | None]
    buffers: dict[str, torch.Tensor | None]
    children: dict[str, nn.Module | None]
    buffer_values: dict[str, _TensorCopy]
    instance_attrs: dict[str, Any]  # forward / checkpointing switches set on the instance


_MISSING = object()


@dataclass
class _OptimizerState:
    optimizer: Optimizer
    state: dict[torch.Tensor, dict[str, Any]]  # param -> key -> _TensorCopy or a plain value
    groups: list[dict[str, Any]]  # each group's settings (params as the list object + items)
    group_params: list[list[torch.Tensor]]


#: a tensor the cell names: the tensor, its values, requires_grad, its .grad's values
_NamedTensor = tuple[torch.Tensor, _TensorCopy, bool, _TensorCopy | None]


@dataclass
class StateCopy:
    """Everything copied before a rerun; :meth:`restore` puts it back."""

    parameters: list[_ParameterState] = field(default_factory=list)
    modules: list[_ModuleState] = field(default_factory=list)
    optimizers: list[_OptimizerState] = field(default_factory=list)
    stateful: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    named_tensors: list[_NamedTensor] = field(default_factory=list)
    random: RandomState | None = None
    configs: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    host_bytes: int = 0
    seconds: float = 0.0

    def restore(self) -> None:
        """Put everything back. Every item is restored even if another fails; the first error
        is raised at the end, so one odd object never leaves the others half-done."""
        errors: list[BaseException] = []
        steps: list[tuple[Callable[[Any], None], Any]] = [
            *((self._restore_module, m) for m in self.modules),
            *((self._restore_parameter, p) for p in self.parameters),
            *((self._restore_optimizer, o) for o in self.optimizers),
            *((self._restore_stateful, s) for s in self.stateful),
            *((self._restore_named, n) for n in self.named_tensors),
            *((self._restore_config, c) for c in self.configs),
        ]
        for restore_one, item in steps:
            try:
                restore_one(item)
            except Exception as error:  # noqa: BLE001 - restore the rest, report the first
                errors.append(error)
        if self.random is not None:
            self.random.put()
        if errors:
            raise errors[0]

    def _restore_module(self, m: _ModuleState) -> None:
        module = m.module
        for attr, saved in (
            (module._parameters, m.parameters),
            (module._buffers, m.buffers),
            (module._modules, m.children),
        ):
            if list(attr) != list(saved) or any(attr[k] is not v for k, v in saved.items()):
                attr.clear()
                attr.update(saved)  # type: ignore[arg-type]
        for name, copy in m.buffer_values.items():
            buffer = module._buffers.get(name)
            restored = copy.into(buffer)
            if restored is not buffer:
                module._buffers[name] = restored
        for name, value in m.instance_attrs.items():
            if value is _MISSING:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = value
        module.training = m.training

    def _restore_parameter(self, p: _ParameterState) -> None:
        param = p.parameter
        data = param.data
        restored = p.values.into(data)
        if restored is not data:
            param.data = restored
        if param.requires_grad != p.requires_grad:
            param.requires_grad_(p.requires_grad)
        if p.grad is None:
            param.grad = None
        else:
            grad = p.grad.into(param.grad)
            if grad is not param.grad:
                param.grad = grad

    def _restore_optimizer(self, o: _OptimizerState) -> None:
        opt = o.optimizer
        current = opt.state
        for param in [p for p in current if p not in o.state]:
            del current[param]  # state the rerun created
        for param, saved in o.state.items():
            now = current.setdefault(param, {})
            for key in [k for k in now if k not in saved]:
                del now[key]
            for key, value in saved.items():
                now[key] = _restore_value(now.get(key), value)
        del opt.param_groups[len(o.groups) :]
        for i, (settings, params) in enumerate(zip(o.groups, o.group_params, strict=True)):
            if i >= len(opt.param_groups):
                opt.param_groups.append({})
            group = opt.param_groups[i]
            for key in [k for k in group if k not in settings]:
                del group[key]
            for key, value in settings.items():
                if key == "params":
                    value[:] = params
                    group[key] = value
                else:
                    group[key] = _restore_value(group.get(key), value)

    def _restore_stateful(self, item: tuple[Any, dict[str, Any]]) -> None:
        obj, state = item
        obj.load_state_dict(state)

    def _restore_named(self, item: _NamedTensor) -> None:
        tensor, values, requires_grad, grad = item
        if _same_layout(tensor, values.values) and tensor.device == values.device:
            _put_values(tensor, values.values)
        else:
            fresh = values.values.to(values.device, copy=True)
            with torch.no_grad():
                tensor.set_(fresh.untyped_storage(), 0, fresh.shape, fresh.stride())
        if tensor.is_leaf and tensor.requires_grad != requires_grad:
            tensor.requires_grad_(requires_grad)
        if tensor.is_leaf:
            tensor.grad = None if grad is None else grad.into(tensor.grad)

    def _restore_config(self, item: tuple[Any, dict[str, Any]]) -> None:
        config, values = item
        for key, value in values.items():
            setattr(config, key, value)


def _copy_value(value: Any, counter: list[int]) -> Any:
    """Optimizer state / settings: tensors to host copies, containers element-wise."""
    if isinstance(value, torch.Tensor):
        copy = _TensorCopy.of(value)
        counter[0] += copy.values.numel() * copy.values.element_size()
        return copy
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_value(v, counter) for v in value)
    if isinstance(value, dict):
        return {k: _copy_value(v, counter) for k, v in value.items()}
    return value


def _restore_value(current: Any, saved: Any) -> Any:
    if isinstance(saved, _TensorCopy):
        return saved.into(current if isinstance(current, torch.Tensor) else None)
    if isinstance(saved, (list, tuple)):
        seq = current if isinstance(current, (list, tuple)) else ()
        items = [_restore_value(seq[i] if i < len(seq) else None, v) for i, v in enumerate(saved)]
        return type(saved)(items)
    if isinstance(saved, dict):
        mapping = current if isinstance(current, dict) else {}
        return {k: _restore_value(mapping.get(k), v) for k, v in saved.items()}
    return saved


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _stateful_objects(namespace: Mapping[str, Any], names: Iterable[str]) -> Iterator[Any]:
    """LR schedulers and gradient scalers held by the namespace's variables (or one level into
    their attributes)."""
    kinds: tuple[type, ...] = (torch.optim.lr_scheduler.LRScheduler, torch.amp.GradScaler)
    seen: set[int] = set()
    for name in names:
        value = namespace.get(name)
        for obj in (value, *getattr(value, "__dict__", {}).values()):
            if isinstance(obj, kinds) and id(obj) not in seen:
                seen.add(id(obj))
                yield obj


def protected_objects(
    namespace: Mapping[str, Any],
) -> tuple[list[nn.Module], list[Optimizer]]:
    """The modules (each with all its submodules) and optimizers a cell can reach."""
    _, modules, optimizers = reachable_objects(namespace)
    every: dict[int, nn.Module] = {}
    for root in modules:
        for sub in root.modules():
            every.setdefault(id(sub), sub)
    return list(every.values()), optimizers


def host_bytes_needed(namespace: Mapping[str, Any], tensor_names: Iterable[str] = ()) -> int:
    """Bytes the host copies of :func:`take` would take (without taking them)."""
    modules, optimizers = protected_objects(namespace)
    seen: set[int] = set()
    total = 0
    for module in modules:
        for t in [*module._parameters.values(), *module._buffers.values()]:
            if t is None or t.is_meta or id(t) in seen:
                continue
            seen.add(id(t))
            total += _nbytes(t)
            grad = t.grad if isinstance(t, nn.Parameter) else None
            if grad is not None:
                total += _nbytes(grad)
    for opt in optimizers:
        for state in opt.state.values():
            total += sum(_nbytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    for name in tensor_names:
        value = namespace.get(name)
        if isinstance(value, torch.Tensor) and id(value) not in seen:
            seen.add(id(value))
            total += _nbytes(value)
    return total


def available_host_bytes() -> int | None:
    """``MemAvailable`` from /proc/meminfo (None where there is no such file)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def take(
    namespace: Mapping[str, Any],
    tensor_names: Iterable[str] = (),
    *,
    extra_modules: Iterable[nn.Module] = (),
) -> StateCopy:
    """Copy everything a cell run from ``namespace`` can change (see the module docstring).

    ``tensor_names``: namespace variables holding tensors the cell names (``x.add_(1)``).
    """
    start = time.perf_counter()
    copy = StateCopy(random=RandomState.take())
    counter = [0]  # bytes copied
    modules, optimizers = protected_objects(namespace)
    known = {id(m) for m in modules}
    for extra in extra_modules:
        for sub in extra.modules():
            if id(sub) not in known:
                known.add(id(sub))
                modules.append(sub)
    _take_modules(copy, modules, counter)
    for opt in optimizers:
        opt_state = {p: _copy_value(dict(s), counter) for p, s in opt.state.items()}
        groups = [
            {k: (v if k == "params" else _copy_value(v, counter)) for k, v in g.items()}
            for g in opt.param_groups
        ]
        params = [list(g["params"]) for g in opt.param_groups]
        copy.optimizers.append(_OptimizerState(opt, opt_state, groups, params))
    names = list(tensor_names)
    for obj in _stateful_objects(namespace, list(namespace)):
        saved = obj.state_dict()
        if saved:  # a disabled GradScaler has none (and refuses to load an empty one)
            copy.stateful.append((obj, _copy_value(saved, counter)))
    _take_named_tensors(copy, namespace, names, counter)
    copy.stateful = [(obj, _unwrap(state)) for obj, state in copy.stateful]
    copy.host_bytes = counter[0]
    copy.seconds = time.perf_counter() - start
    return copy


def _take_modules(copy: StateCopy, modules: list[nn.Module], counter: list[int]) -> None:
    """Each module's attributes, buffers and switches, each parameter (and its gradient)
    once, and the configs a model's ``use_cache`` / ``gradient_checkpointing`` live in."""
    seen_params: set[int] = set()
    for module in modules:
        buffers = {
            n: _TensorCopy.of(b)
            for n, b in module._buffers.items()
            if b is not None and not b.is_meta  # a meta tensor holds no values
        }
        counter[0] += sum(_nbytes(b.values) for b in buffers.values())
        copy.modules.append(
            _ModuleState(
                module,
                module.training,
                dict(module._parameters),
                dict(module._buffers),
                dict(module._modules),
                buffers,
                {a: module.__dict__.get(a, _MISSING) for a in SWITCH_ATTRS},
            )
        )
        for param in module._parameters.values():
            if param is None or param.is_meta or id(param) in seen_params:
                continue
            seen_params.add(id(param))
            grad = None if param.grad is None else _TensorCopy.of(param.grad)
            state = _ParameterState(param, _TensorCopy.of(param), param.requires_grad, grad)
            counter[0] += _nbytes(state.values.values) + (
                _nbytes(grad.values) if grad is not None else 0
            )
            copy.parameters.append(state)
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "use_cache"):
            flags = ("use_cache", "gradient_checkpointing")
            copy.configs.append(
                (config, {k: getattr(config, k) for k in flags if hasattr(config, k)})
            )


def _take_named_tensors(
    copy: StateCopy, namespace: Mapping[str, Any], names: list[str], counter: list[int]
) -> None:
    """The tensors the cell names that are not parameters: values, gradient, requires_grad."""
    for name in names:
        value = namespace.get(name)
        if not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter):
            continue
        value_grad = value.grad if value.is_leaf else None
        grad_copy = None if value_grad is None else _TensorCopy.of(value_grad)
        values = _TensorCopy.of(value)
        counter[0] += _nbytes(values.values)
        copy.named_tensors.append((value, values, value.requires_grad, grad_copy))


def _unwrap(value: Any) -> Any:
    """A state_dict copy with host tensors in place of :class:`_TensorCopy` (load_state_dict
    takes plain values; a scaler's scale goes back to its own device on load)."""
    if isinstance(value, _TensorCopy):
        return value.values
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    return value
