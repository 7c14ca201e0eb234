"""Explode a manifest query's episode rows into its clip rows (pure: Arrow and numpy in memory,
no database, no object store).

Each episode row carries its clips packed (services/metadata/packing.py). The explode is
vectorised numpy, one record batch at a time into reused buffers; per-episode strings become the
dictionaries of their columns (the per-clip indices point at the episode row), so they are never
copied per clip. Measurements behind each choice: docs/performance.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from services.metadata.packing import NO_RANGE, PACKED_COLUMN, RECORD, records
from services.metadata.warehouse import TIMING_COLUMNS

# Episode-level strings that repeat across episodes: dictionary-encoded over the distinct values.
# The others (episode id, raw key and hash) are unique per episode: the episode rows themselves
# are their dictionaries.
SHARED_STRINGS = (
    "device_id",
    "session_id",
    "split",
    "verdict",
    "codec",
    "pipeline_version",
    "stream_labels",
)
UNIQUE_STRINGS = ("episode_id", "raw_key", "raw_sha256")
EPISODE_NUMBERS = (
    "started_at",
    "warning_count",
    "width",
    "height",
    "fps",
    "stream_count",
    *TIMING_COLUMNS,
)

# A clip's quality values (float32 in the packed records, NaN there for unknown: null here).
QUALITY_FIELDS = (
    "sharpness",
    "mean_luma",
    "highlights",
    "shadows",
    "frozen_fraction",
    "blocked_fraction",
    "motion",
)

MANIFEST_COLUMNS = (
    "shard_key",
    "byte_offset",
    "length",
    "imu_offset",
    "imu_length",
    "json_offset",
    "json_length",
    "episode_id",
    "device_id",
    "session_id",
    "started_at",
    "clip_index",
    "clip_start_s",
    "clip_duration_s",
    "frame_count",
    "split",
    "verdict",
    "warning_count",
    "codec",
    "width",
    "height",
    "fps",
    "raw_key",
    "raw_sha256",
    "pipeline_version",
    "stream_labels",
    "stream_count",
    *TIMING_COLUMNS,
    *QUALITY_FIELDS,
    "duplicate_of",
)

# Layer columns (one JSON text per episode: services/manifest/query.py LAYER_JOINS), after
# the columns above, present when the query pinned the layer. Dictionary-encoded over their
# distinct values: a device's calibration is one string however many episodes share it.
LAYER_COLUMNS = ("calibration", "labels")

BATCH_ROWS = 1 << 20  # clip rows per IPC record batch


def _index_type(size: int) -> pa.DataType:
    for arrow_type, limit in ((pa.int8(), 1 << 7), (pa.int16(), 1 << 15)):
        if size < limit:
            return arrow_type
    return pa.int32()


def _encode(column: pa.ChunkedArray) -> tuple[pa.Array, NDArray[Any]]:
    """Distinct values of a string column and each row's code, in the narrowest index type
    (chunk by chunk against one dictionary: the column is never copied whole)."""
    encoded = column.dictionary_encode()
    chunks = [chunk for chunk in encoded.chunks if len(chunk)]
    if not chunks:
        return pa.array([], type=column.type), np.zeros(0, dtype=np.int8)
    dictionary = chunks[-1].dictionary  # one memo table: every chunk's is a prefix of the last
    index_type = _index_type(len(dictionary)).to_pandas_dtype()
    codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in chunks])
    return dictionary, codes.astype(index_type, copy=False)


def _dictionary(indices: NDArray[np.integer[Any]], values: pa.Array) -> pa.DictionaryArray:
    index_type = _index_type(len(values))
    return pa.DictionaryArray.from_arrays(
        pa.array(indices.astype(index_type.to_pandas_dtype(), copy=False), type=index_type),
        values,
    )


def _nullable_dictionary(
    encoded: tuple[pa.Array, NDArray[Any]], nulls: NDArray[np.bool_], parent: NDArray[Any]
) -> pa.DictionaryArray:
    """An episode-level string column with nulls, per clip: the episode's code, masked where
    the episode's value is null."""
    dictionary, codes = encoded
    index_type = _index_type(len(dictionary))
    return pa.DictionaryArray.from_arrays(
        pa.array(
            np.take(codes, parent, mode="clip").astype(index_type.to_pandas_dtype()),
            type=index_type,
            mask=np.take(nulls, parent, mode="clip"),
        ),
        dictionary,
    )


CACHE_RECORDS = 1 << 15  # records copied out field by field while they are in the CPU cache


