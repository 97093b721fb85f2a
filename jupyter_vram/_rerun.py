"""`jv.rerun`: run a `%%vram` cell again with AMP, activation checkpointing or offload, measured
like the first run, and leave the notebook as the first run left it.

A rerun copies everything the cell can change to host memory first (transforms.state), runs
the cell in a copy of the namespace (names it binds or rebinds stay in the copy), with the
random streams set to where they stood when the first run started, and then puts everything
back in place, also when the cell raises or is interrupted. Transforms (checkpoint wrappers,
transformers' checkpointing switch) live only for the rerun.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._cell_source import CellFacts, read_cell, warnings_for
from ._model import Profile as ProfileData
from ._model import Variant
from ._profile import Profile

if TYPE_CHECKING:
    from torch import nn

    from ._session import Cell
    from ._transforms.checkpointing import Checkpointing
    from ._transforms.state import StateCopy

AmpName = Literal["bf16", "fp16"]
Checkpoint = Literal["auto"] | Sequence[str] | None
Progress = Callable[[str], None]

#: Keep this share of the host's available memory free after the state copy.
HOST_MEMORY_MARGIN = 0.9


class RerunError(RuntimeError):
    """A rerun that cannot apply; the message is one line saying why."""


NOT_A_CELL = (
    "rerun needs a profile made by %%vram in this kernel (this one was loaded, estimated, "
    "recorded with jv.record, or its cell is gone)"
)


def default_amp(device: str) -> AmpName:
    """The AMP dtype the device runs best: bf16 where supported, else fp16."""
    import torch

    if torch.device(device).type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp16"
    return "bf16"


# -- planning: can it apply, and to what ---------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    cell: Cell
    amp: AmpName | None
    blocks: tuple[tuple[str, nn.Module], ...]  # (profile path, module) to checkpoint
    offload: bool
    facts: CellFacts
    batch: BatchSplit | None = None


def _roots(namespace: Mapping[str, Any]) -> dict[str, nn.Module]:
    """Top-level modules of the namespace under the names a profile gives them (class name)
    and under their variable names."""
    from torch import nn

    from ._transforms.state import protected_objects

    modules, _ = protected_objects(namespace)
    inner = {id(sub) for m in modules for sub in list(m.modules())[1:]}
    roots: dict[str, nn.Module] = {}
    for module in modules:
        if id(module) not in inner:
            roots.setdefault(type(module).__name__, module)
    for name, value in list(namespace.items()):
        if isinstance(value, nn.Module) and not name.startswith("_"):
            roots.setdefault(name, value)
    return roots


def _resolve(roots: Mapping[str, nn.Module], path: str) -> tuple[str, nn.Module]:
    """A module path (``model.transformer.h.0`` or ``GPT2LMHeadModel.transformer.h.0``) ->
    (the path as the profile names it, the module)."""
    head, _, rest = path.partition(".")
    root = roots.get(head)
    if root is None:
        raise RerunError(f"no module {head!r} in the notebook (checkpoint {path!r})")
    try:
        module = root.get_submodule(rest) if rest else root
    except AttributeError:
        raise RerunError(f"{type(root).__name__} has no submodule {rest!r}") from None
    return (f"{type(root).__name__}.{rest}" if rest else type(root).__name__), module


def _paths(checkpoint: str | Sequence[str]) -> list[str]:
    """Module paths from ``"a.b,c.d"`` or a list (RerunError when there are none)."""
    items = [checkpoint] if isinstance(checkpoint, str) else list(checkpoint)
    paths = [p.strip() for item in items for p in str(item).split(",") if p.strip()]
    if not paths:
        raise RerunError("checkpoint: name at least one module, or 'auto'")
    return paths


def _auto_blocks(
    profile: ProfileData, roots: Mapping[str, nn.Module]
) -> list[tuple[str, nn.Module]]:
    """The blocks of the repeated-block list that held the most activation bytes in the run."""
    from ._analysis.compare import activation_bytes_by_module
    from ._transforms.checkpointing import block_lists

    activations = activation_bytes_by_module(profile)
    named = {k: v for k, v in roots.items() if k == type(v).__name__}
    best: list[tuple[str, nn.Module]] = []
    best_bytes = 0
    for _, blocks in block_lists(dict(named)):
        used = [(p, b) for p, b in blocks if activations.get(p, 0) > 0]
        total = sum(activations.get(p, 0) for p, _ in used)
        if total > best_bytes:
            best, best_bytes = used, total
    return best


def _plan(
    profile: ProfileData,
    amp: str | None,
    checkpoint: Checkpoint,
    offload: bool,
    micro_batch: int | None = None,
    *,
    check_host: bool = True,
) -> _Plan:
    """What a rerun of ``profile`` with these options would apply, or a RerunError saying why
    it cannot (checked in this order: the profile, the options, host memory unless
    ``check_host`` is False)."""
    from ._analysis.compare import activation_bytes_by_module

    cell = _recorded_cell(profile)
    facts = read_cell(cell.source, cell.namespace)
    amp_name = _amp_choice(amp, facts)
    saved_any = bool(activation_bytes_by_module(profile))
    blocks: list[tuple[str, nn.Module]] = []
    if checkpoint is not None:
        blocks = _blocks_to_checkpoint(profile, cell, checkpoint, saved_any)
    if offload:
        _check_offload(profile, saved_any)
    batch = batch_split(cell.namespace, facts, micro_batch) if micro_batch else None
    if check_host:
        _check_host_memory(profile, cell, facts)
    return _Plan(cell, amp_name, tuple(blocks), bool(offload), facts, batch)


def _recorded_cell(profile: ProfileData) -> Cell:
    """The cell ``profile`` recorded, when a rerun can apply to it: a plain %%vram profile of
    this kernel, of one process."""
    from ._session import cell_of

    if not isinstance(profile, ProfileData):  # jv.rerun(5), jv.rerun(None): one clear line
        raise RerunError(
            f"rerun needs a profile made by %%vram in this kernel (a cell's _vram), not "
            f"{type(profile).__name__} {profile!r:.40}"
        )
    if "world_size" in profile.meta:  # made by %%vram --nproc, jv.launch or torchrun
        raise RerunError(
            f"this is rank {profile.meta.get('rank', '?')} of a distributed run (%%vram "
            "--nproc, jv.launch, torchrun): reruns apply to a single-process %%vram cell"
        )
    cell = cell_of(profile)
    variant = profile.variant
    if variant is not None:
        from ._analysis.compare import describe_change

        if cell is None:
            raise RerunError(
                f"this profile is a rerun ({describe_change(profile)}): rerun the profile of "
                f"{variant.baseline_cell or 'its cell'}"
            )
        raise RerunError(
            f"this cell was recorded with {describe_change(profile)}: rerun a plain %%vram "
            "profile of it, to compare with"
        )
    if cell is None:
        raise RerunError(NOT_A_CELL)
    return cell


def _blocks_to_checkpoint(
    profile: ProfileData, cell: Cell, checkpoint: str | Sequence[str], saved_any: bool
) -> list[tuple[str, nn.Module]]:
    """(profile path, module) of each block to checkpoint: those named, or for ``"auto"`` the
    repeated blocks that held the most activations."""
    if not [m for m in profile.modules if m]:
        raise RerunError("checkpointing needs an nn.Module: the cell called none from the notebook")
    roots = _roots(cell.namespace)
    if not (isinstance(checkpoint, str) and checkpoint == "auto"):
        return [_resolve(roots, p) for p in _paths(checkpoint)]
    if not saved_any:
        raise RerunError("the cell saved nothing for backward (no autograd): nothing to checkpoint")
    blocks = _auto_blocks(profile, roots)
    if not blocks:
        raise RerunError(
            "no repeated blocks (a ModuleList / Sequential of same-typed modules) held "
            "activations in this run: nothing to checkpoint"
        )
    return blocks


def _check_offload(profile: ProfileData, saved_any: bool) -> None:
    """Offloading needs a device it can offload from, and activations saved for backward."""
    from ._transforms.offload import offload_unavailable

    reason = offload_unavailable(profile.device)
    if reason is not None:
        raise RerunError(reason)
    if not saved_any:
        raise RerunError("the cell saved nothing for backward (no autograd): nothing to offload")


def _check_host_memory(profile: ProfileData, cell: Cell, facts: CellFacts) -> None:
    """The copy that protects the notebook's state must fit in host memory (with the run
    itself, on the CPU)."""
    from ._transforms.state import available_host_bytes, host_bytes_needed

    tensor_names = [n for n in facts.names if n in cell.namespace]
    needed = host_bytes_needed(cell.namespace, tensor_names)
    # on the CPU the run itself needs host memory too: what the first run added at most
    running = profile.peak_bytes - profile.timeline.baseline_bytes if profile.device == "cpu" else 0
    available = available_host_bytes()
    if available is not None and needed + running > HOST_MEMORY_MARGIN * available:
        from ._units import format_bytes

        run = f" and the run {format_bytes(running)}" if running else ""
        raise RerunError(
            f"not enough host memory to protect the notebook's state: the copy needs "
            f"{format_bytes(needed)}{run}, {format_bytes(available)} is available"
        )


def rerun_unavailable(
    profile: ProfileData,
    *,
    amp: str | None = None,
    checkpoint: Checkpoint = None,
    offload: bool = False,
    micro_batch: int | None = None,
    check_host: bool = True,
) -> str | None:
    """Why :func:`rerun` with these options cannot apply to ``profile`` (None: it can).
    Nothing runs; the app greys out a toggle with this line as its tooltip.
    ``check_host=False`` leaves out the host-memory check, which no option changes: the app
    makes it once for the whole rerun bar, not again for each toggle."""
    try:
        _plan(profile, amp, checkpoint, offload, micro_batch, check_host=check_host)
    except RerunError as error:
        return str(error)
    return None


# -- a micro-batch of the cell's batch -----------------------------------------------------------


@dataclass(frozen=True)
class BatchSplit:
    """The batch tensors a cell reads (by name; a dict, list or tuple of tensors counts as
    one) and the rows of them one micro-batch keeps."""

    names: tuple[str, ...]
    batch: int
    rows: int
    parts: int

    def apply(self, namespace: dict[str, Any]) -> str:
        """Bind each name in ``namespace`` (the rerun's copy) to its first rows (views: no
        copy, the notebook's tensors untouched); the note that says so."""
        for name in self.names:
            namespace[name] = _first_rows(namespace[name], self.batch, self.rows)
        return (
            f"micro-batch 1/{self.parts}: ran on the first {self.rows} of {self.batch} rows of "
            f"{', '.join(self.names)}; an accumulation loop keeps the effective batch by "
            f"summing {self.parts} micro-batches' gradients before one optimizer step"
        )


def _first_rows(value: Any, batch: int, rows: int) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value[:rows] if value.dim() and value.shape[0] == batch else value
    if isinstance(value, dict):
        return type(value)((k, _first_rows(v, batch, rows)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_first_rows(v, batch, rows) for v in value)
    return value


def _leading_dims(value: Any) -> list[int]:
    import torch
    from torch import nn

    if isinstance(value, nn.Parameter):
        return []
    if isinstance(value, torch.Tensor):
        return [int(value.shape[0])] if value.dim() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)) and len(value) <= 64:
        return [d for v in value if isinstance(v, torch.Tensor) for d in _leading_dims(v)]
    return []


