"""One-shot device upload: hash, upload to the raw key, then announce `episodes.uploaded`.

The event goes out only after every raw object of the episode is complete in the object store,
through the idempotent producer, keyed by episode id, with an event id derived from the episode
id and the video's sha256 (a re-run announces the same event id; consumers dedup on it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer
from pydantic import ValidationError

from schemas.events import TOPIC_UPLOADED, EpisodeRef, EpisodeUploaded, SourceFile, derive_event_id
from services.common.files import sha256_file
from services.common.objectstore import ObjectStore

# A recording is finished when its folder holds this file (written last, atomically).
COMPLETION_MARKER = "episode.json"
MARKER = COMPLETION_MARKER


class AgentInputError(ValueError):
    """An episode directory the agent refuses to upload (and publishes nothing for)."""


def raw_key(ref_device: str, started_at: datetime, episode_id: str, sha256: str, ext: str) -> str:
    """`raw/<device>/<yyyy>/<mm>/<dd>/<episode>/<sha256>.<ext>`: never overwritten."""
    day = started_at.astimezone(UTC)
    return f"raw/{ref_device}/{day:%Y/%m/%d}/{episode_id}/{sha256}.{ext}"


def find_episode_dirs(root: Path) -> list[Path]:
    """Finished recordings: directories holding the completion marker, in name order."""
    return sorted(p.parent for p in root.glob(f"*/{MARKER}"))


def describe_episode(directory: Path) -> tuple[EpisodeRef, Path, Path | None]:
    """Read the marker, hash the files, and build the episode reference (ids validated)."""
    try:
        meta = json.loads((directory / MARKER).read_text())
        video = directory / str(meta["video"])
        imu = directory / str(meta["imu"]) if meta.get("imu") else None
    except (OSError, ValueError, KeyError) as exc:
        raise AgentInputError(f"{directory}: unreadable {MARKER}: {exc}") from exc
    for path in (video, imu):
        if path is not None and (
            path.resolve().parent != directory.resolve() or not path.is_file()
        ):
            raise AgentInputError(f"{directory}: {path.name} missing or outside the episode folder")
    started = datetime.fromisoformat(str(meta["started_at"]))
    video_sha = sha256_file(video)
    try:
        ref = EpisodeRef(
            episode_id=meta["episode_id"],
            device_id=meta["device_id"],
            session_id=meta["session_id"],
            started_at=started,
            video=SourceFile(
                key=raw_key(
                    meta["device_id"], started, meta["episode_id"], video_sha, video.suffix[1:]
                ),
                sha256=video_sha,
                size_bytes=video.stat().st_size,
            ),
            imu=None
            if imu is None
            else SourceFile(
                key=raw_key(
                    meta["device_id"], started, meta["episode_id"], sha := sha256_file(imu), "npy"
                ),
                sha256=sha,
                size_bytes=imu.stat().st_size,
            ),
        )
    except (ValidationError, KeyError) as exc:
        raise AgentInputError(f"{directory}: invalid episode metadata: {exc}") from exc
    return ref, video, imu


def upload_files(store: ObjectStore, ref: EpisodeRef, video: Path, imu: Path | None) -> None:
    """Upload each raw file unless its content-addressed key is already complete."""
    for source, path in ((ref.video, video), (ref.imu, imu)):
        if source is None or path is None:
            continue
        info = store.stat(source.key)
        if info is not None and info.size == source.size_bytes:
            continue
        store.put_file(source.key, path)
        info = store.stat(source.key)
        if info is None or info.size != source.size_bytes:
            raise OSError(f"upload of {source.key} did not verify (size {info and info.size})")


def uploaded_event(ref: EpisodeRef, pipeline_version: str) -> EpisodeUploaded:
    return EpisodeUploaded(
        event_id=derive_event_id("uploaded", ref.episode_id, ref.video.sha256),
        produced_at=datetime.now(UTC),
        pipeline_version=pipeline_version,
        episode=ref,
    )


def upload_episodes(
    store: ObjectStore,
    producer: Producer,
    directories: Iterable[Path],
    pipeline_version: str,
    on_done: Callable[[Path, EpisodeUploaded | None, str | None], None] = lambda *_: None,
) -> list[EpisodeUploaded]:
    """Upload each episode and publish its event; returns the events acknowledged by Kafka."""
    acked: list[EpisodeUploaded] = []
    failures: list[str] = []

    for directory in directories:
        try:
            ref, video, imu = describe_episode(directory)
        except AgentInputError as exc:
            on_done(directory, None, str(exc))
            continue
        upload_files(store, ref, video, imu)
        event = uploaded_event(ref, pipeline_version)

        def delivered(
            err: object, _msg: object, event: EpisodeUploaded = event, d: Path = directory
        ) -> None:
            if err is None:
                acked.append(event)
                on_done(d, event, None)
            else:
                failures.append(f"{event.episode.episode_id}: {err}")

        producer.produce(
            TOPIC_UPLOADED,
            key=ref.episode_id.encode(),
            value=event.model_dump_json().encode(),
            headers={"event_id": event.event_id, "content-type": "application/json"},
            on_delivery=delivered,
        )
        producer.poll(0)
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"{remaining} events unacknowledged; failures: {failures[:5]}")
    return acked
