"""Activation checkpointing switched on for a model, and off again.

transformers models have their own switch (``gradient_checkpointing_enable``), which knows
which layers to wrap. Any other model gets its repeated blocks wrapped: the children of its
largest ``nn.ModuleList`` / ``nn.Sequential`` of same-typed modules, which is how transformer
stacks and ResNet stages are built. Checkpointing uses the non-reentrant implementation.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.hooks import RemovableHandle

Undo = Callable[[], None]


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules of the model's biggest list of same-typed blocks (empty if none)."""
    best: list[nn.Module] = []
    best_size = 0
    for container in model.modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        blocks = list(container.children())
        if len(blocks) < 2 or len({type(b) for b in blocks}) != 1:
            continue
        size = sum(p.numel() for b in blocks for p in b.parameters())
        if size > best_size:
            best, best_size = blocks, size
    return best


def enable_checkpointing(model: nn.Module) -> Undo:
    """Checkpoint the model's blocks; returns the function that switches it back off."""
    hf_enable = getattr(model, "gradient_checkpointing_enable", None)
    if callable(hf_enable) and getattr(model, "supports_gradient_checkpointing", False):
        hf_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        disable = model.gradient_checkpointing_disable
        return lambda: disable()  # type: ignore[operator]
    blocks = repeated_blocks(model)
    if not blocks:
        raise ValueError(
            f"{type(model).__name__} has no repeated blocks (a ModuleList or Sequential of "
            "same-typed modules) to checkpoint"
        )
    for block in blocks:
        _wrap(block)

    def undo() -> None:
        for block in blocks:
            block.__dict__.pop("forward", None)

    return undo


def _wrap(block: nn.Module, on_run: Callable[[nn.Module], None] | None = None) -> None:
    original = block.forward

    @functools.wraps(original)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not block.training or not torch.is_grad_enabled():
            return original(*args, **kwargs)
        if on_run is not None:
            on_run(block)
        return checkpoint(original, *args, use_reentrant=False, **kwargs)

    block.forward = checkpointed


# -- reruns: checkpoint the blocks a profile names -------------------------------------------


def block_lists(roots: dict[str, nn.Module]) -> list[tuple[str, list[tuple[str, nn.Module]]]]:
    """Every list of repeated blocks under ``roots`` (name -> top-level module): the path of
    each ``nn.ModuleList`` / ``nn.Sequential`` of two or more same-typed modules, with its
    blocks' paths (``GPT2LMHeadModel.transformer.h`` -> ``[("...h.0", block), ...]``)."""
    found: list[tuple[str, list[tuple[str, nn.Module]]]] = []
    for root_name, root in roots.items():
        for name, container in root.named_modules():
            if not isinstance(container, (nn.ModuleList, nn.Sequential)):
                continue
            blocks = list(container.named_children())
            if len(blocks) < 2 or len({type(b) for _, b in blocks}) != 1:
                continue
            path = f"{root_name}.{name}" if name else root_name
            found.append((path, [(f"{path}.{child}", block) for child, block in blocks]))
    return found


def uses_own_switch(block: nn.Module) -> bool:
    """A transformers layer with its own checkpointing switch (``GradientCheckpointingLayer``:
    it drops the KV cache under checkpointing, which a plain wrapper would update twice)."""
    return any(
        cls.__name__ == "GradientCheckpointingLayer" for cls in type(block).__mro__[1:]
    ) and hasattr(block, "gradient_checkpointing")


#: Instance attributes checkpointing sets on a block (our wrapper, and transformers' switch).
SWITCH_ATTRS = ("forward", "gradient_checkpointing", "_gradient_checkpointing_func")
_MISSING = object()


