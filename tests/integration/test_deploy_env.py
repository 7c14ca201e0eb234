"""The image's contract: a service reads every endpoint and credential from the environment.

`egoline serve decode` runs with exactly the variables compose sets for the decode container
(endpoint values swapped for the embedded stack's), an empty stack dir (no endpoints-file
fallback) and nothing else from this process's environment; it must get ready and decode an
episode."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Producer

from schemas.events import (
    TOPIC_DECODED,
    TOPIC_UPLOADED,
    EpisodeRef,
    EpisodeUploaded,
    SourceFile,
    derive_event_id,
)
from services.common import kafka
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.stack.fleet import ready
from services.stack.launcher import free_port
from tests.deploy_files import compose_config
from tests.fixtures.http import http_get
from tests.fixtures.kafka_read import read_topic
from tests.fixtures.media import EpisodeFactory, video_of
from tests.fixtures.polling import wait_for

pytestmark = pytest.mark.connected

# compose value -> this stack's, for the endpoint and credential variables only
ENDPOINTS = {
    "EGOLINE_KAFKA_BOOTSTRAP": "kafka.bootstrap",
    "EGOLINE_S3_ENDPOINT": "s3.endpoint",
    "EGOLINE_S3_ACCESS_KEY": "s3.access_key",
    "EGOLINE_S3_SECRET_KEY": "s3.secret_key",
    "EGOLINE_S3_BUCKET": "s3.bucket",
}


def container_env(stack: Settings, stack_dir: Path, port: int) -> dict[str, str]:
    env: dict[str, str] = dict(compose_config()["services"]["decode"]["environment"])
    swapped = set()
    for name, field in ENDPOINTS.items():
        if name in env:
            group, _, name_in_group = field.partition(".")
            value = getattr(getattr(stack, group), name_in_group)
            env[name] = value.get_secret_value() if hasattr(value, "get_secret_value") else value
            swapped.add(name)
    assert swapped == set(ENDPOINTS), f"compose no longer sets {set(ENDPOINTS) - swapped}"
    assert not any("DATABASE" in k for k in env)  # decode gets no warehouse credentials
    env["EGOLINE_METRICS_PORT"] = str(port)
    env["EGOLINE_METRICS_HOST"] = "127.0.0.1"  # compose's 0.0.0.0 is for a container network
    env["EGOLINE_STACK_DIR"] = str(stack_dir)  # empty: the endpoints file can't help
    env["EGOLINE_START_JITTER_S"] = "0"
    # The S3 here is the embedded emulator, and its built-in credentials are placeholders, which
    # settings accept only with this flag (`stack up` writes it in the endpoints file).
    env["EGOLINE_EMBEDDED_STACK"] = "true"
    # what the image provides, nothing from this test process's EGOLINE_* environment
    env |= {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(stack_dir)}
    return env


@pytest.fixture
def decode_from_compose_env(stack: Settings, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    stack_dir = tmp_path / "empty-stack-dir"
    stack_dir.mkdir()
    port = free_port()
    log = tmp_path / "decode.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "serve", "decode"],
            env=container_env(stack, stack_dir, port),
            cwd=tmp_path,  # not the repo: no .stack/ to fall back on
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        yield port, log
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert list(stack_dir.iterdir()) == [], "the service wrote an endpoints file"


def decoded_ok(port: int) -> float:
    """Records this process decoded (outcome ok), from its own /metrics."""
    _, body = http_get(port, "/metrics")
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("egoline_stage_records_total{")
        and 'stage="decode"' in line
        and 'outcome="ok"' in line
    )


def publish(stack: Settings, directory: Path, partition: int) -> str:
    """Upload one episode's video and publish its event to `partition`; its episode id."""
    video = video_of(directory)
    data = video.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    episode_id = f"{directory.name}-{int(time.time())}"
    key = f"raw/devdeploy/2026/01/01/{episode_id}/{sha}{video.suffix}"
    object_store(stack).put_bytes(key, data)
    event = EpisodeUploaded(
        event_id=derive_event_id("uploaded", episode_id, sha),
        produced_at=datetime.now(UTC),
        episode=EpisodeRef(
            episode_id=episode_id,
            device_id="devdeploy",
            session_id="sdeploy",
            started_at=datetime(2026, 1, 1, tzinfo=UTC),
            video=SourceFile(key=key, sha256=sha, size_bytes=len(data)),
        ),
    )
    producer = Producer(kafka.producer_config(stack))
    producer.produce(
        TOPIC_UPLOADED, key=episode_id.encode(), value=event.model_dump_json(), partition=partition
    )
    assert producer.flush(15) == 0
    return episode_id


def uploaded_partitions(stack: Settings) -> list[int]:
    admin = kafka.admin_client(stack)
    return sorted(admin.list_topics(TOPIC_UPLOADED, timeout=10).topics[TOPIC_UPLOADED].partitions)


def test_decode_runs_on_only_the_variables_compose_sets(
    stack: Settings,
    decode_from_compose_env: tuple[int, Path],
    episode_factory: EpisodeFactory,
) -> None:
    port, log = decode_from_compose_env
    wait_for(lambda: ready(port), 60, f"decode ready on /readyz (log: {log})")
    assert http_get(port, "/healthz") == (200, "ok")
    # One distinct episode per partition (never one episode on two partitions: the stages
    # rely on an episode's events sharing a partition): the session fleet's decode may share
    # the group, and whichever partitions this process holds, one of them carries an episode.
    partitions = uploaded_partitions(stack)
    dirs = episode_factory(len(partitions), seed=7100)
    ids = [publish(stack, d, p) for d, p in zip(dirs, partitions, strict=True)]
    wait_for(lambda: decoded_ok(port) >= 1, 60, f"decode processing an episode (log: {log})")
    decoded = [json.loads(m.value() or b"{}") for m in read_topic(stack, TOPIC_DECODED)]
    assert set(ids) & {d["episode"]["episode_id"] for d in decoded}
