"""Reverse lineage on the real stack (Postgres, the object store): which manifests hold an
episode and which runs read them, manifests indexed from their file, the diff of two built
manifests, and the held-out check catching a session in eval of one manifest and train of
another."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from services.bench.manifest import seed
from services.cli import app
from services.common.objectstore import object_store
from services.common.settings import Settings, reset_settings_cache
from services.manifest.build import BuiltManifest, build_manifest
from services.manifest.load import load_manifest
from services.manifest.query import ManifestFilter
from services.manifest.runs import used_by
from services.metadata.warehouse import make_engine, upgrade
from services.reader.loader import open_reader
from tests.fixtures.stack import FreshDatabase

pytestmark = pytest.mark.connected

ROWS = 2000  # 200 episodes of 10 clips, 4 episodes a session, ~10% of sessions in eval


@pytest.fixture
def warehouse(fresh_database: FreshDatabase, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """A fresh, seeded warehouse that the CLI uses too (its URL in the environment)."""
    settings = fresh_database()
    upgrade(settings)
    seed(settings, ROWS, lambda _line: None)
    monkeypatch.setenv("EGOLINE_DATABASE_URL", settings.database_libpq_url)
    reset_settings_cache()
    yield settings
    reset_settings_cache()


def build(
    settings: Settings, out: Path, flt: ManifestFilter, family: str | None = "robots", **kw: Any
) -> BuiltManifest:
    engine = make_engine(settings)
    try:
        return build_manifest(
            settings.database_libpq_url,
            engine,
            object_store(settings),
            flt,
            out,
            family=family,
            **kw,
        )
    finally:
        engine.dispose()


def run_cli(*args: str, code: int = 0) -> dict[str, Any]:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == code, result.output
    line: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return line


def test_used_by_lists_every_manifest_holding_the_episode_and_the_runs_that_read_them(
    warehouse: Settings, tmp_path: Path
) -> None:
    everything = build(warehouse, tmp_path / "a", ManifestFilter(verdicts=[]))
    one_device = build(warehouse, tmp_path / "b", ManifestFilter(verdicts=[], devices=["dev00012"]))
    # a training run reads the second manifest: the reader registers it
    open_reader(one_device.local_path, warehouse, prefetch=0, run_name="run-7")
    run_cli("runs", "register", "--manifest", everything.manifest_id, "--run", "run-8")

    shown = run_cli("lineage", "--episode", "ep000000012", "--used-by")
    held = {m["manifest_id"]: m for m in shown["manifests"]}
    assert set(held) == {everything.manifest_id, one_device.manifest_id}
    assert held[one_device.manifest_id]["clip_indexes"] == list(range(10))
    assert held[one_device.manifest_id]["runs"] == ["run-7"]
    assert held[everything.manifest_id]["runs"] == ["run-8"]
    assert held[one_device.manifest_id]["layer_versions"] == {}
    assert held[one_device.manifest_id]["family"] == "robots"
    assert {r["run_name"] for r in shown["runs"]} == {"run-7", "run-8"}
    assert all(r["host"] and r["username"] for r in shown["runs"])

    # an episode of another device is only in the first manifest, read by run-8 alone
    uses, runs = used_by(make_engine(warehouse), "ep000000013")
    assert [u.manifest_id for u in uses] == [everything.manifest_id]
    assert [r.run_name for r in runs] == ["run-8"]
    nothing = build(warehouse, tmp_path / "c", ManifestFilter(devices=["no-such-device"]))
    assert nothing.rows == 0 and nothing.indexed is not None and nothing.indexed.episodes == 0
    listed = run_cli("runs", "list")["runs"]
    assert {(r["run_name"], r["manifest_id"]) for r in listed} == {
        ("run-7", one_device.manifest_id),
        ("run-8", everything.manifest_id),
    }


def test_a_manifest_built_without_the_index_is_indexed_from_its_file(
    warehouse: Settings, tmp_path: Path
) -> None:
    old = build(warehouse, tmp_path, ManifestFilter(verdicts=[]), family=None, index=False)
    assert used_by(make_engine(warehouse), "ep000000001") == ([], [])
    first = run_cli("manifest", "index", str(old.local_path), "--family", "robots")
    again = run_cli("manifest", "index", "--all")  # nothing left to index
    assert first["indexed"] == [
        {"manifest_id": old.manifest_id, "episodes": 200, "clips": ROWS, "new": True}
    ]
    assert again["indexed"] == []
    uses, _ = used_by(make_engine(warehouse), "ep000000001")
    assert [(u.manifest_id, u.family, u.clip_indexes) for u in uses] == [
        (old.manifest_id, "robots", list(range(10)))
    ]
    # a family is set once
    refused = CliRunner().invoke(app, ["manifest", "index", old.manifest_id, "--family", "x"])
    assert refused.exit_code == 2 and "robots" in refused.output
    # built again with the index: the same file, already indexed, left as it is
    rebuilt = build(warehouse, tmp_path / "again", ManifestFilter(verdicts=[]))
    assert rebuilt.manifest_id == old.manifest_id
    assert rebuilt.indexed is not None and not rebuilt.indexed.new


def test_diff_of_two_built_manifests_names_the_episodes_one_filter_left_out(
    warehouse: Settings, tmp_path: Path
) -> None:
    every = build(warehouse, tmp_path / "a", ManifestFilter(verdicts=[]))
    accepted = build(warehouse, tmp_path / "b", ManifestFilter(verdicts=["accept"]))
    with psycopg.connect(warehouse.database_libpq_url) as conn:
        left_out = [
            r[0]
            for r in conn.execute(
                "SELECT episode_id FROM verdicts WHERE verdict <> 'accept' ORDER BY 1"
            )
        ]
        eval_episodes = conn.execute("SELECT count(*) FROM episodes WHERE split = 'eval'")
        evals = (eval_episodes.fetchone() or (0,))[0]
    assert left_out, "the seed rejects some episodes and warns on others"
    diff = run_cli(
        "manifest", "diff", every.manifest_id, str(accepted.local_path), "--json", "--limit", "-1"
    )
    assert diff["a"] == every.manifest_id and diff["b"] == accepted.manifest_id
    assert diff["removed_ids"] == left_out and diff["added_ids"] == []
    assert diff["clips_removed"] == 10 * len(left_out) and diff["clips_added"] == 0
    assert diff["episodes_a"] == 200 and diff["episodes_b"] == 200 - len(left_out)
    assert diff["splits"]["eval"]["episodes_a"] == evals
    assert diff["layers_changed"] == {} and diff["episodes_changed"] == 0
    same = run_cli("manifest", "diff", every.manifest_id, every.manifest_id)
    assert same["identical"]
    assert load_manifest(accepted.local_path).num_rows == diff["clips_b"]


def test_check_catches_a_session_in_eval_of_one_manifest_and_train_of_another(
    warehouse: Settings, tmp_path: Path
) -> None:
    first = build(warehouse, tmp_path / "a", ManifestFilter(verdicts=[]))
    assert run_cli("manifest", "check", first.manifest_id)["ok"]
    with psycopg.connect(warehouse.database_libpq_url) as conn:
        found = conn.execute(
            "SELECT session_id FROM episodes WHERE split = 'eval' ORDER BY 1 LIMIT 1"
        ).fetchone()
        assert found is not None
        session = found[0]
        # the split rule changed under the family (another EGOLINE_EVAL_FRACTION, say): the
        # session's episodes are train in the next build
        for table in ("episodes", "manifest_episodes"):
            conn.execute(
                f"UPDATE {table} SET split = 'train' WHERE session_id = %s",  # noqa: S608
                (session,),
            )
    second = build(warehouse, tmp_path / "b", ManifestFilter(verdicts=[]))
    report = run_cli("manifest", "check", second.manifest_id, code=1)
    assert report["ok"] is False and report["family_manifests"] == 2
    assert [leak["group"] for leak in report["leaked_groups"]] == [session]
    (leak,) = report["leaked_groups"]
    assert leak["eval_in"] == [first.manifest_id] and leak["train_in"] == [second.manifest_id]
    assert report["dropped_sessions"] == [session] and report["eval_dropped"] == 4
    # the first manifest is now in a leak too (its eval session is the second's train)
    assert run_cli("manifest", "check", first.manifest_id, code=1)["leaks"] == 1
    # in another family the second manifest holds nothing back: no violation
    other = build(warehouse, tmp_path / "c", ManifestFilter(verdicts=[], splits=["train"]), "x")
    assert run_cli("manifest", "check", other.manifest_id)["ok"]
