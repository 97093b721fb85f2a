"""Interrupts at random moments of recording cells, in a real kernel: state stays clean.

A real ipykernel receives SIGINT the way a notebook's "interrupt" button sends it, at random
points of allocation-heavy ``%%vram`` cells (while the recorder starts, runs or stops). After
each one the kernel must have recording fully off (no profiler, hooks, signal handler or lock of
ours left) and the next ``%%vram`` must record normally. Bounded to about a minute.
"""

from __future__ import annotations

import contextlib
import queue
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

jupyter_client = pytest.importorskip("jupyter_client")

# long enough (about 0.3 s plain) that interrupts sent 0-0.4 s after it starts land inside
CELL = """%%vram -q
xs = []
for i in range(1000):
    xs.append(torch.randn(128, 128) @ torch.randn(128, 128))
    if len(xs) > 20:
        xs.pop(0)
"""

PROBE = """
import signal, threading, torch
from torch.nn.modules import module as _m
from torch.optim import optimizer as _o
from jupyter_vram._capture import RECORDING_LOCK, native
state = (
    torch.autograd.profiler._is_profiler_enabled,
    len(_m._global_forward_pre_hooks), len(_m._global_forward_hooks),
    len(_o._global_optimizer_pre_hooks), len(_o._global_optimizer_post_hooks),
    torch._C._autograd._top_saved_tensors_default_hooks(False) is None,
    threading.getprofile() is None,
    signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    RECORDING_LOCK.locked(),
    native.recording(),
    torch.autograd.profiler._run_on_profiler_start.__qualname__,
)
assert state == (
    False, 0, 0, 0, 0, True, True, True, False, False, "_run_on_profiler_start"
), state
"""

NEXT = """%%vram -q
probe = torch.ones(1024)
"""

CHECK = """assert 4096 in set(_vram.to_dataframe()["bytes"]) and _vram.error is None, _vram"""


@pytest.fixture
def kernel() -> Iterator[Any]:
    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def execute(client: Any, code: str, timeout: float = 60) -> dict[str, Any]:
    """Run ``code`` and wait for its reply (status 'ok' or 'error', with the error text)."""
    msg_id = client.execute(code)
    deadline = time.monotonic() + timeout
    while True:
        reply = client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply["content"])


def drain(client: Any) -> None:
    while True:
        try:
            client.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            return


@pytest.mark.slow
def test_random_interrupts_leave_the_kernel_clean(kernel: Any) -> None:
    manager, client = kernel
    setup = execute(client, "%load_ext jupyter_vram\nimport torch")
    assert setup["status"] == "ok", setup
    rng = random.Random(20261130)
    interrupted = 0
    lost = 0
    deadline = time.monotonic() + 45
    rounds = 0
    while time.monotonic() < deadline and rounds < 30:
        rounds += 1
        msg_id = client.execute(CELL)
        time.sleep(rng.uniform(0.0, 0.4))
        manager.interrupt_kernel()
        reply = None
        with contextlib.suppress(queue.Empty):
            while True:
                message = client.get_shell_msg(timeout=30)
                if message["parent_header"].get("msg_id") == msg_id:
                    reply = message
                    break
        if reply is None:
            # no reply: the interrupt can land in ipykernel's own dispatch before the cell
            # starts, and that request's reply is lost (seen about once in 100 rounds under
            # load). A kernel hung in our code would not answer the probe below either.
            lost += 1
        elif reply["content"]["status"] == "error":
            interrupted += 1
            assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        drain(client)
        probe = execute(client, PROBE)
        assert probe["status"] == "ok", (rounds, probe.get("evalue"))
        assert execute(client, NEXT)["status"] == "ok"
        check = execute(client, CHECK)
        assert check["status"] == "ok", (rounds, check.get("evalue"))
    assert rounds >= 5 and lost <= 1, (rounds, lost)
    assert interrupted >= 3, "the interrupts never landed inside a cell"


@pytest.mark.slow
def test_top_level_await_in_a_real_kernel(kernel: Any) -> None:
    """In ipykernel the event loop is busy running the cell, so only IPython can await it."""
    _, client = kernel
    assert execute(client, "%load_ext jupyter_vram\nimport torch, asyncio")["status"] == "ok"
    cell = "%%vram -q\nfirst = torch.ones(1024)\nawait asyncio.sleep(0.01)\nsecond = first * 2"
    reply = execute(client, cell)
    assert reply["status"] == "ok", reply
    check = execute(client, "assert {4096} <= set(_vram.to_dataframe()['bytes']), _vram")
    assert check["status"] == "ok", check
    assert execute(client, PROBE)["status"] == "ok"
