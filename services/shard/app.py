"""The shard stage: accepted `episodes.validated` -> GOP-aligned clips remuxed in worker
processes -> the batch's clips packed first-fit-decreasing into WebDataset tar shards ->
`shards.written`.

Idempotence: a shard's key is the sha256 of its deterministic bytes, and it is written under
`tmp/` and copied to that key only when complete. After its shards are stored, each episode gets
a marker (`shards/<pv>/episodes/<id>.json`) holding the events of the shards with its clips; a
redelivered episode with a marker is not cut again: its events are re-emitted (same event ids).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from faststream import FastStream
from pydantic import BaseModel

from schemas.events import (
    TOPIC_SHARDS,
    TOPIC_VALIDATED,
    ClipRecord,
    EpisodeRef,
    EpisodeValidated,
    ReasonCode,
    ShardsWritten,
    Verdict,
    derive_event_id,
)
from services.common.batch import BatchStage, stage_app, worker_fetch_raw, worker_store
from services.common.objectstore import ObjectStore
from services.common.settings import Settings
from services.common.stage import PermanentError, make_broker, parse_event
from services.media.av_io import RemuxError, remux_clips
from services.shard.core import (
    SHARD_FORMAT_VERSION,
    episode_marker_key,
    pack_first_fit_decreasing,
    plan_clips,
    shard_keys,
    write_tar,
)

TAR_OVERHEAD = 3 * 1024  # three 512-byte headers plus padding, per clip


def clip_key(episode_id: str, clip_index: int) -> str:
    return f"{episode_id}_{clip_index:05d}"


@dataclass(frozen=True)
class ShardJob:
    validated: EpisodeValidated
    clip_target_s: float
    spool_dir: str


@dataclass(frozen=True)
class SpooledClip:
    """A cut clip waiting on local disk: its metadata and its member files, in tar order."""

    meta: dict[str, object]
    members: list[tuple[str, str, int]]  # (member name, path, size)

    @property
    def size(self) -> int:
        return sum(size for _, _, size in self.members) + TAR_OVERHEAD


@dataclass(frozen=True)
class CutEpisode:
    episode: EpisodeRef
    clips: list[SpooledClip] = field(default_factory=list)
    done_events: list[str] = field(default_factory=list)  # set when already sharded


def cut_episode(
    store: ObjectStore, job: ShardJob, fetch: Callable[[str, Path], None]
) -> CutEpisode:
    """Remux one accepted episode into clip files in the spool (blocking I/O)."""
    validated = job.validated
    decoded = validated.decoded
    episode = decoded.episode
    marker = episode_marker_key(validated.pipeline_version, episode.episode_id)
    if store.exists(marker):
        return CutEpisode(episode, done_events=json.loads(store.get_bytes(marker))["events"])
    stream = decoded.streams[decoded.primary_stream]
    spans = plan_clips(decoded.keyframe_times_s, stream.duration_s, job.clip_target_s)
    if not spans:
        raise PermanentError(ReasonCode.SHARD_WRITE_FAILED, "no keyframes to cut clips at")
    spool = Path(job.spool_dir) / f"{episode.episode_id}-{uuid.uuid4().hex[:8]}"
    spool.mkdir(parents=True)
    video = spool / "source"
    fetch(episode.video.key, video)
    imu: np.ndarray | None = None
    if episode.imu is not None:
        store.download(episode.imu.key, spool / "imu.npy")
        imu = np.load(spool / "imu.npy", allow_pickle=False)
    try:
        clips = remux_clips(video, stream.index, [s for s, _ in spans] + [spans[-1][1]])
    except RemuxError as exc:
        shutil.rmtree(spool, ignore_errors=True)
        raise PermanentError(ReasonCode.SHARD_WRITE_FAILED, str(exc)) from exc
    video.unlink()
    out: list[SpooledClip] = []
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
        members: list[tuple[str, bytes]] = [(f"{key}.mp4", mp4)]
        if imu is not None:
            buffer = io.BytesIO()
            np.save(buffer, imu[first_frame : first_frame + frames], allow_pickle=False)
            members.append((f"{key}.imu.npy", buffer.getvalue()))
        members.append((f"{key}.json", json.dumps(meta, sort_keys=True).encode()))
        spooled = []
        for name, data in members:
            path = spool / name
            path.write_bytes(data)
            spooled.append((name, str(path), len(data)))
        out.append(SpooledClip(meta, spooled))
        first_frame += frames
    return CutEpisode(episode, clips=out)


def run_cut(job: ShardJob) -> CutEpisode:
    """Worker-process entry point."""
    return cut_episode(worker_store(), job, worker_fetch_raw)


def _clip_record(clip: SpooledClip, spans: dict[str, tuple[int, int]]) -> ClipRecord:
    key = str(clip.meta["clip_key"])
    mp4, js = spans[f"{key}.mp4"], spans[f"{key}.json"]
    imu = spans.get(f"{key}.imu.npy")
    return ClipRecord(
        clip_key=key,
        episode_id=str(clip.meta["episode_id"]),
        clip_index=int(str(clip.meta["clip_index"])),
        start_s=float(str(clip.meta["start_s"])),
        duration_s=float(str(clip.meta["duration_s"])),
        frame_count=int(str(clip.meta["frame_count"])),
        mp4_offset=mp4[0],
        mp4_length=mp4[1],
        imu_offset=imu[0] if imu else None,
        imu_length=imu[1] if imu else None,
        json_offset=js[0],
        json_length=js[1],
    )


def write_shard(
    store: ObjectStore,
    clips: list[SpooledClip],
    episodes: list[EpisodeRef],
    pipeline_version: str,
    scratch: Path,
) -> ShardsWritten:
    """Stream one tar to scratch, then publish it under its content-addressed key."""
    path = scratch / f"shard-{uuid.uuid4().hex}.tar"
    with contextlib.ExitStack() as stack, path.open("w+b") as sink:
        sources = [
            (name, size, stack.enter_context(Path(file).open("rb")))
            for clip in clips
            for name, file, size in clip.members
        ]
        spans = write_tar(sink, sources)
        sink.seek(0)
        digest = hashlib.sha256()
        while chunk := sink.read(8 << 20):
            digest.update(chunk)
    sha = digest.hexdigest()
    size = path.stat().st_size
    shard_key, index_key = shard_keys(pipeline_version, sha)
    by_name = {s.name: (s.offset, s.length) for s in spans}
    records = [_clip_record(clip, by_name) for clip in clips]
    if not store.exists(shard_key):
        tmp_key = f"tmp/shards/{sha}.{uuid.uuid4().hex}.tar"
        store.put_file(tmp_key, path, "application/x-tar", single_put_max=size)
        store.copy(tmp_key, shard_key)
        store.delete(tmp_key)
    path.unlink()
    index = {
        "format": "egoline-shard-index",
        "version": SHARD_FORMAT_VERSION,
        "shard_key": shard_key,
        "sha256": sha,
        "size_bytes": size,
        "members": [{"name": s.name, "offset": s.offset, "length": s.length} for s in spans],
        "clips": [r.model_dump() for r in records],
    }
    store.put_bytes(index_key, json.dumps(index, sort_keys=True).encode(), "application/json")
    return ShardsWritten(
        event_id=derive_event_id("shard", sha, pipeline_version),
        produced_at=datetime.now(UTC),
        pipeline_version=pipeline_version,
        shard_key=shard_key,
        index_key=index_key,
        shard_sha256=sha,
        size_bytes=size,
        episodes=episodes,
        clips=records,
    )


def pack_and_write(
    store: ObjectStore,
    cuts: Sequence[CutEpisode],
    target_bytes: int,
    pipeline_version: str,
    scratch: Path,
) -> list[ShardsWritten]:
    """Pack every clip of the batch into shards (first-fit decreasing by size), write them, and
    mark each episode with the events of its shards. Returns the events to publish."""
    clips = sorted(
        (clip for cut in cuts for clip in cut.clips),
        key=lambda c: (str(c.meta["episode_id"]), int(str(c.meta["clip_index"]))),
    )
    refs = {cut.episode.episode_id: cut.episode for cut in cuts}
    events: list[ShardsWritten] = []
    for indexes in pack_first_fit_decreasing([c.size for c in clips], target_bytes):
        chosen = [clips[i] for i in indexes]
        members = sorted({str(c.meta["episode_id"]) for c in chosen})
        events.append(
            write_shard(store, chosen, [refs[e] for e in members], pipeline_version, scratch)
        )
    for episode_id in refs:
        mine = [
            e.model_dump_json() for e in events if any(c.episode_id == episode_id for c in e.clips)
        ]
        if mine:
            marker = episode_marker_key(pipeline_version, episode_id)
            store.put_bytes(marker, json.dumps({"events": mine}).encode(), "application/json")
    return events


def build_stage(
    settings: Settings, broker: object, store: ObjectStore
) -> BatchStage[ShardJob, CutEpisode]:
    spool = settings.spool_dir or Path(tempfile.gettempdir()) / "egoline-spool"
    target_bytes = int(settings.shard_target_mb * 1024 * 1024)

    def prepare(_topic: str, value: bytes) -> ShardJob | None:
        validated = parse_event(value, EpisodeValidated)
        if validated.verdict is Verdict.REJECT:
            return None  # rejected episodes stop here; the verdict itself is the record
        return ShardJob(validated, settings.clip_target_s, str(spool))

    def finish(
        _jobs: dict[int, ShardJob], results: dict[int, CutEpisode]
    ) -> Sequence[tuple[str, BaseModel, str]]:
        cuts = list(results.values())
        spool.mkdir(parents=True, exist_ok=True)
        try:
            fresh = pack_and_write(
                store, [c for c in cuts if c.clips], target_bytes, settings.pipeline_version, spool
            )
        finally:
            for cut in cuts:
                for clip in cut.clips:
                    shutil.rmtree(Path(clip.members[0][1]).parent, ignore_errors=True)
        replayed = [ShardsWritten.model_validate_json(e) for c in cuts for e in c.done_events]
        unique = {e.event_id: e for e in [*fresh, *replayed]}
        return [(TOPIC_SHARDS, e, e.shard_sha256) for e in unique.values()]

    return BatchStage(
        broker,  # type: ignore[arg-type]
        "shard",
        settings,
        settings.stage_workers,
        prepare=prepare,
        cost=lambda job: float(job.validated.decoded.episode.video.size_bytes),
        run=run_cut,
        finish=finish,
    )


def build_app(settings: Settings) -> FastStream:
    from services.common.objectstore import object_store

    broker = make_broker(settings, "shard")
    stage = build_stage(settings, broker, object_store(settings))
    return stage_app(settings, broker, stage, TOPIC_VALIDATED, TOPIC_SHARDS, ShardsWritten)
