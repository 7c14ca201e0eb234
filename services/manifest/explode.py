"""Explode a manifest query's episode rows into its clip rows (pure: Arrow and numpy in memory,
no database, no object store).

Each episode row carries its clips packed (services/metadata/packing.py). The explode is
vectorised numpy, one record batch at a time into reused buffers; per-episode strings become the
dictionaries of their columns (the per-clip indices point at the episode row), so they are never
copied per clip. Measurements behind each choice: docs/performance.md.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from services.manifest.query import (
    BODY_COLUMNS,
    HEAD_COLUMNS,
    HEAD_SHARED,
    HEADS_SEPARATOR,
    PACKED_HEADS,
    PACKED_HEADS_COLUMN,
)
from services.metadata.packing import (
    FACTS,
    FACTS_COLUMN,
    NO_RANGE,
    PACKED_COLUMN,
    RECORD,
    fact_records,
    records,
)
from services.metadata.warehouse import TIMING_COLUMNS

# Episode-level strings unique per episode (episode id, raw key and hash): the heads themselves
# are their dictionaries. The others (`HEAD_SHARED`) are dictionary-encoded over their distinct
# values.
UNIQUE_STRINGS = ("episode_id", "raw_key", "raw_sha256")

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
        kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
        return pa.array([], type=kind), np.zeros(0, dtype=np.int8)
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


EPISODE_TYPES: dict[str, pa.DataType] = {
    "started_at": pa.timestamp("us", tz="UTC"),
    "warning_count": pa.int32(),
    "width": pa.int32(),
    "height": pa.int32(),
    "fps": pa.float64(),
    "stream_count": pa.int32(),
    **{name: pa.float64() for name in TIMING_COLUMNS},
}


class _Memo:
    """The shard keys' dictionary: values in order of first appearance (what dictionary-encoding
    them all at once gives), grown chunk by chunk as the bodies stream, each with the episode it
    first appeared in, so a batch's dictionary is the values its episodes have seen, however
    the bodies were chunked."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.values: list[str] = []
        self.first_episode: list[int] = []
        self._array: pa.Array = pa.array([], type=pa.string())

    def encode(self, column: pa.Array, episodes: NDArray[np.int64]) -> NDArray[np.int32]:
        """Codes of `column`'s values, row i being of episode `episodes[i]`."""
        encoded = pc.dictionary_encode(column)
        indices = encoded.indices.to_numpy(zero_copy_only=False)
        _, first_row = np.unique(indices, return_index=True)  # local codes are in row order
        local = np.empty(len(encoded.dictionary), dtype=np.int32)
        for code, value in enumerate(encoded.dictionary.to_pylist()):
            known = self.codes.get(value)
            if known is None:
                known = self.codes[value] = len(self.values)
                self.values.append(value)
                self.first_episode.append(int(episodes[first_row[code]]))
            local[code] = known
        out: NDArray[np.int32] = local[indices]
        return out

    def upto(self, episode: int) -> int:
        """How many values had appeared by the end of `episode`."""
        return bisect.bisect_right(self.first_episode, episode)

    def dictionary(self, count: int) -> pa.Array:
        """The first `count` values, in buffers of their own (a slice of a longer array would
        write different bytes: the file must depend on the rows only)."""
        if len(self._array) != count:
            self._array = pa.array(self.values[:count], type=pa.string())
        return self._array


@dataclass
class _Chunk:
    """One streamed chunk of body rows (episodes `first`..`first + count`), decoded per episode;
    its clips go to clip rows `row`.. of the manifest."""

    first: int
    count: int
    row: int
    clips: _Clips
    list_starts: NDArray[np.int64]  # each episode's first shard in `shard_codes`
    shard_codes: NDArray[np.int32]
    numbers: dict[str, NDArray[Any]]  # native-endian, per episode


