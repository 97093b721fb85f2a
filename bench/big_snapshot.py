"""Generate big PyTorch allocator snapshots and time opening them.

``generate``: writes a ``torch.cuda.memory._dump_snapshot``-format pickle of a synthetic
training run (a transformer-like model: per layer, activations kept for backward and
temporaries freed at once; gradients made by the autograd engine without Python frames; Adam
state; the caching allocator's address reuse) with deep Python stacks, written the way
``pickle.dump`` writes what ``torch.cuda.memory._snapshot()`` returns: protocol 4 in 64 KiB
frames, every string memoized, one dict per distinct frame shared by all stacks, one frames
list per allocation shared by its alloc / free entries, a new ``compile_context`` string per
entry. The file is streamed out (bounded memory at any size).

``measure``: opens a snapshot in a fresh process and reports wall time and peak RSS for
``jupyter_vram.Profile.from_snapshot`` (the streaming reader), and, for comparison, a plain
``pickle.load`` and ``pickle.load`` + ``torch.cuda._memory_viz.segsum`` / ``trace``;
``--how phases`` times jupyter_vram's read and conversion apart (after the import).

Usage:
    python bench/big_snapshot.py generate --mb 100 -o /tmp/snap100.pickle
    python bench/big_snapshot.py measure /tmp/snap100.pickle --how jupyter_vram
    python bench/big_snapshot.py measure /tmp/snap100.pickle --how pickle --limit-gb 8
"""

from __future__ import annotations

import argparse
import io
import random
import resource
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TORCH = "/opt/conda/lib/python3.11/site-packages/torch"
MODULE_CALL = [
    (f"{TORCH}/nn/modules/module.py", 1762, "_call_impl"),
    (f"{TORCH}/nn/modules/module.py", 1751, "_wrapped_call_impl"),
]
SCRIPT = "/home/user/project/train.py"
MODEL = "/home/user/project/model.py"


class Emitter:
    """Protocol-4 pickle opcodes, written in frames, with the memo ``pickle.dump`` keeps."""

    def __init__(self, out: io.BufferedWriter) -> None:
        self.out = out
        self.buf = bytearray()
        self.memo_len = 0
        self.refs: dict[object, bytes] = {}  # identity key -> BINGET / LONG_BINGET bytes
        self.out.write(b"\x80\x04")

    def flush(self, force: bool = False) -> None:
        if len(self.buf) >= 65536 or (force and self.buf):
            self.out.write(b"\x95" + struct.pack("<Q", len(self.buf)) + self.buf)
            self.buf = bytearray()

    def memoize(self, key: object) -> bytes:
        """MEMOIZE the object just written; later writes of ``key`` are this reference."""
        index = self.memo_len
        self.memo_len += 1
        ref = b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)
        self.refs[key] = ref
        return b"\x94"

    def string(self, text: str, key: object = None) -> bytes:
        """A str (shared when ``key`` is given and seen before), memoized as pickle does."""
        if key is not None and key in self.refs:
            return self.refs[key]
        data = text.encode()
        head = b"\x8c" + bytes([len(data)]) if len(data) < 256 else b"X" + struct.pack(
            "<I", len(data))  # fmt: skip
        if key is None:
            self.memo_len += 1
            return head + data + b"\x94"
        return head + data + self.memoize(key)


def encode_int(value: int) -> bytes:
    if 0 <= value < 256:
        return b"K" + bytes([value])
    if 0 <= value < 65536:
        return b"M" + struct.pack("<H", value)
    if -(2**31) <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    n = (value.bit_length() + 8) // 8
    return b"\x8a" + bytes([n]) + value.to_bytes(n, "little", signed=True)


def plain(e: Emitter, value: Any) -> bytes:
    """Small plain data (the end state), strings memoized, nothing shared."""
    if isinstance(value, bool) or value is None:
        return {True: b"\x88", False: b"\x89", None: b"N"}[value]
    if isinstance(value, int):
        return encode_int(value)
    if isinstance(value, str):
        return e.string(value, ("s", value))
    if isinstance(value, dict):
        e.memo_len += 1
        body = b"".join(plain(e, k) + plain(e, v) for k, v in value.items())
        return b"}\x94(" + body + b"u" if value else b"}\x94"
    if isinstance(value, list | tuple):
        e.memo_len += 1
        if not value:
            return b"]\x94"
        return b"]\x94(" + b"".join(plain(e, v) for v in value) + b"e"
    raise TypeError(type(value))


