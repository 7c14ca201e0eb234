"""The warehouse schema comes from Alembic migrations, and they match the models exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from schemas.events import derive_event_id
from services.common.settings import Settings
from services.metadata.core import refresh_all_manifest_episodes
from services.metadata.packing import FACT_FIELDS, FACTS, fact_records
from services.metadata.warehouse import (
    TIMING_COLUMNS,
    alembic_config,
    make_engine,
    metadata,
    upgrade,
)
from tests.fixtures.stack import FreshDatabase
from tests.integration.test_curation_warehouse import Crafted, apply_all, records_of

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
