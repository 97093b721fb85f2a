"""What `%%vram` costs on the cells users really run, in a real kernel, with default flags.

Usage: python bench/real_cells.py [--repeats N] [--only NAME ...] [--readme]

Each cell runs in one IPython kernel (started with jupyter_client, as a notebook's is), told
what JupyterLab's page with the jupyter-vram extension tells it (the page draws saved
profiles: ``%%vram`` then sends the saved view, the live app one click away), and runs plain,
under ``%%vram`` (no flags), under ``%%vram`` with the live app built at once (what a frontend
without the extension gets: ``JUPYTER_VRAM_FIRST_VIEW=app``) and under ``%%vram -q``
(recorded, nothing displayed), interleaved (the order reversed every other round) so drift
and load hit all alike; the figure is the median of the round trips from the execute request
to its reply, as the user waits for it (the display included; ``-q`` shows what the
recording costs without it). Each
request carries a cell id, one per variant, as JupyterLab sends with every execution: a
re-run cell's previous app is closed, as in a notebook. Peak
RSS: the kernel's high-water mark during the cell (``/proc/<pid>/clear_refs`` resets it)
minus its resident size before; "extra" is the recorded run's minus the plain run's. The
machine's load average is printed with the results, since a loaded machine inflates both.
Under the table, each bounded cell's ratio of the two runs of one round (same moment, same
load): its median, a 95 % distribution-free interval of that median (order statistics), and
the middle half of the rounds; the bound is resolved where the interval lies on one side.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import queue
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jupyter_client
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_section import write_section


@dataclass(frozen=True)
class Cell:
    name: str
    setup: str  # run once before the timed runs
    body: str
    after: str  # run (untimed) after each run: drop what the cell kept
    target: float  # the bound on recorded / plain
    rss_target_mib: float | None = None


GPT2 = """
import torch, transformers
transformers.logging.set_verbosity_error()
_cfg = transformers.GPT2Config(attn_implementation="eager")  # 12 layers, 768 wide, 124M
model = transformers.GPT2LMHeadModel(_cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, _cfg.vocab_size, (1, 128))
model(input_ids=ids, labels=ids).loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
"""
GPT2_STEP = """loss = model(input_ids=ids, labels=ids).loss
loss.backward()
opt.step()
opt.zero_grad(set_to_none=True)
"""
LOOP_SETUP = """
import torch
from torch import nn
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
"""
LOOP = """for step in range(200):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""
PYTHON_HEAVY = """def bump(v):
    return v + 1
total = 0
for i in range(2_000_000):
    total = bump(total)
out = torch.ones(1000).sum()
"""
CELLS = (
    Cell("python-heavy (2M Python calls, one op)", "import torch", PYTHON_HEAVY, "", 2.0),
    Cell(
        "1M tiny tensors",
        "import torch",
        "for i in range(1_000_000):\n    t = torch.ones(1)\n",
        "",
        5.0,
        1024.0,
    ),
    Cell(
        "300k kept tensors",
        "import torch",
        "keep = [torch.ones(1) for i in range(300_000)]\n",
        "del keep",
        5.0,
    ),
    Cell("200-step small training loop", LOOP_SETUP, LOOP, "", 1.3),
    Cell("GPT-2 small, one training step", GPT2, GPT2_STEP, "", 1.15),
    Cell(
        "a notebook holding 300k tensors in a list: an empty cell",
        "import torch\nheld = [torch.ones(1) for _ in range(300_000)]",
        "pass\n",
        "",
        0.0,
    ),
    Cell(
        "empty cell, 10M-item list + 1M-entry dict in the namespace",
        "big_list = list(range(10_000_000))\nbig_dict = {i: i for i in range(1_000_000)}",
        "pass\n",
        "",
        0.0,
    ),
)
#: the issue's bound for the empty recording's start + stop
EMPTY_MS = 50.0


