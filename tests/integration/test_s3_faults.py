"""S3 faults (latency, connection resets, 503 Slow Down) between the services and the store:
uploads, shard writes and reads retry and finish, and no partial shard is ever visible under a
final key."""

from __future__ import annotations

import hashlib
import re
import signal
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pytest

from services.common.objectstore import object_store
from services.common.settings import Settings
from services.stack.fleet import Fleet
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.proxy import FaultProxy
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected

SHARD_KEY = re.compile(r"^shards/[^/]+/[0-9a-f]{2}/(?P<sha>[0-9a-f]{64})\.tar$")


def test_writes_and_reads_finish_through_s3_faults_and_no_partial_shard_is_visible(
    stack: Settings,
    fleet: Fleet,
    episode_factory: EpisodeFactory,
    tmp_path: Path,
    fault_proxy: type[FaultProxy],
) -> None:
    target = urlparse(stack.require("s3.endpoint"))
    proxy = fault_proxy((str(target.hostname), int(target.port or 80)))
    proxy.latency_s, proxy.reset_rate, proxy.http_503_rate = 0.001, 0.3, 0.3
    through_proxy = f"http://127.0.0.1:{proxy.port}"
    faulty = stack.model_copy(
        update={"s3": stack.s3.model_copy(update={"endpoint": through_proxy})}
    )
    direct = object_store(stack)

    # Every shard write goes through the proxy: the fleet's shard stage is swapped for one whose
    # object store is the proxy, for the length of the test.
    assert fleet.kill("shard-0", signal.SIGTERM, timeout_s=60) == 0
    faulty_fleet = Fleet(
        tmp_path / "faulty", env={**fleet.env, "EGOLINE_S3_ENDPOINT": through_proxy}
    )
    stop = threading.Event()
    checked: set[str] = set()
    partial: list[str] = []

    def watch_final_keys() -> None:
        while not stop.is_set():
            for key in direct.list_keys("shards/"):
                match = SHARD_KEY.match(key)
                if match and key not in checked:
                    checked.add(key)
                    if hashlib.sha256(direct.get_bytes(key)).hexdigest() != match["sha"]:
                        partial.append(key)
            stop.wait(0.3)

    watcher = threading.Thread(target=watch_final_keys, daemon=True)
    try:
        faulty_fleet.start("shard")
        faulty_fleet.wait_ready()
        watcher.start()
        dirs = episode_factory(4, seed=int(time.time()) % 10_000 + 60_000, duration_s=(8, 12))
        ids = [d.name for d in dirs]
        agent = device_agent(faulty, tmp_path / "agent")
        assert agent.run_once(dirs, 60).get("published") == 4
        wait_for(
            lambda: set(episode_states(stack, ids).values()) == {"sharded"}, 240, "all sharded"
        )

        # Reads through the faults give the same bytes as reads without them.
        with psycopg.connect(stack.database_libpq_url) as conn:
            rows = conn.execute(
                "SELECT shard_key, mp4_offset, mp4_length FROM clips WHERE episode_id = ANY(%s)",
                (ids,),
            ).fetchall()
        assert rows
        store = object_store(faulty)
        for shard_key, offset, length in rows:
            assert store.get_range(shard_key, offset, length) == direct.get_range(
                shard_key, offset, length
            )
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(30)
        faulty_fleet.stop()
        fleet.spawn("shard-0")
        fleet.wait_ready()
    assert proxy.injected["resets"] > 0 and proxy.injected["http_503"] > 0, proxy.injected
    assert checked and not partial, partial
