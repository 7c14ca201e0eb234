"""The shard stage: accepted `episodes.validated` -> GOP-aligned clips remuxed in worker
processes -> the batch's clips packed first-fit-decreasing into WebDataset tar shards ->
`shards.written`.

Idempotence: a shard's key is the sha256 of its deterministic bytes (the spooled tar is hashed
first) and it is written straight to that key: an S3 PUT or a completed multipart upload is
atomic, so no reader ever sees a partial shard, and a rewrite puts the same bytes. After its
shards are stored, each episode gets a marker (`shards/<pv>/episodes/<id>.json`) holding the
events of the shards with its clips; a redelivered episode with a marker is not cut again: its
events are re-emitted (same event ids).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from faststream import FastStream
from numpy.typing import NDArray

from schemas.events import (
    TOPIC_SHARDS,
    TOPIC_VALIDATED,
    AudioInfo,
    ClipQuality,
    EpisodeDecoded,
    EpisodeRef,
    EpisodeValidated,
    ReasonCode,
    ShardsWritten,
    StreamInfo,
    Verdict,
    derive_event_id,
)
from services.common.batch import Stage, stage_app, worker_fetch_raw, worker_store
from services.common.consume import Finished, Output
from services.common.objectstore import ObjectStore
from services.common.scratch import owned_name
from services.common.settings import Settings
from services.common.stage import PermanentError, make_broker, parse_event
from services.media.av_io import (
    member_container,
    packet_indexes,
    remux_members,
    ticks,
    time_bases,
)
from services.media.cutting import MISSING, EpisodeClock, clip_windows, episode_clock, plan_runs
from services.media.members import member_labels
from services.media.model import MemberPlan, ProbeError, RemuxError
from services.media.signals import clip_quality, signals_on_clock
from services.sensors.imu import ImuError, load_imu, slice_imu_by_windows
from services.shard.core import (
    clip_key,
    clip_metadata,
    clip_record,
    encode_json,
    episode_marker_key,
    frame_times_s_of,
    imu_member_entry,
    pack_first_fit_decreasing,
    place_members,
    shard_index,
    shard_keys,
    video_member_entry,
    write_tar,
)

TAR_OVERHEAD = 1024  # a 512-byte header plus at most 512 bytes of padding, per member


@dataclass(frozen=True)
class ShardJob:
    validated: EpisodeValidated
    clip_target_s: float
    spool_dir: str
    keep_audio: bool = True
    dark_luma: float = 24.0  # a covered lens: sampled frames darker than this ...
    flat_std: float = 2.0  # ... and flatter than this (EGOLINE_CURATION_*)


@dataclass(frozen=True)
class SourcePlan:
    """One raw video file of an episode, as the cut needs it."""

    camera: str
    key: str
    offset_s: float
    salvage_limit_bytes: int | None
    streams: list[StreamInfo]
    audio: list[AudioInfo]


@dataclass(frozen=True)
class CutMember:
    """One stream's member file of one clip, cut and waiting in the spool."""

    path: Path
    camera: str
    label: str
    stream: StreamInfo
    container: str
    frames: int  # frames shown in the clip's window
    audio_streams: int


@dataclass(frozen=True)
class ClipFile:
    """One member of a spooled clip: its name in the tar, the file holding it, its bytes."""

    name: str
    path: Path
    size: int


@dataclass(frozen=True)
class SpooledClip:
    """A cut clip waiting on local disk: whose it is, its metadata (the member `.json`) and its
    member files, in tar order."""

    episode_id: str
    clip_index: int
    meta: dict[str, object]
    members: list[ClipFile]

    @property
    def size(self) -> int:
        """Bytes it takes in a shard (each member with its tar header and padding, at most)."""
        return sum(m.size + TAR_OVERHEAD for m in self.members)


@dataclass(frozen=True)
class CutEpisode:
    episode: EpisodeRef
    pipeline_version: str  # the version its clips and shards are derived under
    clips: list[SpooledClip] = field(default_factory=list)
    done_events: list[str] = field(default_factory=list)  # set when already sharded


