"""The corpus view's pure parts (percentiles, windows, grouping, the SQL it builds) and its edge's
promises: a panel is read at most once per ttl, and a warehouse that is missing or unreachable
is an `error` field while the lag service keeps answering."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import ClauseElement, Engine, create_engine
from sqlalchemy.dialects import postgresql

from services.common.settings import Settings
from services.common.stats import percentile, rounded_percentile
from services.lag.app import CORPUS_PANELS, LagService, corpus_routes, routes
from services.stack import corpus
from services.stack.corpus import (
    PANELS,
    CorpusReader,
    FreshRow,
    Limits,
    freshness_panel,
    grouped_rows,
    reasons_json,
)
from services.stack.launcher import free_port


def sql(query: ClauseElement) -> str:
    """The statement as Postgres gets it, with its bound values inlined."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    compiled = query.compile(dialect=dialect, compile_kwargs={"literal_binds": True})
    return " ".join(str(compiled).split())


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=200), st.sampled_from([0, 50, 99, 100]))
def test_percentile_interpolates_like_numpy(values: list[float], q: int) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-6)


def test_a_benchmark_percentile_is_the_same_method_rounded_and_needs_values() -> None:
    latencies = [float(v) for v in range(1, 201)]  # 200 lookups, as the benches time
    assert rounded_percentile(latencies, 99, 2) == round(float(np.percentile(latencies, 99)), 2)
    assert rounded_percentile(latencies, 99, 2) == 198.01  # not the nearest rank above (199)
    with pytest.raises(ValueError):
        rounded_percentile([], 50, 2)


def test_percentile_of_nothing_is_none_and_q_is_checked() -> None:
    assert percentile([], 50) is None
    assert percentile([4.0], 99) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_freshness_splits_rows_by_window_and_skips_unknown_uploads() -> None:
    rows = [
        FreshRow(age_s=60, from_started_at_s=100, from_upload_s=10),
        FreshRow(age_s=600, from_started_at_s=300, from_upload_s=None),
        FreshRow(age_s=7200, from_started_at_s=900, from_upload_s=50),  # the day only
    ]
    panel = freshness_panel(rows, truncated=False)
    hour, day = panel["windows"]["hour"], panel["windows"]["day"]
    assert (hour["window_s"], hour["episodes"], day["episodes"]) == (3600, 2, 3)
    assert hour["from_started_at"] == {"episodes": 2, "p50_s": 200.0, "p99_s": 298.0}
    assert hour["from_upload"] == {"episodes": 1, "p50_s": 10.0, "p99_s": 10.0}
    assert day["from_started_at"]["p50_s"] == 300.0
    assert day["from_upload"] == {"episodes": 2, "p50_s": 30.0, "p99_s": 49.6}
    assert panel["truncated"] is False
    empty = freshness_panel([], truncated=True)
    assert empty["windows"]["hour"]["from_upload"] == {"episodes": 0, "p50_s": None, "p99_s": None}
    assert empty["truncated"] is True


def test_grouped_rows_turn_seconds_into_hours() -> None:
    rows = [("dev1", 3, 5400.0), ("dev2", 1, 0)]
    assert grouped_rows(rows, "device") == [
        {"device": "dev1", "episodes": 3, "hours": 1.5},
        {"device": "dev2", "episodes": 1, "hours": 0.0},
    ]


def test_reasons_keep_code_and_detail_and_tolerate_junk() -> None:
    stored = [{"code": "timestamp_gap", "message": "gap of 0.4 s at 2.0 s"}, "junk"]
    assert reasons_json(stored) == [{"code": "timestamp_gap", "detail": "gap of 0.4 s at 2.0 s"}]
    assert reasons_json(None) == []


def test_grouping_sql_groups_by_the_key_under_one_pipeline_version_and_is_limited() -> None:
    day = sql(corpus.grouped_query("day", "v7", 31))
    assert "to_char(timezone('UTC', episodes.started_at), 'YYYY-MM-DD') AS key" in day
    assert "decode_meta.pipeline_version = 'v7'" in day
    assert day.endswith("ORDER BY key DESC LIMIT 31")
    device = sql(corpus.grouped_query("device", "v7", 50))
    assert "GROUP BY episodes.device_id" in device
    assert device.endswith("ORDER BY seconds DESC, episodes DESC, key LIMIT 50")
    verdict = sql(corpus.grouped_query("verdict", "v7", 16))
    assert "coalesce(verdicts.verdict, 'none') AS key" in verdict
    assert "verdicts.pipeline_version = 'v7'" in verdict


