"""The streaming reader's bulk path: a run of trace entries decoded with array operations.

Once a trace's key layout is known (see :mod:`.snapshot_stream`), every entry written like the
ones before it starts with the same bytes: ``EMPTY_DICT MEMOIZE MARK`` and the memo reference
of its first key. Over a whole buffer, this finds every such start at once, then walks all
candidates field by field in lockstep (check the key's reference, measure the value by its
opcode), decodes integers from their bytes, and keeps the entries that chain from the reader's
position (each starting where the previous one ended, past list batch marks and pickle frame
headers). Anything irregular ends the run; the per-entry reader takes it from there.

Memo slots are accounted exactly: one per entry dict, one per inline string, one per new frame
list (whose slot gets its interned stack id, for the frees that refer to it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .snapshot_columns import ACTION_CODE, UnsupportedPickle

if TYPE_CHECKING:
    from .snapshot_stream import _Layout, _Reader

__all__ = ["read_run"]

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[Any]  # integer arrays (positions, opcodes, values)
Mask = npt.NDArray[np.bool_]

_H, _J, _K, _M, _BININT, _LONG1 = 0x68, 0x6A, 0x4B, 0x4D, 0x4A, 0x8A
_SHORT_STR, _MEMOIZE, _LIST, _MARK, _APPENDS, _APPEND = 0x8C, 0x94, 0x5D, 0x28, 0x65, 0x61
_SETITEMS, _FRAME = 0x75, 0x95
_MAX_FRAMES = 4096  # frames in one stack the bulk path follows
_MIN_RUN = 16  # fewer candidate entries than this: not worth the array set-up
_MIN_SPAN, _MAX_SPAN = 64 << 10, 8 << 20  # bytes one call looks at
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
    """Integers written as BININT1 / BININT2 / BININT / LONG1 (up to 8 bytes) at ``p``."""
    word = words.at(8, p + 1)  # the value's bytes after its opcode (and what follows)
    small = (word & np.uint64(0xFF)).astype(np.int64)
    two = (word & np.uint64(0xFFFF)).astype(np.int64)
    four = (word & np.uint64(0xFFFF_FFFF)).astype(np.uint32).view(np.int32).astype(np.int64)
    # LONG1: n bytes, two's complement; read 8 and keep n of them
    n = small.clip(0, 8)
    raw = words.at(8, p + 2)
    short = n < 8
    bits = (8 * n).astype(np.uint64)
    mask = np.where(short, (np.uint64(1) << np.where(short, bits, 0)) - np.uint64(1), ~np.uint64(0))
    value = (raw & mask).view(np.int64)
    top = (value >> np.maximum(8 * n - 1, 0)) & 1  # the sign bit of an n-byte value
    negative = short & (n > 0) & (top == 1)
    value = np.where(negative, value - (np.int64(1) << np.where(short, 8 * n, 0)), value)
    return np.where(op == _K, small, np.where(op == _M, two, np.where(op == _BININT, four, value)))


def read_run(reader: _Reader, layout: _Layout, target: list[Any]) -> bool:
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
    view = arr[start : window - len(prefix)]
    cand = np.flatnonzero(view == prefix[0]).astype(np.int64) + start
    cand = cand[words.at(4, cand + 1) == int.from_bytes(prefix[1:5], "little")]
    for j in range(5, len(prefix)):
        cand = cand[arr[cand + j] == prefix[j]]
    if len(cand) < _MIN_RUN:
        reader.bulk_span = max(reader.bulk_span // 2, _MIN_SPAN)
        return False

    p = cand + len(prefix)
    ok = np.ones(len(cand), bool)
    slots = np.ones(len(cand), np.int64)  # the entry dict
    fields: dict[str, tuple[I64, I64]] = {}  # key -> (position, opcode)
    frame_slot = np.full(len(cand), -1, np.int64)
    frames_kind = np.zeros(len(cand), np.int64)  # 0 ref, 1 new list of refs, 2 empty
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
            frame_slot = np.where(new, slots, -1)  # offset within the entry's slots
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
            frames_kind = np.where(is_ref, 0, np.where(marked | single, 1, 2))
            frames_pos, frames_end = p, p + size
        fields[key] = (p, op)
        p = p + size
    ok &= _at(arr, p) == _SETITEMS
    end = p + 1
    ok &= end <= window

    # the chain from the reader's position: each entry where the one before ended, past list
    # batch marks ("e(" = APPENDS then MARK) and pickle frame headers
    q = end
    batch = np.zeros(len(cand), bool)  # a batch mark right after the entry
    for _ in range(3):
        o = _at(arr, q)
        is_batch = (o == _APPENDS) & (_at(arr, q + 1) == _MARK)
        batch |= is_batch
        q = np.where(o == _FRAME, q + 9, np.where(is_batch, q + 2, q))
    follows = np.append(cand[1:] == q[:-1], False)
    chained = ok & np.append(True, follows[:-1])
    if not chained[0] or cand[0] != start:
        reader.bulk_span = _MIN_SPAN  # an irregular entry here: look less far next time
        return False
    run = int(np.argmin(chained)) if not chained.all() else len(cand)
    # frame lists seen for the first time: interned in order; one the reader cannot follow
    # (a frame dict written inside it) ends the run there
    stack = np.full(max(run, 0), -1, np.int64)
    run_of = reader.stack_of_run
    for r in np.flatnonzero(frames_kind[:run] == 1).tolist():
        g = buf[frames_pos[r] : frames_end[r]]
        sid = run_of.get(g)
        if sid is None:
            try:
                sid = reader.new_run(g)
            except UnsupportedPickle:
                run = r
                break
        stack[r] = sid
    # look about twice as far as this run reached: scanning stays proportional to reading
    if run == len(cand):
        reader.bulk_span = min(reader.bulk_span * 2, _MAX_SPAN)
    else:
        reached = int(end[run - 1]) - start if run else 0
        reader.bulk_span = min(max(2 * reached, _MIN_SPAN), _MAX_SPAN)
    if run < 1:
        return False
    sl = slice(0, run)
    stack = stack[:run]

    # memo: every slot of the run, the frame lists' stack ids in theirs
    base = reader.memo_len + np.concatenate(([0], np.cumsum(slots[sl])[:-1]))
    reader.memo_len += int(slots[sl].sum())
    kind = frames_kind[sl]
    fp = frames_pos[sl]
    lists = np.flatnonzero(kind >= 1)
    reader.set_sids(base[lists] + frame_slot[sl][lists], stack[lists])
    refs = np.flatnonzero(kind == 0)
    if len(refs):
        p_f = fp[refs]
        index = _ref_index(words, p_f, _at(arr, p_f))
        known = reader.slot_sid[np.minimum(index, len(reader.slot_sid) - 1)].astype(np.int64)
        known = np.where(index < len(reader.slot_sid), known, -2)
        stack[refs] = known
        for r, i in zip(refs[known == -2].tolist(), index[known == -2].tolist(), strict=True):
            stack[r] = reader.stack_id(reader.get(i))  # a list the interpreter built

    # the columns
    cols = reader.trace_columns(target)
    pa, oa = fields["action"]
    action_ref = _ref_index(words, pa[sl], oa[sl])
    uniq, inv = np.unique(action_ref, return_inverse=True)
    other = ACTION_CODE["other"]
    codes = np.asarray(
        [ACTION_CODE.get(str(reader.get(int(i))), other) for i in uniq.tolist()], np.int8
    )
    cols.action.frombytes(codes[inv].tobytes())
    for key, column in (("addr", cols.addr), ("size", cols.size), ("time_us", cols.time_us)):
        if key in fields:
            pk, ok_ = fields[key]
            column.frombytes(_int_value(words, pk[sl], ok_[sl]).astype(np.int64).tobytes())
        else:
            column.frombytes(np.zeros(run, np.int64).tobytes())
    cols.stack.frombytes(stack.astype(np.int32).tobytes())
    if "user_metadata" in fields:
        pm, om = fields["user_metadata"]
        meta_ref = _ref_index(words, pm[sl], om[sl])  # -1: an inline empty string
        uniq, inv = np.unique(meta_ref, return_inverse=True)
        ids = [0 if i < 0 else reader.meta_id(reader.get(int(i))) for i in uniq.tolist()]
        cols.meta.frombytes(np.asarray(ids, np.int32)[inv].tobytes())
    else:
        cols.meta.frombytes(np.zeros(run, np.int32).tobytes())
    if batch[: run - 1].any():
        reader.stack = []  # the batches' APPENDS + MARK, with every entry already consumed
    reader.pos = int(end[run - 1])
    return True


def _entry_end(arr: U8, nxt: I64) -> I64:
    """Where an entry ends (after its SETITEMS) given where the next one starts, past list
    batch marks and pickle frame headers between them; -1 if no shape fits."""
    u = _SETITEMS
    at = [_at(arr, nxt - k) for k in range(13)]
    batch_at = (at[2] == _APPENDS) & (at[1] == _MARK)
    choices = [
        (nxt > 0) & (at[1] == u),
        (nxt > 0) & batch_at & (at[3] == u),
        (nxt > 0) & (at[9] == _FRAME) & (at[10] == u),
        (nxt > 0) & (at[9] == _FRAME) & (at[11] == _APPENDS) & (at[10] == _MARK) & (at[12] == u),
        (nxt > 0) & batch_at & (at[11] == _FRAME) & (at[12] == u),
    ]
    return np.select(choices, [nxt, nxt - 2, nxt - 9, nxt - 11, nxt - 11], -1)


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