def cut_episode(
    store: ObjectStore, job: ShardJob, fetch: Callable[[str, Path], None]
) -> CutEpisode:
    """Remux one accepted episode into clip files in the spool (blocking I/O): every video
    stream of every camera cut at the same windows, audio kept or dropped by setting, the IMU
    sliced by time."""
    validated = job.validated
    decoded = validated.decoded
    episode = decoded.episode
    marker = episode_marker_key(validated.pipeline_version, episode.episode_id)
    if store.exists(marker):
        done = json.loads(store.get_bytes(marker))["events"]
        return CutEpisode(episode, validated.pipeline_version, done_events=done)
    # named by this worker's pid: if it is killed before `finish` packs and removes the spool,
    # the next worker swept it (`batch.init_worker`)
    spool = Path(job.spool_dir) / owned_name(f"{episode.episode_id}-{uuid.uuid4().hex[:8]}")
    spool.mkdir(parents=True)
    try:
        return CutEpisode(
            episode, validated.pipeline_version, clips=_cut_into(store, job, fetch, spool)
        )
    except (RemuxError, ImuError, ProbeError) as exc:
        shutil.rmtree(spool, ignore_errors=True)
        raise PermanentError(ReasonCode.SHARD_WRITE_FAILED, str(exc)) from exc
    except BaseException:
        shutil.rmtree(spool, ignore_errors=True)
        raise


def _sources(decoded: EpisodeDecoded) -> list[SourcePlan]:
    """Every raw video file of the episode (main camera first) with its streams."""
    episode = decoded.episode
    out = [
        SourcePlan(
            camera=episode.camera,
            key=episode.video.key,
            offset_s=0.0,
            salvage_limit_bytes=decoded.salvage_limit_bytes,
            streams=decoded.streams,
            audio=decoded.audio_streams,
        )
    ]
    out += [
        SourcePlan(c.name, c.key, c.offset_s, c.salvage_limit_bytes, c.streams, c.audio_streams)
        for c in decoded.cameras
    ]
    return out


def _cut_into(
    store: ObjectStore, job: ShardJob, fetch: Callable[[str, Path], None], spool: Path
) -> list[SpooledClip]:
    validated = job.validated
    decoded = validated.decoded
    episode = decoded.episode
    primary = decoded.streams[decoded.primary_stream]
    sources = _sources(decoded)
    # The episode clock: seconds from the earliest frame of any camera (so nothing any camera
    # recorded falls before the first clip); the main stream's keyframes shift onto it.
    clock = episode_clock(decoded)
    origin = clock.origin_s
    windows = clip_windows(decoded, clock, job.clip_target_s)
    if not windows:
        raise PermanentError(ReasonCode.SHARD_WRITE_FAILED, "no keyframes to cut clips at")
    labels = member_labels(sources)
    per_clip: list[list[CutMember]] = [[] for _ in windows]
    primary_frames = [0] * len(windows)
    frame_times: NDArray[np.float64] | None = None
    for src in sources:
        path = spool / f"source-{src.camera}"
        fetch(src.key, path)
        indexes = packet_indexes(path, src.salvage_limit_bytes)
        bases = time_bases(path)
        plans: list[MemberPlan] = []
        meta: list[tuple[StreamInfo, str, list[int], int]] = []
        for n, stream in enumerate(src.streams):
            index = indexes[stream.index]
            tb = bases[stream.index]
            pts = index["pts"]
            bounds = [ticks(origin + a - src.offset_s, tb) for a, _ in windows] + [
                int(pts.max()) + 1 if len(pts) else 0
            ]
            bounds[0] = min(bounds[0], int(pts[pts != MISSING].min())) if len(pts) else bounds[0]
            pairs = list(itertools.pairwise(bounds))
            runs = plan_runs(pts, index["keyframe"], pairs)
            audio_windows: dict[int, list[tuple[int, int]]] = {}
            if n == 0 and job.keep_audio:
                for audio in src.audio:
                    atb = bases[audio.index]
                    apts = indexes[audio.index]["pts"]
                    ab = [ticks(origin + a - src.offset_s, atb) for a, _ in windows]
                    ab[0] = min(ab[0], int(apts.min())) if len(apts) else ab[0]
                    ab.append(int(apts.max()) + 1 if len(apts) else 0)
                    audio_windows[audio.index] = list(itertools.pairwise(ab))
            container = member_container(
                stream.codec, [a.codec for a in src.audio if a.index in audio_windows]
            )
            plans.append(
                MemberPlan(stream.index, container, runs, [a for a, _ in pairs], audio_windows)
            )
            shown = [int(((pts >= a) & (pts < b)).sum()) for a, b in pairs]
            meta.append((stream, labels[(src.camera, stream.index)], shown, len(audio_windows)))
            if src.camera == episode.camera and stream.index == primary.index:
                primary_frames = shown
                frame_times = frame_times_s_of(pts, tb)
        rows = remux_members(path, plans, len(windows), spool, src.camera)
        path.unlink()
        for clip, row in enumerate(rows):
            for item, plan, (stream, label, shown, audio_count) in zip(
                row, plans, meta, strict=True
            ):
                if item is None:
                    continue
                per_clip[clip].append(
                    CutMember(
                        path=item[0],
                        camera=src.camera,
                        label=label,
                        stream=stream,
                        container=plan.container,
                        frames=shown[clip],
                        audio_streams=audio_count,
                    )
                )
    imu_slices = _imu_slices(store, decoded, windows, clock, frame_times)
    signals = (
        None if validated.signals is None else signals_on_clock(validated.signals, clock.starts_s)
    )
    qualities = [
        None
        if signals is None
        else clip_quality(
            signals,
            a,
            b,
            None if imu_slices is None else imu_slices[i],
            job.dark_luma,
            job.flat_std,
        )
        for i, (a, b) in enumerate(windows)
    ]
    return _spool_clips(validated, windows, per_clip, primary_frames, imu_slices, qualities, spool)