class Kernel:
    """One real IPython kernel, with jupyter_vram loaded, and a client that waits for
    replies and reads the kernel's memory from /proc."""

    def __init__(self) -> None:
        self.manager, self.client = jupyter_client.manager.start_new_kernel(kernel_name="python3")
        self.pid = self.manager.provisioner.process.pid
        self.run("%load_ext jupyter_vram\nimport gc, os")
        self.tell()

    def tell(self) -> None:
        """What the lab extension's page tells an idle kernel (its silent request)."""
        from jupyter_vram._session import FRONTEND_EXPRESSION

        msg_id = self.client.execute(
            "", silent=True, store_history=False, user_expressions={"e": FRONTEND_EXPRESSION}
        )
        while True:
            reply = self.client.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        said = reply["content"]["user_expressions"]["e"]
        if said.get("data", {}).get("text/plain") != "True":
            raise RuntimeError(f"the kernel was not told: {said}")

    def run(self, code: str, timeout: float = 1800, cell_id: str | None = None) -> float:
        """Run ``code`` (as the cell ``cell_id``, as JupyterLab names the cell it runs);
        seconds from the request to its reply. Raises on a cell error."""
        self._drain()
        content = {"code": code, "silent": False, "store_history": True,
                   "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}  # fmt: skip
        metadata = {"cellId": cell_id} if cell_id is not None else {}
        request = self.client.session.msg("execute_request", content, metadata=metadata)
        msg_id = request["header"]["msg_id"]
        start = time.perf_counter()
        self.client.shell_channel.send(request)
        deadline = time.monotonic() + timeout
        while True:
            reply = self.client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        took = time.perf_counter() - start
        content = reply["content"]
        if content["status"] != "ok":
            raise RuntimeError(f"{code[:60]!r}: {content.get('ename')}: {content.get('evalue')}")
        return took

    def _drain(self) -> None:
        while True:
            try:
                self.client.get_iopub_msg(timeout=0.01)
            except queue.Empty:
                return

    def _status(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def measured(self, code: str, cell_id: str) -> tuple[float, int]:
        """(seconds, peak RSS above the resident size before) of one run of ``code``."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # resets the high-water mark
        before = self._status("VmRSS")
        took = self.run(code, cell_id=cell_id)
        return took, self._status("VmHWM") - before

    def in_kernel_ms(self, code: str) -> float:
        """Milliseconds ``code`` takes measured inside the kernel (no messaging)."""
        self.run(
            "import time as _t\n_t0 = _t.perf_counter()\n"
            + code
            + "\n_jv_ms = (_t.perf_counter() - _t0) * 1e3"
        )
        self._drain()
        msg_id = self.client.execute("print(_jv_ms)")
        while True:
            msg = self.client.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                return float(msg["content"]["text"])

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@dataclass(frozen=True)
class Result:
    cell: Cell
    plain_s: float
    recorded_s: float
    plain_rss: int
    recorded_rss: int
    quiet_s: float  # under ``%%vram -q``: recorded, no app displayed
    app_s: float  # under ``%%vram`` with the live app built at once
    #: recorded / plain of the runs of each round (interleaved: the same moment's load)
    paired: tuple[float, ...]

    @property
    def ratio(self) -> float:
        return self.recorded_s / self.plain_s


#: what each variant prefixes to the cell's body
VARIANTS = {"plain": "", "recorded": "%%vram\n", "app": "%%vram\n", "quiet": "%%vram -q\n"}
#: run (untimed) around the "app" variant: the live app at once, then the default again
APP_ON = "os.environ['JUPYTER_VRAM_FIRST_VIEW'] = 'app'"
APP_OFF = "os.environ['JUPYTER_VRAM_FIRST_VIEW'] = 'auto'"


def run_variant(kernel: Kernel, cell: Cell, variant: str, cell_id: str) -> tuple[float, int]:
    """One timed run of ``cell`` as ``variant`` (seconds, peak RSS above the start)."""
    if variant == "app":
        kernel.run(APP_ON)
    try:
        return kernel.measured(VARIANTS[variant] + cell.body, cell_id)
    finally:
        if variant == "app":
            kernel.run(APP_OFF)


#: a cell with a bound, or whose plain run is shorter than SHORT_S, gets MORE_ROUNDS times
#: the repeats: a shared machine's hiccups are a larger share of a short cell, and a bound is
#: judged by an interval of the median whose ends are order statistics (with 11 rounds the
#: 2nd and 10th: one slow run of a 1 s step on either side decides; with 33 the 11th and 23rd)
SHORT_S = 0.5
MORE_ROUNDS = 3


def measure(kernel: Kernel, cell: Cell, repeats: int) -> Result:
    kernel.run(cell.setup)
    ids = {variant: str(uuid.uuid4()) for variant in VARIANTS}  # one notebook cell each
    for variant in VARIANTS:  # warm-up: first-use imports and caches
        run_variant(kernel, cell, variant, ids[variant])
        kernel.run(cell.after or "pass")
    plain_s = kernel.run(cell.body, cell_id=ids["plain"])  # warm now: is the cell short?
    kernel.run(cell.after or "pass")
    runs: dict[str, list[tuple[float, int]]] = {variant: [] for variant in VARIANTS}
    more = cell.target > 0 or plain_s < SHORT_S
    for r in range(repeats * (MORE_ROUNDS if more else 1)):
        for variant in list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]:
            runs[variant].append(run_variant(kernel, cell, variant, ids[variant]))
            if cell.after:
                kernel.run(cell.after)
            kernel.run("gc.collect()")

    for variant, done in runs.items():
        print(f"  {cell.name}, {variant}: " + ", ".join(f"{t:.3f} s" for t, _ in done), flush=True)

    def median(variant: str, k: int) -> float:
        return statistics.median(run[k] for run in runs[variant])

    return Result(
        cell,
        median("plain", 0),
        median("recorded", 0),
        int(median("plain", 1)),
        int(median("recorded", 1)),
        median("quiet", 0),
        median("app", 0),
        tuple(r[0] / p[0] for r, p in zip(runs["recorded"], runs["plain"], strict=True)),
    )


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """First and third quartile (the middle half of the values)."""
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q1, q3


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the order statistics k and
    n + 1 - k, k the largest with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 (each
    value is below the median with probability 1/2, whatever the distribution)."""
    ordered = sorted(values)
    n = len(ordered)
    tail = (1 - confidence) / 2
    below = 0.0  # P(Binomial(n, 1/2) < k), for k = 1, 2, ...
    k = 0
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if below > tail:
            break
        k += 1
    if k == 0:  # too few values for this confidence: all of them
        return ordered[0], ordered[-1]
    return ordered[k - 1], ordered[n - k]


def empty_start_stop_ms(kernel: Kernel, repeats: int) -> float:
    """An empty ``jv.record()`` in the kernel of the last cell (which holds the big list and
    dict), timed inside the kernel: the recorder's start and stop alone."""
    kernel.run("import jupyter_vram as jv")
    times = [kernel.in_kernel_ms("with jv.record() as _rec:\n    pass") for _ in range(repeats)]
    return statistics.median(times)


def table(results: list[Result], empty_ms: float | None) -> str:
    rows = [
        "| cell | plain (s) | under `%%vram` (s) | ratio | target | extra peak RSS (MiB) "
        "| app at once (s) | ratio | `%%vram -q` (s) | ratio, nothing shown |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        extra = (r.recorded_rss - r.plain_rss) / 2**20
        bound = f"<= {r.cell.target:g}x" if r.cell.target else ""
        if r.cell.rss_target_mib is not None:
            bound += f", RSS <= {r.cell.rss_target_mib / 1024:g} GiB"
        rows.append(
            f"| {r.cell.name} | {r.plain_s:.3f} | {r.recorded_s:.3f} | {r.ratio:.2f}x | "
            f"{bound} | {extra:+.0f} | {r.app_s:.3f} | {r.app_s / r.plain_s:.2f}x | "
            f"{r.quiet_s:.3f} | {r.quiet_s / r.plain_s:.2f}x |"
        )
    for r in results:  # the uncertainty of each bounded ratio, from the rounds' own ratios
        if not r.cell.target:
            continue
        lo, hi = median_interval(r.paired)
        q1, q3 = quartiles(r.paired)
        verdict = (
            "within the bound"
            if hi <= r.cell.target
            else "over the bound"
            if lo > r.cell.target
            else "across the bound: not resolved on this machine"
        )
        rows.append(
            f"\n{r.cell.name}: recorded / plain of the runs of one round: median "
            f"{statistics.median(r.paired):.2f}x, 95 % interval of the median "
            f"{lo:.2f}-{hi:.2f}x ({verdict}); middle half of the rounds {q1:.2f}-{q3:.2f}x."
        )
    if empty_ms is not None:
        rows.append(
            f"\nStart + stop of an empty `jv.record()` with that list and dict in the namespace "
            f"(timed inside the kernel): {empty_ms:.1f} ms (target <= {EMPTY_MS:g} ms)."
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="cells whose name starts with these")
    parser.add_argument("--readme", action="store_true", help="write the README section")
    args = parser.parse_args()
    cells = [c for c in CELLS if not args.only or any(c.name.startswith(o) for o in args.only)]
    results = []
    empty_ms = None
    for cell in cells:  # a fresh kernel per cell: no cell pays for another's leftovers
        kernel = Kernel()
        try:
            results.append(measure(kernel, cell, args.repeats))
            if cell.name.startswith("empty"):
                empty_ms = empty_start_stop_ms(kernel, args.repeats)
        finally:
            kernel.close()
        print(table(results[-1:], empty_ms), flush=True)
    load = os.getloadavg()
    text = (
        f"Made by `python bench/real_cells.py --readme` ({args.repeats} interleaved runs "
        f"each, {args.repeats * MORE_ROUNDS} for a cell with a bound or under {SHORT_S:g} s, "
        f"medians) with "
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"on {os.cpu_count()} CPU cores; load average at the end {load[0]:.1f} / "
        f"{load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min).\n\n" + table(results, empty_ms)
    )
    print(text)
    if args.readme:
        write_section("## What a real cell costs under `%%vram`", text)


if __name__ == "__main__":
    main()
