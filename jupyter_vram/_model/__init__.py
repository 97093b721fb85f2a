"""The data the layers pass around: a Profile and what it is made of, at the bottom of the
package (nothing here imports any other jupyter_vram module but the leaf ``_units``).

Bottom first: :mod:`.columns` (category and phase names, the allocation columns, segment
events, limits); :mod:`.timeline` (the replay of a profile's events into live bytes),
:mod:`.variant` (what a rerun changed), :mod:`.oom` (the facts of an OOM post-mortem) and
:mod:`.files` (a saved profile read and checked); :mod:`.profile` (the Profile). This package
re-exports their names.

Where each module here is tested: tests/INDEX.md.
"""

from __future__ import annotations

from .columns import (
    CATEGORIES,
    CATEGORY_INDEX,
    COLUMNS,
    LEGACY_CATEGORIES,
    MAX_BYTES,
    MAX_FILE_BYTES,
    MAX_SEQ,
    PARAMETER_CATEGORIES,
    PHASE_INDEX,
    PHASES,
    Allocations,
    Frame,
    Int8Array,
    Int32Array,
    Int64Array,
    ProfileFileError,
    SegmentEvents,
    category_remap,
)
from .files import open_regular_file
from .profile import SCHEMA_VERSION, Profile
from .timeline import Timeline, replay
from .variant import Variant

__all__ = [
    "CATEGORIES",
    "CATEGORY_INDEX",
    "COLUMNS",
    "LEGACY_CATEGORIES",
    "MAX_BYTES",
    "MAX_FILE_BYTES",
    "MAX_SEQ",
    "PARAMETER_CATEGORIES",
    "PHASES",
    "PHASE_INDEX",
    "SCHEMA_VERSION",
    "Allocations",
    "Frame",
    "Int8Array",
    "Int32Array",
    "Int64Array",
    "Profile",
    "ProfileFileError",
    "SegmentEvents",
    "Timeline",
    "Variant",
    "category_remap",
    "open_regular_file",
    "replay",
]
