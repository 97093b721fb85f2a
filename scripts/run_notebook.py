"""Execute a notebook headlessly with nbclient: `python scripts/run_notebook.py IN [OUT]`.

The executed copy goes to OUT (never back into notebooks/: committed notebooks stay unexecuted).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def run(source: Path, target: Path | None = None, timeout: int = 600) -> nbformat.NotebookNode:
    nb = nbformat.read(source, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={
        "metadata": {"path": str(source.parent)}
    }).execute()  # fmt: skip
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
    return nb


if __name__ == "__main__":
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    run(Path(sys.argv[1]), out)
    print(f"executed {sys.argv[1]}" + (f" -> {out}" if out else ""))
