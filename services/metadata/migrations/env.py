"""Alembic environment: the warehouse models are the target; the URL comes from the caller."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from services.metadata.warehouse import metadata

config = context.config


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no sqlalchemy.url: run migrations through `egoline db upgrade`")
    engine = create_engine(url)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