def batch_split(namespace: Mapping[str, Any], facts: CellFacts, parts: int) -> BatchSplit:
    """The batch (the first dimension most of the cell's tensors share; the larger on a tie)
    and the tensors that have it; RerunError when the cell reads no tensor from the notebook
    (it builds its batch) or ``parts`` is not a whole number of at least 2."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 2:
        raise RerunError(f"micro_batch: a whole number of at least 2, not {parts!r}")
    dims = {n: _leading_dims(namespace[n]) for n in sorted(facts.names) if n in namespace}
    counts: dict[int, int] = {}
    for found in dims.values():
        for d in set(found):
            counts[d] = counts.get(d, 0) + 1
    if not counts:
        raise RerunError(
            "micro-batch: the cell reads no tensor from the notebook (it builds its batch): "
            "make the batch a notebook variable, or run a smaller batch yourself"
        )
    batch = max(counts, key=lambda d: (counts[d], d))
    if batch < parts:
        raise RerunError(f"micro-batch: the batch has {batch} rows, fewer than {parts} parts")
    names = tuple(n for n, found in dims.items() if batch in found)
    return BatchSplit(names, batch, -(-batch // parts), parts)


# -- running ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Changes:
    amp: AmpName | None
    offload: bool


@contextlib.contextmanager
def _transforms(plan: _Changes, device: str) -> Iterator[None]:
    """Autocast and offload around the cell's code (checkpointing is set on the modules)."""
    import torch

    from ._transforms.amp import amp_dtype, autocast
    from ._transforms.offload import offloaded

    with contextlib.ExitStack() as stack:
        if plan.amp is not None:
            stack.enter_context(autocast(torch.device(device).type, amp_dtype(plan.amp)))
        if plan.offload:
            stack.enter_context(offloaded(device))
        yield


