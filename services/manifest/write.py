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


def write_batches(schema: pa.Schema, batches: Iterable[pa.RecordBatch], path: Path) -> str:
    """Write an uncompressed Arrow IPC file (memory-mappable) from record batches, hashing the
    bytes on the way out; returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with (
        HashingDirectSink(tmp) as sink,
        pa.PythonFile(sink, mode="w") as stream,
        ipc.new_file(stream, schema) as writer,
    ):
        for batch in batches:
            writer.write_batch(batch)
    tmp.replace(path)
    return sink.sha256()


def write_ipc(table: pa.Table, path: Path) -> str:
    """Write a table as an uncompressed Arrow IPC file in batches of BATCH_ROWS; its sha256."""
    return write_batches(table.schema, table.to_batches(max_chunksize=BATCH_ROWS), path)