class Exploder:
    """Episode rows (the query's result, as heads and streamed bodies) -> clip rows, one record
    batch of `size` rows at a time (pure).

    The heads prepare what is known before the first body: the clip -> episode index, and the
    dictionaries of the episodes' strings. Each body chunk then adds its clips and shard keys;
    a batch is index arithmetic plus copies of its own clip rows into reused buffers, so memory
    stays at a batch however large the manifest is. The batches are the same whatever the
    bodies' chunking: they cut at fixed clip rows.
    """

    def __init__(self, heads: pa.Table, size: int = BATCH_ROWS) -> None:
        counts = heads.column("clip_count").to_numpy().astype(np.int64)
        self.counts = counts
        self.parent = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        self.episode_rows = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.episode_rows[1:])
        self.size = max(1, min(size, self.rows)) if self.rows else 1
        self.unique = {name: heads.column(name).combine_chunks() for name in UNIQUE_STRINGS}
        self.shared = {name: _encode(heads.column(name)) for name in HEAD_SHARED}
        self.layers: dict[str, tuple[tuple[pa.Array, NDArray[Any]], NDArray[np.bool_]]] = {}
        for name in LAYER_COLUMNS:
            if name in heads.column_names:
                values = heads.column(name).cast(pa.string())
                nulls = values.is_null().to_numpy(zero_copy_only=False)
                self.layers[name] = (_encode(values.fill_null("")), nulls)
        self.columns = (*MANIFEST_COLUMNS, *self.layers)
        # duplicate_of: null for most episodes; encoded over its values, with a null mask.
        duplicate = heads.column("duplicate_of").cast(pa.string())  # all-null: null type
        self.duplicate = _encode(duplicate.fill_null(""))
        self.duplicate_null = duplicate.is_null().to_numpy(zero_copy_only=False)
        self.shards = _Memo()
        # The shard keys' index type is fixed before their values are known (the first batch
        # is written before the last shard is seen): the one for the bound, one shard a clip.
        self.shard_type = _index_type(max(self.rows, 1))
        self.clip_index = np.empty(self.rows, dtype=np.int32)  # every clip's, for the members
        self.episodes_seen = 0

    @property
    def rows(self) -> int:
        return len(self.parent)

    # -- bodies ---------------------------------------------------------------------------
    def _chunk(self, body: pa.RecordBatch) -> _Chunk:
        first, count = self.episodes_seen, body.num_rows
        if first + count > len(self.counts):
            raise ValueError(f"{first + count} body rows for {len(self.counts)} heads")
        facts = _facts(body.column(FACTS_COLUMN))
        expected = self.counts[first : first + count]
        if not np.array_equal(facts["clip_count"].astype(np.int64), expected):
            raise ValueError("the bodies' clip counts disagree with the heads' (rows out of step)")
        clips = _Clips.of(pa.chunked_array([body.column(PACKED_COLUMN)]))
        if clips.total != int(expected.sum()):
            raise ValueError(f"{clips.total} packed clips, clip_count says {int(expected.sum())}")
        shard_lists = body.column("shard_keys")
        offsets = shard_lists.offsets.to_numpy()
        list_starts = offsets[:-1].astype(np.int64) - int(offsets[0])
        episodes = np.arange(first, first + count, dtype=np.int64)
        lengths = np.diff(offsets).astype(np.int64)
        shard_codes = self.shards.encode(
            shard_lists.flatten().cast(pa.string()), np.repeat(episodes, lengths)
        )
        numbers = {
            name: facts[name].astype(facts[name].dtype.newbyteorder("=")) for name in EPISODE_TYPES
        }
        self.episodes_seen += count
        return _Chunk(
            first,
            count,
            int(self.episode_rows[first]),
            clips,
            list_starts,
            shard_codes,
            numbers,
        )

    def _place(self, chunk: _Chunk, lo: int, hi: int, buf: dict[str, NDArray[Any]]) -> None:
        """The chunk's clip rows lo..hi (chunk-relative) into `buf` from its start."""
        n = hi - lo
        parent = self.parent[chunk.row + lo : chunk.row + hi] - chunk.first
        chunk.clips.take(lo, hi, buf)
        np.take(chunk.list_starts, parent, out=buf["flat"][:n], mode="clip")
        buf["flat"][:n] += buf["shard_no"][:n]
        np.take(chunk.shard_codes, buf["flat"][:n], out=buf["shard_key"][:n], mode="clip")
        for name, values in chunk.numbers.items():
            np.take(values, parent, out=buf[name][:n], mode="clip")

    def buffers(self) -> dict[str, NDArray[Any]]:
        """Room for one batch; every batch is built in it (valid until the next)."""
        size = self.size
        out = {
            name: np.empty(size, dtype=RECORD[name].newbyteorder("="))
            for name in RECORD.names or ()
        }
        out["flat"] = np.empty(size, dtype=np.int64)
        out["shard_key"] = np.empty(size, dtype=np.int32)
        for name in EPISODE_TYPES:
            out[name] = np.empty(size, dtype=FACTS[name].newbyteorder("="))
        return out

    def batches(
        self, bodies: Iterable[pa.RecordBatch], reuse: bool = True
    ) -> Iterator[pa.RecordBatch]:
        """The clip rows in batches of `size` (the last one shorter), built as the bodies come.
        With `reuse` (a writer, done with each batch before the next) every batch is built in
        the same buffers; without it, each in its own."""
        buf = self.buffers()
        start, fill = 0, 0  # the batch's first clip row; rows of it placed so far
        for body in bodies:
            if body.num_rows == 0:
                continue
            chunk = self._chunk(body)
            total = int(self.episode_rows[chunk.first + chunk.count]) - chunk.row
            done = 0
            while done < total:
                take = min(total - done, self.size - fill)
                room = {name: values[fill:] for name, values in buf.items()}
                self._place(chunk, done, done + take, room)
                done += take
                fill += take
                if fill == self.size:
                    yield self._batch(start, fill, buf)
                    start, fill = start + fill, 0
                    if not reuse:
                        buf = self.buffers()
        if self.episodes_seen != len(self.counts):
            raise ValueError(f"{self.episodes_seen} body rows for {len(self.counts)} heads")
        if fill or self.rows == 0:
            yield self._batch(start, fill, buf)

    def _batch(self, start: int, size: int, buf: dict[str, NDArray[Any]]) -> pa.RecordBatch:
        parent = self.parent[start : start + size]
        seen = self.shards.upto(int(parent[-1]) if size else -1)
        b = {name: values[:size] for name, values in buf.items()}
        self.clip_index[start : start + size] = b["clip_index"]
        out: dict[str, pa.Array] = {
            "shard_key": pa.DictionaryArray.from_arrays(
                pa.array(
                    b["shard_key"].astype(self.shard_type.to_pandas_dtype(), copy=False),
                    type=self.shard_type,
                ),
                self.shards.dictionary(seen),
            ),
            "byte_offset": pa.array(b["byte_offset"], type=pa.int64()),
            "json_offset": pa.array(b["json_offset"], type=pa.int64()),
            "length": pa.array(b["length"], type=pa.int32()),
            "json_length": pa.array(b["json_length"], type=pa.int32()),
            "clip_index": pa.array(b["clip_index"], type=pa.int32()),
            "frame_count": pa.array(b["frame_count"], type=pa.int32()),
            "clip_start_s": pa.array(b["clip_start_s"], type=pa.float64()),
            "clip_duration_s": pa.array(b["clip_duration_s"], type=pa.float64()),
        }
        no_imu = b["imu_offset"] == NO_RANGE
        out["imu_offset"] = pa.array(b["imu_offset"], type=pa.int64(), mask=no_imu)
        out["imu_length"] = pa.array(b["imu_length"], type=pa.int32(), mask=no_imu)
        for name, values in self.unique.items():
            out[name] = _dictionary(parent, values)
        for name, (dictionary, codes) in self.shared.items():
            out[name] = _dictionary(np.take(codes, parent, mode="clip"), dictionary)
        for name in QUALITY_FIELDS:
            values = b[name]
            out[name] = pa.array(values, type=pa.float32(), mask=np.isnan(values))
        out["duplicate_of"] = _nullable_dictionary(self.duplicate, self.duplicate_null, parent)
        for name, (encoded, nulls) in self.layers.items():
            out[name] = _nullable_dictionary(encoded, nulls, parent)
        for name, arrow_type in EPISODE_TYPES.items():
            out[name] = pa.Array.from_buffers(arrow_type, size, [None, pa.py_buffer(b[name])])
        return pa.record_batch([out[n] for n in self.columns], names=list(self.columns))


