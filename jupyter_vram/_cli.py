"""The ``jupyter-vram`` command: reports, comparisons, whole-script recordings and estimates
from a shell or a CI job, with exit codes a script can test.

Exit codes: 0 done; 1 the profiled script or the estimate failed (a report of the run up to
the failure is still written); 2 bad input or usage (unreadable file, unknown option, model
spec that does not import). Progress goes to stderr, only on a terminal or with ``--progress``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import runpy
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from ._model import Profile

OK, FAILED, BAD_INPUT = 0, 1, 2


class UsageError(Exception):
    """Bad input: the message is printed and the exit code is 2."""


class Progress:
    """One updating status line on stderr (only when asked for or on a terminal)."""

    def __init__(self, enabled: bool | None, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.start = time.perf_counter()
        self._width = 0

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        text = f"jupyter-vram: {message}" if message else ""
        if text:
            text += f" [{time.perf_counter() - self.start:.1f} s]"
        pad = max(self._width - len(text), 0)
        end = "\n" if not self.stream.isatty() else ""
        self.stream.write("\r" + text + " " * pad + end)
        self.stream.flush()
        self._width = len(text)

    def done(self) -> None:
        if self.enabled and self.stream.isatty() and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()


NEITHER = (
    "neither a jupyter_vram profile (JSON, maybe gzip) nor a PyTorch memory snapshot "
    "(a torch.cuda.memory._dump_snapshot pickle)"
)


def load_profile(path: str, *, device: str | None, progress: Progress) -> Profile:
    """A saved jupyter_vram profile (JSON, maybe gzip) or a PyTorch snapshot (pickle / JSON)."""
    from ._model import Profile, ProfileFileError

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{path}: no such file")
    with file.open("rb") as fh:
        head = fh.read(2)
    not_json = False
    if head[:1] != b"\x80":  # not a pickle: JSON, maybe gzip; our profile or a JSON snapshot
        progress(f"reading {file.name}")
        try:
            return Profile.load(file)
        except ProfileFileError as exc:
            # the text did not parse: maybe an old text-protocol pickle, else neither
            not_json = isinstance(exc.__cause__, (ValueError, RecursionError))
            if not not_json and "not a jupyter_vram profile" not in str(exc):
                raise UsageError(str(exc)) from None
    from ._snapshots.file import profile_from_snapshot_source

    total = file.stat().st_size / 2**20

    def reading(done: int) -> None:
        progress(f"reading snapshot {file.name}: {done / 2**20:,.0f} / {total:,.0f} MiB")

    reading(0)
    try:
        return profile_from_snapshot_source(file, device=device, progress=reading)
    except ProfileFileError as exc:
        raise UsageError(f"{path}: {NEITHER}" if not_json else str(exc)) from None


def _write_html(profile: Profile, out: str, progress: Progress) -> Path:
    from ._render.html import write_report

    progress(f"writing {out}")
    return write_report(profile, out, resources="inline")


def cmd_report(args: argparse.Namespace, progress: Progress) -> int:
    from ._units import format_bytes

    profile = load_profile(args.input, device=args.device, progress=progress)
    path = _write_html(profile, args.output, progress)
    progress.done()
    print(f"{path}: {profile.device}, peak {format_bytes(profile.peak_bytes)}, "
          f"{len(profile.allocations):,} allocations")  # fmt: skip
    return OK


def compare_tables(a: Profile, b: Profile) -> list[tuple[str, pd.DataFrame]]:
    """(title, table) of the differences by category, module and op (``Profile.compare``)."""
    from ._analysis.compare import compare

    return [(f"by {by}", compare(a, b, by)) for by in ("category", "module", "op")]


def cmd_compare(args: argparse.Namespace, progress: Progress) -> int:
    import html

    from ._units import format_bytes

    a = load_profile(args.a, device=args.device, progress=progress)
    b = load_profile(args.b, device=args.device, progress=progress)
    progress("comparing")
    tables = compare_tables(a, b)
    change = b.peak_bytes - a.peak_bytes
    sign = "+" if change >= 0 else "-"
    head = (
        f"<h1>jupyter_vram: {html.escape(Path(args.a).name)} vs "
        f"{html.escape(Path(args.b).name)}</h1><p>peak {format_bytes(a.peak_bytes)} -> "
        f"{format_bytes(b.peak_bytes)} ({sign}{format_bytes(abs(change))})</p>"
    )
    body = "".join(
        f"<h2>{html.escape(title)}</h2>{table.to_html(border=0, float_format='{:.1f}'.format)}"
        for title, table in tables
    )
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>jupyter_vram compare</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{padding:2px 10px;text-align:right}th{border-bottom:1px solid #888}</style>"
        f"</head><body>{head}{body}</body></html>"
    )
    progress(f"writing {args.output}")
    Path(args.output).write_text(page, encoding="utf-8")
    progress.done()
    print(f"{args.output}: peak {format_bytes(a.peak_bytes)} -> {format_bytes(b.peak_bytes)}")
    return OK


@contextlib.contextmanager
def _script_context(script: Path, argv: Sequence[str]) -> Iterator[None]:
    """sys.argv and sys.path[0] as ``python script.py args`` would set them, restored after."""
    old_argv, old_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [str(script), *argv]
    if sys.path:
        sys.path[0] = str(script.parent)
    else:
        sys.path.insert(0, str(script.parent))
    try:
        yield
    finally:
        sys.argv = old_argv
        if old_path0 is not None:
            sys.path[0] = old_path0


def cmd_run(args: argparse.Namespace, progress: Progress) -> int:
    from ._capture import RecordingError, parse_device
    from ._recording import record
    from ._units import format_bytes

    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"{args.script}: no such script")
    try:
        parse_device(args.device)
    except RecordingError as error:  # a device this machine lacks: one line, exit 2
        raise UsageError(str(error)) from None
    if args.nproc_per_node is not None:  # torchrun records every rank (_distributed/run.py)
        from ._distributed.launcher import launch_problem
        from ._distributed.run import run_local

        problem = launch_problem(args.nproc_per_node, 1.0, nproc_name="--nproc-per-node")
        if problem is not None:
            raise UsageError(problem)
        return run_local(str(script), args.args, nproc=args.nproc_per_node,
                         out=args.ranks_dir, device=args.device)  # fmt: skip
    progress(f"running {script.name} under recording")
    status = OK
    rec = record(args.device)
    with _script_context(script.resolve(), args.args):
        try:
            with rec:
                runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            if code not in (None, 0):
                print(f"jupyter-vram: {script.name} exited with {code!r}", file=sys.stderr)
                status = FAILED
        except Exception:  # noqa: BLE001 (any error of the script: report it, exit 1)
            progress("")
            traceback.print_exc()
            print(f"jupyter-vram: {script.name} failed; the report covers the run up to the "
                  "error", file=sys.stderr)  # fmt: skip
            status = FAILED
    try:
        profile = rec.profile
    except RuntimeError:  # recording never started (a bad --device)
        return status or FAILED
    if args.save:
        profile.save(args.save)
    path = _write_html(profile, args.output, progress)
    progress.done()
    print(f"{path}: {profile.device}, peak {format_bytes(profile.peak_bytes)}, "
          f"{len(profile.allocations):,} allocations")  # fmt: skip
    return status


def load_factory(spec: str) -> Callable[[], Any]:
    """``package.module:factory`` or ``path/to/file.py:factory`` -> the callable."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise UsageError(f"model {spec!r}: expected module:factory or file.py:factory")
    try:
        if target.endswith(".py"):
            file = Path(target)
            if not file.is_file():
                raise UsageError(f"model {spec!r}: no such file {target}")
            namespace = runpy.run_path(str(file), run_name="jupyter_vram_model")
            found = namespace.get(name)
        else:
            sys.path.insert(0, os.getcwd())
            try:
                found = getattr(importlib.import_module(target), name, None)
            finally:
                sys.path.remove(os.getcwd())
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"model {spec!r}: importing it failed ({type(exc).__name__}: "
                         f"{exc})") from exc  # fmt: skip
    if not callable(found):
        raise UsageError(f"model {spec!r}: {name} is not a function or class there")
    return found  # type: ignore[no-any-return]


