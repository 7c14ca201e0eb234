"""`egoline stack check-broker`: measure how the configured broker deviates from Apache Kafka.

Each check is a real round trip against the broker; the report is what docs/stack.md cites.
Nothing in the services is tuned to these results: they stay written for Apache Kafka.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

from services.common import kafka
from services.common.settings import Settings


def _topic(settings: Settings, partitions: int = 1) -> str:
    name = f"_egoline.check.{uuid.uuid4().hex[:8]}"
    kafka.ensure_topics(kafka.admin_client(settings), [name], partitions)
    return name


def high_watermark_after_one_batch(settings: Settings, messages: int = 10) -> dict[str, Any]:
    """Produce `messages` records in one batch; compare ListOffsets with what a consumer sees."""
    topic = _topic(settings)
    producer = Producer({**kafka.producer_config(settings), "linger.ms": 200})
    for i in range(messages):
        producer.produce(topic, value=str(i).encode())
    producer.flush(10)
    consumer = Consumer(
        {
            **kafka.client_config(settings),
            "group.id": f"check-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    try:
        listed = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen = 0
        deadline = time.monotonic() + 10
        while seen < messages and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen += 1
        cached = consumer.get_watermark_offsets(TopicPartition(topic, 0), cached=True)
    finally:
        consumer.close()
    return {
        "produced": messages,
        "consumed": seen,
        "list_offsets_high": listed[1],
        "fetch_response_high": cached[1] if cached else None,
        "ok": listed[1] == messages,
    }


def create_partitions_supported(settings: Settings) -> dict[str, Any]:
    topic = _topic(settings)
    admin = kafka.admin_client(settings)
    try:
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(timeout=10)
    except KafkaException as exc:
        return {"ok": False, "error": str(exc)[:200]}
    return {"ok": True}


def rejoin_after_early_leave(settings: Settings, wait_s: float = 30.0) -> dict[str, Any]:
    """A member closes (LeaveGroup) before its first join completes; does the next member of the
    same group get partitions? Apache Kafka: yes, within the join time."""
    topic = _topic(settings)
    group = f"check-{uuid.uuid4().hex[:6]}"
    first = Consumer(kafka.consumer_config(settings, group))
    first.subscribe([topic])
    first.poll(1.0)
    first.close()
    second = Consumer(kafka.consumer_config(settings, group))
    second.subscribe([topic])
    started = time.monotonic()
    try:
        while time.monotonic() - started < wait_s:
            second.poll(0.5)
            if second.assignment():
                return {"ok": True, "assigned_after_s": round(time.monotonic() - started, 1)}
    finally:
        second.close()
    return {"ok": False, "assigned_after_s": None, "waited_s": wait_s}


def check_broker(settings: Settings, groups: bool = False) -> dict[str, Any]:
    report = {
        "high_watermark": high_watermark_after_one_batch(settings),
        "create_partitions": create_partitions_supported(settings),
    }
    if groups:
        report["rejoin_after_early_leave"] = rejoin_after_early_leave(settings)
    return report
