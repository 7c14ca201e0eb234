"""The warehouse and manifests on the real stack: replay, byte-identical builds, filters,
split stability and lineage back to the raw object."""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import adbc_driver_postgresql.dbapi as adbc
import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from typer.testing import CliRunner

from schemas.events import (
    ALL_TOPICS,
    TOPIC_ANNOTATED,
    TOPIC_UPLOADED,
    EpisodeRef,
    EpisodeUploaded,
    SourceFile,
)
from services.cli import app
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.manifest.build import BuiltManifest, build_manifest
from services.manifest.load import load_manifest, manifest_rows
from services.manifest.query import ManifestFilter, build_query
from services.manifest.snapshot import render
from services.metadata.app import apply_batch
from services.metadata.warehouse import make_engine, upgrade
from services.stack.fleet import Fleet
from services.synth.writer import Defect
from tests.fixtures.kafka_read import read_topic
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import FreshDatabase, device_agent, episode_states

pytestmark = pytest.mark.connected

# Columns the database fills with now() (and `layer_versions.seq`, the arrival order of layer
# versions: versions of one kind have different keys, so Kafka orders them only per version):
# the only ones allowed to differ between replays.
CLOCK_COLUMNS = {"first_seen", "last_seen", "updated_at", "processed_at", "created_at", "seq"}
TABLES = (
    "devices",
    "episodes",
    "raw_objects",
    "decode_meta",
    "verdicts",
    "shards",
    "clips",
    "dead_letters",
    "processed_events",
    "pipeline_versions",
    "manifest_episodes",
    "episode_quality",
    "phash_bands",
    "near_duplicates",
    "layer_versions",
    "layer_calibration",
    "layer_labels",
)


@dataclass(frozen=True)
class Ingested:
    good: list[str]
    bad: str
    h265: str


