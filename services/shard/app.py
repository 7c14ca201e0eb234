"""The shard stage: accepted `episodes.validated` -> GOP-aligned clips remuxed into
WebDataset tar shards -> `shards.written`."""

from __future__ import annotations

import asyncio
import io
import json
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from faststream import FastStream
from faststream.confluent.annotations import KafkaMessage

from schemas.events import (
    TOPIC_SHARDS,
    TOPIC_VALIDATED,
    ClipRecord,
    EpisodeValidated,
    ReasonCode,
    ShardsWritten,
    Verdict,
    derive_event_id,
)
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
from services.media.av_io import RemuxError, remux_clips
from services.shard.core import (
    SHARD_FORMAT_VERSION,
    Member,
    build_tar,
    pack_first_fit_decreasing,
    plan_clips,
    sha256_bytes,
    shard_keys,
)

GROUP = "egoline-shard"


def clip_key(episode_id: str, clip_index: int) -> str:
    return f"{episode_id}_{clip_index:05d}"


def cut_episode(
    store: ObjectStore, validated: EpisodeValidated, target_s: float
) -> list[tuple[dict[str, object], list[Member]]]:
    """Remux one accepted episode into clips: [(clip metadata, its members)] (blocking I/O)."""
    decoded = validated.decoded
    episode = decoded.episode
    stream = decoded.streams[decoded.primary_stream]
    spans = plan_clips(decoded.keyframe_times_s, stream.duration_s, target_s)
    if not spans:
        raise PermanentError(ReasonCode.SHARD_WRITE_FAILED, "no keyframes to cut clips at")
    with tempfile.TemporaryDirectory(prefix="egoline-shard-") as tmp:
        video = Path(tmp) / "video"
        store.download(episode.video.key, video)
        imu: np.ndarray | None = None
        if episode.imu is not None:
            imu_path = Path(tmp) / "imu.npy"
            store.download(episode.imu.key, imu_path)
            imu = np.load(imu_path, allow_pickle=False)
        try:
            clips = remux_clips(video, stream.index, [s for s, _ in spans] + [spans[-1][1]])
        except RemuxError as exc:
            raise PermanentError(ReasonCode.SHARD_WRITE_FAILED, str(exc)) from exc
    results = []
    first_frame = 0
    for index, ((start, end), (mp4, frames)) in enumerate(zip(spans, clips, strict=True)):
        key = clip_key(episode.episode_id, index)
        meta: dict[str, object] = {
            "clip_key": key,
            "episode_id": episode.episode_id,
            "device_id": episode.device_id,
            "session_id": episode.session_id,
            "clip_index": index,
            "start_s": round(start, 6),
            "duration_s": round(end - start, 6),
            "frame_count": frames,
            "first_frame": first_frame,
            "fps": stream.fps,
            "codec": stream.codec,
            "width": stream.width,
            "height": stream.height,
            "raw_key": episode.video.key,
            "raw_sha256": episode.video.sha256,
            "pipeline_version": validated.pipeline_version,
        }
        members = [Member(f"{key}.mp4", mp4)]
        if imu is not None:
            buffer = io.BytesIO()
            np.save(buffer, imu[first_frame : first_frame + frames], allow_pickle=False)
            members.append(Member(f"{key}.imu.npy", buffer.getvalue()))
        members.append(Member(f"{key}.json", json.dumps(meta, sort_keys=True).encode()))
        results.append((meta, members))
        first_frame += frames
    return results


def write_shards(
    store: ObjectStore, validated: EpisodeValidated, target_bytes: int, target_s: float
) -> list[ShardsWritten]:
    """Cut, pack and publish the shards of one episode; returns one event per shard.

    Each shard goes to a temporary key first and is copied to its final content-addressed key
    only when complete (then the temporary object is removed); its index follows. A shard
    whose final key already exists (a redelivery) is not written again.
    """
    clips = cut_episode(store, validated, target_s)
    sizes = [sum(len(m.data) + 1024 for m in members) for _, members in clips]
    events = []
    for bin_indexes in pack_first_fit_decreasing(sizes, target_bytes):
        chosen = [clips[i] for i in bin_indexes]
        members = [m for _, ms in chosen for m in ms]
        data, spans = build_tar(members)
        sha = sha256_bytes(data)
        shard_key, index_key = shard_keys(validated.pipeline_version, sha)
        span_by_name = {s.name: s for s in spans}
        records = []
        for meta, _ in chosen:
            key = str(meta["clip_key"])
            mp4, js = span_by_name[f"{key}.mp4"], span_by_name[f"{key}.json"]
            imu_span = span_by_name.get(f"{key}.imu.npy")
            records.append(
                ClipRecord(
                    clip_key=key,
                    episode_id=validated.decoded.episode.episode_id,
                    clip_index=int(str(meta["clip_index"])),
                    start_s=float(str(meta["start_s"])),
                    duration_s=float(str(meta["duration_s"])),
                    frame_count=int(str(meta["frame_count"])),
                    mp4_offset=mp4.offset,
                    mp4_length=mp4.length,
                    imu_offset=imu_span.offset if imu_span else None,
                    imu_length=imu_span.length if imu_span else None,
                    json_offset=js.offset,
                    json_length=js.length,
                )
            )
        index = {
            "format": "egoline-shard-index",
            "version": SHARD_FORMAT_VERSION,
            "shard_key": shard_key,
            "sha256": sha,
            "size_bytes": len(data),
            "members": [{"name": s.name, "offset": s.offset, "length": s.length} for s in spans],
            "clips": [r.model_dump() for r in records],
        }
        if not store.exists(shard_key):
            tmp_key = f"tmp/shards/{sha}.{uuid.uuid4().hex}.tar"
            store.put_bytes(tmp_key, data, content_type="application/x-tar")
            store.copy(tmp_key, shard_key)
            store.delete(tmp_key)
        store.put_bytes(index_key, json.dumps(index, sort_keys=True).encode(), "application/json")
        events.append(
            ShardsWritten(
                event_id=derive_event_id("shard", sha, validated.pipeline_version),
                produced_at=datetime.now(UTC),
                pipeline_version=validated.pipeline_version,
                shard_key=shard_key,
                index_key=index_key,
                shard_sha256=sha,
                size_bytes=len(data),
                episodes=[validated.decoded.episode],
                clips=records,
            )
        )
    return events


def build_app(settings: Settings) -> FastStream:
    broker = make_broker(settings, "shard")
    store = object_store(settings)
    consume = Consume(broker, "shard")
    target_bytes = int(settings.shard_target_mb * 1024 * 1024)
    broker.publisher(TOPIC_SHARDS, title="shards.written", schema=ShardsWritten)

    @broker.subscriber(TOPIC_VALIDATED, title="shard", **subscriber_options(settings, GROUP))
    async def on_validated(msg: KafkaMessage) -> None:
        async def work(_topic: str, body: bytes) -> None:
            validated = parse_event(body, EpisodeValidated)
            if validated.verdict is Verdict.REJECT:
                return  # rejected episodes stop here; the verdict itself is the record
            events = await asyncio.to_thread(
                write_shards, store, validated, target_bytes, settings.clip_target_s
            )
            for event in events:
                await publish_event(broker, TOPIC_SHARDS, event, key=event.shard_sha256)

        await consume(msg, work)

    return FastStream(broker)
