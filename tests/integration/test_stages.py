"""The three stages on the real stack: every synthetic defect gets its own reason code while
the stages keep consuming, and redelivering every event changes nothing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from schemas.events import (
    TOPIC_DECODED,
    TOPIC_SHARDS,
    TOPIC_UPLOADED,
    TOPIC_VALIDATED,
    EpisodeRef,
    EpisodeUploaded,
    ShardsWritten,
    SourceFile,
    derive_event_id,
)
from services.common import kafka
from services.common.objectstore import ObjectStore, object_store
from services.common.settings import Settings
from services.shard.core import episode_marker_key
from services.stack.fleet import Fleet
from services.synth.writer import Defect
from tests.fixtures.kafka_read import read_topic
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected

EXPECTED = {
    Defect.TRUNCATED: ("dead_lettered", "container_incomplete"),
    Defect.CORRUPT_PACKETS: ("rejected", "keyframe_undecodable"),
    Defect.NON_MONOTONIC: ("rejected", "non_monotonic_timestamps"),
    Defect.IMU_MISMATCH: ("rejected", "imu_row_mismatch"),
    Defect.NOT_VIDEO: ("dead_lettered", "not_a_video"),
    Defect.ZERO_BYTE: ("dead_lettered", "empty_file"),
}


def reasons(settings: Settings, episode_id: str) -> set[str]:
    with psycopg.connect(settings.database_libpq_url) as conn:
        dead = conn.execute(
            "SELECT reason_code FROM dead_letters WHERE episode_id = %s", (episode_id,)
        ).fetchall()
        verdict = conn.execute(
            "SELECT r->>'code' FROM verdicts, jsonb_array_elements(reasons) r "
            "WHERE episode_id = %s",
            (episode_id,),
        ).fetchall()
    return {row[0] for row in dead + verdict}


def publish_zero_byte_episode(settings: Settings, episode_id: str) -> None:
    """The agent refuses zero-byte files, so this one is put on the topic directly, as a
    misbehaving uploader would, to prove decode dead-letters it."""
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    key = f"raw/devx/2026/01/01/{episode_id}/{empty}.mp4"
    object_store(settings).put_bytes(key, b"")
    event = EpisodeUploaded(
        event_id=derive_event_id("uploaded", episode_id, empty),
        produced_at=datetime.now(UTC),
        episode=EpisodeRef(
            episode_id=episode_id,
            device_id="devx",
            session_id="sx",
            started_at=datetime(2026, 1, 1, tzinfo=UTC),
            video=SourceFile(key=key, sha256=empty, size_bytes=0),
        ),
    )
    producer = Producer(kafka.producer_config(settings))
    producer.produce(TOPIC_UPLOADED, key=episode_id.encode(), value=event.model_dump_json())
    producer.flush(10)


def test_every_defect_gets_its_own_reason_and_clean_episodes_still_flow(
    stack: Settings, fleet: Fleet, episode_factory: EpisodeFactory, tmp_path: Path
) -> None:
    seed = 5000 + int(time.time()) % 4000
    defects = [d for d in EXPECTED if d is not Defect.ZERO_BYTE]
    dirs = episode_factory(len(defects) + 2, seed=seed, defects=tuple(defects))
    by_defect = dict(zip(defects, dirs, strict=False))
    clean = dirs[len(defects) :]
    agent = device_agent(stack, tmp_path / "agent")
    assert agent.run_once(dirs, 30).get("published") == len(dirs)
    zero_id = f"zero{seed}"
    publish_zero_byte_episode(stack, zero_id)

    ids = {d: p.name for d, p in by_defect.items()} | {Defect.ZERO_BYTE: zero_id}
    expected = {ids[d]: state for d, (state, _) in EXPECTED.items()}
    expected |= {c.name: "sharded" for c in clean}
    wait_for(
        lambda: episode_states(stack, list(expected)) == expected, 180, "every episode's outcome"
    )
    for defect, (_, code) in EXPECTED.items():
        assert code in reasons(stack, ids[defect]), f"{defect}: {reasons(stack, ids[defect])}"
    assert not fleet.dead()


def committed_everything(settings: Settings, group: str, topic: str) -> bool:
    """The group's committed offsets reached the end of every partition of the topic."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    ends: dict[int, int] = {}
    for msg in read_topic(settings, topic, quiet_s=1.0):
        ends[int(msg.partition() or 0)] = int(msg.offset() or 0) + 1
    admin = kafka.admin_client(settings)
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    committed = {
        tp.partition: tp.offset for tp in future.result().topic_partitions if tp.topic == topic
    }
    return all(committed.get(p, -1) >= end for p, end in ends.items())