def _facts(column: pa.Array) -> NDArray[Any]:
    """A binary column of packed facts -> its records (zero-copy)."""
    _, offset_buffer, data_buffer = column.buffers()
    offset_type = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    offsets = np.frombuffer(offset_buffer, dtype=offset_type)
    first, last = int(offsets[column.offset]), int(offsets[column.offset + len(column)])
    if last - first != FACTS.itemsize * len(column):
        raise ValueError(f"packed facts of {last - first} bytes for {len(column)} episodes")
    return fact_records(memoryview(data_buffer)[first:last]) if len(column) else np.zeros(0, FACTS)


def _split_packed(text: str) -> list[str]:
    """One packed heads value (PACKED_HEADS joined by HEADS_SEPARATOR) -> its values."""
    values = text.split(HEADS_SEPARATOR, len(PACKED_HEADS) - 1)
    if len(values) != len(PACKED_HEADS):
        raise ValueError(f"packed heads {text!r}: {len(values)} values, not {len(PACKED_HEADS)}")
    return values


def unpack_heads(fetched: pa.Table, pipeline_version: str) -> pa.Table:
    """The heads as fetched (the shared strings packed into one column, `pipeline_version` left
    out: services/manifest/query.py PACKED_HEADS) -> the heads as HEAD_COLUMNS names them, each
    shared string a dictionary array whose values are in order of first appearance, as
    dictionary-encoding the column itself gives (so the file's bytes do not change). The split
    runs once per distinct combination, not per row."""
    n = fetched.num_rows
    packed = pc.dictionary_encode(fetched.column(PACKED_HEADS_COLUMN).combine_chunks())
    # combinations in order of first appearance: so is each value's first combination
    split = [_split_packed(text) for text in packed.dictionary.to_pylist()]
    columns: dict[str, pa.Array] = {}
    for k, name in enumerate(PACKED_HEADS):
        values = pc.dictionary_encode(pa.array([row[k] for row in split], type=pa.string()))
        columns[name] = pa.DictionaryArray.from_arrays(
            pc.take(values.indices, packed.indices), values.dictionary
        )
    columns["pipeline_version"] = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, dtype=np.int8)), pa.array([pipeline_version] if n else [], pa.string())
    )
    names = [name for name in fetched.column_names if name != PACKED_HEADS_COLUMN]
    rest = {name: fetched.column(name) for name in names}
    ordered = [*HEAD_COLUMNS, *(name for name in names if name not in HEAD_COLUMNS)]
    return pa.table({name: rest.get(name, columns.get(name)) for name in ordered})