def rerun(
    profile: ProfileData,
    amp: str | None = None,
    checkpoint: Checkpoint = None,
    offload: bool = False,
    progress: Progress | None = None,
    *,
    stacks: bool | str = False,
    micro_batch: int | None = None,
) -> Profile:
    """Run the cell behind a `%%vram` profile again with a change, and return its profile.

    ``amp``: autocast dtype ("bf16" / "fp16"; CPU autocast on a CPU run). ``checkpoint``:
    "auto" (the repeated blocks that held the most activations in ``profile``) or module paths
    (``"model.transformer.h.0"``). ``offload``: keep activations in host memory
    (``save_on_cpu``; pinned on CUDA). ``micro_batch``: run on ``1 / micro_batch`` of the
    batch (the first rows of every tensor the cell reads whose first dimension is the batch),
    as one micro-batch of a gradient accumulation loop would. ``progress``: called with
    "saving state", "running", "restoring". ``stacks``: Python source lines per
    allocation, off by default (the comparison is by category, module and op): ``True``
    records them as the first run did, or name a mode (``"sampled"``, ``"full"``: see
    :func:`jupyter_vram.record`). The returned profile's ``variant`` says what was applied
    and its notes what could not be kept equal. Parameters, buffers, gradients, optimizer
    state, random streams, modes and the names the cell binds are as they were before the
    call, even when the cell raises (the error propagates) or is interrupted. Raises
    :class:`RerunError` when the change cannot apply.
    """
    from ._capture import RECORDING_LOCK

    __tracebackhide__ = True
    plan = _plan(profile, amp, checkpoint, offload, micro_batch)
    if RECORDING_LOCK.locked():
        raise RerunError("a rerun cannot run inside another recording (%%vram / jv.record)")
    cell = plan.cell
    say = progress or (lambda _message: None)
    notes = warnings_for(plan.facts)
    say("saving state")
    saved = _save_state(plan)
    notes.append(
        f"state copy: {saved.host_bytes / 2**20:.1f} MiB of host memory, {saved.seconds:.2f} s"
    )
    namespace = dict(cell.namespace)  # copy on write: rebinding a name stays in the copy
    result: Profile | None = None
    switch = _checkpointing(plan.blocks, cell.namespace)
    start = time.perf_counter()
    try:
        result = _run_cell(plan, profile.device, namespace, switch, notes, stacks, say)
    finally:
        restore_seconds = _put_back(switch, saved, say)
        namespace.clear()
    if result is None:  # a recording started meanwhile (another thread): ran unrecorded
        raise RerunError("a rerun cannot run inside another recording (%%vram / jv.record)")
    notes.append(f"restore: {restore_seconds:.2f} s; cell: {time.perf_counter() - start:.2f} s")
    checkpointed = _claimed(plan.blocks, switch, notes)
    if plan.blocks and not checkpointed:
        raise RerunError(_NOT_CHECKPOINTED)
    variant = Variant(
        amp=plan.amp,
        checkpointed=checkpointed,
        offload=plan.offload,
        notes=tuple(notes),
        baseline_cell=cell.label or cell.filename,
        micro_batch=plan.batch.parts if plan.batch is not None else 1,
    )
    meta = dict(result.meta)
    meta["variant"] = variant.to_dict()
    meta["rerun_cost"] = {
        "state_bytes": saved.host_bytes,
        "copy_seconds": round(saved.seconds, 6),
        "restore_seconds": round(restore_seconds, 6),
    }
    return result.replace(meta=meta)


