"""The warehouse schema comes from Alembic migrations, and they match the models exactly."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from services.metadata.warehouse import metadata, upgrade
from tests.fixtures.stack import FreshDatabase

pytestmark = pytest.mark.connected


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
