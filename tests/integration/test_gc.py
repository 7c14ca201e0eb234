"""`egoline gc shards` on the real stack: a stray shard holding clips the warehouse already
points elsewhere (what a shard stage killed mid-batch leaves) is found by reading the shard
indexes from the object store, kept while younger than the threshold or in a dry run, and then
deleted; the referenced shard and every clip of the episode stay readable."""

from __future__ import annotations

import io
import json
import tarfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from services.common.objectstore import object_store
from services.common.settings import Settings
from services.metadata.gc import audit_shards, collect_shards
from services.metadata.warehouse import make_engine
from services.shard.core import sha256_bytes, shard_keys
from services.stack.fleet import Fleet
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected


def stray_copy(tar_bytes: bytes) -> bytes:
    """The same clips in a tar with other content (another packing): another content key."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(tar_bytes)) as src,
        tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as dst,
    ):
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member))
        pad = tarfile.TarInfo("zz-other-episode.json")
        pad.size = 2
        dst.addfile(pad, io.BytesIO(b"{}"))
    return out.getvalue()


def test_gc_finds_and_deletes_a_stray_duplicate_shard_and_nothing_else(
    stack: Settings, fleet: Fleet, episode_factory: EpisodeFactory, tmp_path: Path
) -> None:
    del fleet
    seed = 3000 + int(time.time()) % 900
    dirs = episode_factory(1, seed=seed, duration_s=(8.0, 10.0))
    store = object_store(stack)
    agent = device_agent(stack, tmp_path / "agent")
    agent.run_once(dirs, 30)
    episode_id = dirs[0].name
    wait_for(lambda: episode_states(stack, [episode_id]) == {episode_id: "sharded"}, 120, "shard")
    with psycopg.connect(stack.database_libpq_url) as conn:
        live = conn.execute(
            "SELECT DISTINCT shard_key FROM clips WHERE episode_id = %s", (episode_id,)
        ).fetchall()
    live_key = live[0][0]
    index = json.loads(store.get_bytes(live_key.removesuffix(".tar") + ".index.json"))
    clip_count = sum(1 for c in index["clips"] if c["episode_id"] == episode_id)
    assert clip_count >= 1

    engine = make_engine(stack)
    pv = stack.pipeline_version
    now = datetime.now(UTC)
    try:
        collect_shards(engine, store, pv, now, timedelta(0), apply=True)  # earlier tests' leftovers
        before = audit_shards(engine, store, pv)
        assert before.unreferenced_shards == 0 and before.duplicate_clips_in_shards == 0

        data = stray_copy(store.get_bytes(live_key))
        stray_key, stray_index = shard_keys(pv, sha256_bytes(data))
        store.put_bytes(stray_key, data, "application/x-tar")
        store.put_bytes(stray_index, json.dumps({**index, "shard_key": stray_key}).encode())

        audit = audit_shards(engine, store, pv)
        assert audit.unreferenced_shards == 1
        assert audit.duplicate_clips_in_shards == len(index["clips"])
        assert stray_key in audit.examples

        dry = collect_shards(engine, store, pv, datetime.now(UTC), timedelta(0), apply=False)
        assert dry["would_delete"] == [stray_key] and dry["deleted_shards"] == 0
        young = collect_shards(engine, store, pv, datetime.now(UTC), timedelta(hours=1), True)
        assert young["too_young"] == 1 and young["deleted_shards"] == 0
        assert store.exists(stray_key)

        done = collect_shards(engine, store, pv, datetime.now(UTC), timedelta(0), apply=True)
        assert done["deleted_shards"] == 1
        assert not store.exists(stray_key) and not store.exists(stray_index)
        assert store.exists(live_key)
        after = audit_shards(engine, store, pv)
        assert after.unreferenced_shards == 0 and after.duplicate_clips_in_shards == 0
        assert after.shards == before.shards
    finally:
        engine.dispose()
