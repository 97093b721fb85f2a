"""`%%vram` and `%vram`: a thin shell over `session.run_code` and the renderers."""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .model import Profile
from .render.text import summary
from .session import run_code


@magics_class
class VramMagics(Magics):
    @magic_arguments()
    @argument(
        "--device", default=None, help="device to record (default: cuda if available, else cpu)"
    )
    @argument("--no-stacks", action="store_true", help="skip Python stacks (lower overhead)")
    @argument("--quiet", "-q", action="store_true", help="record only; show nothing")
    @argument("--text", action="store_true", help="print the text summary instead of the app")
    @line_cell_magic
    def vram(self, line: str, cell: str | None = None) -> Any:
        """Cell: run the cell under memory recording and show where the memory went.

        Line: show device memory now (allocated / reserved / device used on CUDA; the tensors
        alive per category otherwise).
        """
        __tracebackhide__ = True
        args = parse_argstring(self.vram, line)
        if cell is None:
            from .devices import memory_now

            print(memory_now(args.device))
            return None
        shell = self.shell
        assert shell is not None
        source = shell.transform_cell(cell)
        if not source.strip():
            print("%%vram: the cell is empty; nothing to record")
            return None
        filename = shell.compile.cache(source, shell.execution_count)

        def show(profile: Profile) -> None:
            shell.user_ns["_vram"] = profile
            if args.quiet:
                return
            if args.text:
                print(summary(profile))
                return
            from IPython.display import display

            from .app import ProfileApp

            display(ProfileApp(profile))

        run = run_code(
            source,
            shell.user_ns,
            filename=filename,
            device=args.device,
            stacks=not args.no_stacks,
            on_profile=show,
        )
        if run.nested:
            print("%%vram: already recording; this nested cell ran without its own recording")
        return run.value