def checkpoint_blocks(
    blocks: list[nn.Module],
    within: Iterable[nn.Module] = (),
    on_run: Callable[[nn.Module], None] | None = None,
) -> Undo:
    """Checkpoint each block (non-reentrant) from its next call on, through transformers' own
    per-layer switch where the block has one, else by wrapping its ``forward`` on the
    instance. The returned function puts the instance attributes back exactly. ``on_run``
    is called with the block each time it runs checkpointed (what a rerun may claim).

    transformers models also read a ``gradient_checkpointing`` flag on the modules that hold
    the layers (``GPT2Model`` passes no KV cache to its layers when it is on: a recomputed
    layer would append to the cache a second time); ``within``: the top-level modules whose
    such holders are switched on too, for blocks that use transformers' switch.
    """
    own = [b for b in blocks if uses_own_switch(b)]
    holders: list[nn.Module] = []
    if own:
        inside = {id(sub) for b in own for sub in b.modules()}
        for root in within:
            for module in root.modules():
                if (
                    id(module) not in inside
                    and hasattr(module, "gradient_checkpointing")
                    and any(id(sub) in inside for sub in module.modules())
                ):
                    holders.append(module)
    changed = [*blocks, *holders]
    saved = [(b, {a: b.__dict__.get(a, _MISSING) for a in SWITCH_ATTRS}) for b in changed]
    for holder in holders:
        holder.__dict__["gradient_checkpointing"] = True
    for block in blocks:
        if uses_own_switch(block):
            block.__dict__["gradient_checkpointing"] = True
            block.__dict__["_gradient_checkpointing_func"] = _counted(block, on_run)
        else:
            _wrap(block, on_run)

    def undo() -> None:
        for block, attrs in saved:
            for attr, value in attrs.items():
                if value is _MISSING:
                    block.__dict__.pop(attr, None)
                else:
                    block.__dict__[attr] = value

    return undo


def _counted(block: nn.Module, on_run: Callable[[nn.Module], None] | None) -> Callable[..., Any]:
    """transformers' checkpoint function for one layer, telling ``on_run`` when it runs."""
    run = functools.partial(checkpoint, use_reentrant=False)
    if on_run is None:
        return run

    def counted(*args: Any, **kwargs: Any) -> Any:
        on_run(block)
        return run(*args, **kwargs)

    return counted


# -- blocks of modules the cell builds ------------------------------------------------------


def class_key(obj: object) -> str:
    """``module.QualName`` of an object's class: the same for a class the cell defines again."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class BlockSpec:
    """One block to checkpoint, by where it sits rather than which instance it is."""

    label: str  # the path as the profile names it: "Sequential.0"
    root_class: str  # class_key of the top-level module
    path: str  # the block's path inside it: "0", "transformer.h.0"
    block_class: str  # class_key of the block


class Checkpointing:
    """Checkpoint planned blocks for one run: on the notebook's instances from the start, and
    on the blocks of any other top-level module of the same class (by module and qualified
    name) that the run calls, at the same paths with the same classes: a cell that builds its
    model runs new instances, which wrapping the old ones would leave untouched.

    ``ran``: the labels of the blocks that ran checkpointed, so a rerun claims only those.
    """

    def __init__(self, planned: Sequence[tuple[BlockSpec, nn.Module]], roots: Iterable[nn.Module]):
        self._planned = list(planned)
        self._roots = list(roots)
        self._by_root: dict[str, list[BlockSpec]] = {}
        for spec, _ in self._planned:
            self._by_root.setdefault(spec.root_class, []).append(spec)
        self._labels: dict[int, str] = {id(b): s.label for s, b in self._planned}
        self._seen: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self._undo: list[Undo] = []
        self._handle: RemovableHandle | None = None
        self.ran: set[str] = set()
        self.built: set[str] = set()  # labels matched on modules the run built

    def start(self) -> None:
        blocks = [b for _, b in self._planned]
        for root in self._roots:
            self._seen.update(root.modules())
        self._undo.append(checkpoint_blocks(blocks, self._roots, self._ran))
        if self._planned:
            self._handle = nn.modules.module.register_module_forward_pre_hook(self._pre_forward)

    def stop(self) -> None:
        """Remove the hook and every switch; safe to call twice."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()

    def _ran(self, block: nn.Module) -> None:
        label = self._labels.get(id(block))
        if label is not None:
            self.ran.add(label)

    def _pre_forward(self, module: nn.Module, _args: Any) -> None:
        try:
            if module in self._seen:
                return
            self._seen.update(module.modules())
            specs = self._by_root.get(class_key(module))
            if specs:
                self._adopt(module, specs)
        except Exception:  # noqa: BLE001 - never break the user's forward
            pass

    def _adopt(self, root: nn.Module, specs: list[BlockSpec]) -> None:
        found: list[nn.Module] = []
        for spec in specs:
            try:
                block = root.get_submodule(spec.path)
            except AttributeError:
                continue
            if class_key(block) == spec.block_class:
                found.append(block)
                self._labels[id(block)] = spec.label
                self.built.add(spec.label)
        if found:
            self._undo.append(checkpoint_blocks(found, [root], self._ran))
