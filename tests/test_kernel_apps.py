"""In a real kernel: a cell re-run under the same cell id (what Jupyter frontends send with
each execution) closes the app its previous run displayed, so a long session does not keep
every app's widgets; and the recorder runs none of the user's code."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import jupyter_client
import pytest

pytestmark = pytest.mark.slow

#: what the kernel wrote to stderr (an old app's close raising at garbage collection lands here)
ERRORS: list[str] = []
CELL = "%%vram --no-stacks\nx = torch.ones(64, 64)\ny = x * 2\n"
#: widgets and apps the kernel holds now, counted by ipywidgets' own registry and the gc
COUNT = """
import gc, ipywidgets
gc.collect()
from jupyter_vram._app import ProfileApp
print(len(ipywidgets.widgets.widget._instances),
      sum(type(o) is ProfileApp for o in gc.get_objects()))
"""


@pytest.fixture
def kernel() -> Iterator[Any]:
    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def run(client: Any, code: str, cell_id: str | None = None, timeout: float = 120) -> str:
    """Execute ``code`` as the frontend does (with its cell id in the metadata); its stdout."""
    msg = client.session.msg(
        "execute_request",
        {"code": code, "silent": False, "store_history": True, "user_expressions": {},
         "allow_stdin": False, "stop_on_error": True},
        metadata={"cellId": cell_id} if cell_id else {},
    )  # fmt: skip
    client.shell_channel.send(msg)
    msg_id = msg["header"]["msg_id"]
    deadline = time.monotonic() + timeout
    while True:
        reply = client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    assert reply["content"]["status"] == "ok", reply["content"]
    out = []
    while True:
        try:
            io = client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            break
        if io["parent_header"].get("msg_id") != msg_id or io["msg_type"] != "stream":
            continue
        if io["content"]["name"] == "stderr":
            ERRORS.append(io["content"]["text"])
        if io["content"]["name"] == "stdout":
            out.append(io["content"]["text"])
    return "".join(out)


def counts(client: Any) -> tuple[int, int]:
    widgets, apps = run(client, COUNT).split()
    return int(widgets), int(apps)


def test_rerunning_one_cell_keeps_one_app(kernel: Any) -> None:
    run(kernel, "%load_ext jupyter_vram\nimport torch")
    run(kernel, CELL, cell_id="cell-a")
    one_widgets, one_apps = counts(kernel)
    assert one_apps == 1 and one_widgets > 10  # an app is a tree of many widgets
    for _ in range(29):
        run(kernel, CELL, cell_id="cell-a")
    assert counts(kernel) == (one_widgets, 1)
    assert not [e for e in ERRORS if "Exception ignored" in e or "Traceback" in e]
    # another cell's app is its own; re-running the first leaves it alone
    run(kernel, CELL, cell_id="cell-b")
    run(kernel, CELL, cell_id="cell-a")
    assert counts(kernel)[1] == 2
    # a plain run of the cell (the %%vram line removed) closes its last app too
    run(kernel, "z = 1", cell_id="cell-a")
    assert counts(kernel)[1] == 1
    # without cell ids (an old frontend), apps are kept as before: nothing to tie them to
    run(kernel, CELL)
    run(kernel, CELL)
    assert counts(kernel)[1] == 3


NOSY = """
class Nosy:
    '''Counts every attribute read through __getattr__ and every property read.'''
    calls = 0
    def __init__(self):
        self.t = torch.ones(8)
    def __getattr__(self, name):
        type(self).calls += 1
        raise AttributeError(name)
    @property
    def prop(self):
        type(self).calls += 1
        return torch.zeros(4)
class NosyList(list):
    def __iter__(self):
        Nosy.calls += 1
        return super().__iter__()
    def __len__(self):
        Nosy.calls += 1
        return super().__len__()
class NosyDict(dict):
    def __getitem__(self, key):
        Nosy.calls += 1
        return super().__getitem__(key)
    def values(self):
        Nosy.calls += 1
        return super().values()
nosy = Nosy()
nosy_list = NosyList([Nosy(), torch.ones(2)])
nosy_dict = NosyDict(a=Nosy(), b=torch.ones(3))
"""


def test_the_recorder_runs_no_user_code(kernel: Any) -> None:
    """Objects in the namespace whose ``__getattr__``, properties or container methods count
    their calls: a %%vram cell (recording, leaks, the app, a rerun's start state) makes none."""
    run(kernel, "%load_ext jupyter_vram\nimport torch")
    run(kernel, NOSY)
    assert run(kernel, "print(Nosy.calls)").strip() == "0"
    run(kernel, "%%vram\nkept = nosy.t * 2\nmore = [torch.ones(5) for _ in range(3)]\n", "c1")
    run(kernel, "leaks = _vram.leaks(); top = _vram.top_sites()")  # what the tabs show
    run(kernel, "lin = torch.nn.Linear(4, 2)")
    run(kernel, "%vram_estimate lin --input 2x4 --device cpu", "c3")
    assert run(kernel, "print(Nosy.calls)").strip() == "0"
    # the probes do count: a plain attribute miss and an iteration are two calls
    assert (
        run(kernel, "hasattr(nosy, 'missing')\nfor _ in nosy_list: pass\nprint(Nosy.calls)").strip()
        == "2"
    )
