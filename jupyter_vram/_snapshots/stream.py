"""Read a big ``_dump_snapshot`` pickle in bounded memory, trace entries straight to columns.

``pickle.load`` of a 1 GB snapshot builds a dict, a list and a dozen ints for each of millions
of trace entries: many GB. This reader interprets the pickle's opcodes itself (plain data only:
any opcode that names a class or calls something is refused, as in :class:`SafeUnpickler`),
builds everything but the trace entries as usual, and writes each entry of a device trace into
:class:`.columns.TraceColumns` as soon as it is read; the entry itself is never kept.

Two modules do the work, the lower one first: :mod:`.reader` (the interpreter, and the
compiled expression per key layout that reads a whole entry at once) and
:mod:`.bulk` (long runs of entries decoded with array operations, a subclass of the
interpreter). This module is their entry point.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import IO, Any

from .._model import ProfileFileError
from .bulk import BulkReader
from .columns import TraceColumns, UnsupportedPickle

__all__ = ["UnsupportedPickle", "read_snapshot_stream"]


def read_snapshot_stream(
    fh: IO[bytes], progress: Callable[[int], None] | None = None
) -> tuple[dict[str, Any], list[TraceColumns | list[Any]]]:
    """(the snapshot with ``device_traces`` emptied, the columns of each device's trace).

    Raises :class:`ProfileFileError` for what is not a snapshot or names code, and
    :class:`UnsupportedPickle` for old text-protocol pickles (read those with
    :class:`.file.SafeUnpickler`).
    """
    reader = BulkReader(fh, progress)
    try:
        data = reader.run()
    except (IndexError, KeyError, TypeError, AttributeError, ValueError, struct.error) as exc:
        if isinstance(exc, ProfileFileError):
            raise
        raise ProfileFileError(f"not a memory snapshot ({type(exc).__name__}: {exc})") from exc
    finally:
        reader.ahead.close()
    if not isinstance(data, dict) or not isinstance(data.get("device_traces", []), list):
        raise ProfileFileError("not a memory snapshot (expected a dict with 'device_traces')")
    traces: list[TraceColumns | list[Any]] = []
    for trace in data.get("device_traces") or []:
        cols = reader.columns.get(id(trace)) if isinstance(trace, list) else None
        traces.append(cols if cols is not None else trace)
    return data, traces
