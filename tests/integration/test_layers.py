"""Layers on the real stack: the topic path (the metadata service) and the file path store the
same rows, a malformed file changes nothing, a pinned manifest stays byte-identical when a newer
version arrives, and the label filter selects exactly the labelled episodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from services.bench.manifest import seed
from services.cli import app
from services.common.objectstore import object_store
from services.common.settings import Settings, reset_settings_cache
from services.manifest.build import BuiltManifest, build_manifest
from services.manifest.diff import diff_manifests
from services.manifest.load import load_manifest, manifest_metadata
from services.manifest.query import ManifestFilter
from services.manifest.runs import used_by
from services.metadata.warehouse import make_engine, upgrade
from services.stack.fleet import Fleet
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import FreshDatabase

pytestmark = pytest.mark.connected

IDENTITY = [1.0, 0, 0, 0, 0, 1.0, 0, 0, 0, 0, 1.0, 0, 0, 0, 0, 1.0]
EPISODES = [f"ep{i:09d}" for i in range(20)]  # what `seed` makes of 200 clip rows
LAYER_TABLES = ("layer_versions", "layer_calibration", "layer_labels")


def seeded(fresh_database: FreshDatabase) -> Settings:
    """A migrated database holding 20 episodes of 10 clips (the `bench manifest` seed), every
    episode on its own device (`dev000NN`), started 37 s apart from 2026-01-01."""
    settings = fresh_database()
    upgrade(settings)
    seed(settings, 200, log=lambda _line: None)
    return settings


def calibration(fx: float, **target: Any) -> dict[str, Any]:
    return {"camera": "main", "width": 1280, "height": 720, "fx": fx, "fy": fx, "cx": 640.0,
            "cy": 360.0, "distortion_model": "opencv", "distortion": [0.1, -0.02, 0.0, 0.0],
            "extrinsics": IDENTITY, **target}  # fmt: skip


def label(episode_id: str, text: str, start_s: float = 0.0) -> dict[str, Any]:
    return {"episode_id": episode_id, "label_type": "instruction", "start_s": start_s,
            "end_s": start_s + 4.5, "text": text}  # fmt: skip


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cli(settings: Settings, *args: str) -> tuple[int, str, dict[str, Any] | None]:
    """Run `egoline ...` against `settings`' warehouse: exit code, stderr, the JSON line."""
    env = {"EGOLINE_DATABASE_URL": settings.database_libpq_url}
    reset_settings_cache()
    try:
        result = CliRunner().invoke(app, list(args), env=env)
    finally:
        reset_settings_cache()
    lines = result.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if result.exit_code == 0 and lines else None
    return result.exit_code, result.stderr, report


