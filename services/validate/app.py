"""The validate stage: `episodes.decoded` -> rules (+ keyframe decode) -> `episodes.validated`."""

from __future__ import annotations

import asyncio
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from faststream import FastStream
from faststream.confluent.annotations import KafkaMessage

from schemas.events import (
    TOPIC_DECODED,
    TOPIC_VALIDATED,
    EpisodeDecoded,
    EpisodeValidated,
    derive_event_id,
)
from services.common.objectstore import ObjectStore, object_store
from services.common.settings import Settings
from services.common.stage import (
    Consume,
    make_broker,
    parse_event,
    publish_event,
    subscriber_options,
)
from services.media.av_io import decode_keyframes
from services.validate.rules import KeyframeResult, RuleSet, evaluate

GROUP = "egoline-validate"


def check_keyframes(store: ObjectStore, decoded: EpisodeDecoded, full: bool) -> KeyframeResult:
    """Decode the primary stream's keyframes (every frame when `full`): blocking I/O."""
    with tempfile.TemporaryDirectory(prefix="egoline-validate-") as tmp:
        video = Path(tmp) / "video"
        store.download(decoded.episode.video.key, video)
        stream = decoded.streams[decoded.primary_stream]
        check = decode_keyframes(video, stream.index, full=full)
    return KeyframeResult(decoded=check.decoded, failed=check.failed, first_error=check.first_error)


def validate_episode(
    store: ObjectStore, decoded: EpisodeDecoded, rules: RuleSet
) -> EpisodeValidated:
    keyframes = check_keyframes(store, decoded, rules.full_decode)
    verdict, reasons, warnings = evaluate(decoded, keyframes, rules)
    return EpisodeValidated(
        event_id=derive_event_id("validated", decoded.event_id, decoded.pipeline_version),
        produced_at=datetime.now(UTC),
        pipeline_version=decoded.pipeline_version,
        decoded=decoded,
        verdict=verdict,
        reasons=reasons,
        warnings=warnings,
    )


def build_app(settings: Settings, rules: RuleSet | None = None) -> FastStream:
    broker = make_broker(settings, "validate")
    store = object_store(settings)
    ruleset = rules or RuleSet()
    consume = Consume(broker, "validate")
    broker.publisher(TOPIC_VALIDATED, title="episodes.validated", schema=EpisodeValidated)

    @broker.subscriber(TOPIC_DECODED, title="validate", **subscriber_options(settings, GROUP))
    async def on_decoded(msg: KafkaMessage) -> None:
        async def work(_topic: str, body: bytes) -> None:
            decoded = parse_event(body, EpisodeDecoded)
            validated = await asyncio.to_thread(validate_episode, store, decoded, ruleset)
            await publish_event(broker, TOPIC_VALIDATED, validated, key=decoded.episode.episode_id)

        await consume(msg, work)

    return FastStream(broker)
