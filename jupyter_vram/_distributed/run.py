"""Record every rank of a script: ``torchrun --nproc-per-node N -m jupyter_vram.run
[--out DIR] train.py args...``.

Each rank runs the script as ``__main__`` (its own ``init_process_group`` included) under the
same recorder as ``%%vram`` and writes ``DIR/rank<RANK>.json.gz`` with its rank, world size
and node in ``meta``, also when the script raises (the profile then covers the run up to the
error, and the rank exits non-zero as the script would have). In a multi-node run DIR should
be shared storage, or gather the files afterwards. ``jv.Profile.load_ranks(DIR)`` reads them
back in rank order.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

from .._capture import STACK_MODES
from .files import rank_path
from .rank import format_error, rank_meta, record_rank


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_vram.run",
        description="Record the memory of every rank of a torch.distributed script.",
    )
    parser.add_argument("--out", default="vram_ranks", help="folder for rank<N>.json.gz")
    parser.add_argument("--device", default=None, help="device to record (default: cuda if any)")
    parser.add_argument("--no-stacks", action="store_true", help="skip Python stacks")
    parser.add_argument(
        "--stacks",
        choices=STACK_MODES,
        default="sampled",
        help="Python stacks: sampled (default), full (traced: exact, slower), none",
    )
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    script = Path(options.script)
    if not script.is_file():
        print(f"jupyter_vram.run: no such script: {script}", file=sys.stderr)
        return 2
    meta = rank_meta()
    device = options.device
    if device is None and "LOCAL_RANK" in os.environ:
        import torch

        if torch.cuda.is_available():
            device = f"cuda:{meta['local_rank']}"
    sys.argv = [str(script), *options.args]
    sys.path.insert(0, str(script.resolve().parent))
    namespace: dict[str, object] = {}

    def call() -> None:
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise

    out = rank_path(options.out, meta["rank"])
    out.parent.mkdir(parents=True, exist_ok=True)
    error = record_rank(
        call,
        out,
        device=device,
        stacks="none" if options.no_stacks else options.stacks,
        namespace=namespace,
        meta={**meta, "script": str(script)},
    )
    if error is not None:
        print(format_error(error), file=sys.stderr, end="")
        return 1
    return 0


def run_local(
    script: str, args: list[str], *, nproc: int, out: str, device: str | None = None
) -> int:
    """``jupyter-vram run --nproc-per-node N``: torchrun on this machine, each rank recorded
    into ``out``; prints each rank's peak. Returns torchrun's exit code."""
    import subprocess

    from .._units import format_bytes
    from .files import load_ranks
    from .launcher import launch_problem

    problem = launch_problem(nproc, 1.0, nproc_name="--nproc-per-node")
    if problem is not None:  # before torchrun starts any process
        print(f"jupyter-vram run: {problem}", file=sys.stderr)
        return 2

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "jupyter_vram.run",
        "--out",
        out,
        *(["--device", device] if device else []),
        script,
        *args,
    ]
    code = subprocess.call(command)
    try:
        profiles = load_ranks(out)
    except ValueError as exc:
        print(f"jupyter-vram: no rank profiles: {exc}", file=sys.stderr)
        return code or 1
    for profile in profiles:
        error = f" (failed: {profile.error})" if profile.error else ""
        print(
            f"{out}/rank{profile.meta.get('rank')}.json.gz: peak "
            f"{format_bytes(profile.peak_bytes)}{error}"
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
