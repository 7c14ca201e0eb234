"""Backfill: recompute what the pipeline derives (content signals, clips, shards) for episodes
already ingested, under a new pipeline version, without re-uploading anything.

An episode is re-announced on `episodes.uploaded` exactly as it was first announced (its raw
objects are content-addressed and still in the store) with the new `pipeline_version`; every
stage stamps what it derives with the version of the event it reads, so the episode flows
through decode, validate and shard again and the warehouse gains rows for the new version
beside the old ones (every derived table is keyed by pipeline version). The old version's
values stay; manifests pick a version (`--pipeline-version`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from sqlalchemy import Engine, select

from schemas.events import EpisodeRef, EpisodeUploaded, derive_event_id
from services.metadata.warehouse import decode_meta, episode_refs


def backfill_events(
    refs: Iterable[tuple[EpisodeRef, str]], pipeline_version: str, at: datetime | None = None
) -> list[EpisodeUploaded]:
    """The re-announcements (pure): one `episodes.uploaded` event per (episode, its original
    announcement's event id) with the new version; event ids are derived from the original's
    and the version, so announcing twice is one announcement (the stages' effects and the
    warehouse's ledger are idempotent on them)."""
    produced = at or datetime.now(UTC)
    return [
        EpisodeUploaded(
            event_id=derive_event_id("backfill", original_event_id, pipeline_version),
            produced_at=produced,
            pipeline_version=pipeline_version,
            episode=ref,
        )
        for ref, original_event_id in refs
    ]


def select_refs(
    engine: Engine,
    pipeline_version: str,
    episode_ids: Sequence[str] = (),
    from_version: str | None = None,
) -> list[tuple[EpisodeRef, str]]:
    """The announcements to replay: the given episodes (all when none is given), those already
    derived under `from_version` if it is given, and never those the new version already has."""
    query = select(episode_refs.c.ref, episode_refs.c.event_id).order_by(episode_refs.c.episode_id)
    if episode_ids:
        query = query.where(episode_refs.c.episode_id.in_(list(episode_ids)))
    if from_version is not None:
        query = query.where(
            episode_refs.c.episode_id.in_(
                select(decode_meta.c.episode_id).where(
                    decode_meta.c.pipeline_version == from_version
                )
            )
        )
    done = select(decode_meta.c.episode_id).where(
        decode_meta.c.pipeline_version == pipeline_version
    )
    query = query.where(episode_refs.c.episode_id.not_in(done))
    with engine.connect() as conn:
        return [
            (EpisodeRef.model_validate(ref), str(event_id)) for ref, event_id in conn.execute(query)
        ]
