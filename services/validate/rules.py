"""Pure validation rules: an `episodes.decoded` event (plus the keyframe check) -> a verdict.

Every rule reports with a `ReasonCode`; the same codes appear in DLQ records and in docs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from schemas.events import (
    ContentClass,
    EpisodeDecoded,
    Finding,
    ReasonCode,
    StreamInfo,
    Verdict,
)
from services.media.content import (
    ContentThresholds,
    EpisodeContent,
    content_classes,
    describe,
)


class RuleSet(BaseModel):
    """Bounds for the rules. Durations in seconds, rates in frames per second."""

    model_config = ConfigDict(frozen=True)

    min_duration_s: float = Field(default=1.0, ge=0)
    max_duration_s: float = Field(default=4 * 3600.0, gt=0)
    min_fps: float = Field(default=5.0, ge=0)
    max_fps: float = Field(default=240.0, gt=0)
    min_width: int = Field(default=64, ge=1)
    min_height: int = Field(default=64, ge=1)
    max_width: int = Field(default=7680, ge=1)
    max_height: int = Field(default=4320, ge=1)
    max_pixels: int = Field(default=7680 * 4320, ge=1, description="guard against absurd sizes")
    max_gap_s: float = Field(default=0.5, gt=0, description="largest allowed pts gap")
    imu_row_tolerance: int = Field(default=0, ge=0, description="allowed |imu rows - frames|")
    imu_required: bool = False
    imu_min_rate_hz: float = Field(default=20.0, gt=0, description="slowest IMU accepted")
    imu_max_rate_hz: float = Field(default=10_000.0, gt=0, description="fastest IMU accepted")
    imu_max_gap_s: float = Field(default=0.1, gt=0, description="a longer IMU gap warns")
    imu_min_coverage: float = Field(
        default=0.9, ge=0, le=1, description="IMU must span this fraction of the video, or warn"
    )
    camera_min_overlap: float = Field(
        default=0.5, ge=0, le=1, description="each camera must overlap this fraction of the main"
    )
    camera_max_skew_s: float = Field(default=0.1, ge=0, description="a larger start skew warns")
    keep_audio: bool = Field(default=True, description="audio tracks go into the clips")
    full_decode: bool = Field(default=False, description="decode every frame, not only keyframes")
    # Curation signals ride on the keyframe decode (docs/curation.md); None: not computed.
    signal_sample_s: float | None = Field(default=1.0, gt=0, description="one frame per this")
    still_bits_per_pixel: float = Field(default=0.004, gt=0, description="a still inter frame")
    # Opt-in reject mode (docs/curation.md): the content classes rejected (empty: flag only),
    # the thresholds that decide them, and what judging the clips needs (the shard stage's
    # clip length, the covered-lens frame rule).
    reject_content: frozenset[ContentClass] = frozenset()
    content_thresholds: ContentThresholds = ContentThresholds()
    clip_target_s: float = Field(default=10.0, gt=0, description="the clips judged, seconds")
    dark_luma: float = Field(default=24.0, ge=0, le=255, description="covered: darker than")
    flat_std: float = Field(default=2.0, ge=0, description="covered: luma std below")


@dataclass(frozen=True)
class KeyframeResult:
    """What decoding the keyframes (or every frame) of the primary stream found."""

    decoded: int
    failed: int
    first_error: str | None = None


def dimensions_in_bounds(decoded: EpisodeDecoded, rules: RuleSet) -> bool:
    """Whether every stream's declared size passes the resolution guard. Checked *before*
    anything is decoded: a hostile header declaring e.g. 60000x60000 would otherwise make the
    decoder allocate gigabytes for one frame."""
    return all(
        rules.min_width <= s.width <= rules.max_width
        and rules.min_height <= s.height <= rules.max_height
        and s.width * s.height <= rules.max_pixels
        for s in [*decoded.streams, *(x for c in decoded.cameras for x in c.streams)]
    )


def evaluate(
    decoded: EpisodeDecoded,
    keyframes: KeyframeResult | None,
    rules: RuleSet,
    stream_keyframes: dict[tuple[str, int], KeyframeResult] | None = None,
    content: EpisodeContent | None = None,
) -> tuple[Verdict, list[Finding], list[Finding]]:
    """Apply every rule; returns (verdict, reasons to reject, warnings).

    `keyframes` is the check of the primary stream; `stream_keyframes` that of every other video
    stream, keyed by (camera, stream index) (the main camera is `decoded.episode.camera`).
    `content`: the episode's worst clip values (reject mode), each class of
    `rules.reject_content` that they show rejects with its `content_<class>` code.
    """
    reasons: list[Finding] = []
    warnings: list[Finding] = []

    def reject(code: ReasonCode, message: str) -> None:
        reasons.append(Finding(code=code, message=message[:2000]))

    def warn(code: ReasonCode, message: str) -> None:
        warnings.append(Finding(code=code, message=message[:2000]))

    if decoded.observed_sha256 != decoded.episode.video.sha256:
        reject(
            ReasonCode.SHA256_MISMATCH,
            f"video sha256 {decoded.observed_sha256} != announced {decoded.episode.video.sha256}",
        )
    main = decoded.episode.camera
    _completeness(main, decoded.container_complete, decoded.salvaged_s, rules, reject, warn)
    stream = decoded.streams[decoded.primary_stream]
    if not rules.min_duration_s <= stream.duration_s <= rules.max_duration_s:
        reject(
            ReasonCode.DURATION_OUT_OF_BOUNDS,
            f"duration {stream.duration_s:.3f}s outside "
            f"[{rules.min_duration_s}, {rules.max_duration_s}]",
        )
    if not rules.min_fps <= stream.fps <= rules.max_fps:
        reject(
            ReasonCode.FPS_OUT_OF_BOUNDS,
            f"fps {stream.fps:.3f} outside [{rules.min_fps}, {rules.max_fps}]",
        )
    files = [(main, decoded.streams)] + [(c.name, c.streams) for c in decoded.cameras]
    checks = dict(stream_keyframes or {})
    if keyframes is not None:
        checks[(main, stream.index)] = keyframes
    for camera, streams in files:
        for s in streams:
            _stream_rules(camera, s, checks.get((camera, s.index)), rules, reject)
    for cam in decoded.cameras:
        sha = next(
            (c.file.sha256 for n, c in decoded.episode.cameras.items() if n == cam.name), None
        )
        if sha is not None and sha != cam.observed_sha256:
            reject(ReasonCode.SHA256_MISMATCH, f"camera {cam.name}: sha256 differs")
        _completeness(cam.name, cam.container_complete, cam.salvaged_s, rules, reject, warn)
    _camera_rules(decoded, rules, reject, warn)
    audio = len(decoded.audio_streams) + sum(len(c.audio_streams) for c in decoded.cameras)
    if audio and not rules.keep_audio:
        warn(ReasonCode.AUDIO_DROPPED, f"{audio} audio stream(s) dropped (keep_audio is off)")
    _imu_rules(decoded, rules, reject, warnings)
    if content is not None and rules.reject_content:
        shown = content_classes(content, rules.content_thresholds)
        for cls in ContentClass:  # declaration order: the reasons' order is stable
            if cls in shown and cls in rules.reject_content:
                reject(cls.reason_code, describe(cls, content, rules.content_thresholds))
    if reasons:
        return Verdict.REJECT, reasons, warnings
    return (Verdict.ACCEPT_WITH_WARNINGS if warnings else Verdict.ACCEPT), reasons, warnings


Add = Callable[[ReasonCode, str], None]


def _completeness(
    camera: str, complete: bool, salvaged_s: float | None, rules: RuleSet, reject: Add, warn: Add
) -> None:
    """A file cut short mid-write keeps what it holds whole (`salvaged_s`); only a file with
    nothing usable is refused."""
    if complete:
        return
    if salvaged_s is not None and salvaged_s >= rules.min_duration_s:
        warn(
            ReasonCode.CONTAINER_TRUNCATED,
            f"{camera}: file cut short; {salvaged_s:.3f}s of whole packets salvaged",
        )
    else:
        reject(
            ReasonCode.CONTAINER_INCOMPLETE,
            f"{camera}: packets end before the duration the header states"
            + (f" (only {salvaged_s:.3f}s salvageable)" if salvaged_s is not None else ""),
        )


def _stream_rules(
    camera: str, s: StreamInfo, check: KeyframeResult | None, rules: RuleSet, reject: Add
) -> None:
    where = f"{camera} stream {s.index}"
    too_small = s.width < rules.min_width or s.height < rules.min_height
    too_big = s.width > rules.max_width or s.height > rules.max_height
    if too_small or too_big or s.width * s.height > rules.max_pixels:
        reject(ReasonCode.RESOLUTION_OUT_OF_BOUNDS, f"{where}: {s.width}x{s.height} outside bounds")
    if s.non_monotonic_count:
        reject(
            ReasonCode.NON_MONOTONIC_TIMESTAMPS,
            f"{where}: {s.non_monotonic_count} packets with non-increasing decode timestamps",
        )
    if s.max_gap_s > rules.max_gap_s:
        reject(ReasonCode.TIMESTAMP_GAP, f"{where}: gap of {s.max_gap_s:.3f}s > {rules.max_gap_s}s")
    if s.corrupt_packet_count:
        reject(
            ReasonCode.CORRUPT_PACKETS, f"{where}: {s.corrupt_packet_count} packets flagged corrupt"
        )
    if check is not None and (check.failed or check.decoded < s.keyframe_count):
        reject(
            ReasonCode.KEYFRAME_UNDECODABLE,
            f"{where}: {check.failed} decode errors, {check.decoded}/{s.keyframe_count} "
            f"keyframes decoded: {check.first_error or 'frames missing'}",
        )


def camera_span(
    start_s: float, duration_s: float, offset_s: float, origin_s: float
) -> tuple[float, float]:
    """A stream's [start, end) on the episode clock (seconds from the main stream's start)."""
    begin = start_s + offset_s - origin_s
    return begin, begin + duration_s


def _camera_rules(decoded: EpisodeDecoded, rules: RuleSet, reject: Add, warn: Add) -> None:
    main = decoded.streams[decoded.primary_stream]
    main_end = main.duration_s
    for cam in decoded.cameras:
        s = cam.streams[0]
        begin, end = camera_span(s.start_s, s.duration_s, cam.offset_s, main.start_s)
        overlap = max(0.0, min(end, main_end) - max(begin, 0.0))
        fraction = overlap / main_end if main_end else 0.0
        if fraction < rules.camera_min_overlap:
            reject(
                ReasonCode.CAMERA_OVERLAP,
                f"camera {cam.name} overlaps the main camera for {overlap:.3f}s "
                f"({fraction:.0%} < {rules.camera_min_overlap:.0%})",
            )
        elif abs(begin) > rules.camera_max_skew_s:
            warn(ReasonCode.CAMERA_OVERLAP, f"camera {cam.name} starts {begin:+.3f}s off the main")


def _imu_rules(
    decoded: EpisodeDecoded,
    rules: RuleSet,
    add: Add,
    warnings: list[Finding],
) -> None:
    stream = decoded.streams[decoded.primary_stream]
    if decoded.episode.imu is None:
        if rules.imu_required:
            add(ReasonCode.IMU_UNREADABLE, "episode has no IMU sidecar")
        else:
            warnings.append(Finding(code=ReasonCode.IMU_UNREADABLE, message="no IMU sidecar"))
        return
    if decoded.imu_error is not None or decoded.imu_rows is None:
        add(ReasonCode.IMU_UNREADABLE, decoded.imu_error or "IMU shape unknown")
        return
    imu = decoded.imu
    if imu is None or imu.source_format == "npy_frame_synced":
        # Frame-synced (frames, 6): one row per frame, as before.
        if decoded.imu_cols != 6:
            add(ReasonCode.IMU_UNREADABLE, f"IMU has {decoded.imu_cols} columns, expected 6")
        if abs(decoded.imu_rows - stream.frame_count) > rules.imu_row_tolerance:
            add(
                ReasonCode.IMU_ROW_MISMATCH,
                f"{decoded.imu_rows} IMU rows for {stream.frame_count} frames",
            )
        return
    if imu.non_monotonic_count:
        add(ReasonCode.IMU_TIMESTAMPS, f"{imu.non_monotonic_count} IMU timestamps do not increase")
    if not rules.imu_min_rate_hz <= imu.rate_hz <= rules.imu_max_rate_hz:
        add(
            ReasonCode.IMU_TIMESTAMPS,
            f"IMU rate {imu.rate_hz:.1f} Hz outside "
            f"[{rules.imu_min_rate_hz}, {rules.imu_max_rate_hz}]",
        )
    if imu.max_gap_s > rules.imu_max_gap_s:
        warnings.append(
            Finding(
                code=ReasonCode.IMU_GAP,
                message=f"{imu.gap_count} IMU gaps, largest {imu.max_gap_s:.3f}s",
            )
        )
    if imu.coverage < rules.imu_min_coverage:
        warnings.append(
            Finding(
                code=ReasonCode.IMU_COVERAGE,
                message=f"IMU covers {imu.coverage:.0%} of the video "
                f"(starts {imu.start_skew_s:+.3f}s, ends {imu.end_skew_s:+.3f}s)",
            )
        )
