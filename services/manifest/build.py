"""Build a manifest: run the one query through ADBC straight into Arrow, explode each episode
row into its clips, write an uncompressed Arrow IPC file (repeated strings dictionary-encoded),
name it by its sha256, store it, record it.

The query returns one row per episode with its clips packed (services/manifest/packing.py), so
Postgres and the wire carry each episode's strings once, not once per clip; the explode is
vectorised numpy, and the per-episode strings become the dictionaries of their columns (the
per-clip indices point at the episode row), so they are never copied per clip.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adbc_driver_postgresql.dbapi as adbc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from numpy.typing import NDArray
from sqlalchemy import Engine
from sqlalchemy.dialects.postgresql import insert

from services.common.objectstore import ObjectStore
from services.manifest.packing import FIELDS, NO_RANGE, column_name, unpack
from services.manifest.query import (
    HISTOGRAM_SQL,
    MANIFEST_FORMAT_VERSION,
    KeyRange,
    ManifestFilter,
    build_query,
    key_ranges,
    split_points,
)
from services.metadata.warehouse import manifests

# Episode-level strings that repeat across episodes: dictionary-encoded over the distinct values.
# The others (episode id, raw key and hash) are unique per episode: the episode rows themselves
# are their dictionaries.
SHARED_STRINGS = ("device_id", "session_id", "split", "verdict", "codec", "pipeline_version")
UNIQUE_STRINGS = ("episode_id", "raw_key", "raw_sha256")
EPISODE_NUMBERS = ("started_at", "warning_count", "width", "height", "fps")

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
)

Progress = Callable[[int, int], None]  # (episodes so far, clips so far)


@dataclass(frozen=True)
class BuiltManifest:
    manifest_id: str  # sha256 of the file bytes
    object_key: str
    local_path: Path
    rows: int
    size_bytes: int
    query_s: float  # query + transfer into Arrow
    explode_s: float
    write_s: float  # IPC write + hash
    publish_s: float  # upload to the object store + warehouse row


def fetch_episodes(
    database_url: str,
    flt: ManifestFilter,
    progress: Progress | None = None,
    parallel: int = 2,
) -> pa.Table:
    """The query's rows as one table: run as `parallel` primary-key slices on their own
    connections (a COPY cannot use Postgres's parallel query), concatenated in key order, so
    the rows and their order are exactly those of the single query."""
    with adbc.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(HISTOGRAM_SQL)
        found = cur.fetchone()
    ranges = key_ranges(split_points(found[0] if found else None, parallel))
    lock = threading.Lock()
    totals = [0, 0]

    def one(key_range: KeyRange) -> list[pa.RecordBatch]:
        sql, params = build_query(flt, key_range)
        batches: list[pa.RecordBatch] = []
        with adbc.connect(database_url) as conn, conn.cursor() as cur:
            cur.execute(sql, parameters=params)
            for batch in cur.fetch_record_batch():
                batches.append(batch)
                with lock:
                    totals[0] += batch.num_rows
                    totals[1] += int(pc.sum(batch.column("clip_count")).as_py() or 0)
                    if progress is not None:
                        progress(totals[0], totals[1])
        return batches

    with ThreadPoolExecutor(len(ranges)) as pool:
        parts = list(pool.map(one, ranges))
    batches = [batch for part in parts for batch in part]
    if not batches:
        sql, params = build_query(flt, ranges[0])
        with adbc.connect(database_url) as conn, conn.cursor() as cur:
            cur.execute(sql, parameters=params)
            return cur.fetch_arrow_table()
    return pa.Table.from_batches(batches)


def _smallest_index_type(size: int) -> pa.DataType:
    for arrow_type, limit in ((pa.int8(), 1 << 7), (pa.int16(), 1 << 15)):
        if size < limit:
            return arrow_type
    return pa.int32()


def _dictionary(indices: NDArray[np.integer[Any]], values: pa.Array) -> pa.DictionaryArray:
    index_type = _smallest_index_type(len(values))
    return pa.DictionaryArray.from_arrays(
        pa.array(indices.astype(index_type.to_pandas_dtype(), copy=False), type=index_type),
        values,
    )


def _shared(column: pa.ChunkedArray, parent: NDArray[np.int32]) -> pa.DictionaryArray:
    encoded = column.combine_chunks().dictionary_encode()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    return _dictionary(codes[parent], encoded.dictionary)


def _numbers(column: pa.ChunkedArray, parent: NDArray[np.int32]) -> pa.Array:
    """An episode-level number (or timestamp) repeated for each of the episode's clips."""
    array = column.combine_chunks()
    storage = pa.int64() if pa.types.is_timestamp(array.type) else array.type
    values = array.cast(storage).to_numpy(zero_copy_only=False)
    return pa.array(values[parent], type=storage).cast(array.type)


def _packed(column: pa.ChunkedArray, field: str) -> NDArray[Any]:
    """All episodes' packed values of one clip field: the binary column's data buffers are the
    values back to back, so each chunk is one zero-copy view, byte-swapped once."""
    parts: list[NDArray[Any]] = []
    for chunk in column.chunks:
        if len(chunk) == 0:
            continue
        _, offset_buffer, data_buffer = chunk.buffers()
        offset_type = np.int64 if pa.types.is_large_binary(chunk.type) else np.int32
        offsets = np.frombuffer(offset_buffer, dtype=offset_type)
        first, last = int(offsets[chunk.offset]), int(offsets[chunk.offset + len(chunk)])
        parts.append(unpack(field, memoryview(data_buffer)[first:last]))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else unpack(field, b"")


def explode(episodes: pa.Table) -> pa.Table:
    """Episode rows (the query's result) -> one row per clip, the manifest's columns (pure)."""
    counts = episodes.column("clip_count").to_numpy().astype(np.int64)
    parent = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    fields = {name: _packed(episodes.column(column_name(name)), name) for name, *_ in FIELDS}
    for name, values in fields.items():
        if len(values) != len(parent):
            raise ValueError(f"{name}: {len(values)} packed values, clip_count says {len(parent)}")
    out: dict[str, pa.Array] = {}

    # Shard keys: each episode lists its shards; a clip names one by its position in the list.
    shard_lists = episodes.column("shard_keys").combine_chunks()
    list_starts = shard_lists.offsets.to_numpy()[:-1].astype(np.int64)
    shard_values = shard_lists.flatten().dictionary_encode()
    shard_codes = shard_values.indices.to_numpy(zero_copy_only=False)
    flat_position = list_starts[parent] + fields["shard_no"].astype(np.int64)
    out["shard_key"] = _dictionary(shard_codes[flat_position], shard_values.dictionary)

    for name in ("byte_offset", "json_offset"):
        out[name] = pa.array(fields[name], type=pa.int64())
    for name in ("length", "json_length"):
        out[name] = pa.array(fields[name], type=pa.int32())
    no_imu = fields["imu_offset"] == NO_RANGE
    out["imu_offset"] = pa.array(fields["imu_offset"], type=pa.int64(), mask=no_imu)
    out["imu_length"] = pa.array(fields["imu_length"], type=pa.int32(), mask=no_imu)
    out["clip_index"] = pa.array(fields["clip_index"], type=pa.int32())
    out["frame_count"] = pa.array(fields["frame_count"], type=pa.int32())
    out["clip_start_s"] = pa.array(fields["clip_start_s"], type=pa.float64())
    out["clip_duration_s"] = pa.array(fields["clip_duration_s"], type=pa.float64())

    for name in UNIQUE_STRINGS:
        out[name] = _dictionary(parent, episodes.column(name).combine_chunks())
    for name in SHARED_STRINGS:
        out[name] = _shared(episodes.column(name), parent)
    for name in EPISODE_NUMBERS:
        out[name] = _numbers(episodes.column(name), parent)
    return pa.table([out[name] for name in MANIFEST_COLUMNS], names=list(MANIFEST_COLUMNS))


def with_metadata(table: pa.Table, flt: ManifestFilter, sql: str) -> pa.Table:
    meta = {
        b"egoline.manifest.version": str(MANIFEST_FORMAT_VERSION).encode(),
        b"egoline.manifest.filter": flt.model_dump_json().encode(),
        b"egoline.manifest.query": sql.encode(),
    }
    return table.replace_schema_metadata(meta)


def write_ipc(table: pa.Table, path: Path) -> str:
    """Write an uncompressed Arrow IPC file (memory-mappable); returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    with tmp.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
        digest = hashlib.sha256(view).hexdigest()  # one update from the page cache, no copy
    tmp.replace(path)
    return digest


def build_manifest(
    database_url: str,
    engine: Engine,
    store: ObjectStore,
    flt: ManifestFilter,
    out_dir: Path,
    progress: Progress | None = None,
    parallel: int = 2,
) -> BuiltManifest:
    sql, params = build_query(flt)
    started = time.perf_counter()
    episodes = fetch_episodes(database_url, flt, progress, parallel)
    fetched = time.perf_counter()
    table = with_metadata(explode(episodes), flt, sql)
    del episodes
    exploded = time.perf_counter()
    staging = out_dir / "manifest.arrow.partial"
    manifest_id = write_ipc(table, staging)
    final = out_dir / f"{manifest_id}.arrow"
    staging.replace(final)
    written = time.perf_counter()
    key = f"manifests/{manifest_id}.arrow"
    size = final.stat().st_size
    if not store.exists(key):
        store.put_file(key, final, content_type="application/vnd.apache.arrow.file")
    with engine.begin() as conn:
        conn.execute(
            insert(manifests)
            .values(
                manifest_id=manifest_id,
                object_key=key,
                query=sql,
                params=json.loads(json.dumps(params, default=str)),
                row_count=table.num_rows,
                size_bytes=size,
            )
            .on_conflict_do_nothing()
        )
    return BuiltManifest(
        manifest_id,
        key,
        final,
        table.num_rows,
        size,
        query_s=fetched - started,
        explode_s=exploded - fetched,
        write_s=written - exploded,
        publish_s=time.perf_counter() - written,
    )
