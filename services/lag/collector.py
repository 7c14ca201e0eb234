"""Reading committed and log-end offsets from the broker (the I/O edge of lag monitoring).

Log-end offsets: the ListOffsets answer (`get_watermark_offsets`) and the high watermark of a
fetch response (a consumer parked at the end of every partition, `cached=True`) are both read,
and the larger is used. On Apache Kafka they agree; the embedded broker's ListOffsets reports
the base offset of the last batch + 1 instead (docs/stack.md), and the fetch watermark is right.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from pydantic import ValidationError

from schemas.events import TOPIC_CONSUMER_STATUS, ConsumerStatus
from services.common import kafka
from services.common.settings import Settings

log = logging.getLogger("egoline.lag")


@dataclass(frozen=True)
class PartitionOffsets:
    group: str
    topic: str
    partition: int
    committed: int  # the committed offset, or the log start when the group never committed
    end: int
    at: float
    never_committed: bool = False  # no committed offset on this partition: counted from start


class OffsetReader:
    """Committed offsets per group (Admin API) and log-end offsets per partition."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.admin = kafka.admin_client(settings)
        self._watcher = Consumer(
            {
                **kafka.client_config(settings),
                "group.id": f"egoline-lag-watch-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
            }
        )
        self._watched: set[tuple[str, int]] = set()

    def close(self) -> None:
        self._watcher.close()

    def committed(self, group: str) -> dict[tuple[str, int], int]:
        future = self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
        result = future[group].result(timeout=10)
        return {
            (tp.topic, tp.partition): tp.offset
            for tp in result.topic_partitions
            if tp.offset is not None and tp.offset >= 0
        }

    def ends(self, partitions: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Log-end offset of each partition: the larger of ListOffsets and the fetch watermark."""
        if partitions - self._watched:
            self._watched |= partitions
            self._watcher.assign(
                [TopicPartition(t, p, -1) for t, p in sorted(self._watched)]  # -1: OFFSET_END
            )
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            self._watcher.poll(0.1)  # fetch responses refresh the cached watermarks
        ends = {}
        for topic, partition in partitions:
            tp = TopicPartition(topic, partition)
            listed = self._watcher.get_watermark_offsets(tp, timeout=5, cached=False)[1]
            fetched = self._watcher.get_watermark_offsets(tp, cached=True)
            ends[(topic, partition)] = max(listed, fetched[1] if fetched else -1)
        return ends

    def read(self, groups: Mapping[str, Sequence[str]]) -> list[PartitionOffsets]:
        """Offsets of every partition of each group's topics: the topics it has committed on
        and the topics it is declared to consume (`groups`: group -> topics), so a group that
        has never committed is listed too, counted from each partition's log start."""
        committed = {g: self.committed(g) for g in groups}
        metadata = self.admin.list_topics(timeout=10).topics
        never: set[tuple[str, str, int]] = set()
        for group, offsets in committed.items():
            for topic in {t for t, _ in offsets} | set(groups[group]):
                for partition in metadata[topic].partitions if topic in metadata else ():
                    if (topic, partition) not in offsets:
                        low = self._watcher.get_watermark_offsets(
                            TopicPartition(topic, partition), timeout=5, cached=False
                        )[0]
                        offsets[(topic, partition)] = max(0, low)
                        never.add((group, topic, partition))
        partitions = {tp for offsets in committed.values() for tp in offsets}
        ends = self.ends(partitions) if partitions else {}
        now = time.time()
        return [
            PartitionOffsets(g, t, p, offset, ends[(t, p)], now, (g, t, p) in never)
            for g, offsets in committed.items()
            for (t, p), offset in sorted(offsets.items())
        ]


class StatusReader:
    """The latest `egoline.consumer-status` event of each group, read from the topic's start
    and then incrementally (a consumer of its own, assigned, never committing)."""

    def __init__(self, settings: Settings) -> None:
        self._consumer = Consumer(
            {
                **kafka.client_config(settings),
                "group.id": f"egoline-lag-status-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
            }
        )
        self._assigned = False
        self.latest: dict[str, ConsumerStatus] = {}

    def close(self) -> None:
        self._consumer.close()

    def read(self, max_s: float = 1.0) -> dict[str, ConsumerStatus]:
        if not self._assigned:
            topics = self._consumer.list_topics(TOPIC_CONSUMER_STATUS, timeout=10).topics
            meta = topics.get(TOPIC_CONSUMER_STATUS)
            if meta is None or meta.error is not None:
                return self.latest  # the topic does not exist yet: no consumer reported
            self._consumer.assign(
                [TopicPartition(TOPIC_CONSUMER_STATUS, p, -2) for p in meta.partitions]  # start
            )
            self._assigned = True
        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline:
            msg = self._consumer.poll(0.1)
            if msg is None or msg.error() is not None:
                continue
            try:
                status = ConsumerStatus.model_validate_json(msg.value() or b"")
            except ValidationError as exc:
                log.warning("unreadable consumer status at offset %s: %s", msg.offset(), exc)
                continue
            known = self.latest.get(status.group)
            if known is None or status.at >= known.at:
                self.latest[status.group] = status
        return self.latest
