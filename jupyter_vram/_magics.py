"""`%%vram` and `%vram`: a thin shell over `session.run_code` and the renderers."""

from __future__ import annotations

import sys
import tokenize
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ._capture import STACK_MODES, RecordingError, parse_device
from ._model import Profile as ProfileData
from ._profile import Profile
from ._render.text import summary
from ._session import RecordingNotStarted, run_code


def current_cell_number(shell: Any) -> int:
    """The number IPython gave the running cell (``In[n]``). IPython 9 has already counted
    the next cell while this one runs, so read it from the cell's own code file."""
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if isinstance(names, dict):
        frame = sys._getframe(1)
        while frame is not None:
            number = names.get(frame.f_code.co_filename)
            if isinstance(number, int):
                return number
            frame = frame.f_back  # type: ignore[assignment]
    return int(shell.execution_count)


def shown_value(value: Any, source: str) -> Any:
    """The cell's value, or None when its last statement ends in ``;``: as without %%vram
    (and as %%time does), a trailing semicolon keeps the value from being displayed."""
    from IPython.core.displayhook import DisplayHook

    try:
        quiet = DisplayHook.semicolon_at_end_of_expression(source)
    except (SyntaxError, tokenize.TokenError):  # the cell ran, so this is only a nicety
        quiet = False
    return None if quiet else value


def said(error: object, outcome: str) -> str:
    """One line: the problem, then what became of the cell (no ``.;`` between them)."""
    return f"{str(error).rstrip(' .')}; {outcome}"


def _capacity(text: str | None, outcome: str = "the cell did not run") -> int | None:
    """``--capacity`` in bytes; a bad size prints one message (ending in ``outcome``) and
    gives None."""
    if text is None:
        return None
    from ._capture.capacity import parse_capacity

    try:
        return parse_capacity(text)
    except ValueError as error:
        print(f"%%vram: {said(error, outcome)}", file=sys.stderr)
        return None


class VramLimitExceeded(AssertionError):
    """``%%vram --max``: the cell ran, and its peak passed the limit."""


def _within(limit: int | None, value: Any, profile: Any) -> Any:
    """``value`` when there is no limit or the peak kept to it; else show the value (the
    cell's output comes first) and raise :class:`VramLimitExceeded` saying by how much."""
    __tracebackhide__ = True
    if limit is None or not isinstance(profile, ProfileData):
        return value
    from ._analysis.limits import over_limit

    message = over_limit(profile, limit)
    if message is None:
        return value
    if value is not None:
        from IPython.display import display

        display(value)
    raise VramLimitExceeded(f"%%vram --max: {message}")


def _stacks(args: Any) -> str:
    """The stack mode ``--stacks`` / ``--no-stacks`` ask for."""
    return "none" if args.no_stacks else str(args.stacks)