def layer_rows(settings: Settings) -> dict[str, list[tuple[Any, ...]]]:
    """Every layer table's rows, without the clock (`created_at`)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with psycopg.connect(settings.database_libpq_url) as conn:
        for table in LAYER_TABLES:
            cur = conn.execute(f"SELECT * FROM {table}")  # noqa: S608 (fixed table names)
            names = [d.name for d in cur.description or []]
            keep = [i for i, n in enumerate(names) if n != "created_at"]
            out[table] = sorted(tuple(row[i] for i in keep) for row in cur.fetchall())
    return out


def build(settings: Settings, out: Path, flt: ManifestFilter) -> BuiltManifest:
    engine = make_engine(settings)
    try:
        return build_manifest(settings.database_libpq_url, engine, object_store(settings), flt, out)
    finally:
        engine.dispose()


def test_a_layer_through_the_topic_and_through_the_file_gives_the_same_rows(
    stack: Settings, fresh_database: FreshDatabase, tmp_path: Path
) -> None:
    labels = write_jsonl(
        tmp_path / "labels.jsonl",
        [label(e, f"pick up the cup {i}", 1.5 * i) for i, e in enumerate(EPISODES[:6])]
        + [label(EPISODES[0], "caption: a kitchen", 0.25)],
    )
    rows = [calibration(600.0 + i, episode_id=e) for i, e in enumerate(EPISODES[:5])]
    rows.append(calibration(555.5, device_id="dev00007", valid_from="2026-01-01T00:00:00Z"))
    calibrations = tmp_path / "calibration.parquet"
    columns = {"episode_id": None, "device_id": None, "valid_from": None}  # every row: all keys
    pq.write_table(pa.Table.from_pylist([{**columns, **r} for r in rows]), calibrations)

    through_topic = fresh_database()
    upgrade(through_topic)
    fleet = Fleet(
        tmp_path / "logs",
        env={
            "EGOLINE_DATABASE_URL": through_topic.database_libpq_url,
            "EGOLINE_START_JITTER_S": "0",
            "EGOLINE_BATCH_WAIT_S": "0.5",
        },
    )
    fleet.start("metadata")
    try:
        fleet.wait_ready()
        for kind, path in (("labels", labels), ("calibration", calibrations)):
            code, stderr, _ = cli(stack, "layer", "publish", kind, str(path), "--version", "v1",
                                  "--author", "annotator", "--source", path.name)  # fmt: skip
            assert code == 0, stderr
        wait_for(lambda: len(layer_rows(through_topic)["layer_versions"]) == 2, 90, "layers stored")
        # The same version with other content through the topic: a dead letter, no change.
        stored = layer_rows(through_topic)
        changed = write_jsonl(tmp_path / "changed.jsonl", [label(EPISODES[0], "other")])
        code, stderr, _ = cli(stack, "layer", "publish", "labels", str(changed), "--version", "v1",
                              "--author", "annotator", "--source", "labels.jsonl")  # fmt: skip
        assert code == 0, stderr

        def conflict_dead_lettered() -> bool:
            with psycopg.connect(through_topic.database_libpq_url) as conn:
                found = conn.execute(
                    "SELECT reason_code FROM dead_letters WHERE source_topic = %s",
                    ("episodes.annotated",),
                ).fetchall()
            return [r[0] for r in found] == ["layer_conflict"]

        wait_for(conflict_dead_lettered, 90, "the conflicting version dead-lettered")
        assert layer_rows(through_topic) == stored
    finally:
        fleet.stop()

    through_file = fresh_database()
    upgrade(through_file)
    for kind, path in (("labels", labels), ("calibration", calibrations)):
        code, stderr, report = cli(through_file, "layer", "ingest", kind, str(path),
                                   "--version", "v1", "--author", "annotator")  # fmt: skip
        assert code == 0, stderr
        assert report is not None and report["created"] is True
        # nothing of the warehouse's: every episode id the version names is unknown to it
        assert report["unknown_episodes"] == {"labels": 6, "calibration": 5}[kind]
    by_file, by_topic = layer_rows(through_file), layer_rows(through_topic)
    assert by_file == by_topic
    assert len(by_file["layer_labels"]) == 7 and len(by_file["layer_calibration"]) == 6


def test_a_malformed_layer_file_is_refused_with_a_line_numbered_error_and_changes_nothing(
    fresh_database: FreshDatabase, tmp_path: Path
) -> None:
    settings = seeded(fresh_database)
    good = write_jsonl(tmp_path / "v1.jsonl", [label(e, "open the drawer") for e in EPISODES])
    code, stderr, report = cli(settings, "layer", "ingest", "labels", str(good), "--version", "v1")
    assert code == 0 and report is not None and report["rows"] == 20, stderr
    before = layer_rows(settings)

    # 1,000 good rows and one bad one at the end: nothing of the file is stored.
    rows = [label(EPISODES[i % 20], f"step {i}", float(i)) for i in range(1000)]
    rows.append({**label(EPISODES[3], "bad"), "end_s": -1.0})
    bad = write_jsonl(tmp_path / "v2.jsonl", rows)
    code, stderr, _ = cli(settings, "layer", "ingest", "labels", str(bad), "--version", "v2")
    assert code == 2
    assert f"{bad}:1001: end_s: Input should be greater than or equal to 0" in stderr
    assert layer_rows(settings) == before

    # A line that is not JSON, at its line.
    broken = tmp_path / "v3.jsonl"
    broken.write_text(json.dumps(label(EPISODES[0], "fine")) + '\n\n{"episode_id": \n')
    code, stderr, _ = cli(settings, "layer", "ingest", "labels", str(broken), "--version", "v3")
    assert code == 2 and f"{broken}:3: not JSON" in stderr
    assert layer_rows(settings) == before

    # The same version again: a no-op with the same rows, refused with others.
    code, _, report = cli(settings, "layer", "ingest", "labels", str(good), "--version", "v1")
    assert code == 0 and report is not None and report["created"] is False
    other = write_jsonl(tmp_path / "other.jsonl", [label(e, "close it") for e in EPISODES])
    code, stderr, _ = cli(settings, "layer", "ingest", "labels", str(other), "--version", "v1")
    assert code == 3 and "immutable" in stderr
    assert layer_rows(settings) == before


def test_a_pinned_manifest_is_byte_identical_after_a_newer_version_and_latest_moves_on(
    fresh_database: FreshDatabase, tmp_path: Path
) -> None:
    settings = seeded(fresh_database)
    v1 = [calibration(500.0 + i, episode_id=e) for i, e in enumerate(EPISODES[:10])]
    v1 += [
        # dev00012's episode started 2026-01-01 00:07:24: the second window holds it
        calibration(111.0, device_id="dev00012", valid_until="2026-01-01T00:05:00Z"),
        calibration(222.0, device_id="dev00012", valid_from="2026-01-01T00:05:00Z"),
        calibration(333.0, device_id="dev00003"),  # episode 3 has its own row: that one wins
    ]
    path = write_jsonl(tmp_path / "c1.jsonl", v1)
    assert cli(settings, "layer", "ingest", "calibration", str(path), "--version", "v1")[0] == 0
    pinned = ManifestFilter(verdicts=[], layers={"calibration": "v1"})
    first = build(settings, tmp_path / "a", pinned)

    table = load_manifest(first.local_path)
    by_episode = dict(
        zip(table.column("episode_id").to_pylist(), table.column("calibration").to_pylist(),
            strict=True)
    )  # fmt: skip
    fx = {e: json.loads(c)["main"]["fx"] for e, c in by_episode.items() if c is not None}
    assert fx == {**{e: 500.0 + i for i, e in enumerate(EPISODES[:10])}, EPISODES[12]: 222.0}
    assert json.loads(by_episode[EPISODES[0]])["main"]["extrinsics"] == IDENTITY

    newer = [calibration(900.0 + i, episode_id=e) for i, e in enumerate(EPISODES)]
    path = write_jsonl(tmp_path / "c2.jsonl", newer)
    assert cli(settings, "layer", "ingest", "calibration", str(path), "--version", "v2")[0] == 0
    again = build(settings, tmp_path / "b", pinned)
    assert again.manifest_id == first.manifest_id
    assert again.local_path.read_bytes() == first.local_path.read_bytes()

    latest = build(settings, tmp_path / "c", pinned.model_copy(update={"layers": {
        "calibration": "latest"}}))  # fmt: skip
    assert latest.manifest_id != first.manifest_id and latest.layers == {"calibration": "v2"}
    meta = manifest_metadata(load_manifest(latest.local_path))
    assert meta["version"] == 6 and meta["layers"] == {"calibration": "v2"}
    assert meta["filter"]["layers"] == {"calibration": "v2"}  # resolved, as built
    with psycopg.connect(settings.database_libpq_url) as conn:
        found = conn.execute("SELECT manifest_id, layers FROM manifests").fetchall()
    recorded: dict[str, Any] = {str(m): layers for m, layers in found}
    assert recorded[first.manifest_id] == {"calibration": "v1"}
    assert recorded[latest.manifest_id] == {"calibration": "v2"}

    # reverse lineage names the layer versions each manifest holding the episode pinned
    uses, _ = used_by(make_engine(settings), EPISODES[0])
    assert {u.manifest_id: u.layer_versions for u in uses} == {
        first.manifest_id: {"calibration": "v1"},
        latest.manifest_id: {"calibration": "v2"},
    }
    diff = diff_manifests(load_manifest(first.local_path), load_manifest(latest.local_path))
    assert diff.layers_changed == {"calibration": ("v1", "v2")} and not diff.episodes_added


def test_the_label_filter_selects_exactly_the_labelled_episodes(
    fresh_database: FreshDatabase, tmp_path: Path
) -> None:
    settings = seeded(fresh_database)
    picking = {EPISODES[i] for i in (1, 4, 5, 11, 19)}
    rows = [label(e, "Pick up the red cup", 2.0) for e in sorted(picking)]
    rows += [label(e, "open the drawer") for e in EPISODES[:12]]
    rows += [label(EPISODES[6], "picking nothing up")]  # "pick" but not "pick up"
    path = write_jsonl(tmp_path / "labels.jsonl", rows)
    assert cli(settings, "layer", "ingest", "labels", str(path), "--version", "l1")[0] == 0
    newer = write_jsonl(tmp_path / "l2.jsonl", [label(EPISODES[0], "pick up a pen")])
    assert cli(settings, "layer", "ingest", "labels", str(newer), "--version", "l2")[0] == 0

    def selected(flt: ManifestFilter) -> pa.Table:
        return load_manifest(build(settings, tmp_path / str(len(list(tmp_path.iterdir()))),
                                   flt).local_path)  # fmt: skip

    pinned = ManifestFilter(verdicts=[], layers={"labels": "l1"})
    table = selected(pinned.model_copy(update={"label_contains": ["PICK UP"]}))
    assert set(table.column("episode_id").to_pylist()) == picking
    assert table.num_rows == 10 * len(picking)  # every clip of each, none of the others
    spans = json.loads(table.column("labels")[0].as_py())
    assert spans == [
        {"type": "instruction", "start_s": 0.0, "end_s": 4.5, "text": "open the drawer"},
        {"type": "instruction", "start_s": 2.0, "end_s": 6.5, "text": "Pick up the red cup"},
    ]  # the episode's labels in time order
    both = selected(pinned.model_copy(update={"label_contains": ["pick up", "drawer"]}))
    assert set(both.column("episode_id").to_pylist()) == {e for e in picking if e < EPISODES[12]}
    code, stderr, report = cli(settings, "manifest", "build", "--out", str(tmp_path / "cli"),
                               "--verdicts", "", "--label-contains", "pick up")  # fmt: skip
    assert code == 0, stderr
    assert report is not None and report["layers"] == {"labels": "l2"}  # latest, resolved
    assert report["rows"] == 10  # l2 labels only EPISODES[0]
