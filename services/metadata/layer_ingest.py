"""Layers, the I/O edge: read a layer file (JSON Lines or Parquet), store a version in one
transaction by COPY, and list the stored versions. Checking and canonical rows are the pure
services/metadata/layers.py; the topic path is the metadata service (services/metadata/app.py).

Nothing here reads the object store: releasing a layer for any number of episodes reads no
video (`egoline bench layers` measures it on the object store's side).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow.parquet as pq

from schemas.layers import LayerKind, Row
from services.metadata.layers import (
    LAYER_COLUMNS,
    LAYER_TABLES,
    LayerConflictError,
    LayerContent,
    LayerRecordError,
    Record,
    check_json_lines,
    check_rows,
    layer_content,
)


def read_layer_file(kind: LayerKind, path: Path) -> LayerContent:
    """A layer file's checked, canonical content. Raises LayerRecordError."""
    return layer_content(kind, read_layer_rows(kind, path))


def read_layer_rows(kind: LayerKind, path: Path) -> list[Row]:
    """A layer file's rows, checked. `.parquet` is Parquet (problems named by row number from
    1), anything else JSON Lines (by line number). Raises LayerRecordError."""
    name = str(path)
    records: list[Record]
    if path.suffix.lower() in (".parquet", ".pq"):
        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
            raise LayerRecordError(name, [(1, f"not a Parquet file: {exc}")]) from exc
        records = list(enumerate(table.to_pylist(), start=1))
        return [row for _, row in check_rows(kind, records, name)]
    return [row for _, row in check_json_lines(kind, path.read_bytes(), name)]


@dataclass(frozen=True)
class StoredLayer:
    kind: LayerKind
    version: str
    digest: str
    rows: int
    created: bool  # False: the version was there with this content (a no-op)
    unknown_episodes: int  # episode ids of the version the warehouse has not seen (yet)
    store_s: float


def store_layer(
    database_url: str,
    kind: LayerKind,
    version: str,
    content: LayerContent,
    author: str,
    source: str,
) -> StoredLayer:
    """Store a version in one transaction: its `layer_versions` row, then its rows by COPY.
    The version there with the same digest: nothing written; with another: LayerConflictError
    and nothing written."""
    started = time.perf_counter()
    columns = [name for name, _ in LAYER_COLUMNS[kind]]
    with psycopg.connect(database_url) as conn:
        inserted = conn.execute(
            "INSERT INTO layer_versions (kind, version, digest, row_count, author, source) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (kind, version) DO NOTHING RETURNING seq",
            (kind.value, version, content.digest, len(content.rows), author, source),
        ).fetchone()
        if inserted is None:
            found = conn.execute(
                "SELECT digest FROM layer_versions WHERE kind = %s AND version = %s",
                (kind.value, version),
            ).fetchone()
            if found is None or found[0] != content.digest:
                raise LayerConflictError(
                    f"{kind.value} {version} exists with other content (digest "
                    f"{found[0] if found else '?'}, this file {content.digest}): layer versions "
                    "are immutable, ingest it as a new version"
                )
        else:
            copy_sql = f"COPY {LAYER_TABLES[kind]} (version, {', '.join(columns)}) FROM STDIN"
            with conn.cursor() as cur, cur.copy(copy_sql.encode()) as copy:
                for row in content.rows:
                    copy.write_row((version, *row))
        # An anti-join on the server (sending 10^5 ids as an array parameter cost ~0.5 s).
        unknown = conn.execute(
            f"SELECT count(DISTINCT x.episode_id) FROM {LAYER_TABLES[kind]} x "  # noqa: S608 (a fixed table name)
            "WHERE x.version = %s AND x.episode_id IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM episodes e WHERE e.episode_id = x.episode_id)",
            (version,),
        ).fetchone()
    return StoredLayer(
        kind,
        version,
        content.digest,
        len(content.rows),
        created=inserted is not None,
        unknown_episodes=int(unknown[0]) if unknown else 0,
        store_s=time.perf_counter() - started,
    )


def ingest_layer_file(
    database_url: str, kind: LayerKind, path: Path, version: str, author: str, source: str
) -> StoredLayer:
    """`egoline layer ingest`: read and check the file, then store the version (all or
    nothing)."""
    return store_layer(database_url, kind, version, read_layer_file(kind, path), author, source)


@dataclass(frozen=True)
class LayerVersion:
    kind: str
    version: str
    seq: int
    digest: str
    rows: int
    author: str
    source: str
    created_at: str


def list_versions(database_url: str, kind: str | None = None) -> list[LayerVersion]:
    """Every stored version (of one kind), in ingest order."""
    with psycopg.connect(database_url) as conn:
        found = conn.execute(
            "SELECT kind, version, seq, digest, row_count, author, source, created_at "
            "FROM layer_versions WHERE %(kind)s::text IS NULL OR kind = %(kind)s ORDER BY seq",
            {"kind": kind},
        ).fetchall()
    return [
        LayerVersion(k, v, int(s), d, int(n), a, src, c.isoformat())
        for k, v, s, d, n, a, src, c in found
    ]
