"""The warehouse schema comes from Alembic migrations, and they match the models exactly."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from services.common.settings import Settings
from services.metadata.warehouse import metadata, upgrade

pytestmark = pytest.mark.connected


@pytest.fixture
def empty_database(stack: Settings) -> Iterator[Settings]:
    base, _, _ = stack.database_libpq_url.rpartition("/")
    name = f"migrate_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield stack.model_copy(update={"database_url": f"{base}/{name}"})
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_migrations_build_exactly_the_modelled_schema(empty_database: Settings) -> None:
    upgrade(empty_database)
    upgrade(empty_database)  # idempotent
    engine = create_engine(empty_database.database_sqlalchemy_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
        version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    engine.dispose()
    assert diff == [], f"models and migrations differ: {diff}"
    assert version == "0001"
