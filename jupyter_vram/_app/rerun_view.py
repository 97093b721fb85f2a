"""The row of rerun toggles above the app's tabs: AMP, activation checkpointing, offload, and
a Rerun button with progress and cancel.

Where the rerun runs. A widget's click handler runs inside the kernel. With JupyterLab 4.6 and
ipykernel 7, widget messages go to a kernel *subshell*: another thread, next to the one that
runs cells. A rerun must not run there: cells could run at the same time (and change what the
rerun restores), and signals (a kernel interrupt) only reach the main thread. So a click made
on a subshell hands the rerun to the kernel's main thread (its event loop: it starts when no
cell is running, and cells wait for it, as for a cell). Without subshells the click handler
already runs on the main thread and the rerun runs right there.

Cancel is a kernel interrupt. While the rerun runs the main thread is busy, so a second widget
message (a widget Cancel button) would wait for it to finish. An interrupt is not a message
to the kernel but a signal (SIGINT) the Jupyter server sends the kernel process; on the main
thread it raises KeyboardInterrupt inside the rerun, which undoes what it changed (the engine
restores the notebook's state on any exception) and the bar says "cancelled". The rerun makes
SIGINT raise itself (a click can be handled on the main thread while the kernel ignores SIGINT),
and an interrupt the interpreter drops (one that lands in a weakref callback) is sent again, so
a Cancel at any moment of the rerun stops it (see interrupts.py). The Cancel
button shown while a rerun runs asks the Jupyter server to interrupt this kernel from the page
itself (the request the toolbar's stop button makes); where that request cannot be made (a
frontend without the Jupyter server API) the hint next to it says to press the stop button.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as w
from ipywidgets.widgets.widget_bool import ToggleButtonStyle
from ipywidgets.widgets.widget_description import DescriptionStyle
from ipywidgets.widgets.widget_string import HTMLStyle

from .._render.templating import render
from .holder import GONE, ProfileHandle
from .interrupts import interrupts_raise
from .shared import kept

if TYPE_CHECKING:
    from .._model import Profile

TEMPLATE = "rerun_view.html.j2"
AUTO = "auto"
AUTO_LABEL = "auto (the repeated blocks holding the most activations)"

STYLE = """<style>
.jv-rerun{border-top:1px solid var(--jp-border-color2,#ddd);
border-bottom:1px solid var(--jp-border-color2,#ddd);padding:3px 0;margin:2px 0 4px}
.jv-rerun-row{align-items:center;flex-wrap:wrap}
.jv-rerun-title{font-weight:600;font-size:13px;margin-right:6px}
.jv-rerun-status{font-size:13px}
.jv-rerun-status .jv-running{color:var(--jp-ui-font-color1,#222)}
.jv-rerun-status .jv-done{color:var(--jp-success-color1,#2a7a2a)}
.jv-rerun-status .jv-failed{color:var(--jp-error-color1,#a00)}
.jv-cancel-btn{margin-left:8px;padding:1px 10px;cursor:pointer}
.jv-rerun-note{font-size:12px;color:var(--jp-ui-font-color2,#666);margin:2px 0}
</style>"""

# Asks the Jupyter server to interrupt the kernel (the request JupyterLab's stop button
# makes): the page's base URL and token come from JupyterLab's / Notebook 7's page config,
# the XSRF cookie is sent back as a header as @jupyterlab/services does.
_INTERRUPT_JS = """(async (b) => {
b.disabled = true; b.textContent = 'cancelling\u2026';
try {
  const el = document.getElementById('jupyter-config-data');
  const cfg = el ? JSON.parse(el.textContent) : {};
  const headers = {};
  if (cfg.token) headers['Authorization'] = 'token ' + cfg.token;
  const x = document.cookie.match('\\\\b_xsrf=([^;]*)');
  if (x) headers['X-XSRFToken'] = x[1];
  const r = await fetch((cfg.baseUrl || '/') + 'api/kernels/KERNEL/interrupt',
                        {method: 'POST', headers, credentials: 'same-origin'});
  if (!r.ok) throw new Error(r.status);
  b.textContent = 'interrupt sent';
} catch (e) { b.textContent = 'press \u25a0 (interrupt the kernel) to cancel'; }
})(this)"""

CANCEL_HINT = (
    "Cancel interrupts the kernel (like \u25a0 in the toolbar): the rerun stops and the "
    "notebook's state is restored as the cell left it."
)


def kernel_id() -> str | None:
    """This kernel's id, from its connection file's name (``kernel-<id>.json``), or None
    outside a Jupyter kernel."""
    try:
        from ipykernel.connect import get_connection_file

        name = get_connection_file()
    except Exception:  # noqa: BLE001 (no kernel, no app: the hint alone is shown)
        return None
    match = re.search(r"kernel-([0-9a-fA-F-]{8,})\.json$", name)
    return match.group(1) if match else None


def cancel_html(kernel: str | None) -> str:
    """The Cancel button (an interrupt request sent from the page) and the hint."""
    script = _INTERRUPT_JS.replace("KERNEL", kernel) if kernel is not None else None
    return render(TEMPLATE, "cancel", script=script, hint=CANCEL_HINT)


def repeated_blocks(profile: Profile) -> list[tuple[str, str]]:
    """(module path, class name) of the blocks a user can checkpoint: numbered children
    (``layers.0``, ``layers.1`` ...) of one parent, of one class, at least two of them, as
    the recording named them. Ordered by parent, then number."""
    types = profile.meta.get("module_types")
    kinds = {str(k): str(v) for k, v in types.items()} if isinstance(types, dict) else {}
    groups: dict[str, list[str]] = {}
    for path in profile.modules:
        parent, _, last = path.rpartition(".")
        if last.isdigit():
            groups.setdefault(parent, []).append(path)
    out: list[tuple[str, str]] = []
    for parent in sorted(groups):
        paths = sorted(set(groups[parent]), key=lambda p: int(p.rpartition(".")[2]))
        classes = {kinds.get(p, "") for p in paths}
        if len(paths) >= 2 and len(classes) == 1:
            out.extend((p, kinds.get(p, "")) for p in paths)
    return out


class _Toggles:
    """The bar's option toggles: one style and width for all; one that cannot apply to the
    profile is greyed out, its tooltip saying why."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.style = kept(ToggleButtonStyle)
        self.layout = kept(w.Layout, width="auto")

    def make(self, label: str, name: str, icon: str, options: dict[str, Any], tip: str) -> Any:
        from .._rerun import rerun_unavailable

        # host memory was checked for the whole bar (rerun_bar): no option changes it
        reason = rerun_unavailable(self.profile, check_host=False, **options)
        classes = [f"jv-rerun-{name}"] + (["jv-unavailable"] if reason else [])
        return w.ToggleButton(
            description=label, icon=icon, disabled=reason is not None, tooltip=reason or tip,
            style=self.style, layout=self.layout, _dom_classes=classes,
        )  # fmt: skip


class RerunBar(w.VBox):  # type: ignore[misc]
    """Toggles, Rerun, progress and cancel. ``on_variant(baseline, variant)`` receives each
    finished rerun (the app adds it to its Compare tab). Made by :func:`rerun_bar`, once a
    rerun of the profile can apply (host memory included)."""

    def __init__(
        self, handle: ProfileHandle, on_variant: Callable[[Profile, Profile], None]
    ) -> None:
        from .._rerun import default_amp

        self._handle = handle
        self._on_variant = on_variant
        profile = handle.get()
        assert profile is not None
        self.running = False
        self.pending = False  # handed to the main thread, not started yet
        # Each widget is a comm the page opens, each change after it is made one more
        # message: widgets are made in their final state, with the kernel's shared styles
        # and layouts (the rows below the toggles, whose layouts change, have their own).
        toggles = _Toggles(profile)
        described = kept(DescriptionStyle)
        self.amp_dtype = w.Dropdown(
            options=["bf16", "fp16"],
            value=default_amp(profile.device),
            style=described,
            layout=kept(w.Layout, width="72px"),
            _dom_classes=("jv-rerun-amp-dtype",),
        )
        self.amp = toggles.make(
            "AMP", "amp", "compress", {"amp": self.amp_dtype.value},
            "rerun under autocast in the chosen dtype",
        )  # fmt: skip
        self.checkpoint = toggles.make(
            "checkpointing", "checkpoint", "repeat", {"checkpoint": AUTO},
            "rerun with activation checkpointing (torch.utils.checkpoint) on the blocks picked",
        )  # fmt: skip
        self.offload = toggles.make(
            "offload", "offload", "upload", {"offload": True},
            "rerun with activations saved to host memory (save_on_cpu)",
        )  # fmt: skip
        blocks = repeated_blocks(profile)
        self._choices = [(AUTO_LABEL, AUTO)] + [(f"{p} ({k})" if k else p, p) for p, k in blocks]
        self._rows: dict[str, w.Widget] = {}  # pick, blocks, cancel: made when first shown
        self.button = w.Button(
            description="Rerun", icon="play", button_style="primary", disabled=True,
            tooltip="run the cell again with the changes switched on, and compare",
            style=kept(w.ButtonStyle), layout=kept(w.Layout), _dom_classes=("jv-rerun-button",),
        )  # fmt: skip
        text, plain = kept(HTMLStyle), kept(w.Layout)
        self.status = w.HTML(style=text, layout=plain, _dom_classes=("jv-rerun-status",))
        for widget in (self.amp, self.amp_dtype, self.checkpoint, self.offload):
            widget.observe(self._on_change, "value")
        self.button.on_click(lambda _: self.click())
        title = w.HTML(  # the bar's style sheet rides along with its title
            STYLE + "<span class='jv-rerun-title'>Rerun with:</span>", style=text, layout=plain
        )
        row = w.HBox(
            [title, self.amp, self.amp_dtype, self.checkpoint, self.offload, self.button,
             self.status],
            layout=plain, _dom_classes=("jv-rerun-row",),
        )  # fmt: skip
        self._toggle_row = row
        super().__init__([row], layout=plain, _dom_classes=("jv-rerun",))

    # The rows under the toggles show only after a click (a block offered from the flame
    # graph, checkpointing on, a rerun running): each is made when first asked for, so an
    # app that is only looked at sends none of them (three widgets and their layouts, a
    # message each way).
    @property
    def pick(self) -> w.Button:
        """Offers the block clicked in the flame graph (see :func:`link_flame`)."""
        return self._row("pick", self._make_pick)

    @property
    def blocks(self) -> w.SelectMultiple:
        """The blocks to checkpoint; shown while checkpointing is on."""
        return self._row("blocks", self._make_blocks)

    @property
    def cancel(self) -> w.HTML:
        """The Cancel button and its hint, while a rerun runs."""
        return self._row("cancel", self._make_cancel)

    def _row(self, name: str, make: Callable[[], Any]) -> Any:
        if name not in self._rows:
            self._rows[name] = make()
            order = [self._rows[n] for n in ("pick", "blocks", "cancel") if n in self._rows]
            self.children = [self._toggle_row, *order]
        return self._rows[name]

    def _make_pick(self) -> w.Button:
        pick = w.Button(
            icon="plus", style=kept(w.ButtonStyle), layout=w.Layout(display="none", width="auto"),
            _dom_classes=("jv-rerun-pick",),
        )  # fmt: skip
        pick.on_click(lambda _: self.add_block(pick.tooltip))
        return pick

    def _make_blocks(self) -> w.SelectMultiple:
        blocks = w.SelectMultiple(
            options=self._choices,
            value=(AUTO,),
            rows=min(6, len(self._choices)),
            style=kept(DescriptionStyle),
            layout=w.Layout(width="420px", display="" if self.checkpoint.value else "none"),
            _dom_classes=("jv-rerun-blocks",),
        )
        blocks.observe(self._on_change, "value")
        return blocks

    @staticmethod
    def _make_cancel() -> w.HTML:
        return w.HTML(
            style=kept(HTMLStyle), layout=w.Layout(display="none"),
            _dom_classes=("jv-rerun-cancel",),
        )  # fmt: skip

    def block_of(self, flame_path: tuple[str, ...]) -> str | None:
        """The checkpointable block a flame graph node lies in (``Blocks > blocks > 2 >
        addmm`` -> ``Blocks.blocks.2``), or None; backward / optimizer nodes count too."""
        names = [n for n in flame_path if not n.startswith("[")]
        offered = {value for _, value in self._choices}
        for end in range(len(names), 0, -1):
            path = ".".join(names[:end])
            if path in offered and path != AUTO:
                return path
        return None

    def offer_block(self, flame_path: tuple[str, ...]) -> None:
        """Offer to checkpoint the block under the flame graph node the user zoomed to."""
        block = self.block_of(flame_path)
        usable = block is not None and not self.checkpoint.disabled
        if not usable and "pick" not in self._rows:
            return  # nothing offered yet, nothing to hide
        self.pick.layout.display = "" if usable else "none"
        self.pick.description = f"checkpoint {block}" if usable else ""
        self.pick.tooltip = block if usable and block else ""

    def add_block(self, block: str) -> None:
        """Switch checkpointing on with ``block`` among the blocks picked."""
        if not block or self.checkpoint.disabled:
            return
        picked = [v for v in self.blocks.value if v != AUTO]
        self.blocks.value = tuple(dict.fromkeys([*picked, block]))
        self.checkpoint.value = True
        self._on_change()

    def options(self) -> dict[str, Any]:
        """The rerun's keyword arguments as the toggles are set now."""
        picked = tuple(self.blocks.value) if "blocks" in self._rows else (AUTO,)
        checkpoint: str | list[str] | None = None
        if self.checkpoint.value:
            checkpoint = AUTO if AUTO in picked or not picked else list(picked)
        return {
            "amp": self.amp_dtype.value if self.amp.value else None,
            "checkpoint": checkpoint,
            "offload": bool(self.offload.value),
        }

    def _on_change(self, _: Any = None) -> None:
        if self.checkpoint.value or "blocks" in self._rows:
            self.blocks.layout.display = "" if self.checkpoint.value else "none"
        self._check()

    def _check(self, *, say: bool = True) -> str | None:
        """Enable Rerun when something is switched on and applies; else say why not (in the
        status line too, with ``say``)."""
        opts = self.options()
        if not any(v for v in opts.values()):
            self.button.disabled = True
            self.button.tooltip = "switch on AMP, checkpointing or offload first"
            return "nothing switched on"
        profile = self._handle.get()
        if profile is None:
            self.button.disabled = True
            self.status.value = f"<span class='jv-failed'>{GONE}</span>"
            return "profile gone"
        from .._rerun import rerun_unavailable

        reason = rerun_unavailable(profile, **opts)
        self.button.disabled = reason is not None or self.running or self.pending
        self.button.tooltip = reason or "run the cell again with these changes, and compare"
        if say:
            self.status.value = render(TEMPLATE, "failed", text=reason) if reason else ""
        return reason

    def _progress(self, started: float) -> Callable[[str], None]:
        def show(stage: str) -> None:
            took = time.perf_counter() - started
            self.status.value = render(TEMPLATE, "running", text=f"{stage} ({took:.1f} s)")

        return show

    def click(self) -> None:
        """What a click on Rerun does: rerun on the kernel's main thread (see the module's
        docstring), now when the click arrived there, else as soon as no cell runs."""
        if self.running or self.pending or self._check() is not None:
            return
        loop = main_loop()
        if loop is None:
            self.run()
            return
        self.pending = True
        self.button.disabled = True
        self.status.value = render(
            TEMPLATE,
            "running",
            text="queued: starts when the kernel is free (after the cell that is executing)",
        )
        loop.add_callback(self.run)

    def run(self) -> Profile | None:
        """Rerun with the toggles' options (what a click on Rerun does); returns the variant,
        or None when it failed or was cancelled (the bar says why). On the main thread a
        kernel interrupt cancels it, whatever the kernel's SIGINT handler was (see
        interrupts.interrupts_raise)."""
        self.pending = False
        if self.running or self._check() is not None:
            return None
        from .._rerun import RerunError, rerun

        baseline = self._handle.get()
        assert baseline is not None
        opts = self.options()
        started = time.perf_counter()
        self.running = True
        self.button.disabled = True
        variant = None
        try:
            with interrupts_raise() as interrupts:  # from the moment Cancel shows
                self.cancel.value = cancel_html(kernel_id())
                self.cancel.layout.display = ""
                progress = self._progress(started)
                progress("starting the rerun")
                variant = rerun(baseline, **opts, progress=progress)
            if interrupts.cancelled:  # it ended before a Cancel the interpreter dropped landed
                variant = None
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            self.status.value = render(TEMPLATE, "cancelled")
        except RerunError as error:
            self.status.value = render(TEMPLATE, "failed", text=error)
        except Exception as error:  # noqa: BLE001 (the cell raised: say so, on the bar)
            first = (str(error).splitlines() or [""])[0]
            kind = type(error).__name__
            self.status.value = render(TEMPLATE, "raised", kind=kind, message=first)
        finally:
            self.running = False
            if "cancel" in self._rows:
                self.cancel.layout.display = "none"
                self.cancel.value = ""
            self._check(say=False)
        if variant is not None:
            took = time.perf_counter() - started
            self.status.value = render(TEMPLATE, "done", seconds=took)
            self._on_variant(baseline, variant)
        return variant


def link_flame(bar: RerunBar, flame: Any) -> None:
    """Offer the block the user zooms to in ``flame`` (a FlameView) for checkpointing: its
    breadcrumb changes on every zoom, and ``flame.focus`` is the node zoomed to."""
    flame.crumbs.observe(lambda _: bar.offer_block(tuple(flame.focus)), "value")


def main_loop() -> Any:
    """The kernel's main-thread event loop when called from another thread (a subshell's),
    else None (already on the main thread, or no kernel)."""
    if threading.current_thread() is threading.main_thread():
        return None
    try:
        from IPython import get_ipython

        loop = getattr(getattr(get_ipython(), "kernel", None), "io_loop", None)
    except Exception:  # noqa: BLE001 (no IPython: run where we are)
        return None
    return loop if callable(getattr(loop, "add_callback", None)) else None


def rerun_bar(
    handle: ProfileHandle, on_variant: Callable[[Profile, Profile], None]
) -> w.Widget | None:
    """The toggle row for a profile that can rerun, a one-line note for a measured profile
    that cannot (loaded from a file, recorded with ``jv.record``), nothing for an estimate."""
    profile = handle.get()
    if profile is None or profile.source == "estimate":
        return None
    from .._rerun import rerun_unavailable

    reason = rerun_unavailable(profile)
    if reason is not None:
        return w.HTML(
            render(TEMPLATE, "unavailable", reason=reason),
            style=kept(HTMLStyle), layout=kept(w.Layout),
            _dom_classes=("jv-rerun-unavailable",),
        )  # fmt: skip
    return RerunBar(handle, on_variant)
