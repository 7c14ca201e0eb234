"""The one place Kafka clients are configured: librdkafka configs and the faststream broker."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from services.common.settings import Settings


def client_config(settings: Settings) -> dict[str, Any]:
    """librdkafka settings shared by producers, consumers and the admin client."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.require("kafka_bootstrap"),
        "security.protocol": settings.kafka_security_protocol.lower(),
        # Brokers (and Tansu after ~2.5 s) close idle connections; clients reconnect by
        # themselves, so the per-close log line is noise.
        "log.connection.close": False,
    }
    for option, value in (
        ("ssl.ca.location", settings.kafka_ssl_ca_location),
        ("ssl.certificate.location", settings.kafka_ssl_certificate_location),
        ("ssl.key.location", settings.kafka_ssl_key_location),
    ):
        if value:
            config[option] = value
    if settings.kafka_ssl_key_password is not None:
        config["ssl.key.password"] = settings.kafka_ssl_key_password.get_secret_value()
    if settings.kafka_sasl_mechanism:
        config["sasl.mechanism"] = settings.kafka_sasl_mechanism
        config["sasl.username"] = settings.kafka_sasl_username or ""
        if settings.kafka_sasl_password is not None:
            config["sasl.password"] = settings.kafka_sasl_password.get_secret_value()
    return config


def producer_config(settings: Settings) -> dict[str, Any]:
    """An idempotent producer: retries never duplicate a record within a partition."""
    return {
        **client_config(settings),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
    }


def consumer_config(settings: Settings, group_id: str) -> dict[str, Any]:
    """A consumer that commits only what the caller stores/commits explicitly."""
    return {
        **client_config(settings),
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": settings.kafka_session_timeout_ms,
        "heartbeat.interval.ms": settings.kafka_heartbeat_interval_ms,
        "partition.assignment.strategy": settings.kafka_assignment_strategy,
    }


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(client_config(settings))


def ensure_topics(
    admin: AdminClient, topics: Iterable[str], partitions: int, timeout_s: float = 30.0
) -> None:
    """Create the topics that don't exist yet, with their final partition count.

    Partitions are fixed at creation: adding them later reshuffles keys (and the embedded
    broker can't do it at all), so the count is chosen up front.
    """
    wanted = [t for t in topics]
    deadline = time.monotonic() + timeout_s
    while True:
        existing = set(admin.list_topics(timeout=10).topics)
        missing = [t for t in wanted if t not in existing]
        if not missing:
            return
        futures = admin.create_topics(
            [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in missing]
        )
        for topic, future in futures.items():
            try:
                future.result(timeout=10)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise RuntimeError(f"cannot create topic {topic}: {exc}") from exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics still missing after {timeout_s}s: {missing}")
