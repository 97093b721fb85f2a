"""``%%vram --nproc N``: a cell that defines ``main()``, run on N ranks.

The cell runs once in the notebook, unrecorded, as any cell would (its imports, helpers and
``main`` land in the namespace); then ``main()`` runs on N ranks under torch.distributed, each
rank recorded (:func:`~.launcher.launch`). ``main`` travels by value, with what it uses from
the notebook. The cell must not call ``main()`` itself: the kernel has no process group.
"""

from __future__ import annotations

import ast
from typing import Any

from .._profile import Profile
from .launcher import launch, launch_problem

ENTRY = "main"


class CellError(ValueError):
    """The cell defines no ``main`` to run on the ranks, or asks for ranks or a timeout this
    machine cannot give."""


def run_cell_on_ranks(
    source: str,
    namespace: dict[str, Any],
    *,
    filename: str,
    nproc: int,
    device: str | None = None,
    stacks: bool | str = "sampled",
    timeout: float = 300.0,
) -> list[Profile]:
    """Run the cell in ``namespace``, then its ``main()`` on ``nproc`` ranks (Profiles in rank
    order; :class:`~.launcher.LaunchError` when a rank fails)."""
    problem = launch_problem(nproc, timeout, nproc_name="--nproc", timeout_name="--timeout")
    if problem is not None:  # before the cell runs or any process starts
        raise CellError(f"{problem}; the cell did not run")
    if ENTRY not in _defined_names(source):
        raise CellError(
            "%%vram --nproc runs the cell's main() on each rank: define `def main(): ...` "
            "in the cell (and do not call it there)"
        )
    exec(compile(source, filename, "exec"), namespace)
    entry = namespace.get(ENTRY)
    if not callable(entry):
        raise CellError(f"%%vram --nproc: the cell's {ENTRY} is not a function")
    return launch(entry, nproc=nproc, device=device, stacks=stacks, timeout=timeout)


def _defined_names(source: str) -> set[str]:
    """Names the cell defines at its top level (functions, classes, assignments)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {ENTRY}  # let compile() report it with the cell's line numbers
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names