@magics_class
class VramMagics(Magics):
    @magic_arguments()
    @argument(
        "--device", default=None, help="device to record (default: cuda if available, else cpu)"
    )
    @argument("--no-stacks", action="store_true", help="skip Python stacks (lower overhead)")
    @argument(
        "--stacks",
        choices=STACK_MODES,
        default="sampled",
        help="Python stacks: sampled (default, cheap), full (traced: exact lines, every Python "
        "call recorded: slow on Python-heavy cells), none",
    )
    @argument(
        "--all-ops",
        action="store_true",
        help="keep every op name and record every step of a loop in detail, however much it "
        "costs (by default a loop's repeated steps keep only the allocator's reports, labelled "
        "from the step they repeat, and a cell whose recording falls behind is recorded "
        "without op names past the first 15%% of its time)",
    )
    @argument("--quiet", "-q", action="store_true", help="record only; show nothing")
    @argument("--text", action="store_true", help="print the text summary instead of the app")
    @argument("--amp", default=None, help="record with autocast: bf16 or fp16")
    @argument(
        "--checkpoint",
        nargs="?",
        const="auto",
        default=None,
        help="record with activation checkpointing: auto (repeated blocks) or MOD,MOD",
    )
    @argument("--offload", action="store_true", help="record with activations in host memory")
    @argument(
        "--compare",
        default=None,
        help="amp,checkpoint,offload: record the cell, then rerun it with each, side by side",
    )
    @argument(
        "--capacity",
        default=None,
        help="raise torch.OutOfMemoryError past this much memory (6GiB, 6GB, 512MiB, bytes): "
        "would the cell fit on a device this size?",
    )
    @argument(
        "--max",
        default=None,
        help="a memory budget (2GiB, 512MiB, bytes): the cell runs to its end, then fails if "
        "its peak passed this (with the top three sites)",
    )
    @argument(
        "--nproc",
        type=int,
        default=None,
        help="run the cell's main() on N ranks under torch.distributed, one profile per rank",
    )
    @argument("--timeout", type=float, default=300.0, help="--nproc: seconds for all ranks")
    @line_cell_magic
    def vram(self, line: str, cell: str | None = None) -> Any:
        """Cell: run the cell under memory recording and show where the memory went.

        Line: show device memory now (allocated / reserved / device used on CUDA; the tensors
        alive per category otherwise).
        """
        __tracebackhide__ = True
        args = parse_argstring(self.vram, line)
        try:
            parse_device(args.device)
        except RecordingError as error:
            if cell is None:
                print(f"%vram: {error}", file=sys.stderr)
            else:
                print(f"%%vram: {said(error, 'the cell did not run')}", file=sys.stderr)
            return None
        capacity = _capacity(args.capacity)
        if args.capacity is not None and capacity is None:
            return None
        limit = _capacity(args.max)
        if args.max is not None and limit is None:
            return None
        if cell is None:
            from ._devices import memory_now

            print(memory_now(args.device))
            return None
        shell = self.shell
        assert shell is not None
        source = shell.transform_cell(cell)
        if not source.strip():
            print("%%vram: the cell is empty; nothing to record")
            return None
        number = current_cell_number(shell)
        filename = shell.compile.cache(source, number)

        if args.nproc is not None:
            return self._vram_ranks(source, filename, args)

        def show(profile: Profile) -> None:
            self._show(profile, args)

        if args.amp or args.checkpoint or args.offload or args.compare:
            before = shell.user_ns.get("_vram")
            value = self._vram_changed(source, filename, number, args, show)
            after = shell.user_ns.get("_vram")
            return _within(limit, value, after if after is not before else None)
        try:
            run = run_code(
                source,
                shell.user_ns,
                filename=filename,
                device=args.device,
                stacks=_stacks(args),
                ops="all" if args.all_ops else "auto",
                on_profile=show,
                capacity=capacity,
                cell=f"In [{number}]",
            )
        except RecordingNotStarted as error:
            print(f"%%vram: {said(error, 'the cell did not run')}", file=sys.stderr)
            return None
        if run.nested:
            print("%%vram: already recording; this nested cell ran without its own recording")
        return _within(limit, shown_value(run.value, source), run.profile)

    def _vram_ranks(self, source: str, filename: str, args: Any) -> None:
        """``--nproc N``: the cell defines main(); run it on N ranks, show the ranks."""
        from ._distributed.cell import CellError, run_cell_on_ranks
        from ._distributed.launcher import LaunchError

        shell = self.shell
        assert shell is not None
        try:
            profiles = run_cell_on_ranks(
                source,
                shell.user_ns,
                filename=filename,
                nproc=args.nproc,
                device=args.device,
                stacks=_stacks(args),
                timeout=args.timeout,
            )
        except CellError as error:
            print(f"%%vram: {error}", file=sys.stderr)
            return
        except LaunchError as error:
            print(f"%%vram: {error}", file=sys.stderr)
            profiles = [p for p in error.profiles if p is not None]
            if not profiles:
                return
        shell.user_ns["_vram"] = profiles
        if args.quiet:
            return
        if args.text:
            from ._distributed.summary import ranks_text

            print(ranks_text(profiles))
            return
        from IPython.display import display

        from ._app.ranks_view import RanksApp

        display(RanksApp(profiles))

    def _vram_changed(self, source: str, filename: str, number: int, args: Any, show: Any) -> Any:
        """``--amp / --checkpoint / --offload``: record the cell with the change applied;
        ``--compare``: record it plain, then rerun it with each technique, side by side."""
        __tracebackhide__ = True
        from ._rerun import RerunError, parse_techniques, run_changed

        shell = self.shell
        assert shell is not None
        common = {
            "filename": filename,
            "device": args.device,
            "stacks": _stacks(args),
            "ops": "all" if args.all_ops else "auto",
        }
        try:
            if args.compare:
                if args.amp or args.checkpoint or args.offload:
                    raise RerunError("--compare runs each technique itself; drop the others")
                techniques = parse_techniques(args.compare)
                run = run_code(source, shell.user_ns, **common, cell=f"In [{number}]")
            else:
                checkpoint = args.checkpoint
                if checkpoint is not None and checkpoint != "auto":
                    checkpoint = [p.strip() for p in checkpoint.split(",") if p.strip()]
                run = run_changed(
                    source, shell.user_ns, **common, cell=f"In [{number}]", amp=args.amp,
                    checkpoint=checkpoint, offload=args.offload, on_profile=show,
                )  # fmt: skip
        except (RerunError, RecordingNotStarted) as error:
            print(f"%%vram: {said(error, 'the cell did not run')}", file=sys.stderr)
            return None
        if run.nested or run.profile is None:
            print("%%vram: already recording; this nested cell ran without its own recording")
            return shown_value(run.value, source)
        if args.compare:
            self._compare(run.profile, techniques, args)
        return shown_value(run.value, source)

    def _compare(self, baseline: Profile, techniques: list[str], args: Any) -> None:
        """Rerun ``baseline`` with each technique; the app (shown first) gets each variant in
        its Compare tab as it arrives; ``--text`` prints verdicts and tables instead."""
        from ._analysis.compare import compare, verdict
        from ._rerun import rerun_each

        shell = self.shell
        assert shell is not None
        shell.user_ns["_vram"] = baseline
        variants: list[Profile] = []
        shell.user_ns["_vram_variants"] = variants
        app = None
        if not args.quiet and not args.text:
            from IPython.display import display

            from ._app import ProfileApp

            app = ProfileApp(baseline)
            display(app)
        for technique in techniques:
            (variant,) = rerun_each(baseline, [technique])
            if isinstance(variant, str):
                if not args.quiet:
                    print(f"%%vram --compare: {variant}")
                continue
            variants.append(variant)
            if app is not None:
                app.add_variant(variant, baseline)
            elif args.text and not args.quiet:
                print(verdict(baseline, variant))
                print(compare(baseline, variant).to_string())
                print()

    def _show(self, profile: Profile, args: Any) -> None:
        """Bind ``_vram`` and display the profile as the options ask."""
        shell = self.shell
        assert shell is not None
        shell.user_ns["_vram"] = profile
        if args.quiet:
            return
        if args.text:
            print(summary(profile))
            return
        from IPython.display import display

        from ._session import matching_estimate, saved_view_first

        estimate = matching_estimate(profile)
        comparison = estimate.compare(profile) if estimate is not None else None
        if saved_view_first():  # the page draws it; the live app is built when asked for
            from ._app.first_view import show_saved

            show_saved(profile, comparison)
            return
        from ._app import ProfileApp

        display(ProfileApp(profile, comparison=comparison))

    # -- cells with top-level await (see async_cells): IPython runs the body itself ----------

    def _async_begin(self, line: str) -> None:
        """Start recording for an async %%vram cell (a message, and no recording, on error)."""
        from ._capture import RECORDING_LOCK
        from ._recording import record

        self._async = None
        args = parse_argstring(self.vram, line)
        try:
            parse_device(args.device)
        except RecordingError as error:
            print(f"%%vram: {said(error, 'the cell runs unrecorded')}", file=sys.stderr)
            return
        if args.amp or args.checkpoint or args.offload or args.compare:
            print(
                "%%vram: --amp, --checkpoint, --offload and --compare need a cell without "
                "top-level await; the cell runs unrecorded",
                file=sys.stderr,
            )
            return
        if RECORDING_LOCK.locked():
            print("%%vram: already recording; this nested cell runs without its own recording")
            return
        if args.max is not None:
            print(
                "%%vram: --max needs a cell without top-level await; this cell's peak is "
                "recorded, not checked against it",
                file=sys.stderr,
            )
        assert self.shell is not None
        capacity = _capacity(args.capacity, "the cell runs unrecorded")
        if args.capacity is not None and capacity is None:
            return
        rec = record(
            args.device,
            stacks=_stacks(args),
            ops="all" if args.all_ops else "auto",
            namespace=self.shell.user_ns,
            capacity=capacity,
        )
        try:
            rec.__enter__()
        except RecordingError as error:
            print(f"%%vram: {said(error, 'the cell runs unrecorded')}", file=sys.stderr)
            return
        self._async = (rec, args)

    def _async_end(self, error: BaseException | None) -> None:
        state, self._async = getattr(self, "_async", None), None
        if state is None:
            return
        rec, args = state
        if error is None:
            rec.__exit__(None, None, None)
        else:
            rec.__exit__(type(error), error, error.__traceback__)
        from ._session import remember

        remember(rec.profile)
        self._show(rec.profile, args)

    @magic_arguments()
    @argument("model", help="the model: a name or expression in the notebook (nn.Module)")
    @argument(
        "--input",
        "-i",
        default=None,
        help="a shape (8x3x224x224; 8x512 = token ids), name=shape pairs, or a variable "
        "holding tensors / a dict / a batch function (default: from a transformers config)",
    )
    @argument("--batch-size", "-b", type=int, default=None, help="batch size (first dim)")
    @argument(
        "--loss",
        default=None,
        help="a function loss(output, batch) in the notebook (default: output.loss, else a sum)",
    )
    @argument(
        "--optimizer",
        default="adamw",
        help="adamw, adam, sgd, adafactor, adamw8bit, pagedadamw8bit, ...",
    )
    @argument("--dtype", default=None, help="cast parameters: fp32, bf16, fp16")
    @argument("--amp", default=None, help="autocast dtype: bf16 or fp16")
    @argument("--checkpoint", action="store_true", help="activation checkpointing")
    @argument("--inference", action="store_true", help="forward only, under no_grad")
    @argument(
        "--lora",
        default=None,
        metavar="SPEC",
        help="what if the model were fine-tuned with peft LoRA adapters: LoraConfig arguments "
        "(r=16,target_modules=q_proj+v_proj) or a notebook variable holding a dict",
    )
    @argument(
        "--qlora",
        action="store_true",
        help="what if its linear layers were bitsandbytes NF4 (QLoRA; adapters from --lora)",
    )
    @argument(
        "--generate",
        type=int,
        default=None,
        metavar="N",
        help="model.generate() of N new tokens with a KV cache instead of a training step "
        "(--input: the prompt, a length such as 512 or a shape such as 4x512)",
    )
    @argument(
        "--cache",
        default="dynamic",
        help="with --generate: dynamic (default), static or quantized (optimum-quanto)",
    )
    @argument(
        "--cache-config",
        default=None,
        metavar="K=V,...",
        help="with --cache quantized: transformers' cache_config, e.g. nbits=2,residual_length=64",
    )
    @argument("--device", default="cuda", help="device to predict: cuda (default) or cpu")
    @argument("--gpu", default=None, help="a GPU to check (e.g. A100-80GB): fit + largest batch")
    @argument("--what-if", action="store_true", help="also show the what-if table")
    @argument("--gpus", type=int, default=8, help="GPUs for the data-parallel what-ifs")
    @argument("--timeout", type=float, default=300.0, help="seconds before giving up")
    @argument("--text", action="store_true", help="print text instead of the app")
    @line_magic
    def vram_estimate(self, line: str) -> None:
        """Predict a training step's (or a generate() call's) memory without a GPU, and what
        it fits on."""
        from ._magics_estimate import run_estimate_magic

        args = parse_argstring(self.vram_estimate, line)
        shell = self.shell
        assert shell is not None
        run_estimate_magic(args, shell.user_ns)
