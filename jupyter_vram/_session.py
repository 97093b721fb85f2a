"""Run a cell's code in the user namespace under a recorder; keep the latest profile."""

from __future__ import annotations

import ast
import contextlib
import weakref
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ._capture import RECORDING_LOCK, RecordingError
from ._model import Profile as ProfileData
from ._profile import Profile
from ._recording import Recording

if TYPE_CHECKING:
    from ._estimator.api import Estimate

_last_profile: Profile | None = None  # the latest %%vram run's (keeps its cell alive)
_estimates: list[Estimate] = []  # newest last
_KEPT_ESTIMATES = 8


def remember(profile: Profile) -> None:
    global _last_profile
    _last_profile = profile


#: ``app``: every profile output builds the live app at once; ``saved``: every output is
#: the saved view first; unset or ``auto``: the saved view where the page draws it
FIRST_VIEW_ENV = "JUPYTER_VRAM_FIRST_VIEW"
#: what the lab extension asks an idle kernel to evaluate (a user expression: no output, no
#: history); it finds this module only where jupyter_vram is loaded, and imports nothing
FRONTEND_EXPRESSION = (
    "(lambda m: m is not None and m.frontend_draws_profiles())"
    "(__import__('sys').modules.get('jupyter_vram._session'))"
)
_frontend_draws = [False]


def frontend_draws_profiles() -> bool:
    """Called through :data:`FRONTEND_EXPRESSION` by the ``jupyter-vram`` lab extension: this
    kernel's page draws saved profiles itself (header, breakdown, flame graph, timeline)."""
    _frontend_draws[0] = True
    return True


def saved_view_first() -> bool:
    """Whether a profile is displayed first as its saved view, the live app one click away:
    building the app costs ~40 ms per output, more than recording a short loop does."""
    import os

    choice = os.environ.get(FIRST_VIEW_ENV, "").strip().lower()
    if choice in ("app", "saved"):
        return choice == "saved"
    return _frontend_draws[0]


@dataclass(frozen=True)
class Cell:
    """What a rerun needs to run a `%%vram` cell again: its code, where it ran, and the random
    streams as they were when it started (kept in this kernel's memory only, never saved)."""

    source: str
    filename: str
    namespace: MutableMapping[str, Any]
    device: str | None
    stacks: bool | str
    label: str | None
    start: Any  # transforms.state.StartState, taken just before the cell ran (None: no torch)


#: Profile -> its cell. Weak on the profile, so forgetting a profile forgets its cell.
_cells: weakref.WeakKeyDictionary[ProfileData, Cell] = weakref.WeakKeyDictionary()


def cell_of(profile: ProfileData) -> Cell | None:
    """The cell a `%%vram` profile of this kernel recorded (None for a loaded, `jv.record`
    or estimated profile)."""
    return _cells.get(profile)


def _start_state(namespace: MutableMapping[str, Any]) -> Any:
    """Where the cell starts from (random streams, gradients, optimizer state, names), if
    torch is loaded: a rerun starts from the same point."""
    import sys

    if "torch" not in sys.modules:
        return None
    from ._transforms.state import StartState

    try:
        return StartState.take(namespace)
    except Exception:  # noqa: BLE001 - the cell runs anyway; only its reruns lose this
        return None


def remember_estimate(estimate: Estimate) -> None:
    """Keep an estimate so a later `%%vram` of the same model can be compared with it."""
    _estimates.append(estimate)
    del _estimates[:-_KEPT_ESTIMATES]


def matching_estimate(profile: ProfileData) -> Estimate | None:
    """The newest remembered estimate of the model ``profile`` ran, if any."""
    return next((e for e in reversed(_estimates) if e.matches(profile)), None)


def last_profile() -> Profile | None:
    """The Profile of the latest `%%vram` run in this kernel (None before the first)."""
    return _last_profile


class RecordingNotStarted(RecordingError):
    """Recording could not start (unknown or unavailable device): the cell did not run."""


@dataclass(frozen=True)
class CellRun:
    """What running a cell produced: the value of its last expression and its profile."""

    value: Any
    profile: Profile | None  # None when nothing was recorded (nested %%vram, empty cell)
    nested: bool = False


def mentions_compile(source: str) -> bool:
    """The cell may run torch.compile (``torch.compile(...)``, ``@torch.compile``, an import
    of ``compile`` from torch): its Python stacks are sampled, never traced (see
    capture.cpu_recorder)."""
    return "compile" in source and ("torch" in source or "@" in source)


def split_last_expression(source: str, filename: str) -> tuple[Any, Any]:
    """Compile a cell into (statements, last expression or None), like IPython displays it."""
    tree = ast.parse(source, filename=filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(cast(ast.Expr, tree.body.pop()).value)
    body = compile(tree, filename, "exec")
    return body, (compile(last, filename, "eval") if last is not None else None)


def run_code(
    source: str,
    namespace: MutableMapping[str, Any],
    *,
    filename: str = "<vram-cell>",
    device: str | None = None,
    stacks: bool | str = "sampled",
    ops: str = "auto",
    on_profile: Callable[[Profile], None] | None = None,
    cell: str | None = None,
    around: Callable[[], Any] | None = None,
    keep: bool = True,
    capacity: int | str | None = None,
) -> CellRun:
    """Run ``source`` in ``namespace`` under recording and return its last value and profile.

    A SyntaxError is raised before anything is recorded. If the code raises (KeyboardInterrupt
    included), recording is switched off, ``on_profile`` still receives the partial profile and
    the exception propagates unchanged. Nested use runs the code unrecorded.
    ``cell``: a label for the cell (``In [5]``); ``around``: a context manager factory the
    code runs inside, under the recorder (a rerun's autocast / offload); ``keep=False``: do not
    make this the kernel's latest profile nor remember its cell (reruns). ``capacity``: raise
    ``torch.OutOfMemoryError`` past this many bytes (see :func:`~.recording.record`).
    """
    __tracebackhide__ = True  # IPython hides this frame in the user's traceback
    body, last = split_last_expression(source, filename)
    globals_ = namespace if isinstance(namespace, dict) else dict(namespace)
    if RECORDING_LOCK.locked():
        exec(body, globals_)
        value = eval(last, globals_) if last is not None else None
        return CellRun(value, None, nested=True)
    from ._capture.tagging import one_scan

    rec = Recording(
        device,
        stacks=stacks,
        ops=ops,
        namespace=globals_,
        capacity=capacity,
        trace=not mentions_compile(source),
    )
    with one_scan():  # the start state and the recording's baselines share one walk
        start = _start_state(globals_) if keep else None
        try:
            rec.__enter__()
        except RecordingError as error:
            raise RecordingNotStarted(str(error)) from None
    value = None
    # what the cell's end asks of the namespace (the storages it left, whether a rerun's
    # copies fit in host memory) shares one walk: a notebook holding 300,000 tensors paid
    # each walk again
    ended = contextlib.ExitStack()
    with ended:
        try:
            try:
                with around() if around is not None else contextlib.nullcontext():
                    exec(body, globals_)
                    if last is not None:
                        value = eval(last, globals_)
            except BaseException as error:
                ended.enter_context(one_scan())
                rec.__exit__(type(error), error, error.__traceback__)
                raise
            ended.enter_context(one_scan())
            rec.__exit__(None, None, None)
        finally:
            profile = rec.profile if rec._profile is not None else None
            if profile is not None and keep:
                remember(profile)
                _cells[profile] = Cell(source, filename, namespace, device, stacks, cell, start)
            if profile is not None and on_profile is not None:
                on_profile(profile)
    return CellRun(value, profile)
