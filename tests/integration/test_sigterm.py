"""SIGTERM mid-run: the stage stops cleanly, and after a restart nothing is lost, duplicated or
half-written."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import time
from pathlib import Path

import psycopg
import pytest

from services.common.objectstore import object_store
from services.common.settings import Settings
from services.stack.fleet import Fleet
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected

SHARD_KEY = re.compile(r"^shards/[^/]+/[0-9a-f]{2}/(?P<sha>[0-9a-f]{64})\.tar$")


def test_sigterm_mid_batch_exits_cleanly_and_loses_nothing(
    stack: Settings, fleet: Fleet, episode_factory: EpisodeFactory, tmp_path: Path
) -> None:
    dirs = episode_factory(6, seed=int(time.time()) % 10_000 + 50_000, duration_s=(4.5, 6.0))
    ids = [d.name for d in dirs]
    agent = device_agent(stack, tmp_path / "agent")
    assert agent.run_once(dirs, 60).get("published") == 6
    # Stop the shard stage while the episodes are on their way to it (or in its batch).
    wait_for(
        lambda: any(s in ("validated", "sharded") for s in episode_states(stack, ids).values()),
        120,
        "an episode validated",
    )
    started = time.monotonic()
    assert fleet.kill("shard-0", signal.SIGTERM, timeout_s=60) == 0
    stopped_s = time.monotonic() - started
    assert stopped_s < 60
    fleet.spawn("shard-0")
    fleet.wait_ready()
    wait_for(lambda: set(episode_states(stack, ids).values()) == {"sharded"}, 180, "all sharded")

    with psycopg.connect(stack.database_libpq_url) as conn:
        rows = conn.execute(
            "SELECT episode_id, clip_index, shard_key, json_offset, json_length FROM clips "
            "WHERE episode_id = ANY(%s)",
            (ids,),
        ).fetchall()
    assert {e for e, *_ in rows} == set(ids)
    assert len({(e, i) for e, i, *_ in rows}) == len(rows)  # no clip twice
    store = object_store(stack)
    for shard_key in {k for _, _, k, _, _ in rows}:
        match = SHARD_KEY.match(shard_key)
        assert match, shard_key
        data = store.get_bytes(shard_key)  # whole under its final key: bytes hash to the name
        assert hashlib.sha256(data).hexdigest() == match["sha"]
    for episode_id, clip_index, shard_key, offset, length in rows:
        meta = json.loads(store.get_range(shard_key, offset, length))
        assert (meta["episode_id"], meta["clip_index"]) == (episode_id, clip_index)
