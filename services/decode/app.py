"""The decode stage: `episodes.uploaded` -> probe + GOP index -> `episodes.decoded`.

Records arrive in batches; each batch's episodes are bin-packed by byte size onto the stage's
worker processes (`services.common.batch`).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from faststream import FastStream

from schemas.events import (
    TOPIC_DECODED,
    TOPIC_UPLOADED,
    EpisodeDecoded,
    EpisodeRef,
    EpisodeUploaded,
    ReasonCode,
)
from services.common.batch import Stage, stage_app, worker_fetch_raw, worker_store
from services.common.consume import Finished, Output
from services.common.files import sha256_file
from services.common.objectstore import ObjectStore
from services.common.scratch import job_scratch
from services.common.settings import Settings
from services.common.stage import PermanentError, make_broker, parse_event
from services.decode.core import (
    camera_probe,
    classify_unreadable,
    decoded_event,
    packet_index_key,
)
from services.media.av_io import frame_times_s, probe_container
from services.media.model import ContainerProbe, ProbeError
from services.sensors.imu import ImuError, ImuSummary, load_imu, summarize_imu
from services.sensors.imu_signature import ImuDescriptor, describe_imu


@dataclass(frozen=True)
class DecodeJob:
    uploaded: EpisodeUploaded
    pipeline_version: str


def _probe_file(
    store: ObjectStore, key: str, path: Path, fetch: Callable[[str, Path], None]
) -> tuple[ContainerProbe, str]:
    """Fetch one raw video and demux it; returns the probe and the sha256 of what was read."""
    if store.stat(key) is None:
        raise PermanentError(ReasonCode.OBJECT_MISSING, f"raw object {key} does not exist")
    fetch(key, path)
    observed = sha256_file(path)
    try:
        return probe_container(path), observed
    except ProbeError as exc:
        with path.open("rb") as handle:
            head = handle.read(16)
        raise PermanentError(
            classify_unreadable(head, path.stat().st_size), f"{key}: {exc}"
        ) from exc


def _read_imu(
    store: ObjectStore, episode: EpisodeRef, probe: ContainerProbe
) -> tuple[tuple[int, ...] | None, str | None, ImuSummary | None, ImuDescriptor | None]:
    """Read the IMU sidecar at its own rate, summarise it against the video span and compute
    its motion signature over that span (near duplicates: decode is the stage that reads the
    whole IMU with the episode's video span at hand)."""
    if episode.imu is None:
        return None, None, None, None
    primary = probe.streams[0]
    try:
        samples = load_imu(
            store.get_bytes(episode.imu.key),
            episode.imu.key,
            frame_times_s=frame_times_s(primary),
            fps=primary.fps or None,
            offset_s=episode.imu_offset_s,
        )
    except ImuError as exc:
        return None, str(exc)[:2000], None, None
    cols = samples.values.shape[1] + (1 if samples.source_format != "npy_frame_synced" else 0)
    span_end = probe.salvaged_s if probe.salvaged_s is not None else primary.duration_s
    summary = summarize_imu(samples, 0.0, span_end)
    signature = describe_imu(samples, 0.0, span_end) if span_end > 0 else None
    return (len(samples.t), cols), None, summary, signature


def decode_episode(
    store: ObjectStore,
    uploaded: EpisodeUploaded,
    pipeline_version: str,
    fetch: Callable[[str, Path], None],
) -> EpisodeDecoded:
    """Fetch the raw files, probe every camera by demuxing, read the IMU at its own rate, and
    build the decoded event (blocking I/O)."""
    episode = uploaded.episode
    with job_scratch("decode") as tmp:
        probe, observed = _probe_file(store, episode.video.key, Path(tmp) / "video", fetch)
        cameras = []
        for name, camera in sorted(episode.cameras.items()):
            path = Path(tmp) / f"camera-{name}"
            other, sha = _probe_file(store, camera.file.key, path, fetch)
            cameras.append(camera_probe(name, camera.file.key, camera.offset_s, other, sha))
            path.unlink()
        imu_shape, imu_error, imu_summary, imu_signature = _read_imu(store, episode, probe)
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
        imu=imu_summary,
        imu_signature=imu_signature,
        cameras=cameras,
    )


def run_decode(job: DecodeJob) -> EpisodeDecoded:
    """Worker-process entry point."""
    return decode_episode(worker_store(), job.uploaded, job.pipeline_version, worker_fetch_raw)


def build_stage() -> Stage[DecodeJob, EpisodeDecoded]:
    def prepare(_topic: str, value: bytes) -> DecodeJob:
        # The version travels with the episode: the agent announces it with its configured
        # one, `egoline backfill` re-announces it with a new one (docs/curation.md).
        uploaded = parse_event(value, EpisodeUploaded)
        return DecodeJob(uploaded, uploaded.pipeline_version)

    def finish(_jobs: dict[int, DecodeJob], results: dict[int, EpisodeDecoded]) -> Finished:
        return Finished([Output(TOPIC_DECODED, r, r.episode.episode_id) for r in results.values()])

    return Stage(
        name="decode",
        in_topic=TOPIC_UPLOADED,
        out_topic=TOPIC_DECODED,
        out_schema=EpisodeDecoded,
        prepare=prepare,
        cost=lambda job: float(
            job.uploaded.episode.video.size_bytes
            + sum(c.file.size_bytes for c in job.uploaded.episode.cameras.values())
        ),
        run=run_decode,
        finish=finish,
    )


def build_app(settings: Settings) -> FastStream:
    broker = make_broker(settings, "decode")
    return stage_app(settings, broker, build_stage())
