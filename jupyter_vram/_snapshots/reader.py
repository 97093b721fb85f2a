"""The pickle interpreter of the streaming snapshot reader (:mod:`.stream`).

``pickle.load`` of a 1 GB snapshot builds a dict, a list and a dozen ints for each of millions
of trace entries: many GB. This reader interprets the pickle's opcodes itself (plain data only:
any opcode that names a class or calls something is refused, as in :class:`SafeUnpickler`),
builds everything but the trace entries as usual, and writes each entry of a device trace into
:class:`.columns.TraceColumns` as soon as it is read; the entry itself is never kept.

Speed comes from the shape ``pickle.dump`` gives those entries: each is
``EMPTY_DICT MEMOIZE MARK (key value)* SETITEMS`` with the keys memo references to the same
strings, and most values references or short literals. Once the first entry has shown the keys,
long runs of entries are decoded with array operations (:mod:`.bulk`, a subclass
of this interpreter); shorter ones by a compiled regular expression per key layout that
matches a whole entry at once. An entry
neither matches (a frame seen for the first time, a long string, a pickle frame boundary
inside it) goes through the general interpreter, with the same result. Frame lists are
interned by their memo references: a deep stack costs one dict lookup per allocation, and the
memo keeps only what later entries refer back to (frame dicts, the stack id of each frame list
in an int32 array by slot, action names), never the entries themselves.
"""

from __future__ import annotations

import contextlib
import queue
import re
import struct
import threading
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from .._model import ProfileFileError
from .columns import ACTION_CODE, TraceColumns, UnsupportedPickle

__all__ = ["CHUNK", "Layout", "Reader", "UnsupportedPickle"]

CHUNK = 16 << 20
_FAST_MARGIN = 1 << 20  # bytes kept ahead of the fast path (no entry is longer)
_REFUSED = {
    b"c"[0]: "GLOBAL", 0x93: "STACK_GLOBAL", b"R"[0]: "REDUCE", b"b"[0]: "BUILD",
    b"i"[0]: "INST", b"o"[0]: "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 0x82: "EXT1",
    0x83: "EXT2", 0x84: "EXT4", b"P"[0]: "PERSID", b"Q"[0]: "BINPERSID",
    0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}  # fmt: skip