@dataclass(frozen=True)
class _Clips:
    """All episodes' packed clips: zero-copy arrays of big-endian records, one per result
    chunk, and the clip row each starts at."""

    views: list[NDArray[Any]]
    starts: NDArray[np.int64]

    @classmethod
    def of(cls, column: pa.ChunkedArray) -> _Clips:
        views: list[NDArray[Any]] = []
        for chunk in column.chunks:
            if len(chunk) == 0:
                continue
            _, offset_buffer, data_buffer = chunk.buffers()
            offset_type = np.int64 if pa.types.is_large_binary(chunk.type) else np.int32
            offsets = np.frombuffer(offset_buffer, dtype=offset_type)
            first, last = int(offsets[chunk.offset]), int(offsets[chunk.offset + len(chunk)])
            if (last - first) % RECORD.itemsize:
                raise ValueError(f"packed clips of {last - first} bytes: not whole records")
            views.append(records(memoryview(data_buffer)[first:last]))
        starts = np.cumsum([0, *(len(v) for v in views)], dtype=np.int64)
        return cls(views, starts)

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def take(self, start: int, stop: int, out: dict[str, NDArray[Any]]) -> None:
        """Clip rows [start, stop) into `out`, each field a native-endian array of at least
        stop - start values (byte-swapped while copied out, a cache-sized run of records at a
        time)."""
        first = max(int(np.searchsorted(self.starts, start, side="right")) - 1, 0)
        position = start
        for i in range(first, len(self.views)):
            begin = int(self.starts[i])
            view = self.views[i][position - begin : stop - begin]
            for run in range(0, len(view), CACHE_RECORDS):
                piece = view[run : run + CACHE_RECORDS]
                at = position - start + run
                for name in RECORD.names or ():
                    out[name][at : at + len(piece)] = piece[name]
            position += len(view)
            if position >= stop:
                break


