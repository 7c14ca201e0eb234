"""The baseline a careful engineer writes first: one process, one episode after another, the
same work as the pipeline with none of its machinery (no broker, no stages, no worker pools).

Per episode, in order: hash and PUT the raw files (what the agent does), GET the video once and
reuse the local copy for every step (no second fetch, so it reads no more than the pipeline's
node-local cache does), probe and index it, check its keyframes, remux GOP-aligned clips, write
the tar shard and PUT it, and catalogue every event in the warehouse in one transaction. The
functions are the pipeline's own (`decode_episode`, `validate_episode`, `cut_episode`,
`pack_and_write`, `apply_batch`), so both sides do the same work byte for byte; only the
scheduling differs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel
from sqlalchemy import Engine

from schemas.events import (
    TOPIC_DECODED,
    TOPIC_SHARDS,
    TOPIC_UPLOADED,
    TOPIC_VALIDATED,
    EpisodeUploaded,
    Verdict,
    derive_event_id,
)
from services.agent.recordings import describe
from services.common.objectstore import ObjectStore, object_store
from services.common.settings import Settings
from services.decode.app import decode_episode
from services.metadata.app import apply_batch
from services.metadata.warehouse import make_engine
from services.shard.app import ShardJob, cut_episode, pack_and_write
from services.validate.app import rules_from, validate_episode


def local_fetch(store: ObjectStore, scratch: Path) -> Callable[[str, Path], None]:
    """A fetch that GETs each key once into `scratch` and links it for every later caller."""
    fetched: dict[str, Path] = {}

    def fetch(key: str, dest: Path) -> None:
        if key not in fetched:
            path = scratch / f"raw-{len(fetched)}"
            store.download(key, path)
            fetched[key] = path
        dest.unlink(missing_ok=True)
        try:
            dest.hardlink_to(fetched[key])
        except OSError:
            shutil.copyfile(fetched[key], dest)

    return fetch


def ingest_one(settings: Settings, store: ObjectStore, directory: Path, engine: Engine) -> int:
    """Everything the pipeline does to one episode, serially; returns its clip count."""
    episode = describe(directory)
    for source, local in episode.files():
        store.put_file(source.key, local.paths[0])
    uploaded = EpisodeUploaded(
        event_id=derive_event_id("uploaded", episode.ref.episode_id, episode.ref.video.sha256),
        produced_at=datetime.now(UTC),
        pipeline_version=settings.pipeline_version,
        episode=episode.ref,
    )
    events: list[tuple[str, BaseModel]] = [(TOPIC_UPLOADED, uploaded)]
    clips = 0
    with tempfile.TemporaryDirectory(prefix="egoline-serial-") as tmp:
        scratch = Path(tmp)
        fetch = local_fetch(store, scratch)
        decoded = decode_episode(store, uploaded, settings.pipeline_version, fetch)
        events.append((TOPIC_DECODED, decoded))
        validated = validate_episode(fetch, decoded, rules_from(settings))
        events.append((TOPIC_VALIDATED, validated))
        if validated.verdict is not Verdict.REJECT:
            spool = scratch / "spool"
            spool.mkdir()
            job = ShardJob(validated, settings.clip_target_s, str(spool), settings.keep_audio)
            cut = cut_episode(store, job, fetch)
            target = int(settings.shard_target_mb * 1024 * 1024)
            for event in pack_and_write(store, [cut], target, settings.pipeline_version, spool):
                events.append((TOPIC_SHARDS, event))
                clips += len(event.clips)
    records = [(topic, event.model_dump_json().encode()) for topic, event in events]
    failures = apply_batch(engine, records, settings)
    if failures:
        raise RuntimeError(f"{episode.ref.episode_id}: not catalogued: {failures}")
    return clips


def run_serial(settings: Settings, directories: list[Path]) -> tuple[float, int]:
    """Seconds to ingest every directory one after another (in this process), and the clips."""
    store = object_store(settings)
    engine = make_engine(settings)
    try:
        started = time.perf_counter()
        clips = sum(ingest_one(settings, store, d, engine) for d in directories)
        return time.perf_counter() - started, clips
    finally:
        engine.dispose()
