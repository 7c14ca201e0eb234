"""Lag readings on the real broker: the log-end offset is right even where the embedded broker's
ListOffsets is not, and a group that stops committing while lagging is reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from services.common import kafka
from services.common.settings import Settings
from services.lag.collector import OffsetReader
from services.lag.monitor import LagMonitor
from services.stack.fleet import Fleet, ready
from services.stack.launcher import Stack, free_port
from tests.fixtures.http import http_get
from tests.fixtures.lag import idle_group, produce, running_lag_service
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected


def test_end_offsets_and_lag_are_right_for_a_batched_topic(stack: Settings) -> None:
    topic = f"lagtest.{uuid.uuid4().hex[:8]}"
    group = f"lagtest-{uuid.uuid4().hex[:8]}"
    kafka.ensure_topics(kafka.admin_client(stack), [topic], 1)
    producer = Producer({**kafka.producer_config(stack), "linger.ms": 200})
    for i in range(10):  # one record batch: ListOffsets on the embedded broker says 1
        producer.produce(topic, value=str(i).encode())
    producer.flush(10)
    consumer = Consumer({**kafka.consumer_config(stack, group)})
    consumer.assign([TopicPartition(topic, 0, 0)])
    taken = 0
    deadline = time.monotonic() + 20
    while taken < 4 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            taken += 1
    consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    consumer.close()

    reader = OffsetReader(stack)
    monitor = LagMonitor()
    try:
        for _ in range(3):
            monitor.observe(reader.read({group: ()}))
            time.sleep(0.5)
    finally:
        reader.close()
    (partition,) = monitor.report(time.time())[group].partitions
    assert (partition.committed, partition.end, partition.lag) == (4, 10, 6)
    # the consumer committed once and went away while 6 behind: Burrow's STOP rule applies as
    # soon as it has been idle longer than its window spans
    assert partition.status.name in ("STOP", "OK")
    later = monitor.report(time.time() + 60)[group]
    assert later.partitions[0].status.name == "STOP"
    assert later.status.name == "ERR"  # a group is its worst partition, clamped to ERR


def lag_json(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lag.json", timeout=2) as resp:
            return dict(json.loads(resp.read()))
    except OSError:
        return {}


def test_a_paused_stage_lags_then_drains_to_ok(
    stack: Settings, fleet: Fleet, episode_factory: EpisodeFactory, tmp_path: Path
) -> None:
    port = free_port()
    service = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve", "lag"],
        env={**os.environ, "EGOLINE_METRICS_PORT": str(port), "EGOLINE_START_JITTER_S": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    decode = fleet.procs["decode-0"]
    try:
        wait_for(lambda: lag_json(port).get("last_ok"), 30, "the lag service's first reading")
        dirs = episode_factory(4, seed=7000 + int(time.time()) % 900)
        agent = device_agent(stack, tmp_path / "agent")
        # one episode first, so the decode group has committed offsets to measure from
        agent.run_once(dirs[:1], 30)
        wait_for(
            lambda: episode_states(stack, [dirs[0].name]) == {dirs[0].name: "sharded"},
            60,
            "the first episode",
        )
        os.kill(decode.pid, signal.SIGSTOP)
        try:
            agent.run_once(dirs[1:], 30)

            seen: list[str] = []  # the group's status at each reading showing the backlog

            def lagging() -> bool:
                group = lag_json(port).get("groups", {}).get("egoline-decode", {})
                if group.get("total_lag", 0) >= 3:
                    seen.append(str(group.get("status")))
                return bool(seen) and seen[-1] in ("WARN", "ERR")

            # a paused consumer commits nothing while its lag grows: Burrow's STOP (ERR), or
            # WARN on the way. UNKNOWN (lag could not be read) or OK would hide the outage.
            try:
                wait_for(lagging, 60, "decode WARN or ERR while paused")
            except AssertionError as exc:
                raise AssertionError(f"paused decode read as {seen[-10:]}") from exc
            assert "UNKNOWN" not in seen, seen
        finally:
            os.kill(decode.pid, signal.SIGCONT)

        def drained() -> bool:
            group = lag_json(port).get("groups", {}).get("egoline-decode", {})
            return bool(group.get("total_lag") == 0 and group.get("status") == "OK")

        wait_for(drained, 120, "decode drained back to OK")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        assert 'kafka_consumergroup_group_sum_lag{group="egoline-decode"} 0.0' in metrics
    finally:
        service.terminate()
        service.wait(10)


def test_the_lag_service_survives_a_broker_outage(
    stack: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    """SIGSTOP the embedded broker (never restart it: it is memory-only): the lag service stays
    up, reports UNKNOWN and answers /readyz 503, then recovers after SIGCONT."""
    kafka_state = Stack(stack.stack_dir).read_state().get("kafka")
    if kafka_state is None or not kafka_state.started_by_us or kafka_state.pid is None:
        pytest.skip("the broker is external: this test pauses the embedded one")
    broker_pid = kafka_state.pid
    controlled = idle_group(stack, "lagoutage", partitions=1)
    produce(stack, controlled.topic, 5)
    with running_lag_service(tmp_path, [controlled.group]) as service:
        wait_for(
            lambda: service.group(controlled.group).get("total_lag") == 5,
            60,
            "the lag service reading 5 messages of lag",
        )
        assert http_get(service.port, "/readyz") == (200, "ready")
        paused_at = time.time()
        os.kill(broker_pid, signal.SIGSTOP)
        try:

            def unknown() -> dict[str, Any]:
                snapshot = service.lag_json()
                group = snapshot.get("groups", {}).get(controlled.group, {})
                return (
                    snapshot if snapshot.get("error") and group.get("status") == "UNKNOWN" else {}
                )

            during = wait_for(unknown, 60, "UNKNOWN while the broker is paused")
            assert service.proc.poll() is None
            assert during["last_ok"] is not None and during["last_ok"] < paused_at + 5
            assert http_get(service.port, "/healthz") == (200, "ok")
            assert http_get(service.port, "/readyz")[0] == 503
            code, metrics = http_get(service.port, "/metrics")
            assert code == 200
            assert f'egoline_consumergroup_status{{group="{controlled.group}"}} 2.0' in metrics
            # the stages lose their partitions once the coordinator has been unreachable for
            # a session timeout: their /readyz turns 503 while /healthz stays 200
            decode_port = fleet.metrics_ports["decode-0"]
            wait_for(
                lambda: http_get(decode_port, "/readyz")[0] == 503,
                60,
                "decode not ready while the broker is paused",
            )
            assert http_get(decode_port, "/healthz") == (200, "ok")
        finally:
            os.kill(broker_pid, signal.SIGCONT)
        resumed_at = time.time()

        def recovered() -> bool:
            snapshot = service.lag_json()
            group = snapshot.get("groups", {}).get(controlled.group, {})
            return bool(
                snapshot.get("error") is None
                and (snapshot.get("last_ok") or 0) > resumed_at
                and group.get("total_lag") == 5
                and group.get("status") != "UNKNOWN"
            )

        wait_for(recovered, 60, "readings again after the broker resumed")
        assert service.proc.poll() is None
        assert http_get(service.port, "/readyz") == (200, "ready")
    # the session's stage services rejoin their groups too (later tests use them)
    for name, port in sorted(fleet.metrics_ports.items()):
        wait_for(partial(ready, port), 120, f"{name} ready again after the outage")