class Exploder:
    """Episode rows (the query's result) -> clip rows, one record batch at a time (pure).

    Everything episode-level is prepared once: the clip -> episode index, and the dictionaries
    (the episode rows themselves for unique strings, the distinct values for shared ones, the
    distinct shard keys). A batch is then index arithmetic plus copies of its own clip rows, so
    memory stays at one batch however large the manifest is.
    """

    def __init__(self, episodes: pa.Table) -> None:
        counts = episodes.column("clip_count").to_numpy().astype(np.int64)
        self.parent = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        self.clips = _Clips.of(episodes.column(PACKED_COLUMN))
        if self.clips.total != len(self.parent):
            raise ValueError(f"{self.clips.total} packed clips, clip_count says {len(self.parent)}")
        # Shard keys: each episode lists its shards; a clip names one by its position in it.
        # Encoded chunk by chunk against one dictionary: no copy of the lists.
        lists = [chunk for chunk in episodes.column("shard_keys").chunks if len(chunk)]
        starts, base = [], 0
        for chunk in lists:
            offsets = chunk.offsets.to_numpy()
            starts.append(offsets[:-1].astype(np.int64) - int(offsets[0]) + base)
            base += int(offsets[-1] - offsets[0])
        self.list_starts = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        flat = pa.chunked_array([chunk.flatten() for chunk in lists], type=pa.string())
        self.shard_values, self.shard_codes = _encode(flat)
        self.unique = {name: episodes.column(name).combine_chunks() for name in UNIQUE_STRINGS}
        self.shared = {name: _encode(episodes.column(name)) for name in SHARED_STRINGS}
        # duplicate_of: null for most episodes; encoded over its values, with a null mask.
        duplicate = episodes.column("duplicate_of").cast(pa.string())  # all-null: null type
        self.duplicate = _encode(duplicate.fill_null(""))
        self.duplicate_null = duplicate.is_null().to_numpy(zero_copy_only=False)
        self.layers: dict[str, tuple[tuple[pa.Array, NDArray[Any]], NDArray[np.bool_]]] = {}
        for name in LAYER_COLUMNS:
            if name in episodes.column_names:
                values = episodes.column(name).cast(pa.string())
                nulls = values.is_null().to_numpy(zero_copy_only=False)
                self.layers[name] = (_encode(values.fill_null("")), nulls)
        self.columns = (*MANIFEST_COLUMNS, *self.layers)
        self.numbers: dict[str, tuple[NDArray[Any], pa.DataType]] = {}
        for name in EPISODE_NUMBERS:
            array = episodes.column(name).combine_chunks()
            storage = pa.int64() if pa.types.is_timestamp(array.type) else array.type
            self.numbers[name] = (array.cast(storage).to_numpy(zero_copy_only=False), array.type)

    @property
    def rows(self) -> int:
        return len(self.parent)

    def clip_indexes(self) -> NDArray[np.int32]:
        """Every clip's index, in clip row order (native-endian copy of the packed field)."""
        out = np.empty(self.rows, dtype=np.int32)
        for view, start in zip(self.clips.views, self.clips.starts[:-1], strict=True):
            out[int(start) : int(start) + len(view)] = view["clip_index"]
        return out

    def buffers(self, size: int) -> dict[str, NDArray[Any]]:
        """Room for a batch of up to `size` clip rows: `batch(..., into=)` fills it, so a
        writer that is done with one batch before asking for the next reuses the same memory."""
        out = {
            name: np.empty(size, dtype=RECORD[name].newbyteorder("="))
            for name in RECORD.names or ()
        }
        out["shard_key"] = np.empty(size, dtype=self.shard_codes.dtype)
        out["flat"] = np.empty(size, dtype=np.int64)
        for name, (_, codes) in self.shared.items():
            out[name] = np.empty(size, dtype=codes.dtype)
        for name, (numbers, _) in self.numbers.items():
            out[name] = np.empty(size, dtype=numbers.dtype)
        return out

    def batch(
        self, start: int, stop: int, into: dict[str, NDArray[Any]] | None = None
    ) -> pa.RecordBatch:
        """Clip rows [start, stop). Without `into`, in fresh memory; with it, in those buffers
        (valid until they are filled again)."""
        size = stop - start
        room = into if into is not None else self.buffers(size)
        buf = {name: values[:size] for name, values in room.items()}
        parent = self.parent[start:stop]
        self.clips.take(start, stop, buf)
        np.take(self.list_starts, parent, out=buf["flat"], mode="clip")
        buf["flat"] += buf["shard_no"]
        np.take(self.shard_codes, buf["flat"], out=buf["shard_key"], mode="clip")
        out: dict[str, pa.Array] = {
            "shard_key": _dictionary(buf["shard_key"], self.shard_values),
            "byte_offset": pa.array(buf["byte_offset"], type=pa.int64()),
            "json_offset": pa.array(buf["json_offset"], type=pa.int64()),
            "length": pa.array(buf["length"], type=pa.int32()),
            "json_length": pa.array(buf["json_length"], type=pa.int32()),
            "clip_index": pa.array(buf["clip_index"], type=pa.int32()),
            "frame_count": pa.array(buf["frame_count"], type=pa.int32()),
            "clip_start_s": pa.array(buf["clip_start_s"], type=pa.float64()),
            "clip_duration_s": pa.array(buf["clip_duration_s"], type=pa.float64()),
        }
        no_imu = buf["imu_offset"] == NO_RANGE
        out["imu_offset"] = pa.array(buf["imu_offset"], type=pa.int64(), mask=no_imu)
        out["imu_length"] = pa.array(buf["imu_length"], type=pa.int32(), mask=no_imu)
        for name, values in self.unique.items():
            out[name] = _dictionary(parent, values)
        for name, (dictionary, codes) in self.shared.items():
            np.take(codes, parent, out=buf[name], mode="clip")
            out[name] = _dictionary(buf[name], dictionary)
        for name in QUALITY_FIELDS:
            values = buf[name]
            out[name] = pa.array(values, type=pa.float32(), mask=np.isnan(values))
        out["duplicate_of"] = _nullable_dictionary(self.duplicate, self.duplicate_null, parent)
        for name, (encoded, nulls) in self.layers.items():
            out[name] = _nullable_dictionary(encoded, nulls, parent)
        for name, (numbers, arrow_type) in self.numbers.items():
            np.take(numbers, parent, out=buf[name], mode="clip")
            out[name] = pa.Array.from_buffers(arrow_type, size, [None, pa.py_buffer(buf[name])])
        return pa.record_batch([out[n] for n in self.columns], names=list(self.columns))

    @property
    def schema(self) -> pa.Schema:
        return self.batch(0, 0).schema

    def batches(self, size: int = BATCH_ROWS, reuse: bool = False) -> Iterator[pa.RecordBatch]:
        """The clip rows in batches of `size`. With `reuse`, every batch is built in the same
        buffers: for a consumer that is done with each batch before the next (a writer)."""
        room = self.buffers(min(size, self.rows)) if reuse else None
        for start in range(0, self.rows, size):
            yield self.batch(start, min(start + size, self.rows), room)


def explode(episodes: pa.Table) -> pa.Table:
    """Episode rows -> one row per clip, the manifest's columns, as one table (pure)."""
    exploder = Exploder(episodes)
    return pa.Table.from_batches(list(exploder.batches()), schema=exploder.schema)