class Run:
    """The synthetic training run: allocations, frees and segments, in order."""

    def __init__(self, layers: int, seed: int, depth: int) -> None:
        self.rng = random.Random(seed)
        self.layers = layers
        self.depth = depth
        self.next_addr = 0x7F00_0000_0000
        self.free_by_size: dict[int, list[int]] = {}
        self.segments: dict[int, int] = {}  # address -> request (one block per segment)
        self.t = 1_700_000_000_000_000
        # the script's own frames below the training loop: deep, as in real launchers
        self.base = [(SCRIPT, 10 + 7 * i, f"wrapper_{i}") for i in range(depth)]

    def stack(self, layer: int, what: str) -> list[tuple[str, int, str]]:
        """A forward stack, innermost first: the op's line, the layer's modules, the loop."""
        inner = [(MODEL, 100 + layer % 7 * 10 + len(what), f"{what}_forward")]
        for level in range(4):
            inner += [*MODULE_CALL, (MODEL, 40 + level, f"Block{level}.forward")]
        return [*inner, (SCRIPT, 200, "train_step"), *self.base]

    def malloc(self, size: int) -> tuple[int, bool]:
        """An address for ``size`` bytes; True when a new segment was reserved for it."""
        size = (size + 511) // 512 * 512
        pool = self.free_by_size.get(size)
        if pool:
            return pool.pop(), False
        addr = self.next_addr
        self.next_addr += size
        self.segments[addr] = size
        return addr, True

    def release(self, addr: int, size: int) -> None:
        self.free_by_size.setdefault((size + 511) // 512 * 512, []).append(addr)


def _ref(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)


def generate(path: Path, target_mb: float, layers: int, seed: int, depth: int) -> dict[str, int]:
    """Write the snapshot (see the module docstring); returns what it holds."""
    run = Run(layers, seed, depth)
    frame_refs: dict[tuple[str, int, str], bytes] = {}
    list_refs: dict[int, bytes] = {}  # allocation id -> its frames list's reference
    keys: dict[str, bytes] = {}
    counts = {"entries": 0, "allocations": 0, "steps": 0}
    in_batch = 0

    def key(name: str) -> bytes:
        if name not in keys:
            keys[name] = e.string(name, ("s", name))
            return keys[name]
        return e.refs[("s", name)]

    def new_index() -> int:
        e.memo_len += 1
        return e.memo_len - 1

    def frame_dict(f: tuple[str, int, str]) -> bytes:
        ref = frame_refs.get(f)
        if ref is not None:
            return ref
        frame_refs[f] = _ref(new_index())
        body = [key("name"), e.string(f[2], ("s", f[2])), key("filename"),
                e.string(f[0], ("s", f[0])), key("line"), encode_int(f[1])]  # fmt: skip
        return b"}\x94(" + b"".join(body) + b"u"

    def new_frames(stack: list[tuple[str, int, str]], aid: int) -> bytes:
        """The allocation's own frames list (its frees refer to it)."""
        list_refs[aid] = _ref(new_index())
        if not stack:
            return b"]\x94"
        items = b"".join([frame_dict(f) for f in stack])
        return b"]\x94" + (items + b"a" if len(stack) == 1 else b"(" + items + b"e")

    def empty_list() -> bytes:
        new_index()
        return b"]\x94"

    def entry(action: str, addr: int, size: int, frames: Callable[[], bytes]) -> None:
        nonlocal in_batch
        run.t += run.rng.randint(1, 40)
        new_index()  # the entry dict
        parts = [
            b"}\x94(", key("action"), e.string(action, ("s", action)),
            key("addr"), encode_int(addr), key("size"), encode_int(size),
            key("stream"), b"K\x00", key("time_us"), encode_int(run.t),
            key("compile_context"), e.string("N/A"),  # a new str object per entry
            key("user_metadata"), e.string("", ("s", "")),
            key("frames"), frames(), b"u",
        ]  # fmt: skip
        e.buf += b"".join(parts)
        counts["entries"] += 1
        in_batch += 1
        if in_batch == 1000:
            e.buf += b"e("
            in_batch = 0
        e.flush()

    live: dict[int, tuple[int, int]] = {}  # allocation id -> (addr, size)
    next_id = 0

    def alloc(size: int, stack: list[tuple[str, int, str]]) -> int:
        nonlocal next_id
        addr, fresh = run.malloc(size)
        if fresh:
            entry("segment_alloc", addr, (size + 511) // 512 * 512, empty_list)
        aid = next_id
        next_id += 1
        entry("alloc", addr, size, lambda: new_frames(stack, aid))
        live[aid] = (addr, size)
        counts["allocations"] += 1
        return aid

    def free(aid: int) -> None:
        addr, size = live.pop(aid)
        ref = list_refs.pop(aid)
        entry("free_requested", addr, size, lambda: ref)
        entry("free_completed", addr, size, lambda: ref)
        run.release(addr, size)

    with path.open("wb") as fh:
        e = Emitter(fh)
        e.buf += b"}" + e.memoize(("top",)) + b"("
        e.buf += e.string("device_traces", ("s", "device_traces"))
        e.buf += b"]" + e.memoize(("outer",))
        e.buf += b"]" + e.memoize(("trace",)) + b"("
        hidden = 1024
        params = [(hidden * hidden * 4 * 3, hidden * hidden * 4) for _ in range(layers)]
        # the weights: allocated before recording started, alive throughout
        weights = {run.malloc(p)[0]: p for pair in params for p in pair}
        grads: list[int] = []
        state: list[int] = []
        rng = run.rng
        backward = [(f"{TORCH}/autograd/__init__.py", 347, "backward"),
                    (f"{TORCH}/_tensor.py", 626, "backward"),
                    (SCRIPT, 210, "train_step"), *run.base]  # fmt: skip
        optimizer = [(f"{TORCH}/optim/adam.py", 576, "_multi_tensor_adam"),
                     (f"{TORCH}/optim/optimizer.py", 526, "wrapper"),
                     (SCRIPT, 220, "train_step"), *run.base]  # fmt: skip
        while fh.tell() + len(e.buf) < target_mb * 2**20:
            counts["steps"] += 1
            saved: list[list[int]] = []
            for layer in range(layers):  # forward: activations kept, temporaries freed
                kept = []
                for k in range(6):
                    size = rng.choice((2, 4, 8, 16)) * 2**20 + rng.randrange(0, 4096)
                    kept.append(alloc(size, run.stack(layer, f"op{k}")))
                for k in range(4):
                    free(alloc(rng.randrange(512, 2**20), run.stack(layer, f"tmp{k}")))
                saved.append(kept)
            free(alloc(4, backward))  # the loss gradient, made from Python
            first = not grads
            for layer in reversed(range(layers)):  # the autograd engine: no Python frames
                for _ in range(3):
                    free(alloc(rng.choice((2, 4, 8)) * 2**20, []))
                if first:
                    grads += [alloc(p, []) for p in params[layer]]
                for aid in saved[layer]:
                    free(aid)
            if not state:
                state = [alloc(p, optimizer) for pair in params for p in pair for _ in range(2)]
            for _ in range(layers):
                free(alloc(rng.choice((1, 2)) * 2**20, optimizer))
        e.buf += b"ea"  # the last batch, then the trace into device_traces
        live_at = {**weights, **{addr: size for addr, size in live.values()}}
        segments = []
        for addr, size in run.segments.items():
            used = live_at.get(addr)
            rounded = (size + 511) // 512 * 512
            block = {"address": addr, "size": rounded, "requested_size": used or 0,
                     "state": "active_allocated" if used is not None else "inactive",
                     "frames": []}  # fmt: skip
            active = rounded if used is not None else 0
            segments.append({"device": 0, "address": addr, "total_size": rounded,
                             "allocated_size": active, "active_size": active,
                             "requested_size": used or 0, "stream": 0,
                             "segment_type": "large", "segment_pool_id": [0, 0],
                             "is_expandable": False, "frames": [], "blocks": [block]})  # fmt: skip
        e.buf += plain(e, "segments") + plain(e, segments)
        e.buf += plain(e, "allocator_settings") + plain(e, {"expandable_segments": False})
        e.buf += plain(e, "external_annotations") + plain(e, [])
        e.buf += b"u."
        e.flush(force=True)
    counts["bytes"] = path.stat().st_size
    counts["live_bytes_at_end"] = sum((s + 511) // 512 * 512 for s in live_at.values())
    return counts


def measure(path: Path, how: str) -> dict[str, Any]:
    """Open ``path`` in this process the ``how`` way; time and peak RSS (this process)."""
    t0 = time.perf_counter()
    start = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = start.ru_utime + start.ru_stime
    result: dict[str, Any] = {"how": how, "file_mb": round(path.stat().st_size / 2**20, 1)}
    if how == "jupyter_vram":
        import jupyter_vram as jv

        prof = jv.Profile.from_snapshot(path)
        result["opened_s"] = round(time.perf_counter() - t0, 2)
        result["peak"] = prof.peak_bytes
        result["allocations"] = len(prof.allocations)
        result["peak_breakdown_mib"] = {k: v >> 20 for k, v in prof.peak_breakdown().items() if v}
    elif how == "phases":  # jupyter_vram's read and conversion apart, the import not timed
        from jupyter_vram._snapshots import file as snapshot_file
        from jupyter_vram._snapshots.columns import profile_from_columns
        from jupyter_vram._snapshots.stream import read_snapshot_stream

        t0, cpu0 = time.perf_counter(), time.process_time()
        with path.open("rb") as fh:
            rest, traces = read_snapshot_stream(fh)
        t1, cpu1 = time.perf_counter(), time.process_time()
        prof = snapshot_file._infer_categories(profile_from_columns(traces[0], rest, 0), False)
        t2, cpu2 = time.perf_counter(), time.process_time()
        result["read_s"], result["read_cpu_s"] = round(t1 - t0, 2), round(cpu1 - cpu0, 2)
        result["convert_s"], result["convert_cpu_s"] = round(t2 - t1, 2), round(cpu2 - cpu1, 2)
        result["opened_s"] = round(t2 - t0, 2)
        result["allocations"] = len(prof.allocations)
        start = resource.getrusage(resource.RUSAGE_SELF)  # CPU below: read and convert only
        cpu0 = start.ru_utime + start.ru_stime - (cpu2 - cpu0)
    elif how in ("pickle", "memory_viz"):
        import pickle

        with path.open("rb") as fh:
            data = pickle.load(fh)
        result["opened_s"] = round(time.perf_counter() - t0, 2)
        result["entries"] = sum(len(t) for t in data["device_traces"])
        if how == "memory_viz":
            from torch.cuda import _memory_viz

            _memory_viz.segsum(data)
            text = _memory_viz.trace(data)
            result["trace_text_mb"] = round(len(text) / 2**20, 1)
    else:
        raise SystemExit(f"unknown --how {how!r}")
    result["total_s"] = round(time.perf_counter() - t0, 2)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_s"] = round(usage.ru_utime + usage.ru_stime - cpu0, 2)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return result


def measure_in_subprocess(path: Path, how: str, limit_gb: float) -> str:
    """Run ``measure`` in a fresh process whose address space is capped (a run past the cap
    fails with MemoryError instead of taking the machine)."""
    limit = int(limit_gb * 2**30)
    code = (
        "import resource, sys, json; "
        f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
        "sys.path.insert(0, 'bench'); import big_snapshot as b; from pathlib import Path; "
        f"print(json.dumps(b.measure(Path({str(path)!r}), {how!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["?"]
        return f'{{"how": "{how}", "failed": "{tail[0][:200]}"}}'
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate")
    gen.add_argument("--mb", type=float, default=100)
    gen.add_argument("-o", "--output", type=Path, required=True)
    gen.add_argument("--layers", type=int, default=24)
    gen.add_argument("--depth", type=int, default=40, help="script frames below the loop")
    gen.add_argument("--seed", type=int, default=0)
    mea = sub.add_parser("measure")
    mea.add_argument("path", type=Path)
    mea.add_argument("--how", default="jupyter_vram",
                     choices=["jupyter_vram", "phases", "pickle", "memory_viz"])  # fmt: skip
    mea.add_argument("--limit-gb", type=float, default=8.0, help="address-space cap")
    args = parser.parse_args(argv)
    if args.cmd == "generate":
        t0 = time.perf_counter()
        counts = generate(args.output, args.mb, args.layers, args.seed, args.depth)
        print({**counts, "seconds": round(time.perf_counter() - t0, 1)})
    else:
        print(measure_in_subprocess(args.path, args.how, args.limit_gb))


if __name__ == "__main__":
    main()