def _save_state(plan: _Plan) -> StateCopy:
    """Copy what the cell may change (Ctrl-C waits until the copy is whole)."""
    from ._capture import interrupts_deferred
    from ._transforms import state as state_module

    cell = plan.cell
    with interrupts_deferred():
        return state_module.take(
            cell.namespace,
            [n for n in plan.facts.names if n in cell.namespace],
            extra_modules=[b for _, b in plan.blocks],
        )


def _run_cell(
    plan: _Plan, device: str, namespace: dict[str, Any], switch: Checkpointing,
    notes: list[str], stacks: bool | str, say: Progress,
) -> Profile | None:  # fmt: skip
    """Run the cell's code in ``namespace`` with the plan's changes, recorded: its profile
    (None when another recording started meanwhile). Notes what could not be kept equal."""
    from ._capture.cpu_recorder import discarded_on_error
    from ._session import run_code

    __tracebackhide__ = True
    cell = plan.cell
    if cell.start is not None:  # start where the first run did (its random draws too)
        dropped = cell.start.put(namespace, plan.facts.bound)
        if dropped:
            notes.append("started where the first run did: " + "; ".join(dropped))
    if plan.batch is not None:
        notes.append(plan.batch.apply(namespace))
    switch.start()
    say("running")
    with discarded_on_error():  # a raising rerun (Cancel) returns no profile: none is read
        run = run_code(
            cell.source,
            namespace,
            filename=cell.filename,
            device=device,
            stacks=cell.stacks if stacks is True else stacks,
            around=lambda: _transforms(_Changes(plan.amp, plan.offload), device),
            keep=False,
        )
    return run.profile