def heads_and_bodies(episodes: pa.Table) -> tuple[pa.Table, list[pa.RecordBatch]]:
    """A whole query result (every episode column, as `build_query` selects them) split as the
    build's two passes return it: the heads, and the bodies batch by batch (their facts packed
    from the episode's own columns when the result has none)."""
    layers = [name for name in LAYER_COLUMNS if name in episodes.column_names]
    heads = episodes.select([*HEAD_COLUMNS, *layers])
    if FACTS_COLUMN not in episodes.column_names:
        facts = np.zeros(episodes.num_rows, dtype=FACTS)
        for name in FACTS.names or ():
            column = episodes.column(name)
            if pa.types.is_timestamp(column.type):  # microseconds since the epoch
                column = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
            facts[name] = column.to_numpy()
        offsets = np.arange(episodes.num_rows + 1, dtype=np.int32) * FACTS.itemsize
        packed = pa.Array.from_buffers(
            pa.binary(), episodes.num_rows, [None, pa.py_buffer(offsets), pa.py_buffer(facts)]
        )
        episodes = episodes.append_column(FACTS_COLUMN, packed)
    bodies = episodes.select(list(BODY_COLUMNS)).to_batches()
    return heads, bodies


def explode(episodes: pa.Table, size: int = BATCH_ROWS) -> pa.Table:
    """Episode rows -> one row per clip, the manifest's columns, as one table (pure)."""
    heads, bodies = heads_and_bodies(episodes)
    exploder = Exploder(heads, size)
    batches = list(exploder.batches(bodies, reuse=False))
    return pa.Table.from_batches(batches)
