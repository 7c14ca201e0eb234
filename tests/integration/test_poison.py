"""Poison records on every topic: hypothesis-generated malformed JSON, wrong types, huge fields
and unknown schema versions each land in a DLQ with a reason, from every consumer of the topic,
and a valid episode keyed like the poison (so on the same partitions, after it) still flows."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from schemas.events import (
    DLQ_TOPICS,
    STAGE_TOPICS,
    TOPIC_DECODED,
    TOPIC_METADATA_DLQ,
    TOPIC_SHARDS,
    TOPIC_UPLOADED,
    TOPIC_VALIDATED,
    dlq_topic,
)
from services.common import kafka
from services.common.settings import Settings
from services.stack.fleet import Fleet
from tests.fixtures.kafka_read import read_topic
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected

# Who consumes each topic, by the `stage` they write into their dead letters.
CONSUMERS = {
    TOPIC_UPLOADED: {"decode", "metadata"},
    TOPIC_DECODED: {"validate", "metadata"},
    TOPIC_VALIDATED: {"shard", "metadata"},
    TOPIC_SHARDS: {"metadata"},
    dlq_topic(TOPIC_UPLOADED): {"metadata"},
}
REJECT_CODES = {"malformed_event", "unknown_schema_version"}
# Fields whose values are bounded by the schema (pattern or length): a huge value is invalid.
BOUNDED = {"event_id", "episode_id", "device_id", "session_id", "sha256", "shard_sha256", "key"}

Path_ = tuple[str | int, ...]


def leaf_paths(node: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every path into a JSON document (into lists through their first element)."""
    out: list[Path_] = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += leaf_paths(v, (*prefix, k))
    elif isinstance(node, list) and node:
        out += leaf_paths(node[0], (*prefix, 0))
    return out


def replaced(doc: Any, path: Path_, value: Any) -> Any:
    copy = json.loads(json.dumps(doc))
    node = copy
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return copy


def at(doc: Any, path: Path_) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def not_an_object(data: bytes) -> bool:
    try:
        return not isinstance(json.loads(data), dict)
    except (ValueError, RecursionError):
        return True


