"""A full run with every kind of credential set (S3 secret key, database password, Kafka SASL
password) leaves none of them in any service log, the agent's log or any event."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from pydantic import SecretStr

from schemas.events import ALL_TOPICS
from services.common.redact import secret_values
from services.common.settings import Settings
from services.stack.fleet import Fleet
from tests.fixtures.kafka_read import read_topic
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected

DB_PASSWORD = "pg-pass-i15-9f3c"
SASL_PASSWORD = "sasl-pass-i15-7b21"


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{parts.username or 'postgres'}:{password}@{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
def credentialed(stack: Settings, fleet: Fleet, tmp_path: Path) -> Iterator[Settings]:
    """The shared fleet restarted with a database password and SASL credentials in its
    environment, logging from its first line to fresh files (and restarted without them
    afterwards).

    The embedded Postgres trusts local connections and ignores the password; the embedded broker
    speaks PLAINTEXT, so librdkafka is handed the SASL settings and skips them. Either way the
    secrets travel the same path as in production: settings, client configs, connection URLs."""
    env = {
        "EGOLINE_DATABASE_URL": with_password(stack.require("database_url"), DB_PASSWORD),
        "EGOLINE_KAFKA_SASL_MECHANISM": "PLAIN",
        "EGOLINE_KAFKA_SASL_USERNAME": "egoline-ingest",
        "EGOLINE_KAFKA_SASL_PASSWORD": SASL_PASSWORD,
    }
    plain, plain_logs = dict(fleet.env), fleet.log_dir
    fleet.stop()
    fleet.env, fleet.log_dir = {**plain, **env}, tmp_path / "credentialed-logs"
    fleet.start_all()
    fleet.wait_ready()
    try:
        yield Settings(
            _env_file=None,
            **{
                **stack.model_dump(exclude={"kafka"}),
                "kafka": {
                    **stack.kafka.model_dump(),
                    "sasl_mechanism": "PLAIN",
                    "sasl_username": env["EGOLINE_KAFKA_SASL_USERNAME"],
                    "sasl_password": SecretStr(SASL_PASSWORD),
                },
                "database_url": env["EGOLINE_DATABASE_URL"],
            },
        )
    finally:
        fleet.stop()
        fleet.env, fleet.log_dir = plain, plain_logs
        fleet.start_all()
        fleet.wait_ready()


def test_no_credential_reaches_a_log_or_an_event(
    stack: Settings,
    fleet: Fleet,
    credentialed: Settings,
    episode_factory: EpisodeFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    secrets = secret_values(credentialed)
    assert credentialed.s3.secret_key.get_secret_value() in secrets
    assert DB_PASSWORD in secrets and SASL_PASSWORD in secrets
    dirs = episode_factory(2, seed=int(time.time()) % 10_000 + 40_000, duration_s=(4.5, 5.5))
    caplog.set_level(logging.DEBUG)
    agent = device_agent(credentialed, tmp_path / "agent")
    assert agent.run_once(dirs, 60).get("published") == 2
    ids = [d.name for d in dirs]
    wait_for(lambda: set(episode_states(stack, ids).values()) == {"sharded"}, 120, "sharded")

    logs = sorted(fleet.log_dir.glob("*.log"))
    assert logs, "the fleet writes a log per service"
    assert any(log.stat().st_size for log in logs), "the services logged this run"
    for log in logs:
        text = log.read_bytes()
        for secret in secrets:
            assert secret.encode() not in text, f"{secret[:2]}... in {log.name}"
    for secret in secrets:
        assert secret not in caplog.text, f"{secret[:2]}... in the agent's log"
    records = [m for topic in ALL_TOPICS for m in read_topic(stack, topic, quiet_s=1.0)]
    assert records
    for message in records:
        payload = (message.value() or b"") + (message.key() or b"")
        for secret in secrets:
            assert secret.encode() not in payload, f"{secret[:2]}... in {message.topic()}"
