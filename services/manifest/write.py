"""Write a manifest file: an uncompressed Arrow IPC file (memory-mappable) with the manifest's
format version, filter and query in its schema metadata, hashed on the way out through an
O_DIRECT sink (services/manifest/sink.py)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from services.manifest.explode import BATCH_ROWS
from services.manifest.query import MANIFEST_FORMAT_VERSION, ManifestFilter
from services.manifest.sink import HashingDirectSink


def schema_metadata(flt: ManifestFilter, sql: str) -> dict[bytes, bytes]:
    """The file's schema metadata: format version, the filter (JSON), the query it ran and
    the layer versions it pinned (JSON, kind -> version; `{}` for none)."""
    return {
        b"egoline.manifest.version": str(MANIFEST_FORMAT_VERSION).encode(),
        b"egoline.manifest.filter": flt.model_dump_json().encode(),
        b"egoline.manifest.query": sql.encode(),
        b"egoline.manifest.layers": json.dumps(flt.layers, sort_keys=True).encode(),
    }


def with_metadata(table: pa.Table, flt: ManifestFilter, sql: str) -> pa.Table:
    return table.replace_schema_metadata(schema_metadata(flt, sql))


def write_batches(
    batches: Iterable[pa.RecordBatch], path: Path, metadata: dict[bytes, bytes] | None = None
) -> str:
    """Write an uncompressed Arrow IPC file (memory-mappable) from record batches (at least
    one: the first gives the schema, with `metadata`), hashing the bytes on the way out;
    returns its sha256. A dictionary that grows from batch to batch is written as delta
    dictionary batches (the earlier values never change)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    options = ipc.IpcWriteOptions(emit_dictionary_deltas=True)
    with HashingDirectSink(tmp) as sink, pa.PythonFile(sink, mode="w") as stream:
        writer: ipc.RecordBatchFileWriter | None = None
        try:
            for batch in batches:
                if writer is None:
                    schema = batch.schema.with_metadata(metadata) if metadata else batch.schema
                    writer = ipc.new_file(stream, schema, options=options)
                writer.write_batch(batch)
            if writer is None:
                raise ValueError("no batches: a manifest file needs its schema")
        finally:
            if writer is not None:
                writer.close()
    tmp.replace(path)
    return sink.sha256()


def write_ipc(table: pa.Table, path: Path) -> str:
    """Write a table as an uncompressed Arrow IPC file in batches of BATCH_ROWS; its sha256."""
    batches = table.to_batches(max_chunksize=BATCH_ROWS) or [
        pa.RecordBatch.from_pylist([], schema=table.schema)
    ]
    return write_batches(batches, path, table.schema.metadata)