@pytest.fixture(scope="module")
def ingested(
    stack: Settings,
    fleet: Fleet,
    episode_factory: EpisodeFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Ingested:
    """Two good episodes (H.265, H.264) and one that is not a video, through every stage."""
    seed = int(time.time()) % 10_000 + 20_000
    dirs = episode_factory(
        3, seed=seed, duration_s=(4.5, 6.0), codecs=("h264", "h265"), defects=(Defect.NOT_VIDEO,)
    )
    agent = device_agent(stack, tmp_path_factory.mktemp("agent"))
    assert agent.run_once(dirs, 60).get("published") == 3
    ids = [d.name for d in dirs]
    expected = {ids[0]: "dead_lettered", **{i: "sharded" for i in ids[1:]}}
    wait_for(lambda: episode_states(stack, ids) == expected, 180, "episodes cataloged")
    metas = {d.name: json.loads((d / "episode.json").read_text()) for d in dirs}
    h265 = next(i for i in ids[1:] if "codec=h265" in metas[i]["tags"])
    return Ingested(good=ids[1:], bad=ids[0], h265=h265)


def every_record(settings: Settings) -> list[tuple[str, bytes]]:
    return [(topic, m.value() or b"") for topic in ALL_TOPICS for m in read_topic(settings, topic)]


def shuffled_keeping_layer_order(
    records: list[tuple[str, bytes]], seed: int
) -> list[tuple[str, bytes]]:
    """The records in a random order, except `episodes.annotated`'s, which keep theirs: a layer
    version is first-write-wins (the same version again with other rows is dead-lettered), and
    Kafka delivers one version's events in order (one key, one partition)."""
    rng = random.Random(seed)
    layers = [r for r in records if r[0] == TOPIC_ANNOTATED]
    others = [r for r in records if r[0] != TOPIC_ANNOTATED]
    rng.shuffle(others)
    slots = set(rng.sample(range(len(records)), len(layers)))
    in_order, shuffled = iter(layers), iter(others)
    return [next(in_order) if i in slots else next(shuffled) for i in range(len(records))]


def apply_all(settings: Settings, records: list[tuple[str, bytes]], batch: int = 16) -> None:
    engine = make_engine(settings)
    try:
        for start in range(0, len(records), batch):
            apply_batch(engine, records[start : start + batch], settings)
    finally:
        engine.dispose()


def dump(settings: Settings, episode_ids: list[str] | None = None) -> dict[str, list[Any]]:
    """Every table's rows, sorted, without the clock columns (optionally: these episodes')."""
    out: dict[str, list[Any]] = {}
    with psycopg.connect(settings.database_libpq_url) as conn:
        for table in TABLES:
            cur = conn.execute(f"SELECT * FROM {table}")  # noqa: S608 (fixed table names)
            names = [d.name for d in cur.description or []]
            rows = [
                {k: v for k, v in zip(names, row, strict=True) if k not in CLOCK_COLUMNS}
                for row in cur.fetchall()
            ]
            if episode_ids is not None:
                rows = [r for r in rows if r.get("episode_id", "") in episode_ids]
            out[table] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    return out


def build(settings: Settings, out: Path, flt: ManifestFilter | None = None) -> BuiltManifest:
    engine, store = make_engine(settings), object_store(settings)
    try:
        return build_manifest(
            settings.database_libpq_url, engine, store, flt or ManifestFilter(), out
        )
    finally:
        engine.dispose()


def test_replaying_every_event_in_any_order_rebuilds_the_same_warehouse_and_manifest(
    stack: Settings, ingested: Ingested, fresh_database: FreshDatabase, tmp_path: Path
) -> None:
    records = every_record(stack)
    assert {t for t, _ in records} >= {TOPIC_UPLOADED}
    in_order, shuffled = fresh_database(), fresh_database()
    upgrade(in_order)
    upgrade(shuffled)
    apply_all(in_order, records)
    # Out of order, every record twice, in batches of another size: the same warehouse.
    apply_all(shuffled, shuffled_keeping_layer_order(records * 2, seed=7), batch=5)
    assert dump(shuffled) == dump(in_order)

    # The live warehouse (fed once, through Kafka) holds the same rows for these episodes.
    ours = [*ingested.good, ingested.bad]
    live, replayed = dump(stack, ours), dump(in_order, ours)
    for table in ("episodes", "raw_objects", "decode_meta", "verdicts", "clips", "dead_letters"):
        assert live[table] == replayed[table], table
    assert len(replayed["clips"]) >= len(ingested.good)

    # Same query, same data: byte-identical files, whichever database built them.
    first = build(in_order, tmp_path / "a")
    second = build(shuffled, tmp_path / "b")
    again = build(in_order, tmp_path / "c")
    assert first.manifest_id == second.manifest_id == again.manifest_id
    assert first.local_path.read_bytes() == second.local_path.read_bytes()
    assert hashlib.sha256(first.local_path.read_bytes()).hexdigest() == first.manifest_id


def test_manifest_filters_select_by_tag_device_split_and_verdict(
    stack: Settings, ingested: Ingested, tmp_path: Path
) -> None:
    def episodes(flt: ManifestFilter) -> set[str]:
        table = load_manifest(build(stack, tmp_path / str(time.monotonic_ns()), flt).local_path)
        mine = set(ingested.good)
        return {str(e) for e in table.column("episode_id").to_pylist()} & mine

    everything = episodes(ManifestFilter())
    assert everything == set(ingested.good)
    assert episodes(ManifestFilter(tags=["codec=h265"])) == {ingested.h265}
    assert episodes(ManifestFilter(tags=["synthetic", "codec=h265"])) == {ingested.h265}
    assert episodes(ManifestFilter(tags=["no-such-tag"])) == set()
    assert episodes(ManifestFilter(verdicts=["reject"])) == set()
    with psycopg.connect(stack.database_libpq_url) as conn:
        facts = conn.execute(
            "SELECT episode_id, device_id, split FROM episodes WHERE episode_id = ANY(%s)",
            (ingested.good,),
        ).fetchall()
    device_of = {e: d for e, d, _ in facts}
    one = ingested.good[0]
    assert one in episodes(ManifestFilter(devices=[device_of[one]]))
    assert episodes(ManifestFilter(devices=["no-such-device"])) == set()
    for split in ("train", "eval"):
        assert episodes(ManifestFilter(splits=[split])) == {e for e, _, s in facts if s == split}
    future = datetime.now(UTC) + timedelta(days=3650)
    assert episodes(ManifestFilter(started_from=future)) == set()
    # The COPY that runs the query carries the filter values as quoted literals: hostile ones
    # select nothing and change nothing.
    hostile = ["dev1'; DROP TABLE clips; --", "$1", "\\'", 'a"b', "{x,y}", "Ω'"]
    assert episodes(ManifestFilter(devices=hostile, tags=hostile, splits=hostile)) == set()
    assert everything == episodes(ManifestFilter())


@examples(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st.lists(
        st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")), max_size=4
    ),
    moment=st.datetimes(timezones=st.just(UTC)),
    number=st.integers(min_value=-(2**31), max_value=2**31 - 1),
)
def test_rendered_literals_are_the_values_the_server_would_bind(
    stack: Settings, texts: list[str], moment: datetime, number: int
) -> None:
    """`render` (parameters -> literals for the COPY) gives the server exactly the bound values,
    on the ADBC connection the build runs its statements on (not only on psycopg's)."""
    statement = "SELECT $1::text[], $2::timestamptz, $3::int4, $4::text"
    params: list[object] = [texts, moment, number, texts[0] if texts else ""]
    with psycopg.connect(stack.database_libpq_url) as conn:
        bound = conn.execute(re.sub(r"\$\d", "%s", statement), params).fetchone()
        literal = render(statement, params, conn)
    assert bound == (texts, moment, number, params[3])
    assert adbc_rows(stack, literal) == [bound]


def adbc_rows(settings: Settings, statement: str) -> list[tuple[Any, ...]]:
    """Run `statement` as the build's `Snapshot` does: an ADBC connection, the result streamed as
    Arrow record batches (the driver's COPY path, taken for a statement without parameters)."""
    with adbc.connect(settings.database_libpq_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(statement)
        table = cur.fetch_record_batch().read_all()
    return list(zip(*(column.to_pylist() for column in table.columns), strict=True))


def test_the_rendered_manifest_query_selects_on_adbc_what_the_bound_one_selects(
    stack: Settings, ingested: Ingested
) -> None:
    with psycopg.connect(stack.database_libpq_url) as conn:
        facts = conn.execute(
            "SELECT device_id, min(started_at) FROM episodes WHERE episode_id = ANY(%s) "
            "GROUP BY device_id ORDER BY device_id",
            (ingested.good,),
        ).fetchall()
    (device, first), *_ = facts
    hostile = ["dev1'; DROP TABLE clips; --", "$1", "\\'", 'a"b', "{x,y}", "Ω'"]
    filters = [
        ManifestFilter(),
        ManifestFilter(devices=[device, *hostile]),
        ManifestFilter(started_from=first, started_before=datetime.now(UTC)),
        ManifestFilter(
            tags=["synthetic"], verdicts=["accept", "accept_with_warnings"], max_warnings=5
        ),
        ManifestFilter(max_jitter_s=0.5, min_imu_rate_hz=1e-3, min_height=1),
        ManifestFilter(devices=hostile, tags=hostile, splits=hostile),
    ]
    with psycopg.connect(stack.database_libpq_url, cursor_factory=psycopg.RawCursor) as conn:
        for flt in filters:
            for key_range in ((None, None), (None, ingested.good[1]), (ingested.good[1], None)):
                sql, params = build_query(flt, key_range)
                cur = conn.execute(sql, params)  # server-side binds: $n as the query has them
                names = [d.name for d in cur.description or []]
                bound = [row[names.index("episode_id")] for row in cur.fetchall()]
                literal = adbc_rows(stack, render(sql, params, conn))
                assert [row[names.index("episode_id")] for row in literal] == bound, flt
                if flt == ManifestFilter() and key_range == (None, None):
                    assert set(ingested.good) <= set(bound), "the query selects the corpus"


def test_splits_are_stable_as_the_corpus_grows_and_no_session_straddles_them(
    fresh_database: FreshDatabase,
) -> None:
    settings = fresh_database().model_copy(update={"split_key": "session", "eval_fraction": 0.3})
    upgrade(settings)
    started = datetime(2026, 1, 1, tzinfo=UTC)

    def uploaded(
        i: int, session: int | None = None, later: timedelta = timedelta()
    ) -> tuple[str, bytes]:
        sha = hashlib.sha256(str(i).encode()).hexdigest()
        event = EpisodeUploaded(
            event_id=sha[:32],
            produced_at=started,
            episode=EpisodeRef(
                episode_id=f"grow{i:05d}",
                device_id=f"dev{i % 7}",
                session_id=f"session{i // 5 if session is None else session}",
                started_at=started + later + timedelta(minutes=i),
                video=SourceFile(key=f"raw/dev/{i}/{sha}.mp4", sha256=sha, size_bytes=1),
            ),
        )
        return TOPIC_UPLOADED, event.model_dump_json().encode()

    def splits() -> dict[str, tuple[str, str]]:
        with psycopg.connect(settings.database_libpq_url) as conn:
            rows = conn.execute("SELECT episode_id, session_id, split FROM episodes").fetchall()
        return {e: (s, split) for e, s, split in rows}

    apply_all(settings, [uploaded(i) for i in range(0, 300)])  # sessions 0..59
    before = splits()
    split_before = {session: split for session, split in before.values()}
    assert set(split_before.values()) == {"train", "eval"}, "the cut must have both sides"
    # when the corpus grows: new sessions, and every session of the first cut gets two more
    # episodes days later, from other devices, so both train and eval sessions grow across it
    grown = [
        uploaded(1000 + 2 * s + k, session=s, later=timedelta(days=3 + k))
        for s in range(60)
        for k in range(2)
    ]
    apply_all(settings, [uploaded(i) for i in range(300, 1000)] + grown)
    after = splits()
    assert len(after) == 1000 + len(grown)
    assert {e: after[e] for e in before} == before  # growth moved no episode
    for i in range(1000, 1000 + len(grown)):
        session, split = after[f"grow{i:05d}"]
        assert split == split_before[session], f"{session} grew into {split} across the cut"
    by_session: dict[str, set[str]] = {}
    for session, split in after.values():
        by_session.setdefault(session, set()).add(split)
    assert all(len(s) == 1 for s in by_session.values())  # no session straddles splits
    eval_share = sum(1 for s in by_session.values() if s == {"eval"}) / len(by_session)
    assert 0.15 < eval_share < 0.45  # both splits are used, near the configured 0.3


def test_lineage_leads_from_a_manifest_row_back_to_the_raw_object(
    stack: Settings, ingested: Ingested, tmp_path: Path
) -> None:
    built = build(stack, tmp_path)
    rows = manifest_rows(load_manifest(built.local_path))
    index = next(i for i, r in enumerate(rows) if r["episode_id"] == ingested.good[0])
    row = rows[index]

    result = CliRunner().invoke(app, ["lineage", str(built.local_path), "--row", str(index)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["manifest_mismatches"] == []
    (entry,) = report["lineage"]
    assert entry["clip_key"] == row["clip_key"] and entry["episode_id"] == row["episode_id"]
    assert entry["verdict"] in ("accept", "accept_with_warnings")
    assert entry["device_id"] == row["device_id"] and entry["session_id"] == row["session_id"]

    store = object_store(stack)
    raw = store.get_bytes(entry["raw_key"])
    assert hashlib.sha256(raw).hexdigest() == entry["raw_sha256"] == row["raw_sha256"]
    shard = store.get_bytes(entry["shard_key"])
    assert hashlib.sha256(shard).hexdigest() == entry["shard_sha256"]
    member = shard[entry["json_offset"] : entry["json_offset"] + entry["json_length"]]
    meta = json.loads(member)
    assert meta["raw_sha256"] == entry["raw_sha256"] and meta["clip_key"] == entry["clip_key"]

    # By episode: every clip of it, the same lineage.
    by_episode = CliRunner().invoke(app, ["lineage", "--episode", ingested.good[0]])
    assert by_episode.exit_code == 0, by_episode.output
    clips = json.loads(by_episode.stdout.strip().splitlines()[-1])["lineage"]
    assert entry in clips and len(clips) == sum(
        1 for r in rows if r["episode_id"] == ingested.good[0]
    )


def test_polars_and_duckdb_read_the_manifest_file_as_it_is(
    stack: Settings, ingested: Ingested, tmp_path: Path
) -> None:
    import duckdb
    import polars as pl

    built = build(stack, tmp_path)
    frame = pl.scan_ipc(built.local_path).collect()  # polars memory-maps IPC files itself
    manifest = load_manifest(built.local_path)
    assert frame.shape == (manifest.num_rows, manifest.num_columns)
    assert set(ingested.good) <= set(frame["episode_id"].cast(pl.String).to_list())
    relation = duckdb.sql(  # DuckDB scans the memory-mapped Arrow table in place
        "SELECT episode_id, count(*) AS clips, sum(length) AS bytes FROM manifest "
        "GROUP BY episode_id ORDER BY episode_id"
    )
    assert relation is not None
    per_episode = relation.fetchall()
    expected = frame.group_by("episode_id").agg(pl.len(), pl.col("length").sum())
    assert len(per_episode) == expected.height
    assert sum(c for _, c, _ in per_episode) == manifest.num_rows

    shown = CliRunner().invoke(app, ["manifest", "inspect", str(built.local_path), "--rows", "2"])
    assert shown.exit_code == 0, shown.output
    summary = json.loads(shown.stdout.strip().splitlines()[-1])
    assert summary["rows"] == manifest.num_rows and summary["format_version"] == 6
    assert summary["filter"]["pipeline_version"] == "v1" and summary["bytes"] > 0