def fingerprints(store: ObjectStore) -> dict[str, tuple[str, str]]:
    """(etag, sha256 of the bytes read back through the S3 API) of every object the pipeline
    writes (raw uploads, packet indexes, shards, shard indexes, episode markers): a same-named
    object rewritten with other bytes changes both, where a comparison of names sees nothing."""
    out: dict[str, tuple[str, str]] = {}
    for key in [k for prefix in ("raw/", "index/", "shards/") for k in store.list_keys(prefix)]:
        info = store.stat(key)
        assert info is not None, key
        out[key] = (info.etag, hashlib.sha256(store.get_bytes(key)).hexdigest())
    return out


def test_redelivering_every_event_writes_no_new_objects_and_no_duplicate_clips(
    stack: Settings, fleet: Fleet, episode_factory: EpisodeFactory, tmp_path: Path
) -> None:
    seed = 1000 + int(time.time()) % 4000
    dirs = episode_factory(3, seed=seed, duration_s=(12.0, 16.0))
    ids = [d.name for d in dirs]
    store = object_store(stack)
    agent = device_agent(stack, tmp_path / "agent")
    agent.run_once(dirs, 30)
    wait_for(lambda: set(episode_states(stack, ids).values()) == {"sharded"}, 120, "first pass")
    for group, topic in (
        ("egoline-decode", TOPIC_UPLOADED),
        ("egoline-validate", TOPIC_DECODED),
        ("egoline-shard", TOPIC_VALIDATED),
    ):
        wait_for(partial(committed_everything, stack, group, topic), 60, f"{group} idle")
    objects_before = fingerprints(store)
    with psycopg.connect(stack.database_libpq_url) as conn:
        clips_before = conn.execute("SELECT count(*) FROM clips").fetchone()

    producer = Producer(kafka.producer_config(stack))
    for topic in (TOPIC_UPLOADED, TOPIC_DECODED, TOPIC_VALIDATED):
        for msg in read_topic(stack, topic):
            if (msg.key() or b"").decode() in ids:
                producer.produce(topic, key=msg.key(), value=msg.value())
    producer.flush(10)
    for group, topic in (
        ("egoline-decode", TOPIC_UPLOADED),
        ("egoline-validate", TOPIC_DECODED),
        ("egoline-shard", TOPIC_VALIDATED),
    ):
        wait_for(partial(committed_everything, stack, group, topic), 120, f"{group} redo")

    objects_after = fingerprints(store)
    assert set(objects_after) == set(objects_before), "redelivery added or removed objects"
    rewritten = sorted(k for k in objects_before if objects_after[k] != objects_before[k])
    assert not rewritten, f"redelivery rewrote objects with other bytes: {rewritten[:5]}"
    with psycopg.connect(stack.database_libpq_url) as conn:
        assert conn.execute("SELECT count(*) FROM clips").fetchone() == clips_before
    # within a pipeline version (a backfill rightly holds the same clip under v1 and v2)
    members: list[tuple[str, str]] = []
    for key in store.list_keys("shards/"):
        if key.endswith(".index.json"):
            version = key.split("/")[1]
            index = json.loads(store.get_bytes(key))
            members += [(version, m["name"]) for m in index["members"]]
    assert len(members) == len(set(members)), "a clip was written into two shards"
    # the topic is shared with the poison test: count the records that are shard events
    shard_event_ids = [
        e for e in (shard_event_id(m.value() or b"") for m in read_topic(stack, TOPIC_SHARDS)) if e
    ]
    replayed = len(shard_event_ids) - len(set(shard_event_ids))
    assert replayed > 0, "redelivered episodes re-emit their shard events, with the same ids"


