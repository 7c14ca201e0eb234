"""Split assignment, event -> upsert building and manifest query building, without a database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import ClauseElement

from schemas.events import TOPIC_UPLOADED, EpisodeRef, EpisodeUploaded, SourceFile
from services.manifest.query import ManifestFilter, build_query
from services.metadata.core import assign_split, statements_for


@given(st.text(min_size=1, max_size=40))
def test_split_is_a_pure_function_of_the_group_key(key: str) -> None:
    assert assign_split(key, 0.1) == assign_split(key, 0.1)
    assert assign_split(key, 0.1) in ("train", "eval")


def test_split_share_is_close_to_the_fraction() -> None:
    splits = [assign_split(f"session-{i}", 0.2) for i in range(5000)]
    assert splits.count("eval") / len(splits) == pytest.approx(0.2, abs=0.02)


def test_uploaded_event_becomes_device_episode_and_raw_object_upserts() -> None:
    event = EpisodeUploaded(
        event_id="1" * 32,
        produced_at=datetime(2026, 1, 1, tzinfo=UTC),
        episode=EpisodeRef(
            episode_id="ep1",
            device_id="dev1",
            session_id="s1",
            started_at=datetime(2026, 1, 1, tzinfo=UTC),
            video=SourceFile(key="raw/dev1/v.mp4", sha256="a" * 64, size_bytes=1),
        ),
    )
    upserts = statements_for(TOPIC_UPLOADED, event.model_dump_json().encode(), "session", 0.1)
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    sql = [str(cast(ClauseElement, s).compile(dialect=dialect)) for s in upserts.statements]
    assert sql[0].startswith("INSERT INTO pipeline_versions")
    assert sql[1].startswith("INSERT INTO devices") and "ON CONFLICT DO NOTHING" in sql[1]
    assert (
        sql[2].startswith("INSERT INTO episodes") and "ON CONFLICT (episode_id) DO UPDATE" in sql[2]
    )
    assert sql[3].startswith("INSERT INTO raw_objects")
    assert upserts.episode_ids == {"ep1"}


def test_malformed_record_raises() -> None:
    with pytest.raises(ValueError):
        statements_for(TOPIC_UPLOADED, b'{"event_id": 3}', "session", 0.1)


def test_filters_are_bound_parameters_never_sql_text() -> None:
    hostile = "dev1'; DROP TABLE clips; --"
    sql, params = build_query(ManifestFilter(devices=[hostile], splits=["train"], max_warnings=0))
    assert hostile not in sql and "DROP" not in sql
    assert [hostile] in params and ["train"] in params
    assert sql.count("$") == len(params)


def test_query_order_is_total() -> None:
    sql, _ = build_query(ManifestFilter())
    # The primary key of manifest_episodes: one row per (pipeline version, episode).
    assert sql.rstrip().endswith("ORDER BY m.pipeline_version, m.episode_id")
