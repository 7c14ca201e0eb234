"""A full run leaves no credential in any service log or any event."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from schemas.events import ALL_TOPICS
from services.agent.runner import make_agent
from services.common.objectstore import object_store
from services.common.redact import secret_values
from services.common.settings import Settings
from services.stack.fleet import Fleet
from tests.fixtures.kafka_read import read_topic
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import episode_states

pytestmark = pytest.mark.connected


def test_no_credential_reaches_a_log_or_an_event(
    stack: Settings, fleet: Fleet, episode_factory: EpisodeFactory, tmp_path: Path
) -> None:
    dirs = episode_factory(2, seed=int(time.time()) % 10_000 + 40_000, duration_s=(4.5, 5.5))
    agent = make_agent(
        stack.model_copy(update={"agent_state_dir": tmp_path / "agent"}), object_store(stack)
    )
    assert agent.run_once(dirs, 60).get("published") == 2
    ids = [d.name for d in dirs]
    wait_for(lambda: set(episode_states(stack, ids).values()) == {"sharded"}, 120, "sharded")

    secrets = secret_values(stack)
    assert stack.s3_secret_key.get_secret_value() in secrets
    logs = sorted(fleet.log_dir.glob("*.log"))
    assert logs, "the fleet writes a log per service"
    for log in logs:
        text = log.read_bytes()
        for secret in secrets:
            assert secret.encode() not in text, f"{secret[:2]}... in {log.name}"
    records = [m for topic in ALL_TOPICS for m in read_topic(stack, topic, quiet_s=1.0)]
    assert records
    for message in records:
        payload = (message.value() or b"") + (message.key() or b"")
        for secret in secrets:
            assert secret.encode() not in payload, f"{secret[:2]}... in {message.topic()}"
