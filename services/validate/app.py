"""The validate stage: `episodes.decoded` -> rules (+ keyframe decode) -> `episodes.validated`.

Batches are bin-packed by episode duration (decode work scales with it) onto worker processes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from faststream import FastStream
from pydantic import BaseModel

from schemas.events import (
    TOPIC_DECODED,
    TOPIC_VALIDATED,
    EpisodeDecoded,
    EpisodeValidated,
    derive_event_id,
)
from services.common.batch import BatchStage, stage_app, worker_fetch_raw
from services.common.settings import Settings
from services.common.stage import make_broker, parse_event
from services.media.av_io import decode_keyframes
from services.validate.rules import KeyframeResult, RuleSet, dimensions_in_bounds, evaluate


@dataclass(frozen=True)
class ValidateJob:
    decoded: EpisodeDecoded
    rules: RuleSet


def check_keyframes(
    fetch: Callable[[str, Path], None], decoded: EpisodeDecoded, full: bool
) -> KeyframeResult:
    """Decode the primary stream's keyframes (every frame when `full`): blocking I/O."""
    with tempfile.TemporaryDirectory(prefix="egoline-validate-") as tmp:
        video = Path(tmp) / "video"
        fetch(decoded.episode.video.key, video)
        stream = decoded.streams[decoded.primary_stream]
        check = decode_keyframes(video, stream.index, full=full)
    return KeyframeResult(decoded=check.decoded, failed=check.failed, first_error=check.first_error)


def validate_episode(
    fetch: Callable[[str, Path], None], decoded: EpisodeDecoded, rules: RuleSet
) -> EpisodeValidated:
    # Out-of-bounds sizes are rejected without decoding (and without fetching) anything.
    keyframes = (
        check_keyframes(fetch, decoded, rules.full_decode)
        if dimensions_in_bounds(decoded, rules)
        else None
    )
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


def run_validate(job: ValidateJob) -> EpisodeValidated:
    """Worker-process entry point."""
    return validate_episode(worker_fetch_raw, job.decoded, job.rules)


def build_stage(
    settings: Settings, broker: object, rules: RuleSet
) -> BatchStage[ValidateJob, EpisodeValidated]:
    def finish(
        _jobs: dict[int, ValidateJob], results: dict[int, EpisodeValidated]
    ) -> Sequence[tuple[str, BaseModel, str]]:
        return [(TOPIC_VALIDATED, r, r.decoded.episode.episode_id) for r in results.values()]

    return BatchStage(
        broker,  # type: ignore[arg-type]
        "validate",
        settings,
        settings.stage_workers,
        prepare=lambda _topic, value: ValidateJob(parse_event(value, EpisodeDecoded), rules),
        cost=lambda job: job.decoded.duration_s,
        run=run_validate,
        finish=finish,
    )


def build_app(settings: Settings, rules: RuleSet | None = None) -> FastStream:
    broker = make_broker(settings, "validate")
    stage = build_stage(settings, broker, rules or RuleSet())
    return stage_app(settings, broker, stage, TOPIC_DECODED, TOPIC_VALIDATED, EpisodeValidated)
