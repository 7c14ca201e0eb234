"""How `manifest_episodes` holds an episode's clips: one `bytea` of fixed-size records (pure).

The `clips` column holds one 92-byte record per clip (format version 2; version 1, migrations
0004-0005, was the first 64 bytes: no quality values), in clip order: the fields below as
fixed-width big-endian numbers (Postgres `*send` functions write network byte order), back to
back with no padding. Because a query result's binary column is one contiguous buffer, a whole
manifest's clips are then one zero-copy numpy array of records, each field byte-swapped once
while copied out; no per-clip rows cross the wire or the parser, and each episode row carries
one field for all of it (Postgres formats and ADBC parses per field). The same table generates
the SQL that packs and the numpy record type that unpacks. Missing IMU ranges are stored as -1,
missing quality values (older shards; motion without an IMU) as NaN.

The writer owns the format: the metadata service packs (services/metadata/core.py) and the
manifest build unpacks, so manifest depends on this module and metadata never on manifest.
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
    # The clip's quality values (float4: raw measurements, 7 significant digits are plenty).
    *(
        (name, f"coalesce(c.{name}, 'NaN')::float4", "float4send", ">f4")
        for name in (
            "sharpness",
            "mean_luma",
            "highlights",
            "shadows",
            "frozen_fraction",
            "blocked_fraction",
            "motion",
        )
    ),
)
PACKING_VERSION = 2
NO_RANGE = -1
PACKED_COLUMN = "clips"
RECORD = np.dtype([(name, np_type) for name, _, _, np_type in FIELDS])  # packed, big-endian


def pack_sql() -> str:
    """The SQL aggregate packing the group's clips `c` into records, in clip-index order."""
    return f"string_agg({_record_sql(FIELDS)}, ''::bytea ORDER BY c.clip_index)"


def _record_sql(fields: tuple[tuple[str, str, str, str], ...]) -> str:
    """One record: each field's expression through its `*send` function, concatenated."""
    return " || ".join(f"{fn}({expr})" for _, expr, fn, _ in fields)


def records(data: bytes | memoryview | NDArray[np.uint8]) -> NDArray[Any]:
    """Packed clips as stored: a zero-copy array of big-endian records."""
    return np.frombuffer(data, dtype=RECORD)


def unpack(field: str, data: bytes | memoryview | NDArray[np.uint8]) -> NDArray[Any]:
    """One field of packed clips -> a native-endian numpy array."""
    values = records(data)[field]
    return values.astype(values.dtype.newbyteorder("="))


def pack(clips: list[dict[str, Any]]) -> bytes:
    """Pack clips (dicts with every field; None for a missing IMU range or quality value) the
    way the SQL does, for tests and tools."""
    out = np.zeros(len(clips), dtype=RECORD)
    for name in RECORD.names or ():
        missing = np.nan if RECORD[name].kind == "f" else NO_RANGE
        out[name] = [missing if clip.get(name) is None else clip[name] for clip in clips]
    return out.tobytes()


# An episode's stream timing (decode's measurements; `TIMING_COLUMNS` of the warehouse).
TIMING_FIELDS = (
    "max_jitter_s",
    "max_frame_gap_s",
    "max_drift_ppm",
    "camera_skew_s",
    "imu_skew_s",
    "imu_rate_hz",
)

# An episode's fixed-width facts, one record per `manifest_episodes` row in its `facts` column
# (migration 0012): what the manifest repeats on each of the episode's clips. Packed for the
# same reason as the clips: Postgres formats and ADBC parses each field of each row, and these
# thirteen numbers as separate fields cost more than the 1 GB of packed clips (measured:
# docs/performance.md). The expression names a column of the refresh's grouped row `g`;
# `started_at` is microseconds since the Unix epoch (Arrow's timestamp[us, UTC]).
FACTS_COLUMN = "facts"
FACT_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    ("started_at", "(extract(epoch FROM g.started_at) * 1000000)::int8", "int8send", ">i8"),
    ("warning_count", "g.warning_count", "int4send", ">i4"),
    ("width", "g.width", "int4send", ">i4"),
    ("height", "g.height", "int4send", ">i4"),
    ("fps", "g.fps", "float8send", ">f8"),
    ("clip_count", "g.clip_count", "int4send", ">i4"),
    ("stream_count", "g.stream_count", "int4send", ">i4"),
    *((name, f"g.{name}", "float8send", ">f8") for name in TIMING_FIELDS),
)
FACTS = np.dtype([(name, np_type) for name, _, _, np_type in FACT_FIELDS])  # big-endian


def facts_sql() -> str:
    """The SQL expression packing the grouped row `g`'s facts into one record."""
    return _record_sql(FACT_FIELDS)


def fact_records(data: bytes | memoryview | NDArray[np.uint8]) -> NDArray[Any]:
    """Packed facts as stored: a zero-copy array of big-endian records."""
    return np.frombuffer(data, dtype=FACTS)


def pack_facts(rows: list[dict[str, Any]]) -> bytes:
    """Pack episode facts (dicts with every field; `started_at` as microseconds since the
    epoch) the way the SQL does, for tests and tools."""
    out = np.zeros(len(rows), dtype=FACTS)
    for name in FACTS.names or ():
        out[name] = [row[name] for row in rows]
    return out.tobytes()