def _imu_slices(
    store: ObjectStore,
    decoded: EpisodeDecoded,
    windows: list[tuple[float, float]],
    clock: EpisodeClock,
    frame_times: NDArray[np.float64] | None,
) -> list[NDArray[np.float64]] | None:
    """The IMU cut by time: every sample in exactly one clip (the first clip also takes what
    came before the video, the last what came after), timestamps rebased to the clip start."""
    episode = decoded.episode
    if episode.imu is None:
        return None
    primary = decoded.streams[decoded.primary_stream]
    samples = load_imu(
        store.get_bytes(episode.imu.key),
        episode.imu.key,
        frame_times_s=frame_times,
        fps=primary.fps or None,
        offset_s=episode.imu_offset_s,
    )
    # IMU time is on the main stream's clock (0 = its first frame)
    return slice_imu_by_windows(samples, windows, clock.primary_shift_s(decoded))


def _spool_clips(
    validated: EpisodeValidated,
    windows: list[tuple[float, float]],
    per_clip: list[list[CutMember]],
    primary_frames: list[int],
    imu_slices: list[NDArray[np.float64]] | None,
    qualities: list[ClipQuality | None],
    spool: Path,
) -> list[SpooledClip]:
    decoded = validated.decoded
    episode = decoded.episode
    primary = decoded.streams[decoded.primary_stream]
    out: list[SpooledClip] = []
    first_frame = 0
    for index, ((start, end), members) in enumerate(zip(windows, per_clip, strict=True)):
        key = clip_key(episode.episode_id, index)
        main = next(
            (m for m in members if m.camera == episode.camera and m.stream.index == primary.index),
            None,
        )
        if main is None:
            raise RemuxError(f"clip {index} has no frame of the main stream")
        ordered = [main, *(m for m in members if m is not main)]
        files: list[tuple[str, Path]] = []
        streams: list[dict[str, object]] = []
        for m in ordered:
            ext = "mp4" if m.container == "mp4" else "mkv"
            name = f"{key}.{ext}" if m is main else f"{key}.{m.label}.{ext}"
            files.append((name, m.path))
            streams.append(
                video_member_entry(name, m.camera, m.label, m.stream, m.frames, m.audio_streams)
            )
        if imu_slices is not None:
            imu_path = spool / f"{key}.imu.npy"
            np.save(imu_path, imu_slices[index], allow_pickle=False)
            files.append((f"{key}.imu.npy", imu_path))
            streams.append(
                imu_member_entry(f"{key}.imu.npy", episode.camera, len(imu_slices[index]))
            )
        place_members(streams, [p.stat().st_size for _, p in files])
        meta = clip_metadata(
            validated,
            index,
            (start, end),
            primary_frames[index],
            first_frame,
            streams,
            qualities[index],
        )
        json_path = spool / f"{key}.json"
        json_path.write_bytes(encode_json(meta))
        files.append((f"{key}.json", json_path))
        out.append(
            SpooledClip(
                episode_id=episode.episode_id,
                clip_index=index,
                meta=meta,
                members=[ClipFile(n, p, p.stat().st_size) for n, p in files],
            )
        )
        first_frame += primary_frames[index]
    return out