def poison_records(template: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Malformed JSON, a wrong-typed field, a huge bounded field, an unknown schema version."""
    paths = leaf_paths(template)
    bounded = [p for p in paths if p and p[-1] in BOUNDED and isinstance(at(template, p), str)]

    def wrong_type(path: Path_) -> Any:
        # a value no pydantic lax-mode coercion turns into the original's type
        return [1, 2] if isinstance(at(template, path), dict) else {"wrong": [1]}

    malformed = st.one_of(
        st.binary(max_size=512).filter(not_an_object),
        st.text(max_size=256).map(str.encode).filter(not_an_object),
        st.integers(2_000, 200_000).map(lambda n: b"[" * n + b"]" * n),  # nesting bomb
        st.just(b'{"schema_version": 1, "event_id": '),  # cut short
    )
    wrong = st.sampled_from(paths).map(lambda p: replaced(template, p, wrong_type(p)))
    huge = st.tuples(st.sampled_from(bounded), st.integers(10_000, 400_000)).map(
        lambda pn: replaced(template, pn[0], "a" * pn[1])
    )
    version = st.one_of(
        st.integers().filter(lambda v: v != 1), st.text(max_size=8), st.none(), st.floats()
    ).map(lambda v: {**template, "schema_version": v})
    return st.one_of(
        malformed, st.one_of(wrong, huge, version).map(lambda d: json.dumps(d).encode())
    )


def generate(template: dict[str, Any], count: int) -> list[bytes]:
    found: list[bytes] = []

    @hyp_settings(
        max_examples=count,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(poison_records(template))
    def collect(record: bytes) -> None:
        found.append(record)

    collect()
    return found


def first_event(settings: Settings, topic: str, episode_id: str) -> dict[str, Any]:
    for msg in read_topic(settings, topic):
        if f'"{episode_id}"'.encode() in (msg.value() or b""):  # shard events are keyed by shard
            return dict(json.loads(msg.value() or b"{}"))
    raise AssertionError(f"no event of {episode_id} on {topic}")


def produce_all(settings: Settings, records: list[tuple[str, bytes]], key: str) -> list[Message]:
    delivered: list[Message] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        (errors.append(err) if err is not None else delivered.append(msg))

    producer = Producer({**kafka.producer_config(settings), "message.max.bytes": 2_000_000})
    for topic, value in records:
        producer.produce(topic, key=key.encode(), value=value, on_delivery=on_delivery)
        producer.poll(0)
    producer.flush(30)
    assert not errors, errors[:3]
    return delivered


def dead_letters(settings: Settings) -> dict[tuple[str, int, int], dict[str, set[str]]]:
    """(source topic, partition, offset) -> {stage: reason codes}, over every DLQ topic."""
    found: dict[tuple[str, int, int], dict[str, set[str]]] = {}
    for topic in (*DLQ_TOPICS, TOPIC_METADATA_DLQ):
        for msg in read_topic(settings, topic, quiet_s=1.0):
            try:
                record = json.loads(msg.value() or b"{}")
                where = (
                    str(record["source_topic"]),
                    int(record["source_partition"]),
                    int(record["source_offset"]),
                )
            except (ValueError, KeyError, TypeError, RecursionError):
                continue  # a poison record of ours on a DLQ topic
            found.setdefault(where, {}).setdefault(str(record["stage"]), set()).add(
                str(record["reason_code"])
            )
    return found


def test_poison_on_every_topic_is_dead_lettered_with_a_reason_and_consumers_keep_going(
    stack: Settings, fleet: Fleet, episode_factory: EpisodeFactory, tmp_path: Path
) -> None:
    seed = 3000 + int(time.time()) % 900
    template_dir, valid_dir = episode_factory(2, seed=seed, duration_s=(2.0, 3.0))
    agent = device_agent(stack, tmp_path / "agent")
    agent.run_once([template_dir], 30)
    template_id = template_dir.name
    wait_for(
        lambda: episode_states(stack, [template_id]) == {template_id: "sharded"},
        120,
        "the template episode",
    )
    templates = {t: first_event(stack, t, template_id) for t in STAGE_TOPICS}
    templates[dlq_topic(TOPIC_UPLOADED)] = {
        "schema_version": 1,
        "event_id": uuid.uuid4().hex,
        "failed_at": "2026-01-01T00:00:00Z",
        "stage": "decode",
        "source_topic": TOPIC_UPLOADED,
        "source_partition": 0,
        "source_offset": 0,
        "reason_code": "not_a_video",
        "reason": "x",
        "original_key": None,
        "original_value": "{}",
    }

    records: list[tuple[str, bytes]] = []
    for topic, template in templates.items():
        # poison about episodes of their own: a dead letter marks its episode dead-lettered
        own = json.loads(json.dumps(template).replace(template_id, f"poison{seed}-{len(records)}"))
        records += [(topic, r) for r in generate(own, 12)]
    delivered = produce_all(stack, records, key=valid_dir.name)
    assert len(delivered) == len(records) >= 50

    # a valid episode keyed like the poison: its events follow the poison on each partition
    agent.run_once([valid_dir], 30)
    wait_for(
        lambda: episode_states(stack, [valid_dir.name]) == {valid_dir.name: "sharded"},
        120,
        "the valid episode behind the poison",
    )

    def all_dead_lettered() -> list[str]:
        letters = dead_letters(stack)
        missing = []
        for msg in delivered:
            topic = str(msg.topic())
            where = (topic, int(msg.partition() or 0), int(msg.offset() or 0))
            by_stage = letters.get(where, {})
            for stage in CONSUMERS[topic]:
                if not by_stage.get(stage, set()) & REJECT_CODES:
                    missing.append(f"{where} by {stage}: {by_stage}")
        return missing

    missing: list[list[str]] = [[]]

    def none_missing() -> bool:
        missing[0] = all_dead_lettered()
        return not missing[0]

    wait_for(none_missing, 90, "every poison record dead-lettered by every consumer", 1.0)
    assert missing[0] == []
    assert not fleet.dead()
