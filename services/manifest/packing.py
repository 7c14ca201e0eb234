"""How `manifest_episodes` holds an episode's clips: one `bytea` per clip field (pure).

Each column holds the episode's values of one clip field, in clip order, as fixed-width
big-endian numbers (Postgres `*send` functions write network byte order). Because a query
result's binary column is one contiguous buffer, a whole manifest's values of a field are then
one zero-copy numpy view, byte-swapped once: no per-clip rows cross the wire or the parser.
The same table generates the SQL that packs and the numpy types that unpack. Missing IMU ranges
are stored as -1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

# (manifest field, SQL expression over the clips row `c` (+ `shard_no`), send fn, numpy type).
# Offsets are 64-bit (shards may exceed 2 GiB); a clip's member lengths are 32-bit.
FIELDS: tuple[tuple[str, str, str, str], ...] = (
    ("byte_offset", "c.mp4_offset", "int8send", ">i8"),
    ("length", "c.mp4_length::int4", "int4send", ">i4"),
    ("imu_offset", "coalesce(c.imu_offset, -1)", "int8send", ">i8"),
    ("imu_length", "coalesce(c.imu_length, -1)::int4", "int4send", ">i4"),
    ("json_offset", "c.json_offset", "int8send", ">i8"),
    ("json_length", "c.json_length::int4", "int4send", ">i4"),
    ("clip_start_s", "c.start_s", "float8send", ">f8"),
    ("clip_duration_s", "c.duration_s", "float8send", ">f8"),
    ("clip_index", "c.clip_index", "int4send", ">i4"),
    ("frame_count", "c.frame_count", "int4send", ">i4"),
    ("shard_no", "c.shard_no::int4", "int4send", ">i4"),
)
NO_RANGE = -1


def column_name(field: str) -> str:
    """The `manifest_episodes` column that holds a packed field."""
    return f"c_{field}"


def pack_columns_sql() -> list[tuple[str, str]]:
    """(column, SQL aggregate packing the group's clips `c` in clip-index order) per field."""
    return [
        (column_name(name), f"string_agg({fn}({expr}), ''::bytea ORDER BY c.clip_index)")
        for name, expr, fn, _ in FIELDS
    ]


def big_endian_view(field: str, data: bytes | memoryview | NDArray[np.uint8]) -> NDArray[Any]:
    """Packed values of one field as they are stored (a zero-copy view)."""
    (np_type,) = [t for name, _, _, t in FIELDS if name == field]
    return np.frombuffer(data, dtype=np.dtype(np_type))


def unpack(field: str, data: bytes | memoryview | NDArray[np.uint8]) -> NDArray[Any]:
    """Packed values of one field -> a native-endian numpy array."""
    view = big_endian_view(field, data)
    return view.astype(view.dtype.newbyteorder("="))


def pack(field: str, values: list[Any]) -> bytes:
    """Pack one field's values the way the SQL does (for tests and tools)."""
    (np_type,) = [t for name, _, _, t in FIELDS if name == field]
    return np.array([NO_RANGE if v is None else v for v in values], dtype=np_type).tobytes()
