"""The decode stage: `episodes.uploaded` -> probe + GOP index -> `episodes.decoded`.

Records arrive in batches; each batch's episodes are bin-packed by byte size onto the stage's
worker processes (`services.common.batch`).
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from faststream import FastStream
from pydantic import BaseModel

from schemas.events import (
    TOPIC_DECODED,
    TOPIC_UPLOADED,
    EpisodeDecoded,
    EpisodeUploaded,
    ReasonCode,
)
from services.common.batch import BatchStage, stage_app, worker_fetch_raw, worker_store
from services.common.files import npy_shape, sha256_file
from services.common.objectstore import ObjectStore
from services.common.settings import Settings
from services.common.stage import PermanentError, make_broker, parse_event
from services.decode.core import classify_unreadable, decoded_event, packet_index_key
from services.media.av_io import ProbeError, probe_container


@dataclass(frozen=True)
class DecodeJob:
    uploaded: EpisodeUploaded
    pipeline_version: str


def decode_episode(
    store: ObjectStore,
    uploaded: EpisodeUploaded,
    pipeline_version: str,
    fetch: Callable[[str, Path], None],
) -> EpisodeDecoded:
    """Fetch the raw files, probe by demuxing, and build the decoded event (blocking I/O)."""
    episode = uploaded.episode
    with tempfile.TemporaryDirectory(prefix="egoline-decode-") as tmp:
        video = Path(tmp) / "video"
        if store.stat(episode.video.key) is None:
            raise PermanentError(
                ReasonCode.OBJECT_MISSING, f"raw object {episode.video.key} does not exist"
            )
        fetch(episode.video.key, video)
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
        # The per-packet index is large (one row per frame): it goes to the object store and
        # the event carries its key; the keyframe times the shard stage needs stay inline.
        index_key = packet_index_key(pipeline_version, episode.episode_id, observed)
        buffer = io.BytesIO()
        np.save(buffer, probe.streams[0].packet_index, allow_pickle=False)
        store.put_bytes(index_key, buffer.getvalue())
    return decoded_event(
        uploaded,
        probe,
        observed,
        imu_shape,
        imu_error,
        pipeline_version,
        datetime.now(UTC),
        packet_index_key=index_key,
    )


def run_decode(job: DecodeJob) -> EpisodeDecoded:
    """Worker-process entry point."""
    return decode_episode(worker_store(), job.uploaded, job.pipeline_version, worker_fetch_raw)


def build_stage(settings: Settings, broker: object) -> BatchStage[DecodeJob, EpisodeDecoded]:
    def prepare(_topic: str, value: bytes) -> DecodeJob:
        return DecodeJob(parse_event(value, EpisodeUploaded), settings.pipeline_version)

    def finish(
        _jobs: dict[int, DecodeJob], results: dict[int, EpisodeDecoded]
    ) -> Sequence[tuple[str, BaseModel, str]]:
        return [(TOPIC_DECODED, r, r.episode.episode_id) for r in results.values()]

    return BatchStage(
        broker,  # type: ignore[arg-type]
        "decode",
        settings,
        settings.stage_workers,
        prepare=prepare,
        cost=lambda job: float(job.uploaded.episode.video.size_bytes),
        run=run_decode,
        finish=finish,
    )


def build_app(settings: Settings) -> FastStream:
    broker = make_broker(settings, "decode")
    stage = build_stage(settings, broker)
    return stage_app(settings, broker, stage, TOPIC_UPLOADED, TOPIC_DECODED, EpisodeDecoded)
