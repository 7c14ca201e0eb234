"""The decode stage: `episodes.uploaded` -> probe + GOP index -> `episodes.decoded`."""

from __future__ import annotations

import asyncio
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from faststream import FastStream
from faststream.confluent.annotations import KafkaMessage

from schemas.events import (
    TOPIC_DECODED,
    TOPIC_UPLOADED,
    EpisodeDecoded,
    EpisodeUploaded,
    ReasonCode,
)
from services.common.files import npy_shape, sha256_file
from services.common.objectstore import ObjectStore, object_store
from services.common.settings import Settings
from services.common.stage import (
    Consume,
    PermanentError,
    make_broker,
    parse_event,
    publish_event,
    subscriber_options,
)
from services.decode.core import classify_unreadable, decoded_event
from services.media.av_io import ProbeError, probe_container

GROUP = "egoline-decode"


def decode_episode(
    store: ObjectStore, uploaded: EpisodeUploaded, pipeline_version: str
) -> EpisodeDecoded:
    """Fetch the raw files, probe by demuxing, and build the decoded event (blocking I/O)."""
    episode = uploaded.episode
    with tempfile.TemporaryDirectory(prefix="egoline-decode-") as tmp:
        video = Path(tmp) / "video"
        if store.stat(episode.video.key) is None:
            raise PermanentError(
                ReasonCode.OBJECT_MISSING, f"raw object {episode.video.key} does not exist"
            )
        store.download(episode.video.key, video)
        observed = sha256_file(video)
        try:
            probe = probe_container(video)
        except ProbeError as exc:
            with video.open("rb") as handle:
                head = handle.read(16)
            raise PermanentError(classify_unreadable(head, video.stat().st_size), str(exc)) from exc
        imu_shape: tuple[int, ...] | None = None
        imu_error: str | None = None
        if episode.imu is not None:
            imu = Path(tmp) / "imu.npy"
            store.download(episode.imu.key, imu)
            try:
                imu_shape = npy_shape(imu)
            except (ValueError, OSError) as exc:
                imu_error = str(exc)[:2000]
    return decoded_event(
        uploaded, probe, observed, imu_shape, imu_error, pipeline_version, datetime.now(UTC)
    )


def build_app(settings: Settings) -> FastStream:
    broker = make_broker(settings, "decode")
    store = object_store(settings)
    consume = Consume(broker, "decode")
    broker.publisher(TOPIC_DECODED, title="episodes.decoded", schema=EpisodeDecoded)

    @broker.subscriber(TOPIC_UPLOADED, title="decode", **subscriber_options(settings, GROUP))
    async def on_uploaded(msg: KafkaMessage) -> None:
        async def work(_topic: str, body: bytes) -> None:
            uploaded = parse_event(body, EpisodeUploaded)
            decoded = await asyncio.to_thread(
                decode_episode, store, uploaded, settings.pipeline_version
            )
            await publish_event(broker, TOPIC_DECODED, decoded, key=decoded.episode.episode_id)

        await consume(msg, work)

    return FastStream(broker)