def test_every_example_list_is_limited_and_ordered_latest_first() -> None:
    rejects = sql(corpus.latest_rejects_query("v1", 10))
    assert "episodes.status = 'rejected'" in rejects and "verdicts.verdict = 'reject'" in rejects
    assert rejects.endswith("ORDER BY episodes.updated_at DESC, episodes.episode_id LIMIT 10")
    dups = sql(corpus.latest_duplicates_query("v1", 10))
    assert "manifest_episodes.duplicate_of IS NOT NULL" in dups
    assert dups.endswith("ORDER BY episodes.updated_at DESC, manifest_episodes.episode_id LIMIT 10")
    assert sql(corpus.latest_dead_letters_query(5)).endswith("LIMIT 5")


def test_freshness_sql_reads_episodes_sharded_within_the_window_latest_first() -> None:
    query = sql(corpus.freshness_query(86400, 1000))
    assert "WHERE episodes.status = 'sharded' AND episodes.updated_at >= now() - " in query
    assert "make_interval(0, 0, 0, 0, 0, 0, 86400)" in query
    assert "EXTRACT(epoch FROM episodes.updated_at - episodes.started_at)" in query
    # the upload: when the warehouse recorded the episode's `episodes.uploaded` event
    assert "processed_events.event_id = episode_refs.event_id" in query
    assert "EXTRACT(epoch FROM episodes.updated_at - processed_events.processed_at)" in query
    assert query.endswith("ORDER BY episodes.updated_at DESC LIMIT 1000")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_panel_is_read_once_per_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake(engine: Engine, pipeline_version: str, limits: Limits) -> dict[str, Any]:
        calls.append(pipeline_version)
        return {"episodes": len(calls)}

    monkeypatch.setitem(corpus.READERS, "summary", fake)
    clock = Clock()
    reader = CorpusReader(lambda: create_engine("sqlite://"), "v3", ttl_s=10, clock=clock)
    first = reader.panel("summary")
    assert first["episodes"] == 1 and first["error"] is None and first["pipeline_version"] == "v3"
    clock.now += 9
    assert reader.panel("summary")["episodes"] == 1  # cached
    clock.now += 2
    assert reader.panel("summary")["episodes"] == 2
    with pytest.raises(KeyError):
        reader.panel("nope")
    reader.close()


def test_an_unconfigured_warehouse_is_an_error_field_retried_after_the_ttl() -> None:
    made: list[int] = []

    def no_warehouse() -> Engine:
        made.append(1)
        raise RuntimeError("EGOLINE_DATABASE_URL is not set")

    clock = Clock()
    reader = CorpusReader(no_warehouse, "v1", ttl_s=10, clock=clock)
    for name in PANELS:
        assert reader.panel(name)["error"] == "RuntimeError: EGOLINE_DATABASE_URL is not set"
    assert reader.panel("summary")["error"] is not None
    assert len(made) == len(PANELS)  # each failure cached for the ttl
    clock.now += 11
    reader.panel("summary")
    assert len(made) == len(PANELS) + 1


def test_the_lag_service_answers_corpus_errors_when_the_warehouse_is_unreachable() -> None:
    port = free_port()  # nothing listens there
    settings = Settings(_env_file=None, database_url=f"postgresql://u:p@127.0.0.1:{port}/none")
    reader = corpus.corpus_reader(settings)
    served = routes(LagService(settings, {"egoline-decode": ()}), reader.panels())
    started = time.monotonic()
    for name in CORPUS_PANELS:
        code, kind, body = served[f"/corpus/{name}.json"]()
        assert (code, kind) == (200, "application/json")
        payload = json.loads(body)
        assert payload["panel"] == name and "OperationalError" in payload["error"]
    assert time.monotonic() - started < 30
    everything = json.loads(served["/corpus.json"]()[2])
    assert set(everything) == set(CORPUS_PANELS)
    assert served["/lag.json"]()[0] == 200  # the lag side is untouched
    assert served["/corpus"]()[2].startswith(b"<!doctype html>")
    reader.close()


def test_a_lag_service_without_a_corpus_reader_says_so() -> None:
    served = corpus_routes(None)
    payload = json.loads(served["/corpus/summary.json"]()[2])
    assert payload == {"panel": "summary", "error": "this lag service has no warehouse reader"}


def test_the_lag_service_serves_the_panels_the_corpus_module_computes() -> None:
    assert CORPUS_PANELS == PANELS


def test_a_lag_service_without_a_configured_warehouse_names_the_setting() -> None:
    reader = corpus.corpus_reader(Settings(_env_file=None, database_url=None))
    error = reader.panel("summary")["error"]
    assert error is not None and "EGOLINE_DATABASE_URL" in error
