"""`manifest_episodes` is derived: every row is recomputed from the normalized tables by the
statement the metadata service runs (services/metadata/core.py). A migration that changes its
layout empties it and marks it stale; the rows are recomputed once the warehouse is at the head
revision, by the head's own statement.

Why not recompute inside each migration: the statement is the current code's, which names the
columns and tables of the head revision. Run from migration 0004 on a warehouse at 0003 it would
read columns that 0005-0012 have not added yet, and the upgrade would fail.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection

STALE = "egoline: stale, recomputed at the head revision"


def empty_and_mark_stale(conn: Connection) -> None:
    """In a migration: the derived rows go (the layout changes under them), to be recomputed at
    the head revision."""
    conn.exec_driver_sql("DELETE FROM manifest_episodes")
    conn.exec_driver_sql(f"COMMENT ON TABLE manifest_episodes IS '{STALE}'")


def is_stale(conn: Connection) -> bool:
    found = conn.exec_driver_sql(
        "SELECT obj_description('manifest_episodes'::regclass, 'pg_class')"
    ).scalar()
    return found == STALE


def recompute_if_stale(conn: Connection, progress: Callable[[int], None] | None = None) -> bool:
    """At the head revision: recompute every row if a migration marked the table stale (and
    clear the mark, in the same transaction); whether it did."""
    if not is_stale(conn):
        return False
    from services.metadata.core import refresh_all_manifest_episodes

    for done in refresh_all_manifest_episodes(conn):
        if progress is not None:
            progress(done)
    conn.exec_driver_sql("COMMENT ON TABLE manifest_episodes IS NULL")
    return True
