"""The streaming reader's bulk path: a run of trace entries decoded with array operations.

Once a trace's key layout is known (see :mod:`.stream`), every entry written like the
ones before it starts with the same bytes: ``EMPTY_DICT MEMOIZE MARK`` and the memo reference
of its first key. Over a whole window, this finds every such start at once (the read-ahead
thread has found the EMPTY_DICT bytes), then reads the candidates by shape: each shape of
entry seen (:class:`_Template`: opcodes, integer widths, string lengths up to the frames) is a
set of fixed bytes, checked on rows of 8-byte words, its values read from columns at fixed
offsets. Where shapes vary too much for that, all candidates are walked field by field in
lockstep (check the key's reference, measure the value by its opcode) instead. Either way the
entries kept are those that chain from the reader's position (each starting where the previous
one ended, past list batch marks and pickle frame headers). Anything irregular ends the run;
the per-entry reader takes it from there.

Memo slots are accounted exactly: one per entry dict, one per inline string, one per new frame
list (whose slot gets its interned stack id, for the frees that refer to it).

About 800 lines in one file, on purpose: it is one algorithm whose steps (find, match by
shape or walk, chain, account the memo, write the columns) share the byte layout of an entry
and the memo's count; apart, each would have to restate them. Its only caller is
:class:`BulkReader`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from .columns import ACTION_CODE, UnsupportedPickle
from .reader import CHUNK, Layout, Reader

__all__ = ["BulkReader", "read_run"]

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[Any]  # integer arrays (positions, opcodes, values)
Mask = npt.NDArray[np.bool_]

_H, _J, _K, _M, _BININT, _LONG1 = 0x68, 0x6A, 0x4B, 0x4D, 0x4A, 0x8A
_SHORT_STR, _MEMOIZE, _LIST, _MARK, _APPENDS, _APPEND = 0x8C, 0x94, 0x5D, 0x28, 0x65, 0x61
_SETITEMS, _FRAME = 0x75, 0x95
_MAX_FRAMES = 4096  # frames in one stack the bulk path follows
_MIN_RUN = 16  # fewer candidate entries than this: not worth the array set-up
_MIN_SPAN, _MAX_SPAN = 16 << 10, 8 << 20  # bytes one call looks at
_INT_KEYS = {"addr", "size", "stream", "time_us", "device_free"}
_STR_KEYS = {"action", "compile_context", "user_metadata"}


def _at(arr: U8, idx: I64) -> I64:
    """The bytes at ``idx`` (clipped to the buffer: anything read past it fails a check)."""
    return arr.take(idx, mode="clip")


def _at64(arr: U8, idx: I64) -> I64:
    return arr.take(idx, mode="clip").astype(np.int64)


class _Words:
    """Unaligned little-endian views of the buffer at every byte offset: a 2-, 4- or 8-byte
    value at any position in one gather (instead of one gather per byte). Indexed, not
    ``take``-n: ``take`` copies a strided array whole first. A value that runs past the end
    of the buffer reads zeros there."""

    _PAD = 16

    def __init__(self, arr: U8) -> None:
        self.u8 = arr
        self.size = len(arr)
        tail = np.zeros(2 * self._PAD, np.uint8)
        last = arr[max(self.size - self._PAD, 0) :]
        tail[: len(last)] = last
        self.tail_start = self.size - len(last)
        self.views = {width: self._view(arr, width) for width in (2, 4, 8)}
        self.tails = {width: self._view(tail, width) for width in (2, 4, 8)}

    @staticmethod
    def _view(arr: U8, width: int) -> npt.NDArray[Any]:
        kind = {2: "<u2", 4: "<u4", 8: "<u8"}[width]
        return np.ndarray((max(len(arr) - width + 1, 1),), kind, arr, 0, (1,))

    def at(self, width: int, idx: I64) -> npt.NDArray[Any]:
        """The ``width``-byte values at ``idx`` (positions are never negative)."""
        view = self.views[width]
        past = idx >= len(view)
        if not past.any():
            return view[idx]
        out = view[np.minimum(idx, len(view) - 1)]
        tail = self.tails[width]
        out[past] = tail[np.minimum(idx[past] - self.tail_start, len(tail) - 1)]
        return out

    def is_ref(self, p: I64, ref: bytes) -> Mask:
        """Where the memo reference ``ref`` (BINGET: 2 bytes, LONG_BINGET: 5) is written."""
        if len(ref) == 2:
            found: Mask = self.at(2, p) == int.from_bytes(ref, "little")
            return found
        found = self.u8.take(p, mode="clip") == ref[0]
        found &= self.at(4, p + 1) == int.from_bytes(ref[1:], "little")
        return found


def _ref_index(words: _Words, p: I64, op: I64) -> I64:
    """The memo index of a BINGET / LONG_BINGET at ``p`` (-1 elsewhere)."""
    one = words.u8.take(p + 1, mode="clip").astype(np.int64)
    four = words.at(4, p + 1).astype(np.int64)
    return np.where(op == _H, one, np.where(op == _J, four, -1))


def _int_value(words: _Words, p: I64, op: I64) -> I64:
    """Integers written as BININT1 / BININT2 / BININT / LONG1 (up to 8 bytes) at ``p``: each
    opcode's values decoded apart (a run's values mostly share one: an address's LONG1 of 6
    bytes, a time's of 7), so each is one gather of the right width."""
    out = np.empty(len(p), np.int64)
    kinds = np.unique(op) if len(op) and (op != op[0]).any() else op[:1]
    for kind in kinds.tolist():
        at = None if len(kinds) == 1 else np.flatnonzero(op == kind)
        q = p if at is None else p[at]
        if kind == _K:
            value = words.u8[q + 1].astype(np.int64)
        elif kind == _M:
            value = words.at(2, q + 1).astype(np.int64)
        elif kind == _BININT:
            value = words.at(4, q + 1).view(np.int32).astype(np.int64)
        else:
            value = _long1(words, q)
        if at is None:
            out[:] = value
        else:
            out[at] = value
    return out


