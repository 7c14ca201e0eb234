"""Curation in the warehouse on the real stack: crafted events with signals, IMU signatures and
clip quality, applied through the metadata service's own `apply_batch`; the manifest filters
leave out exactly the flagged episodes, duplicates (by bytes, pHash or IMU signature) name the
earliest copy, resting devices are never duplicates, and replays in any order agree."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest

from schemas.events import (
    ImuSignature,
    derive_event_id,
)
from services.common.objectstore import object_store
from services.common.settings import CurationSettings, Settings
from services.decode.core import signature_model
from services.manifest.build import build_manifest
from services.manifest.lineage import lineage
from services.manifest.load import load_manifest
from services.manifest.query import ExposureBounds, ManifestFilter
from services.metadata.warehouse import make_engine, upgrade
from services.sensors.imu import ImuSamples
from services.sensors.imu_signature import describe_imu
from services.synth.realistic import imu_samples
from tests.fixtures.crafted import GOOD, Crafted, apply_all, records_of
from tests.fixtures.stack import FreshDatabase

pytestmark = pytest.mark.connected

TABLES = (
    "episodes",
    "raw_objects",
    "clips",
    "episode_quality",
    "phash_bands",
    "near_duplicates",
    "imu_signatures",
    "imu_landmarks",
    "imu_duplicates",
    "manifest_episodes",
)


def imu(seed: int, trim_s: float = 0.0, at_rest: bool = False) -> ImuSignature:
    """The IMU signature decode computes for a 14 s recording (synth's hand-held or resting
    trace of `seed`), trimmed by `trim_s` and rebased to the cut as a trimmed copy is."""
    rows = imu_samples(200.0, -0.05, 14.05, seed, at_rest)
    rows = rows[rows[:, 0] >= trim_s - 0.05]
    rows[:, 0] -= trim_s
    samples = ImuSamples(
        np.ascontiguousarray(rows[:, 0]), np.ascontiguousarray(rows[:, 1:]), "npy_timestamped"
    )
    signature = signature_model(describe_imu(samples, 0.0, 14.0 - trim_s))
    if bool(signature.landmarks) == at_rest:
        raise AssertionError(f"seed {seed}: the trace's informativeness is not what it should")
    return signature


def flip(h: int, bits: int, rng: random.Random) -> int:
    for bit in rng.sample(range(64), bits):
        h ^= 1 << bit
    return h


def corpus() -> list[Crafted]:
    rng = random.Random(17)
    base = [rng.getrandbits(64) for _ in range(12)]
    sha = [derive_event_id("video", str(i)) * 2 for i in range(16)]
    black = [0x8000000000000000] * 8  # what a covered lens hashes to: the same every frame

    def fresh() -> list[int]:
        return [rng.getrandbits(64) for _ in range(12)]

    held, other_held = imu(101), imu(202)
    rest = GOOD.model_copy(update={"motion": 0.002})
    return [
        Crafted("cur-clean", "dev-a", 0, sha[0], base, imu=held),
        Crafted("cur-blur", "dev-a", 1, sha[1], fresh(), GOOD.model_copy(update={"sharpness": 4})),
        Crafted(
            "cur-frozen",
            "dev-a",
            2,
            sha[2],
            fresh(),
            GOOD.model_copy(update={"frozen_fraction": 0.9}),
        ),
        Crafted(
            "cur-bright", "dev-b", 3, sha[3], fresh(), GOOD.model_copy(update={"highlights": 0.6})
        ),
        Crafted("cur-noimu", "dev-b", 4, sha[4], fresh(), GOOD.model_copy(update={"motion": None})),
        # The same bytes again, under another id and device, later: an exact duplicate.
        Crafted("cur-exact", "dev-c", 5, sha[0], base, imu=held),
        # Re-encoded and trimmed: frames 3..7 of the clean one, 3 bits off each (5 of its 12:
        # under half of the longer one, all of the shorter one, which is what the rule counts).
        # Its IMU is the clean one's from 3 s on: the IMU confirms both pairs.
        Crafted(
            "cur-near", "dev-c", 6, sha[5], [flip(h, 3, rng) for h in base[3:8]], imu=imu(101, 3.0)
        ),
        # Similar but different: every hash 14 bits away (the rule matches within 7).
        Crafted(
            "cur-similar", "dev-c", 7, sha[6], [flip(h, 14, rng) for h in base], imu=other_held
        ),
        # Two covered-lens recordings: identical uniform frames, which carry no signature.
        Crafted("cur-dark1", "dev-d", 8, sha[7], black, std_luma=0.5),
        Crafted("cur-dark2", "dev-d", 9, sha[8], black, std_luma=0.5),
        # Another recording; then a copy of it whose picture no longer hashes alike (cropped,
        # re-graded: unrelated pHashes) but whose IMU is the same trace, trimmed by 2.6 s.
        Crafted("cur-imu-orig", "dev-e", 10, sha[9], fresh(), imu=imu(303)),
        Crafted("cur-imu-copy", "dev-f", 11, sha[10], fresh(), imu=imu(303, 2.6)),
        # And a copy whose frames are all uniform (a covered lens: no pHash at all).
        Crafted("cur-imu-dark", "dev-f", 12, sha[11], black, std_luma=0.5, imu=imu(303)),
        # Two recordings of one device on a table, facing a blank wall: neither the pictures
        # nor the IMU say anything, so they are not duplicates.
        Crafted("cur-rest1", "dev-g", 13, sha[12], black, rest, std_luma=0.5,
                imu=imu(404, at_rest=True)),
        Crafted("cur-rest2", "dev-g", 14, sha[13], black, rest, std_luma=0.5,
                imu=imu(405, at_rest=True)),
    ]  # fmt: skip


def dump(settings: Settings) -> dict[str, list[tuple[object, ...]]]:
    out: dict[str, list[tuple[object, ...]]] = {}
    with psycopg.connect(settings.database_libpq_url) as conn:
        for table in TABLES:
            cur = conn.execute(f"SELECT * FROM {table}")  # noqa: S608 (fixed table names)
            names = [d.name for d in cur.description or []]
            keep = [i for i, n in enumerate(names) if n != "updated_at"]
            out[table] = sorted((tuple(repr(row[i]) for i in keep) for row in cur), key=str)
    return out


def selected(settings: Settings, out: Path, flt: ManifestFilter) -> tuple[set[str], str]:
    engine = make_engine(settings)
    try:
        built = build_manifest(
            settings.database_libpq_url, engine, object_store(settings), flt, out
        )
    finally:
        engine.dispose()
    table = load_manifest(built.local_path)
    return {str(e) for e in table.column("episode_id").to_pylist()}, built.manifest_id


@pytest.fixture(scope="module")
def warehouse(stack: Settings) -> Iterator[Settings]:
    """One fresh database holding the crafted corpus, applied in order in batches of 7."""
    import uuid

    from psycopg import sql

    base, _, _ = stack.database_libpq_url.rpartition("/")
    name = f"test_curation_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    settings = stack.model_copy(update={"database_url": f"{base}/{name}"})
    upgrade(settings)
    apply_all(settings, records_of(corpus()), batch=7)
    yield settings
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


ALL = {c.episode_id for c in corpus()}


def test_quality_filters_leave_out_exactly_the_flagged_episodes(
    warehouse: Settings, tmp_path: Path
) -> None:
    def pick(**kwargs: object) -> set[str]:
        flt = ManifestFilter.model_validate(kwargs)
        return selected(warehouse, tmp_path / str(len(list(tmp_path.iterdir()))), flt)[0]

    assert pick() == ALL
    assert pick(min_sharpness=50.0) == ALL - {"cur-blur"}
    assert pick(max_frozen_fraction=0.5) == ALL - {"cur-frozen"}
    bounds = ExposureBounds.of(CurationSettings())
    assert pick(exposure_ok=bounds.model_dump()) == ALL - {"cur-bright"}
    # no IMU: no motion value; on a table: too little
    assert pick(min_motion=0.1) == ALL - {"cur-noimu", "cur-rest1", "cur-rest2"}
    # The canonical copies stay; the exact and the near duplicates (all later) go.
    dups = {"cur-exact", "cur-near", "cur-imu-copy", "cur-imu-dark"}
    assert pick(exclude_duplicates=True) == ALL - dups
    everything = pick(
        min_sharpness=50.0,
        max_frozen_fraction=0.5,
        exposure_ok=bounds.model_dump(),
        min_motion=0.1,
        exclude_duplicates=True,
    )
    assert everything == {"cur-clean", "cur-similar", "cur-dark1", "cur-dark2", "cur-imu-orig"}


def test_duplicates_name_the_earliest_copy_with_their_evidence(warehouse: Settings) -> None:
    with psycopg.connect(warehouse.database_libpq_url) as conn:
        marked = conn.execute(
            "SELECT episode_id, duplicate_of, duplicate_kind FROM manifest_episodes "
            "WHERE duplicate_of IS NOT NULL ORDER BY episode_id"
        ).fetchall()
        pairs = conn.execute(
            "SELECT episode_id, duplicate_of, shared, frames, min_distance FROM near_duplicates "
            "ORDER BY episode_id, duplicate_of"
        ).fetchall()
        dark = conn.execute(
            "SELECT informative_frames, frames FROM episode_quality WHERE episode_id = 'cur-dark1'"
        ).fetchone()
        imu_pairs = conn.execute(
            "SELECT episode_id, duplicate_of, votes, lag_s, correlation, overlap_s "
            "FROM imu_duplicates ORDER BY episode_id, duplicate_of"
        ).fetchall()
        resting = conn.execute(
            "SELECT s.episode_id, s.landmarks, count(l.hash) FROM imu_signatures s "
            "LEFT JOIN imu_landmarks l USING (episode_id, pipeline_version) "
            "WHERE s.episode_id LIKE 'cur-rest%' GROUP BY s.episode_id, s.landmarks "
            "ORDER BY s.episode_id"
        ).fetchall()
    assert marked == [
        ("cur-exact", "cur-clean", "exact"),
        ("cur-imu-copy", "cur-imu-orig", "imu"),  # only the IMU tells: the pictures differ
        ("cur-imu-dark", "cur-imu-orig", "imu"),  # uniform frames: no pHash at all
        ("cur-near", "cur-clean", "near"),  # pHash, confirmed by the IMU (below)
    ]
    # The exact copy has the same frames too; the trimmed copy matches all 5 of its frames.
    assert pairs == [
        ("cur-exact", "cur-clean", 1.0, 12, 0),
        ("cur-near", "cur-clean", 1.0, 5, 3),
        ("cur-near", "cur-exact", 1.0, 5, 3),
    ]
    assert dark == (0, 8)  # uniform frames: no signature, so no covered-lens "duplicates"
    # The IMU pairs: the trimmed copy's lag is its cut; the pHash pairs are confirmed.
    assert [(a, b, v >= 2, round(lag, 1), r >= 0.9) for a, b, v, lag, r, _ in imu_pairs] == [
        ("cur-exact", "cur-clean", True, 0.0, True),
        ("cur-imu-copy", "cur-imu-orig", True, 2.6, True),
        ("cur-imu-dark", "cur-imu-copy", True, -2.6, True),
        ("cur-imu-dark", "cur-imu-orig", True, 0.0, True),
        ("cur-near", "cur-clean", True, 3.0, True),
        ("cur-near", "cur-exact", True, 3.0, True),
    ]
    # Resting devices: a signature without landmarks, which finds nothing and is found by none.
    assert resting == [("cur-rest1", 0, 0), ("cur-rest2", 0, 0)]
    engine = make_engine(warehouse)
    try:
        (entry, *_) = lineage(engine, "cur-near", "v1", 0)
        (blurred, *_) = lineage(engine, "cur-blur", "v1", 0)
    finally:
        engine.dispose()
    assert entry["duplicate_of"] == "cur-clean" and entry["duplicate_kind"] == "near"
    assert blurred["sharpness"] == 4.0 and blurred["duplicate_of"] is None
    assert blurred["episode_min_sharpness"] == 4.0 and blurred["motion"] == 0.4


def test_replays_in_any_order_give_the_same_tables_and_manifest(
    warehouse: Settings, fresh_database: FreshDatabase, tmp_path: Path
) -> None:
    records = records_of(corpus())
    reversed_db, shuffled_db = fresh_database(), fresh_database()
    upgrade(reversed_db)
    upgrade(shuffled_db)
    # Later episodes first: each duplicate is stored before its canonical copy.
    apply_all(reversed_db, records[::-1], batch=3)
    doubled = records * 2
    random.Random(5).shuffle(doubled)
    apply_all(shuffled_db, doubled, batch=5)
    expected = dump(warehouse)
    assert dump(reversed_db) == expected
    assert dump(shuffled_db) == expected
    flt = ManifestFilter(exclude_duplicates=True, min_sharpness=1.0)
    ids = {selected(db, tmp_path / str(i), flt)[1] for i, db in enumerate((warehouse, shuffled_db))}
    assert len(ids) == 1  # byte-identical manifests


def test_manifest_rows_carry_quality_and_duplicate_of_and_inspect_shows_them(
    warehouse: Settings, tmp_path: Path
) -> None:
    import json

    from typer.testing import CliRunner

    from services.cli import app

    engine = make_engine(warehouse)
    try:
        built = build_manifest(
            warehouse.database_libpq_url,
            engine,
            object_store(warehouse),
            ManifestFilter(),
            tmp_path,
        )
    finally:
        engine.dispose()
    rows = load_manifest(built.local_path).to_pylist()
    by_episode = {r["episode_id"]: r for r in rows}
    assert by_episode["cur-near"]["duplicate_of"] == "cur-clean"
    assert by_episode["cur-clean"]["duplicate_of"] is None
    assert by_episode["cur-blur"]["sharpness"] == 4.0
    assert by_episode["cur-noimu"]["motion"] is None and by_episode["cur-clean"]["motion"] > 0
    shown = CliRunner().invoke(app, ["manifest", "inspect", str(built.local_path)])
    assert shown.exit_code == 0, shown.output
    summary = json.loads(shown.stdout.strip().splitlines()[-1])
    assert summary["format_version"] == 6
    assert summary["duplicate_rows"] == 12
    assert summary["duplicates_of"] == ["cur-clean", "cur-imu-orig"]
    assert summary["quality"]["motion"]["nulls"] == 3
    assert summary["quality"]["sharpness"]["min"] == 4.0