def cmd_estimate(args: argparse.Namespace, progress: Progress) -> int:
    from ._estimator import EstimateError, estimate, find_gpu
    from ._estimator.api import estimate_summary
    from ._estimator.inputs import InputError
    from ._estimator.search import format_batch
    from ._estimator.step import StepError
    from ._render.estimate_text import what_if_text

    factory = load_factory(args.model)
    try:
        gpu = find_gpu(args.gpu) if args.gpu else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    progress(f"estimating {args.model} on fake tensors")
    try:
        result = estimate(
            factory,
            args.input,
            optimizer=args.optimizer,
            device=args.device,
            dtype=args.dtype,
            amp=args.amp,
            checkpoint=args.checkpoint,
            batch_size=args.batch_size,
            inference=args.inference,
            timeout_s=args.timeout,
        )
        largest = result.max_batch_size(gpu, progress=progress) if gpu is not None else None
        what_ifs = result.what_ifs(gpus=args.gpus, progress=progress) if args.what_if else None
    except (EstimateError, StepError) as exc:  # the model's step itself failed
        progress.done()
        print(f"jupyter-vram estimate: {exc}", file=sys.stderr)
        return FAILED
    except (InputError, ValueError) as exc:  # a bad shape, optimizer or dtype name
        progress.done()
        raise UsageError(str(exc)) from None
    progress.done()
    print(estimate_summary(result))
    if what_ifs is not None:
        print(what_if_text(what_ifs))
    status = OK
    if gpu is not None and largest is not None:
        fits = result.fits(gpu)
        print(f"{gpu.name}: batch {result.batch_size} {'fits' if fits else 'does NOT fit'}; "
              f"largest batch that fits: {format_batch(largest)}")  # fmt: skip
        if args.require_fit and not fits:
            status = FAILED
    if args.output:
        _write_html(result.profile, args.output, progress)
        progress.done()
        print(f"report: {args.output}")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jupyter-vram",
        description="PyTorch memory reports from the shell (exit codes: 0 ok, 1 the script or "
        "estimate failed, 2 bad input).",
    )
    parser.add_argument("--progress", action="store_true", default=None,
                        help="progress on stderr even when it is not a terminal")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)

    rep = sub.add_parser("report", help="HTML report of a saved profile or a PyTorch snapshot")
    rep.add_argument("input", help="a profile (.json / .json.gz) or a _dump_snapshot pickle")
    rep.add_argument("-o", "--output", default="report.html")
    rep.add_argument("--device", default=None, help="cuda:N of a multi-device snapshot")

    cmp = sub.add_parser("compare", help="HTML diff of two runs by category, module and op")
    cmp.add_argument("a", help="the baseline (profile or snapshot)")
    cmp.add_argument("b", help="the variant (profile or snapshot)")
    cmp.add_argument("-o", "--output", default="diff.html")
    cmp.add_argument("--device", default=None, help="cuda:N of multi-device snapshots")

    run = sub.add_parser("run", help="record a whole Python script and write its report")
    run.add_argument("-o", "--output", default="report.html")
    run.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if any)")
    run.add_argument("--save", default=None, help="also save the profile (.json / .json.gz)")
    run.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="run the script on N local ranks with torchrun, one profile per rank",
    )
    run.add_argument(
        "--ranks-dir",
        default="vram_ranks",
        help="with --nproc-per-node: the folder for rank<N>.json.gz",
    )
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")

    est = sub.add_parser("estimate", help="predict a training step's memory without a GPU")
    est.add_argument("model", help="module:factory or file.py:factory building the nn.Module")
    est.add_argument("--input", "-i", default=None, help="a shape (8x3x224x224; 8x512 = token "
                     "ids) or name=shape pairs (default: from a transformers config)")  # fmt: skip
    est.add_argument("--batch-size", "-b", type=int, default=None)
    est.add_argument("--optimizer", default="adamw", help="adamw, adam, sgd, adafactor, ...")
    est.add_argument("--dtype", default=None, help="cast parameters: fp32, bf16, fp16")
    est.add_argument("--amp", default=None, help="autocast dtype: bf16 or fp16")
    est.add_argument("--checkpoint", action="store_true", help="activation checkpointing")
    est.add_argument("--inference", action="store_true", help="forward only, under no_grad")
    est.add_argument("--device", default="cuda", help="device to predict: cuda or cpu")
    est.add_argument("--gpu", default=None, help="a GPU to check (A100-80GB): fit, largest batch")
    est.add_argument("--require-fit", action="store_true",
                     help="exit 1 when the step does not fit --gpu")  # fmt: skip
    est.add_argument("--what-if", action="store_true", help="also print the what-if table")
    est.add_argument("--gpus", type=int, default=8, help="GPUs for the data-parallel what-ifs")
    est.add_argument("--timeout", type=float, default=300.0, help="seconds before giving up")
    est.add_argument("-o", "--output", default=None, help="also write an HTML report")
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace, Progress], int]] = {
    "report": cmd_report,
    "compare": cmd_compare,
    "run": cmd_run,
    "estimate": cmd_estimate,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors exit 2 (argparse)
    progress = Progress(args.progress)
    try:
        return COMMANDS[args.command](args, progress)
    except UsageError as exc:
        progress.done()
        print(f"jupyter-vram {args.command}: {exc}", file=sys.stderr)
        return BAD_INPUT
    except KeyboardInterrupt:
        progress.done()
        print("jupyter-vram: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
