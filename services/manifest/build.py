"""Build a manifest: run the one query through ADBC straight into Arrow, write an uncompressed
Arrow IPC file (repeated strings dictionary-encoded), name it by its sha256, store it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import adbc_driver_postgresql.dbapi as adbc
import pyarrow as pa
import pyarrow.ipc as ipc
from sqlalchemy import Engine
from sqlalchemy.dialects.postgresql import insert

from services.common.objectstore import ObjectStore
from services.manifest.query import MANIFEST_FORMAT_VERSION, ManifestFilter, build_query
from services.metadata.warehouse import manifests

DICTIONARY_COLUMNS = (
    "shard_key",
    "device_id",
    "session_id",
    "split",
    "verdict",
    "codec",
    "pipeline_version",
    "raw_key",
)


@dataclass(frozen=True)
class BuiltManifest:
    manifest_id: str  # sha256 of the file bytes
    object_key: str
    local_path: Path
    rows: int
    size_bytes: int


def fetch_table(database_url: str, sql: str, params: list[object]) -> pa.Table:
    with adbc.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(sql, parameters=params)
        return cur.fetch_arrow_table()


def to_manifest_table(table: pa.Table, flt: ManifestFilter, sql: str) -> pa.Table:
    """Dictionary-encode repeated strings and attach the format, filter and query as metadata."""
    columns = []
    for name in table.column_names:
        column = table[name]
        if name in DICTIONARY_COLUMNS and pa.types.is_string(column.type):
            column = column.dictionary_encode()
        columns.append(column)
    meta = {
        b"egoline.manifest.version": str(MANIFEST_FORMAT_VERSION).encode(),
        b"egoline.manifest.filter": flt.model_dump_json().encode(),
        b"egoline.manifest.query": sql.encode(),
    }
    return pa.table(columns, names=table.column_names).replace_schema_metadata(meta)


def write_ipc(table: pa.Table, path: Path) -> str:
    """Write an uncompressed Arrow IPC file (memory-mappable); returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 20)
    digest = hashlib.sha256()
    with tmp.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    tmp.replace(path)
    return digest.hexdigest()


def build_manifest(
    database_url: str, engine: Engine, store: ObjectStore, flt: ManifestFilter, out_dir: Path
) -> BuiltManifest:
    sql, params = build_query(flt)
    table = to_manifest_table(fetch_table(database_url, sql, params), flt, sql)
    staging = out_dir / "manifest.arrow.partial"
    manifest_id = write_ipc(table, staging)
    final = out_dir / f"{manifest_id}.arrow"
    staging.replace(final)
    key = f"manifests/{manifest_id}.arrow"
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
            )
            .on_conflict_do_nothing()
        )
    return BuiltManifest(manifest_id, key, final, table.num_rows, final.stat().st_size)
