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
    EpisodeSignals,
    EpisodeValidated,
    StreamInfo,
    StreamSignals,
    derive_event_id,
)
from services.common.batch import Stage, stage_app, worker_fetch_raw
from services.common.consume import Finished, Output
from services.common.scratch import job_scratch
from services.common.settings import Settings
from services.common.stage import make_broker, parse_event
from services.media.av_io import decode_keyframes
from services.media.signals import SignalSampler, stream_signals
from services.validate.rules import KeyframeResult, RuleSet, dimensions_in_bounds, evaluate


@dataclass(frozen=True)
class ValidateJob:
    decoded: EpisodeDecoded
    rules: RuleSet


def is_depth(stream: StreamInfo) -> bool:
    """A depth (or other single-channel, high bit depth) stream: picture signals (sharpness,
    exposure) mean nothing there, so curation skips it."""
    return (stream.pix_fmt or "").startswith("gray") and stream.bit_depth > 8


def check_keyframes(
    fetch: Callable[[str, Path], None], decoded: EpisodeDecoded, rules: RuleSet
) -> tuple[dict[tuple[str, int], KeyframeResult], EpisodeSignals | None]:
    """Decode the keyframes (every frame when `rules.full_decode`) of every video stream of
    every camera, keyed by (camera, stream index), and the content signals of the frames that
    pass computes anyway: blocking I/O."""
    files = [
        (
            decoded.episode.camera,
            decoded.episode.video.key,
            decoded.streams,
            decoded.salvage_limit_bytes,
        )
    ] + [(c.name, c.key, c.streams, c.salvage_limit_bytes) for c in decoded.cameras]
    out: dict[tuple[str, int], KeyframeResult] = {}
    signals: list[StreamSignals] = []
    sample_s = rules.signal_sample_s
    with job_scratch("validate") as tmp:
        for camera, key, streams, limit in files:
            video = Path(tmp) / f"video-{camera}"
            fetch(key, video)
            for stream in streams:
                sampler = None if sample_s is None or is_depth(stream) else SignalSampler(sample_s)
                check = decode_keyframes(
                    video,
                    stream.index,
                    full=rules.full_decode,
                    salvage_limit_bytes=limit,
                    sampler=sampler,
                    still_bits_per_pixel=None if sampler is None else rules.still_bits_per_pixel,
                )
                out[(camera, stream.index)] = KeyframeResult(
                    decoded=check.decoded, failed=check.failed, first_error=check.first_error
                )
                if sampler is not None:
                    signals.append(
                        stream_signals(camera, stream.index, sampler.frames, check.still_spans_s)
                    )
            video.unlink()
    if sample_s is None:
        return out, None
    return out, EpisodeSignals(sample_s=sample_s, streams=signals)


def validate_episode(
    fetch: Callable[[str, Path], None], decoded: EpisodeDecoded, rules: RuleSet
) -> EpisodeValidated:
    # Out-of-bounds sizes are rejected without decoding (and without fetching) anything.
    checks, signals = (
        check_keyframes(fetch, decoded, rules)
        if dimensions_in_bounds(decoded, rules)
        else ({}, None)
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
        signals=signals,
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


def rules_from(settings: Settings) -> RuleSet:
    """The stage's rules from the settings (the ones the settings carry)."""
    return RuleSet(
        keep_audio=settings.keep_audio,
        signal_sample_s=settings.curation.sample_s,
        still_bits_per_pixel=settings.curation.still_bits_per_pixel,
    )


def build_app(settings: Settings, rules: RuleSet | None = None) -> FastStream:
    broker = make_broker(settings, "validate")
    stage = build_stage(rules or rules_from(settings))
    return stage_app(settings, broker, stage)
