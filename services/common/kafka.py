"""The one place Kafka clients are configured: librdkafka configs and the faststream broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from services.common.settings import DeviceSettings, Settings


def client_config(settings: DeviceSettings) -> dict[str, Any]:
    """librdkafka settings shared by producers, consumers and the admin client."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.require("kafka.bootstrap"),
        "security.protocol": settings.kafka.security_protocol.lower(),
        # Brokers (and Tansu after ~2.5 s) close idle connections; clients reconnect by
        # themselves, so the per-close log line is noise.
        "log.connection.close": False,
    }
    for option, value in (
        ("ssl.ca.location", settings.kafka.ssl_ca_location),
        ("ssl.certificate.location", settings.kafka.ssl_certificate_location),
        ("ssl.key.location", settings.kafka.ssl_key_location),
    ):
        if value:
            config[option] = value
    if settings.kafka.ssl_key_password is not None:
        config["ssl.key.password"] = settings.kafka.ssl_key_password.get_secret_value()
    if settings.kafka.sasl_mechanism:
        config["sasl.mechanism"] = settings.kafka.sasl_mechanism
        config["sasl.username"] = settings.kafka.sasl_username or ""
        if settings.kafka.sasl_password is not None:
            config["sasl.password"] = settings.kafka.sasl_password.get_secret_value()
    return config


def producer_config(settings: DeviceSettings) -> dict[str, Any]:
    """An idempotent producer: retries never duplicate a record within a partition."""
    return {
        **client_config(settings),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
    }


def consumer_config(settings: DeviceSettings, group_id: str) -> dict[str, Any]:
    """A consumer that commits only what the caller stores/commits explicitly."""
    return {
        **client_config(settings),
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": settings.kafka.session_timeout_ms,
        "heartbeat.interval.ms": settings.kafka.heartbeat_interval_ms,
        "partition.assignment.strategy": settings.kafka.assignment_strategy,
    }


def admin_client(settings: DeviceSettings) -> AdminClient:
    return AdminClient(client_config(settings))


@dataclass(frozen=True)
class TopicPolicy:
    """How topics are created: final partition count and durability."""

    partitions: int
    replication_factor: int = 1
    min_insync_replicas: int = 1


def production_topic_policy(settings: Settings, embedded_broker: bool) -> TopicPolicy:
    """The pipeline's topics' policy from settings. One replica is what the embedded (one-node,
    memory-only) broker has; on a real cluster it loses acknowledged records with a broker, so
    it is refused there unless `EGOLINE_TOPIC_ALLOW_SINGLE_REPLICA=true` says so."""
    policy = TopicPolicy(
        settings.topic_partitions,
        settings.topic_replication_factor,
        settings.topic_min_insync_replicas,
    )
    if policy.min_insync_replicas > policy.replication_factor:
        raise ValueError(
            f"EGOLINE_TOPIC_MIN_INSYNC_REPLICAS={policy.min_insync_replicas} is more than "
            f"EGOLINE_TOPIC_REPLICATION_FACTOR={policy.replication_factor}: no write succeeds"
        )
    single = policy.replication_factor == 1 and not embedded_broker
    if single and not settings.topic_allow_single_replica:
        raise RuntimeError(
            "refusing to create production topics with one replica: set "
            "EGOLINE_TOPIC_REPLICATION_FACTOR (3, with EGOLINE_TOPIC_MIN_INSYNC_REPLICAS=2, "
            "on a cluster of three or more brokers), or EGOLINE_TOPIC_ALLOW_SINGLE_REPLICA="
            "true for a single-broker cluster"
        )
    return policy


def ensure_topics(
    admin: AdminClient,
    topics: Iterable[str],
    policy: TopicPolicy | int,
    timeout_s: float = 30.0,
) -> None:
    """Create the topics that don't exist yet, with their final partition count, replication
    factor and `min.insync.replicas` (an int: that many partitions, one replica).

    Partitions are fixed at creation: adding them later reshuffles keys (and the embedded
    broker can't do it at all), so the count is chosen up front. A replication factor larger
    than the cluster's broker count is refused before anything is created.
    """
    if isinstance(policy, int):
        policy = TopicPolicy(policy)
    wanted = [t for t in topics]
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = admin.list_topics(timeout=10)
        existing = set(metadata.topics)
        missing = [t for t in wanted if t not in existing]
        if not missing:
            return
        brokers = len(metadata.brokers)
        if brokers and policy.replication_factor > brokers:
            raise RuntimeError(
                f"replication factor {policy.replication_factor} needs as many brokers; the "
                f"cluster has {brokers} (EGOLINE_TOPIC_REPLICATION_FACTOR)"
            )
        futures = admin.create_topics(
            [
                NewTopic(
                    t,
                    num_partitions=policy.partitions,
                    replication_factor=policy.replication_factor,
                    config={"min.insync.replicas": str(policy.min_insync_replicas)},
                )
                for t in missing
            ]
        )
        for topic, future in futures.items():
            try:
                future.result(timeout=10)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise RuntimeError(f"cannot create topic {topic}: {exc}") from exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics still missing after {timeout_s}s: {missing}")


def read_topic(
    settings: DeviceSettings, topic: str, quiet_s: float = 2.0, limit_s: float = 30.0
) -> list[Message]:
    """Every record of `topic` from the beginning, reading until no record arrived for
    `quiet_s` (for counting what was published, from outside the consumers: tests, benches).

    (ListOffsets high watermarks are not trusted: the embedded broker reports them wrong.)
    """
    consumer = Consumer(
        {
            **client_config(settings),
            "group.id": f"egoline-read-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[Message] = []
        last = started = time.monotonic()
        while time.monotonic() - last < quiet_s and time.monotonic() - started < limit_s:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                records.append(msg)
                last = time.monotonic()
        return records
    finally:
        consumer.close()