def _put_back(switch: Checkpointing, saved: StateCopy, say: Progress) -> float:
    """Checkpointing off and the saved state back, whatever happens; the seconds it took."""
    from ._capture import interrupts_deferred

    restore_start = time.perf_counter()
    try:
        say("restoring")
    finally:
        with interrupts_deferred():
            try:
                switch.stop()
            finally:
                _restore(saved)
    return time.perf_counter() - restore_start


_NOT_CHECKPOINTED = (
    "checkpointing did not apply: none of the chosen blocks ran in training mode with "
    "gradients on during the rerun (the cell ran other modules than the ones chosen, in eval "
    "mode or without gradients)"
)


def _checkpointing(
    blocks: Sequence[tuple[str, nn.Module]], namespace: Mapping[str, Any]
) -> Checkpointing:
    """The switch for these blocks: each named by its top-level module's class and its path
    inside it, so the same blocks of a model the cell builds again are checkpointed too."""
    from ._transforms.checkpointing import BlockSpec, Checkpointing, class_key

    roots = _roots(namespace)
    planned: list[tuple[BlockSpec, nn.Module]] = []
    for label, block in blocks:
        head, _, rest = label.partition(".")
        root_class = ""
        for root in roots.values():
            if type(root).__name__ != head:
                continue
            with contextlib.suppress(AttributeError):
                if root.get_submodule(rest) is block:
                    root_class = class_key(root)
                    break
        planned.append((BlockSpec(label, root_class, rest, class_key(block)), block))
    return Checkpointing(planned, roots.values())


def _claimed(
    blocks: Sequence[tuple[str, nn.Module]], switch: Checkpointing, notes: list[str]
) -> tuple[str, ...]:
    """The blocks that really ran checkpointed; a note for the model the cell built and for
    the chosen blocks that never did."""
    ran = tuple(p for p, _ in blocks if p in switch.ran)
    skipped = [p for p, _ in blocks if p not in switch.ran]
    built = sorted(switch.built & set(ran))
    if built:
        notes.append(
            f"the cell builds its model: checkpointed the blocks it built ({_span(built)})"
        )
    if ran and skipped:
        notes.append(
            f"not checkpointed: {_span(skipped)} did not run in training mode with gradients on"
        )
    return ran


def _span(labels: Sequence[str]) -> str:
    """``a, b`` or ``a ... z`` for a long list."""
    return ", ".join(labels) if len(labels) <= 3 else f"{labels[0]} ... {labels[-1]}"


def _restore(saved: StateCopy) -> None:
    """Put the notebook's state back; one object that refuses is named in one line (every
    other object is restored regardless, see transforms.state.StateCopy.restore)."""
    try:
        saved.restore()
    except Exception as error:
        raise RerunError(
            f"the rerun could not put one object back ({type(error).__name__}: {error}); "
            "everything else is as before"
        ) from error


# -- first runs with a change (`%%vram --amp bf16 --checkpoint auto --offload`) --------------


def _structural_blocks(namespace: Mapping[str, Any]) -> list[tuple[str, nn.Module]]:
    """Without a profile to choose from: every top-level module's biggest list of repeated
    blocks (by parameter count), named as a profile names them."""
    from ._transforms.checkpointing import block_lists

    roots = {k: v for k, v in _roots(namespace).items() if k == type(v).__name__}
    chosen: list[tuple[str, nn.Module]] = []
    for name, root in roots.items():
        lists = block_lists({name: root})
        if lists:
            _, blocks = max(
                lists, key=lambda item: sum(p.numel() for _, b in item[1] for p in b.parameters())
            )
            chosen.extend(blocks)
    return chosen


