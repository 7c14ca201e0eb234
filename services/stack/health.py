"""Readiness probes that prove each service is usable, not merely listening."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from services.common import kafka
from services.common.objectstore import object_store
from services.common.redact import redact_url
from services.common.settings import Settings
from services.stack.launcher import HEALTH_TOPIC, Health

T = TypeVar("T")


def kafka_round_trip(settings: Settings, timeout_s: float = 10.0) -> None:
    """Produce one record to the health topic and read exactly that record back."""
    admin = kafka.admin_client(settings)
    kafka.ensure_topics(admin, [HEALTH_TOPIC], 1)
    token = uuid.uuid4().hex.encode()
    producer = Producer(kafka.producer_config(settings))
    delivered: list[int] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is None:
            delivered.append(msg.offset())  # type: ignore[attr-defined]

    producer.produce(HEALTH_TOPIC, value=token, on_delivery=on_delivery)
    producer.flush(timeout_s)
    if not delivered:
        raise RuntimeError("kafka: produce was not acknowledged")
    consumer = Consumer(
        {
            **kafka.client_config(settings),
            "group.id": "egoline-healthcheck",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(HEALTH_TOPIC, 0, delivered[0])])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None and msg.value() == token:
                return
        raise RuntimeError("kafka: produced record was not consumed back")
    finally:
        consumer.close()


def postgres_query(settings: Settings) -> None:
    with psycopg.connect(settings.database_libpq_url, connect_timeout=5) as conn:
        conn.execute("SELECT 1").fetchone()


def postgres_create_database(settings: Settings) -> None:
    """Create the warehouse database on an embedded server (it starts with `postgres` only)."""
    url = settings.database_libpq_url
    base, _, dbname = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True, connect_timeout=5) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if not exists:
            conn.execute(
                psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(dbname))
            )


def s3_round_trip(settings: Settings) -> None:
    store = object_store(settings)
    store.ensure_bucket()
    key = f"_healthcheck/{uuid.uuid4().hex}"
    store.put_bytes(key, b"ok")
    if store.get_bytes(key) != b"ok":
        raise RuntimeError("s3: read back differs")
    store.delete(key)


def retry_until(probe: Callable[[], T], timeout_s: float, interval_s: float = 0.3) -> T:
    """Call `probe` until it returns without raising, or raise its last error at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return probe()
        except Exception:
            if time.monotonic() >= deadline:
                raise
            time.sleep(interval_s)


def check(settings: Settings, timeout_s: float = 0.0) -> dict[str, Health]:
    """Probe all three services; with a timeout, keep retrying each until it passes."""
    probes: dict[str, tuple[str | None, Callable[[], None]]] = {
        "kafka": (settings.kafka.bootstrap, lambda: kafka_round_trip(settings)),
        "postgres": (settings.database_dsn, lambda: postgres_query(settings)),
        "s3": (settings.s3.endpoint, lambda: s3_round_trip(settings)),
    }
    report: dict[str, Health] = {}
    for name, (endpoint, probe) in probes.items():
        if not endpoint:
            report[name] = Health(ok=False, endpoint=None, detail="not configured")
            continue
        try:
            retry_until(probe, timeout_s)
            report[name] = Health(ok=True, endpoint=redact_url(endpoint))
        except Exception as exc:
            report[name] = Health(ok=False, endpoint=redact_url(endpoint), detail=str(exc)[:300])
    return report
