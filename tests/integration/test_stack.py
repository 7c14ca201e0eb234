"""The embedded stack: every service usable, status reported, a second `up` reuses it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from services.common.settings import Settings
from services.stack.launcher import Stack
from services.stack.provision import stack_up

pytestmark = pytest.mark.connected


def test_status_json_reports_every_service_ok(stack: Settings) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "stack", "status", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    status = json.loads(result.stdout.strip().splitlines()[-1])["status"]
    assert {name: s["ok"] for name, s in status.items()} == {
        "kafka": True,
        "postgres": True,
        "s3": True,
    }
    assert all(s["endpoint"] for s in status.values())


def test_second_up_reuses_the_running_stack(stack: Settings) -> None:
    before = Stack(stack.stack_dir).read_state()
    stack_up(stack, log=lambda _line: None)
    after = Stack(stack.stack_dir).read_state()
    assert {n: s.pid for n, s in after.items()} == {n: s.pid for n, s in before.items()}


def test_topics_are_created_with_their_durability_and_never_beyond_the_cluster(
    stack: Settings,
) -> None:
    import uuid

    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    from services.common import kafka

    admin = kafka.admin_client(stack)
    brokers = len(admin.list_topics(timeout=10).brokers)
    name = f"_egoline.check.{uuid.uuid4().hex[:8]}"
    with pytest.raises(RuntimeError, match="needs as many brokers"):
        kafka.ensure_topics(admin, [name], kafka.TopicPolicy(1, brokers + 1, 1))
    assert name not in admin.list_topics(timeout=10).topics
    kafka.ensure_topics(admin, [name], kafka.TopicPolicy(2, 1, 1))
    metadata = admin.list_topics(name, timeout=10).topics[name]
    assert len(metadata.partitions) == 2
    assert {len(p.replicas) for p in metadata.partitions.values()} == {1}
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["min.insync.replicas"].value == "1"


def test_ranged_gets_of_the_embedded_store_return_exactly_the_range(stack: Settings) -> None:
    """services.stack.s3_server serves a plain `bytes=a-b` range without reading the whole
    object: the bytes must still be exactly moto's (a range at the start, inside, the last
    byte), and a whole GET is untouched."""
    import os
    import uuid

    from services.common.objectstore import object_store

    store = object_store(stack)
    key = f"test/ranges/{uuid.uuid4().hex}"
    data = os.urandom(3 << 20)
    store.put_bytes(key, data)
    try:
        for offset, length in ((0, 1), (0, 4096), (1_234_567, 1_900_000), (len(data) - 1, 1)):
            assert store.get_range(key, offset, length) == data[offset : offset + length]
        assert store.get_bytes(key) == data
        info = store.stat(key)
        assert info is not None and info.size == len(data)
    finally:
        store.delete(key)


def test_up_with_its_own_endpoints_in_the_environment_keeps_them_its_own(
    stack: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`set -a; . .stack/endpoints.env` then `egoline stack up`: the services named are this
    stack's own, so they stay its own (reused, stopped by `down`, the emulator's credentials
    still accepted), instead of being taken for external ones and forgotten."""
    from services.common.settings import reset_settings_cache

    before = Stack(stack.stack_dir).read_state()
    endpoints = stack.stack_dir / "endpoints.env"
    for line in endpoints.read_text().splitlines():
        name, _, value = line.partition("=")
        monkeypatch.setenv(name, value)
    reset_settings_cache()
    try:
        stack_up(Settings(), log=lambda _line: None)
    finally:
        reset_settings_cache()
    after = Stack(stack.stack_dir).read_state()
    assert after == before
    assert all(s.started_by_us for s in after.values())
    assert "EGOLINE_EMBEDDED_STACK=true" in endpoints.read_text().splitlines()