class _Ahead:
    """Reads the file a chunk ahead in a second thread, and finds the EMPTY_DICT bytes (where
    trace entries may start) in what it read. File reads, gzip's inflation and numpy's scans
    release the GIL, so on two cores they run while the main thread decodes (on one, in
    turns). A daemon thread: it ends with the process, or when :meth:`close` stops it."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.ready: queue.Queue[tuple[bytes, Any] | BaseException] = queue.Queue(maxsize=1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.work, name="snapshot read-ahead", daemon=True)
        self.thread.start()

    def work(self) -> None:
        offset = 0
        item: tuple[bytes, Any] | BaseException
        while True:
            try:
                chunk = self.fh.read(CHUNK)
                dicts = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 0x7D)
                dicts += offset
                offset += len(chunk)
                item = (chunk, dicts)
            except Exception as exc:  # noqa: BLE001 (raised in the reader)
                item = exc
            while not self.stop.is_set():
                try:
                    self.ready.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self.stop.is_set() or not isinstance(item, tuple) or len(item[0]) < CHUNK:
                return

    def next(self) -> tuple[bytes, Any]:
        """The next chunk (short at the end of the file) and its EMPTY_DICT positions."""
        while True:
            try:
                item = self.ready.get(timeout=1)
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.ready.empty():
                    raise ProfileFileError("the file stopped being read") from None
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(queue.Empty):
            self.ready.get_nowait()
        self.thread.join(timeout=10)


class _Consumed:
    """Stands on the stack for a trace entry already written to its columns."""


_CONSUMED = _Consumed()


class _Unset:
    """A memo slot the bulk reader skipped (an inline string no snapshot refers back to)."""


_UNSET = _Unset()


class _StackId(int):
    """The memo value of a frame list the fast path interned (its stack id)."""


_REF = rb"(?:h.|j....)"
_INT = rb"(K.|M..|J....|\x8a(?:\x00|\x01.|\x02..|\x03...|\x04.{4}|\x05.{5}|\x06.{6}|\x07.{7}|\x08.{8}))"  # noqa: E501
_STR = (
    rb"(h.|j....|\x8c(?:"
    + b"|".join(re.escape(bytes([n])) + b".{%d}" % n for n in range(33))
    + rb")\x94)"
)
_FRAMES = rb"(h.|j....|\]\x94\((?:h.|j....)++e|\]\x94(?:h.|j....)a|\]\x94)"
_INT_KEYS = {"addr", "size", "stream", "time_us", "device_free"}
_STR_KEYS = {"action", "compile_context", "user_metadata"}


class Layout:
    """The compiled expression of one key layout and where its groups are (0-based)."""

    def __init__(
        self, pattern: re.Pattern[bytes], keys: tuple[str, ...], refs: tuple[bytes, ...]
    ) -> None:
        self.pattern = pattern
        self.keys = keys
        self.refs = refs  # each key's memo reference, as written
        where = {key: i for i, key in enumerate(keys)}
        self.frames = where["frames"]
        self.action = where.get("action", -1)
        self.addr = where.get("addr", -1)
        self.size = where.get("size", -1)
        self.time = where.get("time_us", -1)
        self.meta = where.get("user_metadata", -1)
        strs = [i for i, key in enumerate(keys) if key in _STR_KEYS]
        self.before = tuple(i for i in strs if i < self.frames)
        self.after = tuple(i for i in strs if i > self.frames)


def _ref_bytes(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)


def _decode_int(g: bytes) -> int:
    op = g[0]
    if op == 0x8A:
        return int.from_bytes(g[2:], "little", signed=True)
    if op == 0x4B:  # K
        return g[1]
    if op == 0x4D:  # M
        return g[1] | g[2] << 8
    return int.from_bytes(g[1:5], "little", signed=True)  # J


def _dict_of_items(items: list[Any]) -> dict[Any, Any]:
    """DICT: the items since the mark, key and value in turn."""
    return {items[i]: items[i + 1] for i in range(0, len(items) - 1, 2)}


class Reader:
    """The interpreter (see the module docstring)."""

    def __init__(self, fh: IO[bytes], progress: Callable[[int], None] | None) -> None:
        self.ahead = _Ahead(fh)
        self.buf = b""
        self.dicts = np.zeros(0, np.int64)  # file offsets of the EMPTY_DICT bytes in buf
        self.pos = 0
        self.eof = False
        self.consumed = 0  # bytes before buf[0]
        self.progress = progress
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        # the memo: objects the interpreter built, by slot; the stack ids of frame lists the
        # fast paths read, by slot (-2: none); slots of neither were never kept
        self.objects: dict[int, Any] = {}
        self.memo_len = 0
        self.slot_sid = np.full(1 << 16, -2, np.int32)
        self.str_slot: dict[str, int] = {}
        self.dict_slot: dict[int, int] = {}
        self.columns: dict[int, TraceColumns] = {}
        self.keep: dict[int, list[Any]] = {}  # id -> trace list (keeps the id valid)
        self.stacks: list[Any] = []
        self.stack_of_run: dict[bytes, int] = {}
        self.stack_of_list: dict[int, tuple[object, int]] = {}
        self.meta_ids: dict[str, int] = {"": 0}
        self.metas: list[str] = [""]
        self.strings: dict[str, str] = {}
        self.patterns: dict[tuple[str, ...], Layout] = {}
        self.action_of: dict[bytes, int] = {}
        self.meta_of: dict[bytes, int] = {}
        self.inline_of: dict[bytes, str] = {}
        self.bulk_ready = False
        self.bulk_span = 256 << 10  # bytes the bulk path looks at (it adapts)
        self.templates: list[Any] = []  # entry shapes the bulk path has seen
        self.shape_misses = 0  # windows in a row where a shape was missing early
        self.template_off = 0  # windows the bulk path still walks fields (shapes vary)
        self.bulk_retry = 0  # where the bulk path may try again (bytes into the file)
        self.list_table: Any = None  # the frame lists known so far, for the bulk path
        self.bulk_backoff = 0

    # -- input -------------------------------------------------------------------------------

    def fill(self, need: int) -> None:
        """Make ``need`` bytes available at ``pos`` (fewer only at the end of the file)."""
        if len(self.buf) - self.pos >= need or self.eof:
            return
        self.consumed += self.pos
        parts, got = [self.buf[self.pos :]], len(self.buf) - self.pos
        dicts = [self.dicts[np.searchsorted(self.dicts, self.consumed) :]]
        while True:  # at least one chunk, and as many as ``need`` takes
            chunk, where = self.ahead.next()
            parts.append(chunk)
            dicts.append(where)
            got += len(chunk)
            if len(chunk) < CHUNK:  # a short read: the end of the file
                self.eof = True
            if self.eof or got >= need:
                break
        self.buf = b"".join(parts)
        self.dicts = np.concatenate(dicts)
        self.pos = 0
        if self.progress is not None:
            self.progress(self.consumed)

    def take(self, n: int) -> bytes:
        if len(self.buf) - self.pos < n:
            self.fill(n)
            if len(self.buf) - self.pos < n:
                raise ProfileFileError("not a memory snapshot (the pickle ends early)")
        data = self.buf[self.pos : self.pos + n]
        self.pos += n
        return data

    # -- memo and strings ----------------------------------------------------------------------

    def memoize(self, value: Any) -> None:
        index = self.memo_len
        self.memo_len += 1
        self.objects[index] = value
        if type(value) is str:
            self.str_slot.setdefault(value, index)
        elif type(value) is dict:
            self.dict_slot[id(value)] = index

    def put(self, index: int, value: Any) -> None:
        if index == self.memo_len:
            self.memoize(value)
            return
        if index > 1 << 40:
            raise ProfileFileError("not a memory snapshot (a memo slot of absurd number)")
        self.memo_len = max(self.memo_len, index + 1)
        self.objects[index] = value

    def get(self, index: int) -> Any:
        value = self.objects.get(index, _UNSET)
        if value is _UNSET:
            sid = int(self.slot_sid[index]) if index < len(self.slot_sid) else -2
            if sid == -2:
                if index >= self.memo_len:
                    raise ProfileFileError(f"not a memory snapshot (memo {index} is unset)")
                raise UnsupportedPickle("a reference to a value the fast reader did not keep")
            return _StackId(sid)
        return value

    def set_sids(self, slots: Any, sids: Any) -> None:
        """Record the stack ids of frame lists at their memo slots (arrays or ints)."""
        top = int(np.max(slots)) + 1 if np.size(slots) else 0
        if top > len(self.slot_sid):
            grown = np.full(max(top, 2 * len(self.slot_sid)), -2, np.int32)
            grown[: len(self.slot_sid)] = self.slot_sid
            self.slot_sid = grown
        self.slot_sid[slots] = sids

    def intern(self, text: str) -> str:
        return self.strings.setdefault(text, text)

    # -- trace entries -----------------------------------------------------------------------

    def trace_columns(self, target: list[Any]) -> TraceColumns:
        cols = self.columns.get(id(target))
        if cols is None:
            cols = self.columns[id(target)] = TraceColumns(stacks=self.stacks, metas=self.metas)
            self.keep[id(target)] = target
        return cols

    def stack_id(self, frames: Any) -> int:
        if isinstance(frames, _StackId):
            return int(frames)
        if not isinstance(frames, list) or not frames:
            return -1
        hit = self.stack_of_list.get(id(frames))
        if hit is not None and hit[0] is frames:
            return hit[1]
        sid = len(self.stacks)
        self.stacks.append(frames)
        self.stack_of_list[id(frames)] = (frames, sid)
        return sid

    def meta_id(self, value: object) -> int:
        text = value if isinstance(value, str) else ""
        mid = self.meta_ids.get(text)
        if mid is None:
            mid = self.meta_ids[text] = len(self.metas)
            self.metas.append(text)
        return mid

    def add_entry(self, cols: TraceColumns, entry: dict[Any, Any]) -> None:
        cols.action.append(ACTION_CODE.get(str(entry.get("action")), ACTION_CODE["other"]))
        cols.addr.append(int(entry.get("addr", 0)))
        cols.size.append(int(entry.get("size", 0)))
        cols.time_us.append(int(entry.get("time_us", 0)))
        cols.stack.append(self.stack_id(entry.get("frames")))
        cols.meta.append(self.meta_id(entry.get("user_metadata")))

    def learn(self, entry: dict[Any, Any]) -> None:
        """Compile the fast expression for this entry's key layout, if its keys are memoized
        strings and its values of the kinds the expression knows."""
        keys = tuple(entry)
        if keys in self.patterns or len(self.patterns) > 8 or "frames" not in keys:
            return
        parts = [rb"\}\x94\("]
        refs = []
        for key in keys:
            slot = self.str_slot.get(key) if isinstance(key, str) else None
            if slot is None:
                return
            refs.append(_ref_bytes(slot))
            parts.append(re.escape(refs[-1]))
            if key in _INT_KEYS:
                parts.append(_INT)
            elif key in _STR_KEYS:
                parts.append(_STR)
            elif key == "frames":
                parts.append(_FRAMES)
            else:
                return
        parts.append(b"u")
        self.patterns[keys] = Layout(re.compile(b"".join(parts), re.DOTALL), keys, tuple(refs))
        self.bulk_ready = len(self.patterns) == 1 and keys[0] == "action"

    def fast_entries(self, target: list[Any]) -> bool:
        """Read entries of the ``target`` trace with the compiled expressions while they
        match (see the module docstring); the order of memo slots is kept exactly."""
        layouts = list(self.patterns.values())
        if len(self.buf) - self.pos < _FAST_MARGIN and not self.eof:
            self.fill(_FAST_MARGIN)
        if not any(lay.pattern.match(self.buf, self.pos) for lay in layouts):
            return False
        cols = self.trace_columns(target)
        read = 0
        action_of, meta_of = self.action_of, self.meta_of
        run_of = self.stack_of_run
        add_action, add_addr, add_size = cols.action.append, cols.addr.append, cols.size.append
        add_time, add_stack, add_meta = cols.time_us.append, cols.stack.append, cols.meta.append
        from_bytes = int.from_bytes
        while True:
            if len(self.buf) - self.pos < _FAST_MARGIN and not self.eof:
                self.fill(_FAST_MARGIN)
            buf, pos = self.buf, self.pos
            for lay in layouts:
                m = lay.pattern.match(buf, pos)
                if m is not None:
                    break
            else:
                return True
            read += 1
            if read > 64 and self.bulk_ready:  # long runs go to the bulk reader
                return True
            g = m.groups()
            self.memo_len += 1  # the entry dict itself: never referenced again
            for k in lay.before:
                if g[k][0] == 0x8C:  # an inline string, memoized
                    self.keep_inline(g[k], k == lay.action)
            f = g[lay.frames]
            op = f[0]
            if op == 0x68 or op == 0x6A:  # h / j: the frames list of an earlier entry
                value = self.get(f[1] if op == 0x68 else from_bytes(f[1:5], "little"))
                sid = int(value) if type(value) is _StackId else self.stack_id(value)
            else:
                sid = run_of.get(f, -2)
                if sid == -2:
                    sid = self.new_run(f) if len(f) > 2 else -1
                self.set_sids(self.memo_len, sid)
                self.memo_len += 1
            for k in lay.after:
                if g[k][0] == 0x8C:
                    self.keep_inline(g[k], k == lay.action)
            self.pos = m.end()
            x = g[lay.action]
            code = action_of.get(x)
            add_action(code if code is not None else self.action_code(x))
            x = g[lay.addr]
            add_addr(from_bytes(x[2:], "little", signed=True) if x[0] == 0x8A else _decode_int(x))
            add_size(_decode_int(g[lay.size]))
            x = g[lay.time]
            add_time(from_bytes(x[2:], "little", signed=True) if x[0] == 0x8A else _decode_int(x))
            add_stack(sid)
            if lay.meta < 0:
                add_meta(0)
            else:
                mid = meta_of.get(g[lay.meta])
                add_meta(mid if mid is not None else self.meta_code(g[lay.meta]))

    def bulk_entries(self, target: list[Any]) -> bool:
        """Read a run of entries at ``pos`` with array operations; this plain interpreter has
        no such path (:class:`.bulk.BulkReader` adds it) and reads nothing here."""
        return False

    def value_of(self, g: bytes) -> Any:
        """A STR group's value: a memo reference, or an inline string."""
        if g[0] == 0x68:
            return self.get(g[1])
        if g[0] == 0x6A:
            return self.get(int.from_bytes(g[1:5], "little"))
        return self.inline(g)

    def keep_inline(self, g: bytes, always: bool) -> None:
        """Count an inline string's memo slot; keep the string when later entries may refer
        to it (an action name; any text not seen before), not the fresh copies of repeated
        text (``compile_context``) that fill every entry."""
        seen = g in self.inline_of
        text = self.inline_of.get(g) or self.inline(g)
        if always or not seen:
            self.objects[self.memo_len] = text
        self.memo_len += 1

    def inline(self, g: bytes) -> str:
        text = self.intern(g[2:-1].decode("utf-8", "surrogatepass"))
        self.inline_of[g] = text
        return text

    def action_code(self, g: bytes) -> int:
        code = ACTION_CODE.get(str(self.value_of(g)), ACTION_CODE["other"])
        self.action_of[g] = code
        return code

    def meta_code(self, g: bytes) -> int:
        mid = self.meta_id(self.value_of(g))
        self.meta_of[g] = mid
        return mid

    def new_run(self, g: bytes) -> int:
        """Intern a frame list written as memo references (``]\\x94(`` refs ``e`` or one ref
        ``a``): the referenced frame dicts, innermost first."""
        body = g[3:-1] if g[2:3] == b"(" else g[2:-1]
        frames: list[Any] = []
        i = 0
        while i < len(body):
            if body[i] == 0x68:
                frames.append(self.get(body[i + 1]))
                i += 2
            elif body[i] == 0x6A and i + 5 <= len(body):
                frames.append(self.get(int.from_bytes(body[i + 1 : i + 5], "little")))
                i += 5
            else:
                raise UnsupportedPickle("a frame list the fast reader cannot follow")
        if not all(type(f) is dict for f in frames):
            raise ProfileFileError("not a memory snapshot (a frame list holds non-frames)")
        sid = len(self.stacks)
        self.stacks.append(frames)
        self.stack_of_run[g] = sid
        return sid

    # -- the interpreter -----------------------------------------------------------------------

    def pop_mark(self) -> list[Any]:
        items = self.stack
        if not self.marks:
            raise ProfileFileError("not a memory snapshot (unbalanced pickle marks)")
        self.stack = self.marks.pop()
        return items

    def run(self) -> Any:
        handlers = self.table()
        while True:
            if self.pos >= len(self.buf):
                self.fill(1)
                if self.pos >= len(self.buf):
                    raise ProfileFileError("not a memory snapshot (the pickle ends early)")
            op = self.buf[self.pos]
            self.pos += 1
            if op == 0x7D and self.patterns and self.marks:  # } : maybe a trace entry
                base = self.marks[-1][-1] if self.marks[-1] else None
                if type(base) is list:
                    self.pos -= 1
                    before = self.pos + self.consumed
                    while self.bulk_entries(base) or self.fast_entries(base):
                        pass
                    if self.pos + self.consumed != before:
                        continue
                    self.pos += 1
            if op == 0x2E:  # . STOP
                return self.stack.pop()
            handler = handlers[op]
            if handler is None:
                self.unknown(op)
            else:
                handler()

    def table(self) -> list[Callable[[], None] | None]:
        """The handler of each opcode (None: refused or unknown)."""
        t: list[Callable[[], None] | None] = [None] * 256
        self._literal_handlers(t)
        self._memo_handlers(t)
        self._container_handlers(t)
        return t

    def _literal_handlers(self, t: list[Callable[[], None] | None]) -> None:
        """Framing, and the opcodes that push one value read from the bytes after them."""
        take, push = self.take, self.push
        unpack = struct.unpack

        def skip(n: int) -> Callable[[], None]:
            def read() -> None:
                take(n)

            return read

        def text(size: int, fmt: str) -> Callable[[], None]:
            def read() -> None:
                n = take(1)[0] if size == 1 else unpack(fmt, take(size))[0]
                push(self.intern(take(n).decode("utf-8", "surrogatepass")))

            return read

        def binary(size: int, kind: type) -> Callable[[], None]:
            def read() -> None:
                n = int.from_bytes(take(size), "little")
                push(kind(take(n)))

            return read

        def long1() -> None:
            n = take(1)[0]
            push(int.from_bytes(take(n), "little", signed=True))

        def long4() -> None:
            n = unpack("<i", take(4))[0]
            if n < 0 or n > 1 << 16:
                raise ProfileFileError("not a memory snapshot (an integer of absurd size)")
            push(int.from_bytes(take(n), "little", signed=True))

        t[0x95] = skip(8)  # FRAME: framing only
        t[0x80] = skip(1)  # PROTO
        t[0x4B] = lambda: push(take(1)[0])
        t[0x4D] = lambda: push(unpack("<H", take(2))[0])
        t[0x4A] = lambda: push(unpack("<i", take(4))[0])
        t[0x8A] = long1
        t[0x8B] = long4
        t[0x8C] = text(1, "")
        t[0x58] = text(4, "<I")
        t[0x8D] = text(8, "<Q")
        t[0x43] = binary(1, bytes)
        t[0x42] = binary(4, bytes)
        t[0x8E] = binary(8, bytes)
        t[0x96] = binary(8, bytearray)
        t[0x4E] = lambda: push(None)
        t[0x88] = lambda: push(True)
        t[0x89] = lambda: push(False)
        t[0x47] = lambda: push(unpack(">d", take(8))[0])

    def _memo_handlers(self, t: list[Callable[[], None] | None]) -> None:
        """The memo: store the top of the stack, push what a slot holds."""
        take, push = self.take, self.push
        unpack = struct.unpack
        t[0x94] = lambda: self.memoize(self.stack[-1])
        t[0x71] = lambda: self.put(take(1)[0], self.stack[-1])
        t[0x72] = lambda: self.put(unpack("<I", take(4))[0], self.stack[-1])
        t[0x68] = lambda: push(self.get(take(1)[0]))
        t[0x6A] = lambda: push(self.get(unpack("<I", take(4))[0]))

    def _container_handlers(self, t: list[Callable[[], None] | None]) -> None:
        """Marks, the stack, and the containers built on it (a dict's items may end a trace
        entry: :meth:`after_dict`)."""
        push = self.push

        def pop_mark() -> None:
            self.pop_mark()

        def mark() -> None:
            self.marks.append(self.stack)
            self.stack = []

        def setitems() -> None:
            items = self.pop_mark()
            target = self.stack[-1]
            for i in range(0, len(items) - 1, 2):
                target[items[i]] = items[i + 1]
            self.after_dict(target)

        def setitem() -> None:
            value, key = self.stack.pop(), self.stack.pop()
            self.stack[-1][key] = value
            self.after_dict(self.stack[-1])

        def appends() -> None:
            items = self.pop_mark()
            self.stack[-1].extend(i for i in items if i is not _CONSUMED)

        def append() -> None:
            value = self.stack.pop()
            if value is not _CONSUMED:
                self.stack[-1].append(value)

        def tuple_n(n: int) -> Callable[[], None]:
            def build() -> None:
                items = self.stack[-n:]
                del self.stack[-n:]
                push(tuple(items))

            return build

        def from_mark(kind: Callable[[list[Any]], Any]) -> Callable[[], None]:
            def build() -> None:
                items = self.pop_mark()
                self.stack.append(kind(items))

            return build

        def additems() -> None:
            items = self.pop_mark()
            self.stack[-1].update(items)

        def pop() -> None:
            if self.stack:
                self.stack.pop()
            else:
                self.pop_mark()

        t[0x28] = mark
        t[0x7D] = lambda: push({})
        t[0x5D] = lambda: push([])
        t[0x29] = lambda: push(())
        t[0x75] = setitems
        t[0x73] = setitem
        t[0x65] = appends
        t[0x61] = append
        t[0x85] = tuple_n(1)
        t[0x86] = tuple_n(2)
        t[0x87] = tuple_n(3)
        t[0x74] = from_mark(tuple)
        t[0x8F] = lambda: push(set())
        t[0x90] = additems
        t[0x91] = from_mark(frozenset)
        t[0x6C] = from_mark(list)
        t[0x64] = from_mark(_dict_of_items)
        t[0x30] = pop
        t[0x31] = pop_mark
        t[0x32] = lambda: push(self.stack[-1])

    def push(self, value: Any) -> None:
        self.stack.append(value)

    def unknown(self, op: int) -> None:
        if op in _REFUSED:
            raise ProfileFileError(
                f"the pickle uses {_REFUSED[op]}, which runs code; a memory snapshot holds plain "
                "data only, so it was not loaded (nothing in it was run)"
            )
        raise UnsupportedPickle(f"pickle opcode {op:#04x}")

    def after_dict(self, entry: dict[Any, Any]) -> None:
        """A dict just got its items: a trace entry inside a list goes to that list's columns
        (and leaves the stack and the memo)."""
        if "action" not in entry or not self.marks:
            return
        base = self.marks[-1][-1] if self.marks[-1] else None
        if type(base) is not list or self.stack[-1] is not entry:
            return
        self.learn(entry)
        self.add_entry(self.trace_columns(base), entry)
        self.stack[-1] = _CONSUMED
        slot = self.dict_slot.pop(id(entry), None)
        if slot is not None:
            self.objects.pop(slot, None)
