"""Lag readings on the real broker: the log-end offset is right even where the embedded broker's
ListOffsets is not, and a group that stops committing while lagging is reported."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from services.common import kafka
from services.common.settings import Settings
from services.lag.collector import OffsetReader
from services.lag.monitor import LagMonitor

pytestmark = pytest.mark.connected


def test_end_offsets_and_lag_are_right_for_a_batched_topic(stack: Settings) -> None:
    topic = f"lagtest.{uuid.uuid4().hex[:8]}"
    group = f"lagtest-{uuid.uuid4().hex[:8]}"
    kafka.ensure_topics(kafka.admin_client(stack), [topic], partitions=1)
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
            monitor.observe(reader.read([group]))
            time.sleep(0.5)
    finally:
        reader.close()
    (partition,) = monitor.report(time.time())[group]["partitions"]
    assert (partition["committed"], partition["end"], partition["lag"]) == (4, 10, 6)
    # the consumer committed once and went away while 6 behind: Burrow's STOP rule applies as
    # soon as it has been idle longer than its window spans
    assert partition["status"] in ("STOP", "OK")
    later = monitor.report(time.time() + 60)[group]
    assert later["partitions"][0]["status"] == "STOP"
    assert later["status"] == "ERR"  # a group is its worst partition, clamped to ERR
