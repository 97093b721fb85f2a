"""Build hook for the lab extension (hatch-jupyter-builder's ``build-function``).

Wraps ``hatch_jupyter_builder.npm_builder`` so that a build that cannot run says why in one
clear message instead of a raw ``CalledProcessError``, and so that the prebuilt output counts
as stale when any input changed (sources, styles, settings schema, package.json, yarn.lock),
not only ``src/``. A wheel or an sdist (which carries the prebuilt output) installs without
Node.js; only a clean clone, or changed sources, needs it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

NODE_MIN = (20, 19)
"""jupyter-builder's rspack needs Node.js >= 20.19."""

INPUTS = ("src", "style", "schema", "package.json", "yarn.lock", "tsconfig.json")


class LabExtensionBuildError(RuntimeError):
    """The lab extension must be built and cannot be; the message says what to do."""


def newest_input(ext_dir: Path) -> float:
    """Modification time of the newest file among the extension's inputs."""
    newest = 0.0
    for name in INPUTS:
        path = ext_dir / name
        files = path.rglob("*") if path.is_dir() else [path]
        for f in files:
            if f.is_file():
                newest = max(newest, f.stat().st_mtime)
    return newest


def is_stale(ext_dir: Path, build_dir: Path) -> bool:
    """True when the build output is missing or older than one of its inputs."""
    stamp = build_dir / "package.json"
    return not stamp.is_file() or stamp.stat().st_mtime < newest_input(ext_dir)


def node_problem(node: str | None) -> str | None:
    """Why ``node`` cannot build the extension, or None when it can."""
    if node is None:
        return "Node.js is not installed (no `node` on PATH)"
    try:
        out = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"`{node} --version` failed: {err}"
    m = re.match(r"v(\d+)\.(\d+)", out.strip())
    if m is None:
        return f"`{node} --version` printed {out.strip()!r}"
    if (int(m[1]), int(m[2])) < NODE_MIN:
        return f"Node.js {out.strip()} is too old (need >= {NODE_MIN[0]}.{NODE_MIN[1]})"
    return None


def build(target_name: str, version: str, **kwargs: Any) -> None:
    """hatch-jupyter-builder entry point: build ``labextension/`` into the package if stale."""
    from hatch_jupyter_builder import npm_builder

    ext_dir = Path(kwargs.get("path", "labextension")).resolve()
    build_dir = Path(kwargs["build_dir"]).resolve()
    if not is_stale(ext_dir, build_dir):
        return
    problem = node_problem(shutil.which("node"))
    if problem is not None:
        raise LabExtensionBuildError(
            f"jupyter_vram: the JupyterLab extension in {ext_dir} must be built into "
            f"{build_dir}, and {problem}. Install Node.js >= {NODE_MIN[0]}.{NODE_MIN[1]} "
            "(https://nodejs.org, or `conda install nodejs`) and retry, or install a "
            "released wheel (`pip install jupyter_vram`), which carries the extension "
            "prebuilt and needs no Node.js."
        )
    try:
        npm_builder(target_name, version, **{**kwargs, "force": True})
    except subprocess.CalledProcessError as err:
        cmd = " ".join(str(c) for c in err.cmd) if isinstance(err.cmd, list) else err.cmd
        raise LabExtensionBuildError(
            f"jupyter_vram: building the JupyterLab extension failed: `{cmd}` (in {ext_dir}) "
            f"exited with {err.returncode}; its output is above. `jlpm install` needs the npm "
            "registry (or a warm yarn cache); run `cd labextension && jlpm install && jlpm "
            "build` to see the error alone."
        ) from None
