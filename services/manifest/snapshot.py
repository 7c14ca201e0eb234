"""Fetch a manifest query's episode rows from the warehouse: ADBC straight into Arrow, as
parallel primary-key slices in one exported snapshot.

The query returns one row per episode with its clips packed (services/metadata/packing.py), so
Postgres and the wire carry each episode's strings once, not once per clip. Each slice streams
by COPY (bound values rendered as literals: see `render`). Measurements: docs/performance.md.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import adbc_driver_postgresql.dbapi as adbc
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql as psql

from services.manifest.query import (
    HISTOGRAM_SQL,
    ManifestFilter,
    build_query,
    key_ranges,
    split_points,
)

Progress = Callable[[int, int], None]  # (episodes so far, clips so far)


def render(sql: str, params: list[object], conn: psycopg.Connection[Any]) -> str:
    """The statement with each bound parameter ($n) replaced by its literal, quoted by psycopg
    for this connection. ADBC's PostgreSQL driver streams a result through COPY (batch by batch)
    only for a statement without bind parameters; with them it materialises the whole result in
    libpq first (measured: 2.6 GiB touched for a 1 GiB result, returned as a single batch)."""
    # Parenthesised: `$1::int4` with -2147483648 must not become -(2147483648::int4).
    return re.sub(
        r"\$(\d+)",
        lambda m: f"({psql.Literal(params[int(m.group(1)) - 1]).as_string(conn)})",
        sql,
    )


def fetch_episodes(
    database_url: str,
    flt: ManifestFilter,
    progress: Progress | None = None,
    parallel: int = 2,
) -> pa.Table:
    """The query's rows as one table: run as `parallel` primary-key slices on their own
    connections (a COPY cannot use Postgres's parallel query), all in one exported snapshot and
    concatenated in key order, so the rows and their order are exactly those of the single
    query at one moment, even while the metadata service writes."""
    with psycopg.connect(database_url, autocommit=True) as coordinator:
        coordinator.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        found = coordinator.execute(HISTOGRAM_SQL).fetchone()
        snapshot = coordinator.execute("SELECT pg_export_snapshot()").fetchone()
        assert snapshot is not None
        ranges = key_ranges(split_points(found[0] if found else None, parallel))
        statements = [render(*build_query(flt, key_range), coordinator) for key_range in ranges]
        lock = threading.Lock()
        totals = [0, 0]

        def one(statement: str) -> tuple[pa.Schema, list[pa.RecordBatch]]:
            batches: list[pa.RecordBatch] = []
            with adbc.connect(database_url, autocommit=True) as conn, conn.cursor() as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cur.execute(f"SET TRANSACTION SNAPSHOT '{snapshot[0]}'")
                cur.execute(statement)
                reader = cur.fetch_record_batch()
                for batch in reader:
                    batches.append(batch)
                    with lock:
                        totals[0] += batch.num_rows
                        totals[1] += int(pc.sum(batch.column("clip_count")).as_py() or 0)
                        if progress is not None:
                            progress(totals[0], totals[1])
                cur.execute("COMMIT")
            return reader.schema, batches

        with ThreadPoolExecutor(len(ranges)) as pool:
            parts = list(pool.map(one, statements))
        coordinator.execute("COMMIT")
    return pa.Table.from_batches([b for _, part in parts for b in part], schema=parts[0][0])