def _long1(words: _Words, p: I64) -> I64:
    """LONG1 integers at ``p``: n bytes, two's complement (n <= 8, checked by the caller)."""
    n = words.u8[p + 1].astype(np.int64)
    raw = words.at(8, p + 2)
    if len(n) and (n == n[0]).all():  # one length: shifts by a scalar
        bits = 8 * int(n[0])
        if bits == 64:
            return raw.view(np.int64)
        if bits == 0:
            return np.zeros(len(p), np.int64)
        value = (raw << np.uint64(64 - bits)).view(np.int64)
        return value >> np.int64(64 - bits)  # arithmetic shift: the sign of an n-byte value
    shift = (64 - 8 * n).astype(np.uint64)
    value = (raw << shift).view(np.int64)
    value >>= shift.view(np.int64)
    return np.where(n == 0, 0, value)


def read_run(reader: Reader, layout: Layout, target: list[Any]) -> bool:
    """Decode the run of entries starting at ``reader.pos``; True if it read any."""
    buf, start = reader.buf, reader.pos
    window = len(buf) if reader.eof else len(buf) - (64 << 10)
    window = min(window, start + reader.bulk_span)  # grows while runs fill it, else shrinks
    prefix = b"}\x94(" + layout.refs[0]
    if window - start < 64 or buf[start : start + len(prefix)] != prefix:
        return False
    arr = np.frombuffer(buf, np.uint8)
    words = _Words(arr)
    # entry starts: one pass for the first byte, then the next four checked where it is
    dicts = reader.dicts  # file offsets of the buffer's EMPTY_DICT bytes (found ahead)
    lo, hi = np.searchsorted(
        dicts, (reader.consumed + start, reader.consumed + window - len(prefix))
    )
    cand = dicts[lo:hi] - reader.consumed
    cand = cand[words.at(4, cand + 1) == int.from_bytes(prefix[1:5], "little")]
    for j in range(5, len(prefix)):
        cand = cand[arr[cand + j] == prefix[j]]
    if len(cand) < _MIN_RUN:
        reader.bulk_span = max(reader.bulk_span // 2, _MIN_SPAN)
        return False

    got = None
    if reader.template_off > 0:  # shapes too varied of late: the general path for a while
        reader.template_off -= 1
    else:
        got = _templated(reader, layout, arr, cand, window)
    if got is None:
        got = _general(reader, layout, arr, words, cand, window)
    return _finish(reader, target, buf, cand, got)


class _Run:
    """What the bulk path found in a window, per candidate (the first ``run`` chain from the
    reader's position): where each ends, its memo slots, its frames, its decoded values."""

    def __init__(self, n: int) -> None:
        self.ok = np.ones(n, bool)
        self.end = np.zeros(n, np.int64)  # after its SETITEMS
        self.batch = np.zeros(n, bool)  # a batch mark right after the entry
        self.slots = np.ones(n, np.int64)  # the entry dict, inline strings, a new frames list
        self.frame_slot = np.full(n, -1, np.int64)  # a new frame list's slot within the entry's
        self.frames_kind = np.zeros(n, np.int64)  # 0 ref, 1 new list of refs, 2 empty list
        self.frames_pos = np.zeros(n, np.int64)
        self.frames_end = np.zeros(n, np.int64)
        self.frames_ref = np.full(n, -1, np.int64)  # the memo index a reference names
        self.action_ref = np.full(n, -1, np.int64)
        self.ints: dict[str, I64] = {}
        self.meta_ref: I64 | None = None  # -1: an inline empty string


class _Template:
    """The byte shape of one kind of entry up to its frames (the last key): its opcodes,
    integer widths and string lengths, so every value's offset is fixed. Entries of one shape
    are checked by comparing masked 8-byte words at once and decoded by reading columns at
    fixed offsets; their frames (a reference, or a new list) are told apart row by row."""

    def __init__(self, buf: bytes, s: int, layout: Layout) -> None:
        fixed: dict[int, int] = {}  # offset -> byte every entry of this shape has there

        def put(offset: int, data: bytes) -> None:
            for i, byte in enumerate(data):
                fixed[offset + i] = byte

        o = len(b"}\x94(" + layout.refs[0])
        put(0, b"}\x94(" + layout.refs[0])
        self.fields: dict[str, tuple[int, int, int]] = {}  # key -> (offset, opcode, size)
        self.slots = 1  # the entry dict and inline strings (a new frames list adds one)
        self.frames_at = -1
        for n, key in enumerate(layout.keys):
            if n:
                put(o, layout.refs[n])
                o += len(layout.refs[n])
            if s + o + 16 > len(buf):
                raise ValueError("near the end of the buffer")
            op = buf[s + o]
            if key in _INT_KEYS or key in _STR_KEYS:
                put(o, bytes([op]))
            if key in _INT_KEYS:
                size = {_K: 2, _M: 3, _BININT: 5}.get(op, 0)
                if op == _LONG1 and buf[s + o + 1] <= 8:
                    size = 2 + buf[s + o + 1]
                    put(o + 1, bytes([size - 2]))
            elif key in _STR_KEYS:
                size = {_H: 2, _J: 5}.get(op, 0)
                if op == _SHORT_STR:
                    size = 3 + buf[s + o + 1]
                    if key in ("action", "user_metadata") and (key, size) != ("user_metadata", 3):
                        raise ValueError("their values must be references")
                    put(o + 1, bytes([size - 3]))
                    put(o + size - 1, bytes([_MEMOIZE]))
                    self.slots += 1
            elif n == len(layout.keys) - 1:  # frames, the last key: its shape varies by row
                self.frames_at = o
                size = 0
            else:
                raise ValueError("frames before other keys")
            if size == 0 and key != "frames":
                raise ValueError("a value of another kind")
            self.fields[key] = (o, op, size)
            o += size
        if self.frames_at < 0:
            raise ValueError("no frames last")
        top = max(max(fixed) + 1, max(off + 10 for off, _, _ in self.fields.values()))
        top = max(top, self.frames_at + 10)  # what tells the frames' shape
        self.need = (top + 7) // 8 * 8  # bytes of each entry read into the block
        if self.need > 256:
            raise ValueError("too long a shape")
        mask, value = bytearray(self.need), bytearray(self.need)
        for offset, byte in fixed.items():
            mask[offset], value[offset] = 0xFF, byte
        self.mask = np.frombuffer(bytes(mask), "<u8")
        self.value = np.frombuffer(bytes(value), "<u8")
        self.words = [(w, self.mask[w], self.value[w]) for w in np.flatnonzero(self.mask).tolist()]


def _matches(bw: npt.NDArray[Any], t: _Template) -> Mask:
    """Which rows of 8-byte words have the fixed bytes of ``t`` (a word at a time: reducing
    along short rows is slow)."""
    diff: npt.NDArray[Any] | None = None
    for w, mask, value in t.words:
        col = bw[:, w] & mask
        col ^= value
        if diff is None:
            diff = col
        else:
            diff |= col
    if diff is None:
        return np.ones(len(bw), bool)
    found: Mask = diff == 0
    return found


def _column(block: U8, offset: int, kind: str) -> npt.NDArray[Any]:
    """The values of type ``kind`` at ``offset`` of every row of ``block`` (unaligned)."""
    out: npt.NDArray[Any] = np.ndarray((len(block),), kind, block, offset, (block.shape[1],))
    return out


def _decode_int(block: U8, offset: int, op: int, size: int) -> I64:
    if op == _K:
        return block[:, offset + 1].astype(np.int64)
    if op == _M:
        return _column(block, offset + 1, "<u2").astype(np.int64)
    if op == _BININT:
        return _column(block, offset + 1, "<i4").astype(np.int64)
    bits = 8 * (size - 2)  # LONG1 of size - 2 bytes, two's complement
    if bits == 0:
        return np.zeros(len(block), np.int64)
    raw = _column(block, offset + 2, "<u8").astype(np.uint64)
    if bits < 64:
        raw <<= np.uint64(64 - bits)
    value = raw.view(np.int64)
    if bits < 64:
        value >>= np.int64(64 - bits)  # arithmetic: the sign of an n-byte value
    return value


def _decode_ref(block: U8, offset: int, op: int) -> I64:
    """The memo index a BINGET / LONG_BINGET at ``offset`` names (-1: an inline string)."""
    if op == _H:
        return block[:, offset + 1].astype(np.int64)
    if op == _J:
        return _column(block, offset + 1, "<u4").astype(np.int64)
    return np.full(len(block), -1, np.int64)


_MAX_TEMPLATES = 24


def _templated(reader: Reader, layout: Layout, arr: U8, cand: I64, window: int) -> _Run | None:
    """The candidates whose bytes fit one of the shapes seen before (see :class:`_Template`);
    None when the first fits none and has no shape of its own (the general path reads it)."""
    buf = reader.buf
    templates: list[_Template] = reader.templates
    first = next((t for t in templates if _fits(arr, int(cand[0]), t)), None)
    if first is None:
        if len(templates) >= _MAX_TEMPLATES:
            templates.pop()  # the least used in the last window
        try:
            first = _Template(buf, int(cand[0]), layout)
        except (ValueError, IndexError):
            return None
        if not _fits(arr, int(cand[0]), first):
            return None
        templates.append(first)
    width = max(t.need for t in templates)
    cv = cand[: int(np.searchsorted(cand, len(arr) - width, side="right"))]
    n = len(cv)
    if n < _MIN_RUN:
        return None
    rows = np.lib.stride_tricks.as_strided(arr, (len(arr) - width + 1, width), (1, 1))
    block = rows[cv]
    bw = block.view("<u8")
    tid = np.full(n, -1, np.int64)
    rest = np.arange(n)
    hits = [0] * len(templates)
    for i, t in enumerate(templates):
        if not len(rest):
            break
        sub = bw if len(rest) == n else bw[rest]
        hit = _matches(sub, t)
        tid[rest[hit]] = i
        hits[i] = int(hit.sum())
        rest = rest[~hit]
    # the most common shapes first next time
    order = sorted(range(len(templates)), key=lambda i: -hits[i])
    reader.templates = [templates[i] for i in order]
    # a row of no shape known early in the window, three windows in a row: the shapes vary
    # too much for templates (each window makes one more); walk fields for the next 16
    misses = np.flatnonzero(tid < 0)
    if len(misses) and misses[0] < n // 2:
        reader.shape_misses += 1
        if reader.shape_misses >= 3:
            reader.shape_misses, reader.template_off = 0, 16
    else:
        reader.shape_misses = 0

    run = _Run(n)
    run.end = np.full(n, -1, np.int64)
    good = np.zeros(n, bool)
    nxt = np.append(cand[1:], -1)[:n]
    want = [k for k in ("addr", "size", "time_us") if k in layout.keys]
    for key in want:
        run.ints[key] = np.zeros(n, np.int64)
    if "user_metadata" in layout.keys:
        run.meta_ref = np.full(n, -1, np.int64)
    # the most common shape decoded on every row (no scatter: the rows of the others are
    # written over next, those of none fail), then the others on their rows
    everywhere = True
    for i in sorted(range(len(templates)), key=lambda i: -hits[i]):
        if not hits[i]:
            continue
        t = templates[i]
        at: I64 | slice = slice(None) if everywhere else np.flatnonzero(tid == i)
        everywhere = False
        sub = block[at]
        good[at] = _frames(arr, sub, cv[at], nxt[at], t, at, run)
        off, op, _ = t.fields["action"]
        run.action_ref[at] = _decode_ref(sub, off, op)
        for key in want:
            off, op, size = t.fields[key]
            run.ints[key][at] = _decode_int(sub, off, op, size)
        if run.meta_ref is not None:
            off, op, _ = t.fields["user_metadata"]
            run.meta_ref[at] = _decode_ref(sub, off, op)
    run.ok = good & (tid >= 0)
    run.ok = _chain(arr, cand, run, window)
    return run


def _frames(
    arr: U8, sub: U8, start: I64, nxt: I64, t: _Template, at: I64 | slice, run: _Run
) -> npt.NDArray[np.bool_]:
    """The frames of rows ``at`` (entries of shape ``t`` at ``start``, rows ``sub`` of the
    block): a memo reference, or a new list (memoized): empty, of one reference (APPEND), or
    of several (MARK ... APPENDS, ending where the next entry starts). Which rows are whole."""
    f = t.frames_at
    op, b1, b2 = sub[:, f], sub[:, f + 1], sub[:, f + 2]
    is_h, is_j = op == _H, op == _J
    is_list = (op == _LIST) & (b1 == _MEMOIZE)
    one_h = is_list & (b2 == _H) & (sub[:, f + 4] == _APPEND)
    one_j = is_list & (b2 == _J) & (sub[:, f + 7] == _APPEND)
    empty = is_list & (b2 == _SETITEMS)
    marked = is_list & (b2 == _MARK)
    size = np.select([is_h, is_j, empty, one_h, one_j], [2, 5, 2, 5, 8], 0)
    end = start + f + size + 1
    fixed = np.flatnonzero(size > 0)
    good = np.zeros(len(start), bool)
    good[fixed] = _at(arr, end[fixed] - 1) == _SETITEMS
    many = np.flatnonzero(marked)
    if len(many):  # a list of any length: the entry ends where the next starts
        e = _entry_end(arr, nxt[many])
        good[many] = (e > 0) & (_at(arr, e - 2) == _APPENDS) & (e - 1 - start[many] > f + 3)
        end[many] = e
    run.end[at] = np.where(good, end, -1)
    run.slots[at] = t.slots + is_list
    run.frame_slot[at] = np.where(is_list, t.slots, -1)
    run.frames_kind[at] = np.where(is_list, np.where(empty, 2, 1), 0)
    run.frames_pos[at] = start + f
    run.frames_end[at] = end - 1
    run.frames_ref[at] = np.where(
        is_h, sub[:, f + 1], np.where(is_j, _column(sub, f + 1, "<u4"), -1)
    )
    return good


_HASH_MUL = np.uint64(0x9E37_79B9_7F4A_7C15)
_LOW_BYTES = np.asarray([(1 << 8 * k) - 1 for k in range(9)], np.uint64)  # k low bytes set


def _hash(words: npt.NDArray[Any], sizes: I64) -> npt.NDArray[Any]:
    """A 64-bit hash of each row of words (and its byte length); equal rows hash equal."""
    h = sizes.astype(np.uint64) * _HASH_MUL
    for c in range(words.shape[1]):
        h ^= words[:, c]
        h *= _HASH_MUL
        h ^= h >> np.uint64(29)
    return h


class _ListTable:
    """The frame lists interned so far (``reader.stack_of_run``: bytes -> stack id) as rows of
    8-byte words sorted by a hash: a window's copies of known lists are found with array
    operations and checked byte for byte (a dict lookup each cost a third of the read).
    Lists longer than ``_MAX_BYTES``, past ``_MAX_LISTS``, or not found go by the dict."""

    _MAX_BYTES = 512
    _MAX_LISTS = 1 << 14

    def __init__(self) -> None:
        self.count = 0  # entries of stack_of_run seen by the last update
        self.width = 8
        self.hashes = np.zeros(0, np.uint64)
        self.sids = np.zeros(0, np.int64)
        self.sizes = np.zeros(0, np.int64)
        self.words = np.zeros((0, 1), np.uint64)

    def update(self, run_of: dict[bytes, int]) -> None:
        if len(run_of) == self.count:
            return
        self.count = len(run_of)
        items = [(g, sid) for g, sid in run_of.items() if len(g) <= self._MAX_BYTES]
        items = items[: self._MAX_LISTS]
        if not items:
            return
        width = (max(len(g) for g, _ in items) + 7) // 8 * 8
        rows = bytearray(len(items) * width)
        for i, (g, _) in enumerate(items):
            rows[i * width : i * width + len(g)] = g
        words = np.frombuffer(bytes(rows), "<u8").reshape(len(items), width // 8)
        sizes = np.asarray([len(g) for g, _ in items], np.int64)
        hashes = _hash(words, sizes)
        order = np.argsort(hashes, kind="stable")
        self.width = width
        self.hashes, self.words, self.sizes = hashes[order], words[order], sizes[order]
        self.sids = np.asarray([sid for _, sid in items], np.int64)[order]

    def find(self, arr: U8, pos: I64, end: I64) -> I64:
        """The stack id of the list at each ``pos``..``end``; -1 where not found."""
        out = np.full(len(pos), -1, np.int64)
        if not len(self.hashes) or not len(pos):
            return out
        width = self.width
        size = end - pos
        idx = np.flatnonzero((size > 0) & (size <= width) & (pos + width <= len(arr)))
        if not len(idx):
            return out
        rows = np.lib.stride_tricks.as_strided(arr, (len(arr) - width + 1, width), (1, 1))
        words = rows[pos[idx]].view("<u8")
        size = size[idx]
        for c in range(words.shape[1]):  # the bytes past each list's end zeroed, word by word
            words[:, c] &= _LOW_BYTES[np.clip(size - 8 * c, 0, 8)]
        h = _hash(words, size)
        j = np.minimum(np.searchsorted(self.hashes, h), len(self.hashes) - 1)
        row = np.dtype((np.void, width))  # rows compared whole (memcmp)
        same = (self.hashes[j] == h) & (self.sizes[j] == size)
        same &= words.view(row)[:, 0] == self.words[j].view(row)[:, 0]
        out[idx[same]] = self.sids[j[same]]
        return out


def _fits(arr: U8, s: int, t: _Template) -> bool:
    """Whether the entry at ``s`` has the shape of ``t``."""
    if s + t.need > len(arr):
        return False
    words = np.frombuffer(arr[s : s + t.need].tobytes(), "<u8")
    return bool(((words & t.mask) == t.value).all())


def _chain(arr: U8, cand: I64, run: _Run, window: int) -> npt.NDArray[np.bool_]:
    """Which candidates chain from the first: each where the one before ended, past list
    batch marks ("e(" = APPENDS then MARK) and pickle frame headers."""
    n = len(run.end)
    run.ok &= run.end <= window
    nxt = np.append(cand[1:], -1)[:n]
    far = np.flatnonzero(nxt != run.end)  # something between the two, or no chain
    q = run.end[far]
    for _ in range(3):
        o = _at(arr, q)
        is_batch = (o == _APPENDS) & (_at(arr, q + 1) == _MARK)
        run.batch[far] |= is_batch
        q = np.where(o == _FRAME, q + 9, np.where(is_batch, q + 2, q))
    follows = np.ones(n, bool)
    follows[far] = q == nxt[far]
    chained = run.ok.copy()
    chained[1:] &= follows[:-1]
    return chained


def _general(
    reader: Reader, layout: Layout, arr: U8, words: _Words, cand: I64, window: int
) -> _Run:
    """Every candidate walked field by field in lockstep (any layout of values)."""
    run = _Run(len(cand))
    p = cand + len(b"}\x94(" + layout.refs[0])
    ok = run.ok
    slots = run.slots
    fields: dict[str, tuple[I64, I64]] = {}  # key -> (position, opcode)
    frame_slot = run.frame_slot
    frames_kind = run.frames_kind
    frames_pos = frames_end = p
    for n, key in enumerate(layout.keys):
        if n:
            ref = layout.refs[n]
            ok &= words.is_ref(p, ref)
            p = p + len(ref)
        op = _at(arr, p)
        if key in _INT_KEYS:
            long1 = 2 + _at64(arr, p + 1)
            size = np.select([op == _K, op == _M, op == _BININT, op == _LONG1], [2, 3, 5, long1], 0)
            ok &= (size > 0) & ((op != _LONG1) | (_at(arr, p + 1) <= 8))
        elif key in _STR_KEYS:
            inline = op == _SHORT_STR
            size = np.select([op == _H, op == _J, inline], [2, 5, 3 + _at64(arr, p + 1)], 0)
            ok &= (size > 0) & (~inline | (_at(arr, p + size - 1) == _MEMOIZE))
            if key in ("action", "user_metadata"):  # their values must be references
                ok &= ~inline | ((key == "user_metadata") & (_at(arr, p + 1) == 0))
            slots += inline
        else:  # frames
            is_ref = (op == _H) | (op == _J)
            new = (op == _LIST) & (_at(arr, p + 1) == _MEMOIZE)
            ok &= is_ref | new
            frame_slot[:] = np.where(new, slots, -1)  # offset within the entry's slots
            slots += new
            nxt = _at(arr, p + 2)
            if n == len(layout.keys) - 1:  # the last key: the entry ends where the next starts
                end_here = _entry_end(arr, np.append(cand[1:], -1))
                ok &= end_here > 0
                size = end_here - 1 - p
                last = _at(arr, end_here - 2)
                marked = new & (nxt == _MARK) & (last == _APPENDS)
                single = new & ((nxt == _H) | (nxt == _J)) & (last == _APPEND)
                empty = new & (size == 2)
                ok &= (is_ref & (size == np.where(op == _H, 2, 5))) | marked | single | empty
            else:
                marked, single, size = _walk_frames(arr, p, op, new, is_ref, nxt, ok)
            frames_kind[:] = np.where(is_ref, 0, np.where(marked | single, 1, 2))
            frames_pos, frames_end = p, p + size
            refs = np.flatnonzero(is_ref)
            run.frames_ref[refs] = _ref_index(words, p[refs], op[refs])
        fields[key] = (p, op)
        p = p + size
    ok &= _at(arr, p) == _SETITEMS
    run.end = p + 1
    run.frames_pos, run.frames_end = frames_pos, frames_end
    run.ok = _chain(arr, cand, run, window)
    n_ok = int(np.argmin(run.ok)) if not run.ok.all() else len(cand)
    sl = slice(0, n_ok)
    pa, oa = fields["action"]
    run.action_ref[sl] = _ref_index(words, pa[sl], oa[sl])
    for key in ("addr", "size", "time_us"):
        if key in fields:
            pk, ok_ = fields[key]
            value = np.zeros(len(cand), np.int64)
            value[sl] = _int_value(words, pk[sl], ok_[sl])
            run.ints[key] = value
    if "user_metadata" in fields:
        pm, om = fields["user_metadata"]
        run.meta_ref = np.full(len(cand), -1, np.int64)
        run.meta_ref[sl] = _ref_index(words, pm[sl], om[sl])
    return run


def _finish(reader: Reader, target: list[Any], buf: bytes, cand: I64, got: _Run) -> bool:
    """Write the run that chains from the reader's position to the columns and the memo."""
    start = reader.pos
    chained = got.ok
    if not len(chained) or not chained[0] or cand[0] != start:
        reader.bulk_span = _MIN_SPAN  # an irregular entry here: look less far next time
        return False
    run = int(np.argmin(chained)) if not chained.all() else len(chained)
    stack, run = _intern_new_lists(reader, buf, got, run)
    # look about twice as far as this run reached: scanning stays proportional to reading
    if run == len(chained):
        reader.bulk_span = min(reader.bulk_span * 2, _MAX_SPAN)
    else:
        reached = int(got.end[run - 1]) - start if run else 0
        reader.bulk_span = min(max(2 * reached, _MIN_SPAN), _MAX_SPAN)
    if run < 1:
        return False
    stack = stack[:run]
    _account_memo(reader, got, run, stack)
    _write_columns(reader, target, got, run, stack)
    if got.batch[: run - 1].any():
        reader.stack = []  # the batches' APPENDS + MARK, with every entry already consumed
    reader.pos = int(got.end[run - 1])
    return True


def _intern_new_lists(reader: Reader, buf: bytes, got: _Run, run: int) -> tuple[I64, int]:
    """The stack id of each entry of the run whose frames are a list written in it (-1 for
    the others), frame lists seen for the first time interned in order; and the run's length,
    shortened where a list the reader cannot follow (a frame dict written inside it) ends it."""
    stack = np.full(max(run, 0), -1, np.int64)
    run_of = reader.stack_of_run
    frames_pos, frames_end = got.frames_pos, got.frames_end
    lists = np.flatnonzero(got.frames_kind[:run] == 1)
    table: _ListTable = reader.list_table
    known = table.find(np.frombuffer(buf, np.uint8), frames_pos[lists], frames_end[lists])
    found = known.tolist()
    for i in np.flatnonzero(known < 0).tolist():  # not in the table: by the dict, or new here
        r = int(lists[i])
        g = buf[frames_pos[r] : frames_end[r]]
        sid = run_of.get(g)
        if sid is None:
            try:
                sid = reader.new_run(g)
            except UnsupportedPickle:
                run = r
                lists, found = lists[:i], found[:i]
                break
        found[i] = sid
    stack[lists] = np.asarray(found, np.int64)
    table.update(run_of)
    return stack, run


def _account_memo(reader: Reader, got: _Run, run: int, stack: I64) -> None:
    """Take every memo slot of the run, the new frame lists' stack ids in theirs; fill in
    the stack of the entries whose frames are a reference to a list met before."""
    sl = slice(0, run)
    slots = got.slots[sl]
    base = reader.memo_len + np.concatenate(([0], np.cumsum(slots)[:-1]))
    reader.memo_len += int(slots.sum())
    kind = got.frames_kind[sl]
    lists = np.flatnonzero(kind >= 1)
    reader.set_sids(base[lists] + got.frame_slot[sl][lists], stack[lists])
    refs = np.flatnonzero(kind == 0)
    if len(refs):
        index = got.frames_ref[refs]
        known = reader.slot_sid[np.minimum(index, len(reader.slot_sid) - 1)].astype(np.int64)
        known = np.where(index < len(reader.slot_sid), known, -2)
        stack[refs] = known
        for r, i in zip(refs[known == -2].tolist(), index[known == -2].tolist(), strict=True):
            stack[r] = reader.stack_id(reader.get(i))  # a list the interpreter built


def _write_columns(reader: Reader, target: list[Any], got: _Run, run: int, stack: I64) -> None:
    """Append the run's entries to the trace's columns."""
    sl = slice(0, run)
    cols = reader.trace_columns(target)
    other = ACTION_CODE["other"]
    cols.action.frombytes(
        _raw(
            _by_value(
                got.action_ref[sl], lambda i: ACTION_CODE.get(str(reader.get(i)), other), np.int8
            )
        )
    )
    for key, column in (("addr", cols.addr), ("size", cols.size), ("time_us", cols.time_us)):
        if key in got.ints:
            column.frombytes(_raw(got.ints[key][sl]))
        else:
            column.frombytes(np.zeros(run, np.int64).tobytes())
    cols.stack.frombytes(stack.astype(np.int32).tobytes())
    if got.meta_ref is not None:
        cols.meta.frombytes(
            _raw(
                _by_value(
                    got.meta_ref[sl],
                    lambda i: 0 if i < 0 else reader.meta_id(reader.get(i)),
                    np.int32,
                )
            )
        )
    else:
        cols.meta.frombytes(np.zeros(run, np.int32).tobytes())


def _raw(values: npt.NDArray[Any]) -> memoryview:
    """An array's bytes without a copy (what ``array.frombytes`` takes)."""
    data: Any = np.ascontiguousarray(values)
    return memoryview(data).cast("B")


def _by_value(refs: I64, of: Callable[[int], int], kind: type) -> npt.NDArray[Any]:
    """``of`` each memo index in ``refs`` (-1 or more), called once per distinct index: the
    distinct ones are few (action names, metadata strings); a table when they are small."""
    if not len(refs):
        return np.zeros(0, kind)
    low, high = int(refs.min()), int(refs.max())
    if high - low < 1 << 16:
        present = np.flatnonzero(np.bincount(refs - low)) + low
        table: npt.NDArray[Any] = np.zeros(high - low + 1, kind)
        table[present - low] = [of(i) for i in present.tolist()]
        out: npt.NDArray[Any] = table[refs - low]
        return out
    uniq, inv = np.unique(refs, return_inverse=True)
    out = np.asarray([of(i) for i in uniq.tolist()], kind)[inv]
    return out


def _entry_end(arr: U8, nxt: I64) -> I64:
    """Where an entry ends (after its SETITEMS) given where the next one starts, past list
    batch marks and pickle frame headers between them; -1 if no shape fits. (Mostly nothing
    is between: the other shapes are tried on the rest only.)"""
    end = np.where((nxt > 0) & (_at(arr, nxt - 1) == _SETITEMS), nxt, -1)
    rest = np.flatnonzero(end < 0)
    if len(rest) == 0:
        return end
    u = _SETITEMS
    nx = nxt[rest]
    at = [_at(arr, nx - k) for k in range(13)]
    batch_at = (at[2] == _APPENDS) & (at[1] == _MARK)
    choices = [
        (nx > 0) & batch_at & (at[3] == u),
        (nx > 0) & (at[9] == _FRAME) & (at[10] == u),
        (nx > 0) & (at[9] == _FRAME) & (at[11] == _APPENDS) & (at[10] == _MARK) & (at[12] == u),
        (nx > 0) & batch_at & (at[11] == _FRAME) & (at[12] == u),
    ]
    end[rest] = np.select(choices, [nx - 2, nx - 9, nx - 11, nx - 11], -1)
    return end


def _walk_frames(
    arr: U8, p: I64, op: I64, new: Mask, is_ref: Mask, nxt: I64, ok: Mask
) -> tuple[Mask, Mask, I64]:
    """Frame lists not at the end of their entry: follow each list's references."""
    marked = new & (nxt == _MARK)
    one = np.where(nxt == _H, 2, np.where(nxt == _J, 5, 0))
    single = new & (one > 0) & (_at(arr, p + 2 + one) == _APPEND)
    q = p + 3
    active = marked.copy()
    for _ in range(_MAX_FRAMES):
        if not active.any():
            break
        o = _at(arr, q)
        step = np.where(o == _H, 2, np.where(o == _J, 5, 0))
        closing = active & (o == _APPENDS)
        ok &= ~(active & (step == 0) & ~closing)
        q = np.where(active, q + np.where(closing, 1, step), q)
        active &= step > 0
    else:
        ok &= ~active
    ok &= ~new | marked | single | ~((nxt == _H) | (nxt == _J) | (nxt == _MARK))
    size = np.where(
        is_ref,
        np.where(op == _H, 2, 5),
        np.where(marked, q - p, np.where(single, 3 + one, 2)),
    )
    return marked, single, size


class BulkReader(Reader):
    """The interpreter with the bulk path: long runs of regular entries go to :func:`read_run`."""

    def bulk_entries(self, target: list[Any]) -> bool:
        """Read the run of entries at ``pos`` with array operations (:func:`read_run`).
        After it fails several times in a row (irregular entries), it waits a while longer
        each time before it tries again (each try looks at a whole window)."""
        if not self.bulk_ready or self.consumed + self.pos < self.bulk_retry:
            return False
        if len(self.buf) - self.pos < CHUNK // 8 and not self.eof:
            self.fill(CHUNK)
        if self.list_table is None:
            self.list_table = _ListTable()
        layout = next(iter(self.patterns.values()))
        if read_run(self, layout, target):
            self.bulk_backoff = 0
            return True
        self.bulk_retry = self.consumed + self.pos + 1 + self.bulk_backoff
        self.bulk_backoff = min(max(2 * self.bulk_backoff, 1 << 10), 256 << 10)
        return False
