"""Reading committed and log-end offsets from the broker (the I/O edge of lag monitoring).

Log-end offsets: the ListOffsets answer (`get_watermark_offsets`) and the high watermark of a
fetch response (a consumer parked at the end of every partition, `cached=True`) are both read,
and the larger is used. On Apache Kafka they agree; the embedded broker's ListOffsets reports
the base offset of the last batch + 1 instead (docs/stack.md), and the fetch watermark is right.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition

from services.common import kafka
from services.common.settings import Settings


@dataclass(frozen=True)
class PartitionOffsets:
    group: str
    topic: str
    partition: int
    committed: int
    end: int
    at: float


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

    def read(self, groups: list[str]) -> list[PartitionOffsets]:
        committed = {g: self.committed(g) for g in groups}
        # A group consuming a topic lags on every partition of it, including partitions it
        # has never committed on: those count from the log start.
        topics = {t for offsets in committed.values() for t, _ in offsets}
        metadata = self.admin.list_topics(timeout=10).topics if topics else {}
        for offsets in committed.values():
            for topic in {t for t, _ in offsets}:
                for partition in metadata[topic].partitions if topic in metadata else ():
                    if (topic, partition) not in offsets:
                        low = self._watcher.get_watermark_offsets(
                            TopicPartition(topic, partition), timeout=5, cached=False
                        )[0]
                        offsets[(topic, partition)] = max(0, low)
        partitions = {tp for offsets in committed.values() for tp in offsets}
        ends = self.ends(partitions) if partitions else {}
        now = time.time()
        return [
            PartitionOffsets(g, t, p, offset, ends[(t, p)], now)
            for g, offsets in committed.items()
            for (t, p), offset in sorted(offsets.items())
        ]
