"""A full local disk is our fault, never the episode's: a shard stage whose spool is a small
tmpfs filled to the last byte retries (rewinds with backoff), counts the errors, reports not
ready, and shards every episode once space comes back — no dead letter, nothing lost."""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from schemas.events import TOPIC_VALIDATED, DlqRecord, dlq_topic
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.metadata.gc import read_index_clips, stored_shards
from services.stack.fleet import Fleet
from services.synth.realistic import write_realistic
from tests.fixtures.http import http_get
from tests.fixtures.kafka_read import read_topic
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "spool"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem has no byte left; returns it."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as out:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    out.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    return filler


def disk_errors(port: int) -> float:
    status, body = http_get(port, "/metrics")
    assert status == 200, body
    for family in text_string_to_metric_families(body):
        if family.name == "egoline_stage_local_disk_errors":
            return sum(
                s.value
                for s in family.samples
                if s.name.endswith("_total") and s.labels.get("errno") == "ENOSPC"
            )
    return 0.0


def dead_lettered(settings: Settings, ids: set[str]) -> list[str]:
    """Shard DLQ records (read from the topic itself) of any of `ids`."""
    hits = []
    for record in read_topic(settings, dlq_topic(TOPIC_VALIDATED), quiet_s=1.0):
        dlq = DlqRecord.model_validate_json(record.value() or b"{}")
        if any(i in dlq.original_value or i in (dlq.original_key or "") for i in ids):
            hits.append(f"{dlq.reason_code.value}: {dlq.reason[:200]}")
    return hits


def test_a_full_spool_is_retried_not_dead_lettered_and_nothing_is_lost(
    stack: Settings,
    fleet: Fleet,
    small_tmpfs: Path,
    tmp_path: Path,
) -> None:
    # This test's shard stage is the group's only member: its spool is the tmpfs.
    fleet.kill("shard-0", timeout_s=60)
    own = Fleet(
        tmp_path / "logs",
        env={
            "EGOLINE_START_JITTER_S": "0",
            "EGOLINE_BATCH_WAIT_S": "0.5",
            "EGOLINE_SPOOL_DIR": str(small_tmpfs),
            # the node's raw cache is on the same (full) disk
            "EGOLINE_RAW_CACHE_DIR": str(small_tmpfs / "raw-cache"),
        },
    )
    try:
        own.start("shard")
        own.wait_ready()
        port = own.metrics_ports["shard-0"]
        filler = fill(small_tmpfs)
        # made as devices make them: x265 defaults (open GOP), RGB + gray16 depth in one MKV,
        # AV1 with IMU at 1 kHz
        seed = 5100 + int(time.time()) % 800
        names = ["h265_default_open_gop_mp4", "rgbd_ffv1_depth_mkv", "av1_default_mp4"]
        dirs = write_realistic(tmp_path / "episodes", names, seed=seed)
        ids = [d.name for d in dirs]
        store = object_store(stack)
        agent = device_agent(stack, tmp_path / "agent")
        agent.run_once(dirs, 30)

        wait_for(lambda: disk_errors(port) >= 2, 180, "ENOSPC retried at least twice")
        status, body = http_get(port, "/readyz")
        assert status == 503 and "local disk" in body, (status, body)
        assert set(episode_states(stack, ids).values()) <= {"validated"}, "none sharded yet"
        assert own.dead() == [], "the stage kept running"

        filler.unlink()  # space comes back
        wait_for(
            lambda: set(episode_states(stack, ids).values()) == {"sharded"},
            180,
            "every episode sharded once the disk had space",
        )
        wait_for(lambda: http_get(port, "/readyz")[0] == 200, 30, "ready again")
        assert dead_lettered(stack, set(ids)) == []
        # every clip of every episode is in a shard index in the object store, exactly once
        index = read_index_clips(store, stored_shards(store, stack.pipeline_version))
        ours = [k for keys in index.values() for k in keys if any(i in k for i in ids)]
        assert {i for i in ids if any(i in k for k in ours)} == set(ids)
        assert len(ours) == len(set(ours))
    finally:
        own.stop()
        fleet.spawn("shard-0")
        fleet.wait_ready()
