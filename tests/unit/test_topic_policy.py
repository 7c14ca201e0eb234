"""Topic durability from settings: one replica only on the embedded broker unless allowed."""

from __future__ import annotations

import pytest

from services.common.kafka import TopicPolicy, production_topic_policy
from services.common.settings import Settings


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


def test_the_embedded_broker_takes_one_replica() -> None:
    assert production_topic_policy(settings(topic_partitions=6), True) == TopicPolicy(6, 1, 1)


def test_a_real_cluster_with_one_replica_is_refused_unless_allowed() -> None:
    with pytest.raises(RuntimeError, match="refusing to create production topics"):
        production_topic_policy(settings(), embedded_broker=False)
    allowed = production_topic_policy(settings(topic_allow_single_replica=True), False)
    assert allowed.replication_factor == 1


def test_three_replicas_two_in_sync_for_a_cluster() -> None:
    policy = production_topic_policy(
        settings(topic_replication_factor=3, topic_min_insync_replicas=2), False
    )
    assert (policy.replication_factor, policy.min_insync_replicas) == (3, 2)


def test_more_in_sync_replicas_than_replicas_is_refused() -> None:
    with pytest.raises(ValueError, match="no write succeeds"):
        production_topic_policy(
            settings(topic_replication_factor=2, topic_min_insync_replicas=3), False
        )
