"""What the app's first display costs: `ProfileApp(profile)` in-process, and
`display(ProfileApp(_vram))` inside a real kernel (comms and the display's bundle included).

Usage: python bench/app_first_display.py [--repeats N] [--no-kernel]

Two cells, each recorded by `%%vram -q` (so the app has its rerun bar, as after a real cell):
a 200-step training loop of a 3-layer MLP with AdamW, and one GPT-2 small step (seq 128,
AdamW; needs transformers). Each figure is the median of N runs after a warm-up, with the
profile's flame trees dropped before each run (a first display computes them). Also printed:
the widgets a display opens (each a comm in a kernel), the update messages sent after they
opened, and the flame figure's bokeh models.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
SETUP = """\
import torch
torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                          torch.nn.ReLU(), torch.nn.Linear(128, 10))
mlp_opt = torch.optim.AdamW(mlp.parameters())
mlp_x, mlp_y = torch.randn(32, 64), torch.randint(0, 10, (32,))
if HAS_TRANSFORMERS:
    import transformers
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(attn_implementation="eager"))
    gpt2_opt = torch.optim.AdamW(gpt2.parameters())
    gpt2_ids = torch.randint(0, 50257, (1, 128))
"""
CELLS = {
    "MLP, 200 steps": "%%vram -q\nfor _ in range(200):\n    mlp_opt.zero_grad()\n"
    "    torch.nn.functional.cross_entropy(mlp(mlp_x), mlp_y).backward()\n    mlp_opt.step()\n",
    "GPT-2 small, 1 step": "%%vram -q\ngpt2(gpt2_ids, labels=gpt2_ids).loss.backward()\n"
    "gpt2_opt.step()\ngpt2_opt.zero_grad()\n",
}
DROP_TREES = (
    "from jupyter_vram._analysis.flame import _SHARED\n"
    "_SHARED.pop(_vram, None)\n_freed = gc.collect()"
)


def in_process(repeats: int) -> None:
    import ipywidgets as w
    from IPython.terminal.interactiveshell import TerminalInteractiveShell
    from IPython.testing.globalipapp import start_ipython

    from jupyter_vram._app import ProfileApp

    start_ipython()
    shell = TerminalInteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_vram")
    code = f"import gc\nHAS_TRANSFORMERS = {HAS_TRANSFORMERS}\n{SETUP}"
    assert shell.run_cell(code).success
    for name, cell in CELLS.items():
        if "gpt2" in cell and not HAS_TRANSFORMERS:
            continue
        assert shell.run_cell(cell).success
        ProfileApp(shell.user_ns["_vram"])
        took = []
        for _ in range(repeats):
            assert shell.run_cell(DROP_TREES).success
            opened, updates = count_messages(w)
            start = time.perf_counter()
            app = ProfileApp(shell.user_ns["_vram"])
            took.append((time.perf_counter() - start) * 1e3)
            restore(w)
        models = len(list(app.tabs.children[0].figure.references()))
        print(
            f"{name}: ProfileApp {statistics.median(took):.1f} ms in-process; {len(opened)} "
            f"widgets opened, {len(updates)} updates, {models} bokeh models"
        )


_ORIGINAL: dict[str, Any] = {}


def count_messages(w: Any) -> tuple[list[int], list[Any]]:
    """Record widget comm opens and update messages until :func:`restore`."""
    opened: list[int] = []
    updates: list[Any] = []
    _ORIGINAL.update(open=w.Widget.open, send=w.Widget._send)

    def record_open(self: Any) -> None:
        if self.comm is None:
            opened.append(id(self))
        _ORIGINAL["open"](self)

    def record_send(self: Any, msg: Any, buffers: Any = None) -> None:
        updates.append(msg)
        _ORIGINAL["send"](self, msg, buffers)

    w.Widget.open, w.Widget._send = record_open, record_send
    return opened, updates


def restore(w: Any) -> None:
    w.Widget.open, w.Widget._send = _ORIGINAL["open"], _ORIGINAL["send"]


def in_kernel(repeats: int) -> None:
    from real_cells import Kernel

    kernel = Kernel()
    try:
        kernel.run(f"HAS_TRANSFORMERS = {HAS_TRANSFORMERS}\n{SETUP}")
        kernel.run("from jupyter_vram._app import ProfileApp")
        for name, cell in CELLS.items():
            if "gpt2" in cell and not HAS_TRANSFORMERS:
                continue
            kernel.run(cell)
            kernel.run("display(ProfileApp(_vram))")
            timed = f"{DROP_TREES}\n_t0 = _t.perf_counter()\ndisplay(ProfileApp(_vram))"
            took = [kernel.in_kernel_ms(timed) for _ in range(repeats)]
            print(
                f"{name}: display(ProfileApp(_vram)) {statistics.median(took):.1f} ms in a kernel"
            )
    finally:
        kernel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-kernel", action="store_true")
    args = parser.parse_args()
    in_process(args.repeats)
    if not args.no_kernel:
        in_kernel(args.repeats)


if __name__ == "__main__":
    main()
