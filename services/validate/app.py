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
from services.media.content import ContentThresholds, EpisodeContent
from services.media.signals import SignalSampler, stream_signals
from services.sensors.imu import ImuError, ImuSamples, load_imu
from services.validate.content import episode_content
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


def fetch_imu(fetch: Callable[[str, Path], None], decoded: EpisodeDecoded) -> ImuSamples | None:
    """The episode's IMU samples on the main stream's clock (blocking I/O), None without a
    readable sidecar (decode reports an unreadable one; the rules reject it). A frame-synced
    `(frames, 6)` sidecar is timed by the nominal frame rate (the shard stage uses the frame
    times: the same samples, a gyro RMS that differs only at clip edges of VFR video)."""
    ref = decoded.episode.imu
    if ref is None or decoded.imu_error is not None:
        return None
    primary = decoded.streams[decoded.primary_stream]
    with job_scratch("validate-imu") as tmp:
        path = Path(tmp) / "imu"
        fetch(ref.key, path)
        try:
            return load_imu(
                path.read_bytes(),
                ref.key,
                fps=primary.fps or None,
                offset_s=decoded.episode.imu_offset_s,
            )
        except ImuError:
            return None


def judge_content(
    fetch: Callable[[str, Path], None],
    decoded: EpisodeDecoded,
    signals: EpisodeSignals | None,
    rules: RuleSet,
) -> EpisodeContent | None:
    """The worst clip values reject mode judges; None (nothing fetched, nothing computed) in
    the default flag-only mode or without signals."""
    if not rules.reject_content or signals is None:
        return None
    imu = fetch_imu(fetch, decoded)
    return episode_content(
        decoded, signals, imu, rules.clip_target_s, rules.dark_luma, rules.flat_std
    )


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
    content = judge_content(fetch, decoded, signals, rules)
    verdict, reasons, warnings = evaluate(decoded, keyframes, rules, checks, content)
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
    curation = settings.curation
    return RuleSet(
        keep_audio=settings.keep_audio,
        signal_sample_s=curation.sample_s,
        still_bits_per_pixel=curation.still_bits_per_pixel,
        reject_content=curation.reject,
        content_thresholds=ContentThresholds.of(curation),
        clip_target_s=settings.clip_target_s,
        dark_luma=curation.dark_luma,
        flat_std=curation.flat_std,
    )


def build_app(settings: Settings, rules: RuleSet | None = None) -> FastStream:
    broker = make_broker(settings, "validate")
    stage = build_stage(rules or rules_from(settings))
    return stage_app(settings, broker, stage)
