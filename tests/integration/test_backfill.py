"""Backfill on the real stack: an episode ingested under one pipeline version is re-derived
under a new one by one command (`egoline backfill`), without re-uploading: the raw objects are
not written again, the new version's clips carry content signals, and the old version's rows
stay as they were."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from services.cli import app
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.stack.fleet import Fleet
from services.synth.realistic import RealisticCase, write_case
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected


def clip_rows(settings: Settings, episode_id: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(settings.database_libpq_url) as conn:
        rows = conn.execute(
            "SELECT pipeline_version, clip_index, shard_key, sharpness, frozen_fraction "
            "FROM clips WHERE episode_id = %s ORDER BY pipeline_version, clip_index",
            (episode_id,),
        ).fetchall()
    out: dict[str, list[tuple[Any, ...]]] = {}
    for version, *rest in rows:
        out.setdefault(str(version), []).append(tuple(rest))
    return out


def test_backfill_rederives_under_a_new_version_and_keeps_the_old(
    stack: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    seed = int(time.time()) % 9000 + 1000
    folder = write_case(RealisticCase("backfill_me", duration_s=12.0), tmp_path / "ep", seed)
    episode_id = str(json.loads((folder / "episode.json").read_text())["episode_id"])
    agent = device_agent(stack, tmp_path / "agent")
    assert agent.run_once([folder], 60).get("published") == 1
    wait_for(lambda: episode_states(stack, [episode_id]) == {episode_id: "sharded"}, 180, "v1")
    before = clip_rows(stack, episode_id)
    assert list(before) == [stack.pipeline_version]
    store = object_store(stack)
    raw_prefix = f"raw/{json.loads((folder / 'episode.json').read_text())['device_id']}/"
    raw_before = {
        o.key: o.last_modified for o in store.list_objects(raw_prefix) if episode_id in o.key
    }
    assert raw_before

    new = f"v2-{seed}"
    runner = CliRunner()
    dry = runner.invoke(
        app, ["backfill", "--pipeline-version", new, "--episode", episode_id, "--dry-run"]
    )
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout.strip().splitlines()[-1])["episodes"] == 1
    done = runner.invoke(app, ["backfill", "--pipeline-version", new, "--episode", episode_id])
    assert done.exit_code == 0, done.output

    wait_for(lambda: clip_rows(stack, episode_id).get(new), 240, "the new version's clips")
    after = clip_rows(stack, episode_id)
    assert after[stack.pipeline_version] == before[stack.pipeline_version]  # the old stays
    assert len(after[new]) == len(before[stack.pipeline_version])
    assert all(sharp is not None for _, _, sharp, _ in after[new])  # signals computed
    assert all(f"shards/{new}/" in key for _, key, _, _ in after[new])
    # nothing uploaded again
    raw_after = {
        o.key: o.last_modified for o in store.list_objects(raw_prefix) if episode_id in o.key
    }
    assert raw_after == raw_before
    # and once re-derived, a second backfill has nothing to do
    again = runner.invoke(app, ["backfill", "--pipeline-version", new, "--episode", episode_id])
    assert json.loads(again.stdout.strip().splitlines()[-1])["episodes"] == 0