def run_changed(
    source: str,
    namespace: dict[str, Any],
    *,
    filename: str,
    device: str | None,
    stacks: bool | str,
    cell: str | None,
    amp: str | None,
    checkpoint: Checkpoint,
    offload: bool,
    on_profile: Callable[[Profile], None] | None = None,
    ops: str = "auto",
) -> Any:
    """Run a cell once with AMP / checkpointing / offload applied (it changes the notebook's
    state, as the cell does); the checkpoint switches are taken off again afterwards. Returns
    the session's CellRun; its profile's ``variant`` says what was applied."""
    from ._capture import parse_device
    from ._session import run_code
    from ._transforms.offload import offload_unavailable

    name = parse_device(device)
    facts = read_cell(source, namespace)
    amp_name = _amp_choice(amp, facts)
    if offload and (reason := offload_unavailable(name)) is not None:
        raise RerunError(reason)
    blocks: list[tuple[str, nn.Module]] = []
    if checkpoint is not None:
        if isinstance(checkpoint, str) and checkpoint == "auto":
            blocks = _structural_blocks(namespace)
            if not blocks:
                raise RerunError(
                    "no repeated blocks (a ModuleList / Sequential of same-typed modules) in "
                    "the notebook's modules: nothing to checkpoint (a model the cell builds "
                    "exists only once it ran: run the cell, then --compare checkpoint or "
                    "jv.rerun(_vram, checkpoint='auto'))"
                )
        else:
            roots = _roots(namespace)
            blocks = [_resolve(roots, p) for p in _paths(checkpoint)]
    changes = _Changes(amp_name, offload)
    switch = _checkpointing(blocks, namespace)

    def tag(profile: Profile) -> None:
        notes: list[str] = []
        checkpointed = _claimed(blocks, switch, notes)
        if blocks and not checkpointed:
            notes.append(_NOT_CHECKPOINTED.replace("during the rerun", "in this run"))
        profile.meta["variant"] = Variant(
            amp_name, checkpointed, offload, tuple(notes), None
        ).to_dict()
        if on_profile is not None:
            on_profile(profile)

    switch.start()
    try:
        return run_code(
            source,
            namespace,
            filename=filename,
            device=name,
            stacks=stacks,
            ops=ops,
            on_profile=tag,
            cell=cell,
            around=lambda: _transforms(changes, name),
        )
    finally:
        switch.stop()


TECHNIQUES = ("amp", "checkpoint", "offload")


def parse_techniques(text: str) -> list[str]:
    """``"amp,checkpoint"`` -> ``["amp", "checkpoint"]`` (RerunError naming a bad one)."""
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    aliases = {"ckpt": "checkpoint", "checkpointing": "checkpoint", "autocast": "amp"}
    names = [aliases.get(n, n) for n in names]
    bad = [n for n in names if n not in TECHNIQUES]
    if bad or not names:
        raise RerunError(
            f"--compare takes a comma-separated list of {', '.join(TECHNIQUES)}"
            + (f", not {bad[0]!r}" if bad else "")
        )
    return list(dict.fromkeys(names))


def technique_options(technique: str, device: str) -> dict[str, Any]:
    """The rerun options one technique stands for (AMP: the device's default dtype)."""
    if technique == "amp":
        return {"amp": default_amp(device)}
    if technique == "checkpoint":
        return {"checkpoint": "auto"}
    return {"offload": True}


def rerun_each(
    baseline: ProfileData, techniques: Sequence[str], progress: Progress | None = None
) -> list[Profile | str]:
    """One rerun per technique: its profile, or the one-line reason it could not apply."""
    out: list[Profile | str] = []
    for technique in techniques:
        options = technique_options(technique, baseline.device)
        try:
            out.append(rerun(baseline, **options, progress=progress))
        except RerunError as error:
            out.append(f"{technique}: {error}")
    return out


def _amp_choice(amp: str | None, facts: Any) -> AmpName | None:
    """The AMP dtype asked for, by its short name; RerunError if it is unknown or the cell
    already runs under autocast."""
    if amp is None:
        return None
    from ._transforms.amp import amp_dtype

    try:
        amp_dtype(amp)
    except ValueError as error:
        raise RerunError(str(error)) from None
    if facts.autocast_line is not None:
        raise RerunError(
            f"the cell already runs under autocast (line {facts.autocast_line}): AMP is on"
        )
    return "fp16" if amp.lower() in ("fp16", "float16", "half") else "bf16"
