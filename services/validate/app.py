"""The validate stage: `episodes.decoded` -> rules (+ keyframe decode) -> `episodes.validated`.

Batches are bin-packed by episode duration (decode work scales with it) onto worker processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from faststream import FastStream

from schemas.events import (
    TOPIC_DECODED,
    TOPIC_VALIDATED,
    EpisodeDecoded,
    EpisodeValidated,
    derive_event_id,
)
from services.common.batch import Stage, stage_app, worker_fetch_raw
from services.common.consume import Finished, Output
from services.common.scratch import job_scratch
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
) -> dict[tuple[str, int], KeyframeResult]:
    """Decode the keyframes (every frame when `full`) of every video stream of every camera,
    keyed by (camera, stream index): blocking I/O."""
    files = [
        (
            decoded.episode.camera,
            decoded.episode.video.key,
            decoded.streams,
            decoded.salvage_limit_bytes,
        )
    ] + [(c.name, c.key, c.streams, c.salvage_limit_bytes) for c in decoded.cameras]
    out: dict[tuple[str, int], KeyframeResult] = {}
    with job_scratch("validate") as tmp:
        for camera, key, streams, limit in files:
            video = Path(tmp) / f"video-{camera}"
            fetch(key, video)
            for stream in streams:
                check = decode_keyframes(video, stream.index, full=full, salvage_limit_bytes=limit)
                out[(camera, stream.index)] = KeyframeResult(
                    decoded=check.decoded, failed=check.failed, first_error=check.first_error
                )
            video.unlink()
    return out


def validate_episode(
    fetch: Callable[[str, Path], None], decoded: EpisodeDecoded, rules: RuleSet
) -> EpisodeValidated:
    # Out-of-bounds sizes are rejected without decoding (and without fetching) anything.
    checks = (
        check_keyframes(fetch, decoded, rules.full_decode)
        if dimensions_in_bounds(decoded, rules)
        else {}
    )
    primary = decoded.streams[decoded.primary_stream]
    keyframes = checks.pop((decoded.episode.camera, primary.index), None)
    verdict, reasons, warnings = evaluate(decoded, keyframes, rules, checks)
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


def build_stage(rules: RuleSet) -> Stage[ValidateJob, EpisodeValidated]:
    def finish(_jobs: dict[int, ValidateJob], results: dict[int, EpisodeValidated]) -> Finished:
        return Finished(
            [Output(TOPIC_VALIDATED, r, r.decoded.episode.episode_id) for r in results.values()]
        )

    return Stage(
        name="validate",
        in_topic=TOPIC_DECODED,
        out_topic=TOPIC_VALIDATED,
        out_schema=EpisodeValidated,
        prepare=lambda _topic, value: ValidateJob(parse_event(value, EpisodeDecoded), rules),
        cost=lambda job: job.decoded.duration_s,
        run=run_validate,
        finish=finish,
    )


def build_app(settings: Settings, rules: RuleSet | None = None) -> FastStream:
    broker = make_broker(settings, "validate")
    stage = build_stage(rules or RuleSet(keep_audio=settings.keep_audio))
    return stage_app(settings, broker, stage)