def run_cut(job: ShardJob) -> CutEpisode:
    """Worker-process entry point."""
    return cut_episode(worker_store(), job, worker_fetch_raw)


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
            (m.name, m.size, stack.enter_context(m.path.open("rb")))
            for clip in clips
            for m in clip.members
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
    records = [clip_record(clip.meta, by_name) for clip in clips]
    if not store.exists(shard_key):
        store.put_file(shard_key, path, "application/x-tar", single_put_max=size)
    path.unlink()
    index = shard_index(shard_key, sha, size, spans, records)
    store.put_bytes(index_key, encode_json(index), "application/json")
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
        key=lambda c: (c.episode_id, c.clip_index),
    )
    refs = {cut.episode.episode_id: cut.episode for cut in cuts}
    events: list[ShardsWritten] = []
    for indexes in pack_first_fit_decreasing([c.size for c in clips], target_bytes):
        chosen = [clips[i] for i in indexes]
        members = sorted({c.episode_id for c in chosen})
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


def split_covered(
    cuts: Sequence[CutEpisode], replayed: Sequence[ShardsWritten]
) -> tuple[list[CutEpisode], dict[str, list[ShardsWritten]]]:
    """The cuts still to pack, and the episodes already held whole by replayed shards.

    A stage killed while writing a batch's markers leaves some episodes of a shard marked and
    others not; redelivered together, the marked ones replay the shard's event, which already
    holds every clip of the unmarked ones. Those take the shard's events as their marker instead
    of being packed a second time (which would store their clips twice: once in the replayed
    shard, still referenced, once in a new one)."""
    todo: list[CutEpisode] = []
    covered: dict[str, list[ShardsWritten]] = {}
    for cut in cuts:
        if not cut.clips:
            continue
        episode_id = cut.episode.episode_id
        theirs = [e for e in replayed if any(c.episode_id == episode_id for c in e.clips)]
        held = {c.clip_index for e in theirs for c in e.clips if c.episode_id == episode_id}
        if held and held >= {c.clip_index for c in cut.clips}:
            covered[episode_id] = theirs
        else:
            todo.append(cut)
    return todo, covered


def build_stage(settings: Settings, store: ObjectStore) -> Stage[ShardJob, CutEpisode]:
    spool = settings.spool_path
    target_bytes = int(settings.shard_target_mb * 1024 * 1024)

    def prepare(_topic: str, value: bytes) -> ShardJob | None:
        validated = parse_event(value, EpisodeValidated)
        if validated.verdict is Verdict.REJECT:
            return None  # rejected episodes stop here; the verdict itself is the record
        return ShardJob(
            validated,
            settings.clip_target_s,
            str(spool),
            settings.keep_audio,
            settings.curation.dark_luma,
            settings.curation.flat_std,
        )

    def finish(_jobs: dict[int, ShardJob], results: dict[int, CutEpisode]) -> Finished:
        cuts = list(results.values())
        replayed = [ShardsWritten.model_validate_json(e) for c in cuts for e in c.done_events]
        spool.mkdir(parents=True, exist_ok=True)
        fresh: list[ShardsWritten] = []
        # A shard holds clips of one pipeline version (a backfill's episodes share batches
        # with new uploads): each version is packed on its own, under its own keys.
        for version in sorted({c.pipeline_version for c in cuts}):
            mine = [c for c in cuts if c.pipeline_version == version]
            theirs = [e for e in replayed if e.pipeline_version == version]
            todo, covered = split_covered(mine, theirs)
            for episode_id, events in covered.items():
                marker = episode_marker_key(version, episode_id)
                body = json.dumps({"events": [e.model_dump_json() for e in events]})
                store.put_bytes(marker, body.encode(), "application/json")
            fresh += pack_and_write(store, todo, target_bytes, version, spool)
        unique = {e.event_id: e for e in [*fresh, *replayed]}
        return Finished([Output(TOPIC_SHARDS, e, e.shard_sha256) for e in unique.values()])

    def release(results: dict[int, CutEpisode]) -> None:
        # The clips' spooled members, kept until the batch is done with them: `finish` may run
        # on them several times (retries, bisection for a poison record).
        for cut in results.values():
            for clip in cut.clips:
                shutil.rmtree(clip.members[0].path.parent, ignore_errors=True)

    return Stage(
        name="shard",
        in_topic=TOPIC_VALIDATED,
        out_topic=TOPIC_SHARDS,
        out_schema=ShardsWritten,
        prepare=prepare,
        cost=lambda job: float(job.validated.decoded.episode.video.size_bytes),
        run=run_cut,
        finish=finish,
        release=release,
    )


def build_app(settings: Settings) -> FastStream:
    from services.common.objectstore import object_store

    broker = make_broker(settings, "shard")
    return stage_app(settings, broker, build_stage(settings, object_store(settings)))
