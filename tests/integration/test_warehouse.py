"""The warehouse schema comes from Alembic migrations, and they match the models exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from psycopg.rows import dict_row
from sqlalchemy import create_engine

from schemas.events import derive_event_id
from services.common.settings import Settings
from services.manifest.explode import QUALITY_FIELDS
from services.metadata.core import refresh_all_manifest_episodes
from services.metadata.packing import FACT_FIELDS, FACTS, RECORD, fact_records, records
from services.metadata.warehouse import (
    EPISODE_QUALITY_COLUMNS,
    TIMING_COLUMNS,
    alembic_config,
    make_engine,
    metadata,
    upgrade,
)
from tests.fixtures.crafted import Crafted, apply_all, records_of
from tests.fixtures.stack import FreshDatabase

pytestmark = pytest.mark.connected
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def test_migrations_build_exactly_the_modelled_schema(fresh_database: FreshDatabase) -> None:
    empty_database = fresh_database()
    upgrade(empty_database)
    upgrade(empty_database)  # idempotent
    engine = create_engine(empty_database.database_sqlalchemy_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
        version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    engine.dispose()
    assert diff == [], f"models and migrations differ: {diff}"
    assert version == "0012"


# The columns each packed fact repeats (`started_at` is compared as microseconds since the epoch).
FACT_COLUMNS = ", ".join(name for name, *_ in FACT_FIELDS)


def facts_disagreeing_with_columns(settings: Settings) -> list[str]:
    """Every manifest row whose decoded `facts` record differs from its own columns."""
    wrong = []
    with psycopg.connect(settings.database_libpq_url) as conn:
        rows = conn.execute(
            f"SELECT episode_id, facts, {FACT_COLUMNS} FROM manifest_episodes"  # noqa: S608 (fixed)
        ).fetchall()
    assert rows, "no manifest rows to check"
    for episode_id, facts, started_at, *rest in rows:
        (record,) = fact_records(facts)
        expected = [(started_at - EPOCH) // timedelta(microseconds=1), *rest]
        unpacked = [record[name].item() for name in FACTS.names or ()]
        if unpacked != expected:
            wrong.append(f"{episode_id}: facts {unpacked} != columns {expected}")
    return wrong


def test_every_manifest_row_packs_its_own_facts_after_a_refresh_and_after_migration_0012(
    fresh_database: FreshDatabase,
) -> None:
    # Given episodes applied by the metadata service, then every fact made distinct per episode
    # and per field (odd microseconds, warnings, frame sizes, rates, streams, timing figures)
    # and the manifest rows recomputed with the service's refresh statement
    settings = fresh_database()
    upgrade(settings)
    sha = [derive_event_id("video", f"facts-{n}") * 2 for n in range(4)]
    crafted = [Crafted(f"facts-{n}", f"dev-{n}", n, sha[n], [n + 1], clips=n + 1) for n in range(4)]
    apply_all(settings, records_of(crafted), batch=3)
    timing = ", ".join(
        f"{name} = {k + 1}.25 * (n + 1) * (-1) ^ {k}" for k, name in enumerate(TIMING_COLUMNS)
    )
    distinct_decode_meta = (  # fixed column names
        "WITH x AS (SELECT episode_id, "  # noqa: S608
        "  row_number() OVER (ORDER BY episode_id)::int AS n FROM decode_meta) "
        "UPDATE decode_meta d SET width = 640 + n, height = 480 - n, "
        f"fps = 29.97 * n, stream_count = 1 + n, {timing} "
        "FROM x WHERE x.episode_id = d.episode_id"
    )
    engine = make_engine(settings)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(distinct_decode_meta)
            conn.exec_driver_sql(
                "UPDATE episodes SET started_at = started_at "
                "+ interval '1.000001 s' * (ascii(right(episode_id, 1)) - 47) * 123457"
            )
            conn.exec_driver_sql(
                "UPDATE verdicts SET warnings = (SELECT coalesce(jsonb_agg(jsonb_build_object("
                "'code', 'x', 'message', 'y')), '[]') FROM generate_series(1, "
                "ascii(right(episode_id, 1)) - 47))"
            )
            assert list(refresh_all_manifest_episodes(conn)) == [4]
    finally:
        engine.dispose()
    # Then each row's facts record holds exactly that row's columns
    assert facts_disagreeing_with_columns(settings) == []
    # And so after the migration that adds the column fills it from the existing rows
    command.downgrade(alembic_config(settings), "0011")
    upgrade(settings)
    assert facts_disagreeing_with_columns(settings) == []


def manifest_rows(settings: Settings) -> list[dict[str, object]]:
    """Every manifest row (column -> value), in key order (what the build reads)."""
    with psycopg.connect(settings.database_libpq_url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT * FROM manifest_episodes ORDER BY pipeline_version, episode_id"
        ).fetchall()


# What revision 0006 added (content signals, near duplicates): a warehouse taken back to 0003
# loses it.
SINCE_0006 = (*EPISODE_QUALITY_COLUMNS, "duplicate_of", "duplicate_kind")


def without_content_signals(row: dict[str, object]) -> dict[str, object]:
    """A manifest row less what comes from the content signals and near duplicates, its packed
    clips decoded to their other fields."""
    kept = {k: v for k, v in row.items() if k not in SINCE_0006}
    packed = row["clips"]
    assert isinstance(packed, bytes)
    clips = records(packed)
    kept["clips"] = [
        tuple(r[name].item() for name in RECORD.names or () if name not in QUALITY_FIELDS)
        for r in clips
    ]
    return kept


def test_a_populated_warehouse_upgrades_from_revision_0003_to_the_head_manifest_rows(
    fresh_database: FreshDatabase,
) -> None:
    # Given a warehouse with episodes the metadata service applied, taken back to revision 0003
    # (its data in the normalized tables; the derived rows gone with the columns they had)
    settings = fresh_database()
    upgrade(settings)
    sha = [derive_event_id("video", f"old-{n}") * 2 for n in range(3)]
    crafted = [Crafted(f"old-{n}", f"dev-{n}", n, sha[n], [n + 1], clips=n + 2) for n in range(3)]
    apply_all(settings, records_of(crafted), batch=2)
    before = manifest_rows(settings)
    assert len(before) == 3
    command.downgrade(alembic_config(settings), "0003")
    # When it is upgraded to the head revision (0004-0006 and 0012 each change the derived
    # table's layout; the head's statement cannot run at 0004)
    done: list[int] = []
    upgrade(settings, progress=done.append)
    # Then every manifest row is back, computed once, at the head: what the head's statement
    # computes from the data, and the same as before but for what 0003 cannot hold
    after = manifest_rows(settings)
    assert done == [3]
    engine = make_engine(settings)
    try:
        with engine.begin() as conn:
            assert list(refresh_all_manifest_episodes(conn)) == [3]
    finally:
        engine.dispose()
    assert manifest_rows(settings) == after
    assert [without_content_signals(r) for r in after] == [
        without_content_signals(r) for r in before
    ]
    # And a second upgrade recomputes nothing
    done.clear()
    upgrade(settings, progress=done.append)
    assert done == []