def shard_event_id(value: bytes) -> str | None:
    try:
        return ShardsWritten.model_validate_json(value).event_id
    except ValueError:  # pydantic's ValidationError is a ValueError
        return None


def worker_mid_task(stage_pid: int, marker: str, timeout_s: float) -> tuple[list[Any], Path]:
    """Poll the stage's worker processes until one holds open a file under a `marker` scratch
    directory (its job's temporary directory exists only while a job runs): that worker is
    provably mid-task. Returns every worker and the busy one's scratch directory."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = psutil.Process(stage_pid).children(recursive=True)
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                for f in worker.open_files():
                    scratch = next((p for p in Path(f.path).parents if marker in p.name), None)
                    if scratch is not None:
                        return workers, scratch
        time.sleep(0.005)
    raise AssertionError(f"no worker of pid {stage_pid} was seen mid-task in {timeout_s}s")


def clips_in_shards(store: ObjectStore, ids: list[str]) -> dict[tuple[str, int], list[str]]:
    """(episode, clip index) -> the shards whose index (read from the object store) lists it."""
    where: dict[tuple[str, int], list[str]] = {}
    for key in store.list_keys("shards/"):
        if key.endswith(".index.json"):
            for clip in json.loads(store.get_bytes(key))["clips"]:
                if clip["episode_id"] in ids:
                    where.setdefault((clip["episode_id"], clip["clip_index"]), []).append(key)
    return where


def test_a_worker_killed_mid_task_is_replaced_and_no_clip_is_lost_or_duplicated(
    stack: Settings, fleet: Fleet, episode_factory: EpisodeFactory, tmp_path: Path
) -> None:
    import signal

    seed = 9000 + int(time.time()) % 900
    dirs = episode_factory(4, seed=seed, duration_s=(20.0, 30.0))
    store = object_store(stack)
    agent = device_agent(stack, tmp_path / "agent")
    ids = [d.name for d in dirs]
    agent.run_once(dirs, 30)
    # when a validate worker is inside a job (its scratch directory holds an open file) ...
    workers, scratch = worker_mid_task(fleet.procs["validate-0"].pid, "-validate-", 60)
    for worker in workers:
        worker.send_signal(signal.SIGKILL)
    # ... the kill landed mid-task: the job's `with TemporaryDirectory()` never got to clean up
    assert scratch.exists(), f"{scratch} was cleaned up: the worker had finished its job"
    markers = [episode_marker_key(stack.pipeline_version, e) for e in ids]
    wait_for(
        lambda: all(store.exists(m) for m in markers),
        180,
        "every episode's shard marker after a validate worker was killed mid-task",
    )
    assert fleet.procs["validate-0"].poll() is None, "the stage itself kept running"
    # the replacement workers swept the killed one's scratch directory (named by its pid)
    assert not scratch.exists(), f"{scratch} of a dead worker is still on disk"

    # counted from the object store, not the warehouse: every shard index, each episode's marker
    where = clips_in_shards(store, ids)
    duplicated = {clip: keys for clip, keys in where.items() if len(keys) > 1}
    assert not duplicated, f"clips stored in more than one shard: {duplicated}"
    for episode_id in ids:
        indexes = sorted(i for e, i in where if e == episode_id)
        assert indexes and indexes == list(range(len(indexes))), (episode_id, indexes)
        marker = json.loads(store.get_bytes(markers[ids.index(episode_id)]))
        marked = {
            (c.episode_id, c.clip_index)
            for e in marker["events"]
            for c in ShardsWritten.model_validate_json(e).clips
            if c.episode_id == episode_id
        }
        assert marked == {(episode_id, i) for i in indexes}, episode_id
