"""The consume protocol (`services/common/consume.py`) in memory, with faststream's
`TestKafkaBroker`: the same subscriber the services run, fed by an in-memory broker; the
real-stack tests (test_stages, test_poison, test_chaos) run the same code on Tansu.

Each test records what reached the broker, in order: every published event (a subscriber on
each output and DLQ topic) and every commit and seek of the consumer, and asserts on that and
on the publishers' `mock`s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest.mock import patch

import pytest
from faststream.confluent import KafkaBroker, TestKafkaBroker
from faststream.confluent.annotations import KafkaMessage
from faststream.confluent.message import FakeConsumer
from pydantic import BaseModel

from schemas.events import (
    DLQ_TOPICS,
    STAGE_TOPICS,
    TOPIC_CONSUMER_STATUS,
    TOPIC_METADATA_DLQ,
    ConsumerStatus,
    DlqRecord,
    ReasonCode,
)
from services.common.batch import run_jobs
from services.common.consume import (
    BatchConsumer,
    Finished,
    NoWork,
    Output,
    Publishers,
    Record,
    decode_records,
    rewind_positions,
    subscribe,
)
from services.common.failpoints import Failpoints, FailpointTripped
from services.common.settings import Settings
from services.common.stage import PermanentError, TransientError, classify, keep_raw

IN, OUT, DLQ = "in.topic", "out.topic", "in.topic.dlq"


class Done(BaseModel):
    event_id: str
    value: int


@dataclass
class Journal:
    """What the broker saw, in order: ("publish", topic, body) / ("commit",) / ("seek", ...)."""

    entries: list[tuple[Any, ...]] = field(default_factory=list)

    def kinds(self) -> list[str]:
        """What reached the broker, without the consumer-status events (observability only,
        asserted on by the tests about them)."""
        return [
            e[0] if e[0] != "publish" else f"publish:{e[1]}"
            for e in self.entries
            if e[:2] != ("publish", TOPIC_CONSUMER_STATUS)
        ]

    def published(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(e[2]) for e in self.entries if e[0] == "publish" and e[1] == topic]


class InProcessRunner:
    """The `run` step in this process, through the production `run_jobs` (the same per-job
    time limit and classification as a worker process)."""

    def __init__(self, run: Callable[[Any], Any]) -> None:
        self._run = run

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    async def run(self, jobs: dict[int, Any]) -> dict[int, Any]:
        results, _, _ = run_jobs(self._run, list(jobs.values()))
        return dict(zip(jobs, results, strict=True))


def parse(_topic: str, value: bytes) -> int:
    """prepare: a record is a JSON integer; anything else is bad input."""
    try:
        number = json.loads(value)
    except ValueError as exc:
        raise PermanentError(ReasonCode.MALFORMED_EVENT, f"not JSON: {exc}") from exc
    if not isinstance(number, int):
        raise PermanentError(ReasonCode.MALFORMED_EVENT, "not an integer")
    return number


def work(number: int) -> int:
    """run: fails the ways a media job can."""
    if number == 13:
        raise PermanentError(ReasonCode.NOT_A_VIDEO, "thirteen is not a video")
    if number == 99:
        raise TransientError("object store unreachable")
    return number * 10


def outputs(_jobs: dict[int, int], results: dict[int, int]) -> Finished:
    return Finished(
        [Output(OUT, Done(event_id=f"e{v}", value=v), str(v)) for v in results.values()]
    )


@pytest.fixture
def journal() -> Iterator[Journal]:
    log = Journal()

    async def commit(_self: FakeConsumer) -> None:
        log.entries.append(("commit",))

    async def seek(_self: FakeConsumer, topic: str, partition: int, offset: int) -> None:
        log.entries.append(("seek", topic, partition, offset))

    with patch.object(FakeConsumer, "commit", commit), patch.object(FakeConsumer, "seek", seek):
        yield log


@dataclass
class Harness:
    broker: KafkaBroker
    consumer: BatchConsumer[Any, Any]
    journal: Journal

    async def deliver(self, *values: bytes, topic: str = IN) -> None:
        """One batch, as the consumer would poll it."""
        await self.broker.publish_batch(*values, topic=topic)


@pytest.fixture
def make_harness(journal: Journal) -> Callable[..., Any]:
    def build(
        prepare: Callable[[str, bytes], Any] = parse,
        run: Callable[[Any], Any] | None = work,
        finish: Callable[[dict[int, Any], dict[int, Any]], Finished] = outputs,
        topics: tuple[str, ...] = (IN,),
        dlq_for: Callable[[str], str] = lambda t: f"{t}.dlq",
    ) -> Any:
        broker = KafkaBroker("localhost:9092")
        dlqs = {dlq_for(t): DlqRecord for t in topics}
        consumer: BatchConsumer[Any, Any] = BatchConsumer(
            stage="test",
            prepare=prepare,
            runner=InProcessRunner(run) if run is not None else NoWork(),
            finish=finish,
            publishers=Publishers(
                broker, {OUT: Done, **dlqs, TOPIC_CONSUMER_STATUS: ConsumerStatus}
            ),
            dlq_for=dlq_for,
            backoff_base_s=0.0,
            step_backoff_s=0.0,
        )
        subscribe(Settings(_env_file=None), broker, consumer, topics)
        for topic in (OUT, *dlqs, TOPIC_CONSUMER_STATUS):

            @broker.subscriber(topic, group_id=f"watch-{topic}", decoder=keep_raw)
            async def watch(msg: KafkaMessage) -> None:
                (record,) = decode_records(msg)
                journal.entries.append(("publish", record.topic, record.value))

        return Harness(broker, consumer, journal)

    return build


@pytest.fixture
async def harness(make_harness: Callable[..., Harness]) -> AsyncIterator[Harness]:
    h = make_harness()
    async with TestKafkaBroker(h.broker):
        yield h


async def test_outputs_are_published_before_the_commit(harness: Harness) -> None:
    await harness.deliver(b"1", b"2", b"3")
    assert harness.journal.kinds() == [*["publish:out.topic"] * 3, "commit"]
    assert [e["value"] for e in harness.journal.published(OUT)] == [10, 20, 30]
    publisher = harness.consumer.publishers[OUT]
    assert publisher.mock.call_count == 3
    assert json.loads(publisher.mock.call_args.args[0]) == {"event_id": "e30", "value": 30}


async def test_bad_record_in_prepare_is_dead_lettered_and_the_rest_goes_on(
    harness: Harness,
) -> None:
    await harness.deliver(b"1", b"{not json", b"2")
    assert harness.journal.kinds() == [
        "publish:out.topic",
        "publish:out.topic",
        "publish:in.topic.dlq",
        "commit",
    ]
    (dead,) = harness.journal.published(DLQ)
    assert (dead["reason_code"], dead["original_value"]) == ("malformed_event", "{not json")
    assert (dead["stage"], dead["source_topic"]) == ("test", IN)
    harness.consumer.publishers[DLQ].mock.assert_called_once()


async def test_bad_input_in_the_run_step_costs_only_its_record(harness: Harness) -> None:
    await harness.deliver(b"13", b"4")
    assert harness.journal.kinds() == ["publish:out.topic", "publish:in.topic.dlq", "commit"]
    (dead,) = harness.journal.published(DLQ)
    assert dead["reason_code"] == "not_a_video" and "thirteen" in dead["reason"]


async def test_unexpected_error_about_one_record_is_dead_lettered_as_internal_error(
    make_harness: Callable[..., Harness],
) -> None:
    def buggy(_topic: str, value: bytes) -> int:
        if value == b"7":
            raise KeyError("a bug in parsing")
        return int(value)

    h = make_harness(prepare=buggy)
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"7", b"8")
    assert h.journal.kinds() == ["publish:out.topic", "publish:in.topic.dlq", "commit"]
    (dead,) = h.journal.published(DLQ)
    assert dead["reason_code"] == "internal_error" and "KeyError" in dead["reason"]


async def test_transient_failure_in_run_rewinds_without_publishing_or_committing(
    harness: Harness,
) -> None:
    await harness.deliver(b"1", b"99", b"2")
    assert harness.journal.kinds() == ["seek"]
    assert harness.journal.entries[0] == ("seek", IN, 0, 0)
    assert harness.consumer.publishers[OUT].mock.call_count == 0
    assert harness.consumer.publishers[DLQ].mock.call_count == 0


async def test_transient_failure_in_prepare_rewinds(make_harness: Callable[..., Harness]) -> None:
    def unreachable(_topic: str, _value: bytes) -> int:
        raise ConnectionError("schema registry unreachable")

    h = make_harness(prepare=unreachable)
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"1")
    assert h.journal.kinds() == ["seek"]


async def test_a_rewound_batch_redelivered_is_published_once_then_committed(
    make_harness: Callable[..., Harness],
) -> None:
    attempts: list[int] = []

    def flaky(number: int) -> int:
        attempts.append(number)
        if len(attempts) == 1:
            raise TimeoutError("read timed out")
        return number

    h = make_harness(run=flaky)
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"5")
        await h.deliver(b"5")  # the consumer, sought back, polls the same record again
    assert h.journal.kinds() == ["seek", "publish:out.topic", "commit"]
    assert h.consumer._retries == 0  # the backoff restarts after a committed batch


async def test_transient_failure_in_finish_rewinds(make_harness: Callable[..., Harness]) -> None:
    def warehouse_down(_jobs: dict[int, int], _results: dict[int, int]) -> Finished:
        raise TransientError("warehouse unavailable")

    h = make_harness(finish=warehouse_down)
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"1", b"2")
    assert h.journal.kinds() == ["seek"]


async def test_permanent_failure_in_finish_dead_letters_the_records_that_reached_it(
    make_harness: Callable[..., Harness],
) -> None:
    def refuse(_jobs: dict[int, int], _results: dict[int, int]) -> Finished:
        raise PermanentError(ReasonCode.SHARD_WRITE_FAILED, "the shard cannot be written")

    h = make_harness(finish=refuse)
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"1", b"13", b"2")
    # 13 failed in run (its own reason); 1 and 2 reached finish and carry its reason.
    assert h.journal.kinds() == [*["publish:in.topic.dlq"] * 3, "commit"]
    reasons = [d["reason_code"] for d in h.journal.published(DLQ)]
    assert reasons == ["shard_write_failed", "not_a_video", "shard_write_failed"]


def poison_finish(
    poison: set[int], calls: list[list[int]] | None = None, outage_on_call: int | None = None
) -> Callable[[dict[int, int], dict[int, int]], Finished]:
    """A batch-level step with a bug: it raises KeyError whenever its batch holds a poison
    value (after doing its work, like a packing step that fails half-way), and, if asked, a
    dependency outage on its n-th call."""

    def finish(jobs: dict[int, int], results: dict[int, int]) -> Finished:
        if calls is not None:
            calls.append(sorted(jobs.values()))
            if outage_on_call is not None and len(calls) == outage_on_call:
                raise TransientError("object store unreachable")
        done = outputs(jobs, results)
        bad = poison & set(jobs.values())
        if bad:
            raise KeyError(f"{min(bad)}_00000.mp4")
        return done

    return finish


async def test_a_bug_in_finish_dead_letters_only_the_record_that_causes_it(
    make_harness: Callable[..., Harness],
) -> None:
    calls: list[list[int]] = []
    h = make_harness(finish=poison_finish({5}, calls))
    async with TestKafkaBroker(h.broker):
        await h.deliver(*(str(n).encode() for n in range(1, 9)))
    kinds = h.journal.kinds()
    assert "seek" not in kinds and kinds[-1] == "commit"
    assert sorted(e["value"] for e in h.journal.published(OUT)) == [10, 20, 30, 40, 60, 70, 80]
    (dead,) = h.journal.published(DLQ)
    assert (dead["reason_code"], dead["original_value"]) == ("internal_error", "5")
    assert dead["exception_type"] == "KeyError" and "5_00000.mp4" in dead["reason"]
    assert len(dead["traceback_digest"]) == 16
    # 3 attempts on the whole batch, then halves: [1-4] ok, [5-8] -> [5,6] -> [5] poison, [6],
    # [7,8]: bounded by attempts + 2 log2(n) calls, never a retry of the batch forever.
    assert calls[:3] == [list(range(1, 9))] * 3
    assert len(calls) <= 3 + 2 * 3 + 1


async def test_two_poison_records_in_one_batch_are_both_isolated_with_one_digest(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(finish=poison_finish({2, 7}))
    async with TestKafkaBroker(h.broker):
        await h.deliver(*(str(n).encode() for n in range(1, 9)))
    dead = h.journal.published(DLQ)
    assert sorted(d["original_value"] for d in dead) == ["2", "7"]
    assert len({d["traceback_digest"] for d in dead}) == 1  # the same bug
    assert len(h.journal.published(OUT)) == 6 and h.journal.kinds()[-1] == "commit"


async def test_a_bug_that_passes_on_a_retry_dead_letters_nothing(
    make_harness: Callable[..., Harness],
) -> None:
    calls: list[list[int]] = []

    def flaky(jobs: dict[int, int], results: dict[int, int]) -> Finished:
        calls.append(sorted(jobs.values()))
        if len(calls) == 1:
            raise RuntimeError("a race of ours")
        return outputs(jobs, results)

    h = make_harness(finish=flaky)
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"1", b"2")
    assert h.journal.kinds() == ["publish:out.topic", "publish:out.topic", "commit"]
    assert len(calls) == 2


async def test_a_bug_only_in_combination_commits_every_record(
    make_harness: Callable[..., Harness],
) -> None:
    """Records that fail only together (each half succeeds alone) are none of them poison."""

    def together(jobs: dict[int, int], results: dict[int, int]) -> Finished:
        if {1, 8} <= set(jobs.values()):
            raise ValueError("these two collide")
        return outputs(jobs, results)

    h = make_harness(finish=together)
    async with TestKafkaBroker(h.broker):
        await h.deliver(*(str(n).encode() for n in range(1, 9)))
    assert h.journal.published(DLQ) == [] and len(h.journal.published(OUT)) == 8
    assert h.journal.kinds()[-1] == "commit"


async def test_a_dependency_outage_during_the_bisection_rewinds_and_dead_letters_nothing(
    make_harness: Callable[..., Harness],
) -> None:
    calls: list[list[int]] = []
    # Calls 1-3: the whole batch (poison); call 4: the first half, while S3 is down.
    h = make_harness(finish=poison_finish({5}, calls, outage_on_call=4))
    async with TestKafkaBroker(h.broker):
        await h.deliver(*(str(n).encode() for n in range(1, 9)))
    assert h.journal.kinds() == ["seek"]
    assert h.journal.published(DLQ) == [] and h.journal.published(OUT) == []
    assert len(calls) == 4


async def test_a_dependency_outage_in_finish_is_never_bisected(
    make_harness: Callable[..., Harness],
) -> None:
    calls: list[list[int]] = []

    def down(jobs: dict[int, int], _results: dict[int, int]) -> Finished:
        calls.append(sorted(jobs.values()))
        raise TransientError("warehouse unavailable")

    h = make_harness(finish=down)
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"1", b"2", b"3")
    assert h.journal.kinds() == ["seek"] and calls == [[1, 2, 3]]


async def test_the_consumer_reports_retrying_isolating_then_committed(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(finish=poison_finish({3}))
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"1", b"3")
        await h.deliver(b"4")  # the next batch commits cleanly: no status
    states = [(e["state"], e["count"]) for e in h.journal.published(TOPIC_CONSUMER_STATUS)]
    assert states == [("retrying", 1), ("retrying", 2), ("isolating", 3), ("committed", 0)]
    (status, *_) = h.journal.published(TOPIC_CONSUMER_STATUS)
    assert status["group"] == "egoline-test"
    assert status["positions"] == [{"topic": IN, "partition": 0, "offset": 0}]


async def test_a_rewinding_consumer_reports_each_rewind_with_its_reason(
    harness: Harness,
) -> None:
    await harness.deliver(b"99")
    await harness.deliver(b"99")
    states = [
        (e["state"], e["count"], e["reason"])
        for e in harness.journal.published(TOPIC_CONSUMER_STATUS)
    ]
    assert [s[:2] for s in states] == [("rewinding", 1), ("rewinding", 2)]
    assert all("object store unreachable" in s[2] for s in states)


async def test_release_runs_once_after_every_attempt_and_the_bisection(
    make_harness: Callable[..., Harness],
) -> None:
    released: list[list[int]] = []
    h = make_harness(finish=poison_finish({2}))
    h.consumer.release = lambda results: released.append(sorted(results.values()))
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"1", b"2", b"3")
    assert released == [[10, 20, 30]]


async def test_a_failpoint_plants_a_bug_in_finish_for_its_marked_records(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness()
    h.consumer.failpoints = Failpoints.parse("test.finish=77")
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"1", b"77", b"2")
    (dead,) = h.journal.published(DLQ)
    assert (dead["original_value"], dead["exception_type"]) == ("77", "FailpointTripped")
    assert len(h.journal.published(OUT)) == 2


def test_failpoints_parse_and_refuse_typos() -> None:
    points = Failpoints.parse(" shard.finish=poison-, metadata.finish=x ")
    assert points.markers == {("shard", "finish"): b"poison-", ("metadata", "finish"): b"x"}
    points.check("shard", "finish", [b"fine"])
    points.check("decode", "finish", [b"poison-1"])
    with pytest.raises(FailpointTripped):
        points.check("shard", "finish", [b"fine", b'{"id": "poison-1"}'])
    for typo in ("shard=x", "shard.finsh=x", "shard.finish=", ".finish=x"):
        with pytest.raises(ValueError, match="failpoint"):
            Failpoints.parse(typo)


async def test_per_record_failures_from_finish_go_to_the_dlq_topic_of_their_record(
    make_harness: Callable[..., Harness],
) -> None:
    """The metadata shape: no work step, `finish` refuses one record, DLQs chosen per topic."""

    def apply(jobs: dict[int, int], _results: dict[int, int]) -> Finished:
        refused = classify(PermanentError(ReasonCode.INTERNAL_ERROR, "violates a constraint"))
        return Finished(failures={i: refused for i, v in jobs.items() if v == 3})

    h = make_harness(run=None, finish=apply, topics=(IN, "other"), dlq_for=lambda t: f"{t}.dlq")
    async with TestKafkaBroker(h.broker):
        await h.deliver(b"2", b"3", topic="other")
    assert h.journal.kinds() == ["publish:other.dlq", "commit"]
    (dead,) = h.journal.published("other.dlq")
    assert (dead["source_topic"], dead["original_value"]) == ("other", "3")


async def test_a_failed_publish_rewinds_and_does_not_commit(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broker_gone(*_outputs: Output) -> None:
        raise TransientError("broker unreachable")

    monkeypatch.setattr(harness.consumer.publishers, "publish", broker_gone)
    await harness.deliver(b"1")
    assert harness.journal.kinds() == ["seek"]


def test_rewind_positions_are_each_partitions_first_record() -> None:
    records = [
        Record("a", 0, 7, None, b""),
        Record("a", 1, 3, None, b""),
        Record("a", 0, 5, None, b""),
        Record("b", 0, 9, None, b""),
    ]
    assert rewind_positions(records) == {("a", 0): 5, ("a", 1): 3, ("b", 0): 9}


def test_no_work_runner_passes_jobs_through() -> None:
    assert asyncio.run(NoWork[int]().run({0: 1, 2: 3})) == {0: 1, 2: 3}


@pytest.fixture
def metadata_harness(journal: Journal) -> Harness:
    """The metadata service's own consumer (`metadata.app.build_consumer`) on the in-memory
    broker, against a warehouse URL where nothing listens (port 9 is discard)."""
    from sqlalchemy import create_engine

    from services.metadata.app import build_consumer

    broker = KafkaBroker("localhost:9092")
    settings = Settings(_env_file=None)
    engine = create_engine("postgresql+psycopg://egoline@127.0.0.1:9/none")
    consumer = build_consumer(settings, broker, engine)
    consumer.backoff_base_s = 0.0
    subscribe(settings, broker, consumer, (*STAGE_TOPICS, *DLQ_TOPICS))
    for topic in sorted({"episodes.uploaded.dlq", TOPIC_METADATA_DLQ}):

        @broker.subscriber(topic, group_id=f"watch-{topic}", decoder=keep_raw)
        async def watch(msg: KafkaMessage) -> None:
            (record,) = decode_records(msg)
            journal.entries.append(("publish", record.topic, record.value))

    return Harness(broker, consumer, journal)


async def test_metadata_dead_letters_unreadable_records_by_their_topic(
    metadata_harness: Harness,
) -> None:
    async with TestKafkaBroker(metadata_harness.broker):
        await metadata_harness.deliver(b'{"event_id": 1}', topic="episodes.uploaded")
        await metadata_harness.deliver(b"[[[", topic="episodes.decoded.dlq")
    # The metadata service also consumes the DLQs: the in-memory broker hands it its own dead
    # letter at once (to it and to the test's watcher, in no fixed order), which, valid but
    # with the warehouse down, is rewound once.
    kinds = metadata_harness.journal.kinds()
    assert [k for k in kinds if k != "seek"] == [
        "publish:episodes.uploaded.dlq",
        "commit",
        "publish:metadata.dlq",
        "commit",
    ]
    assert kinds.count("seek") == 1 and kinds.index("seek") < kinds.index("commit")
    for dead in metadata_harness.journal.published("episodes.uploaded.dlq"):
        assert (dead["stage"], dead["reason_code"]) == ("metadata", "malformed_event")


async def test_metadata_rewinds_while_the_warehouse_is_unreachable(
    metadata_harness: Harness, episode_uploaded_json: bytes
) -> None:
    async with TestKafkaBroker(metadata_harness.broker):
        await metadata_harness.deliver(episode_uploaded_json, topic="episodes.uploaded")
    assert metadata_harness.journal.kinds() == ["seek"]


@pytest.fixture
def episode_uploaded_json() -> bytes:
    from datetime import UTC, datetime

    from schemas.events import EpisodeRef, EpisodeUploaded, SourceFile

    return (
        EpisodeUploaded(
            event_id="1" * 32,
            produced_at=datetime(2026, 1, 1, tzinfo=UTC),
            episode=EpisodeRef(
                episode_id="ep1",
                device_id="dev1",
                session_id="s1",
                started_at=datetime(2026, 1, 1, tzinfo=UTC),
                video=SourceFile(key="raw/dev1/v.mp4", sha256="a" * 64, size_bytes=1),
            ),
        )
        .model_dump_json()
        .encode()
    )
