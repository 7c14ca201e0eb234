"""Pure validation rules: an `episodes.decoded` event (plus the keyframe check) -> a verdict.

Every rule reports with a `ReasonCode`; the same codes appear in DLQ records and in docs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from schemas.events import EpisodeDecoded, Finding, ReasonCode, Verdict


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
    full_decode: bool = Field(default=False, description="decode every frame, not only keyframes")


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
        for s in decoded.streams
    )


def evaluate(
    decoded: EpisodeDecoded, keyframes: KeyframeResult | None, rules: RuleSet
) -> tuple[Verdict, list[Finding], list[Finding]]:
    """Apply every rule; returns (verdict, reasons to reject, warnings)."""
    reasons: list[Finding] = []
    warnings: list[Finding] = []

    def reject(code: ReasonCode, message: str) -> None:
        reasons.append(Finding(code=code, message=message))

    if decoded.observed_sha256 != decoded.episode.video.sha256:
        reject(
            ReasonCode.SHA256_MISMATCH,
            f"video sha256 {decoded.observed_sha256} != announced {decoded.episode.video.sha256}",
        )
    if not decoded.container_complete:
        reject(ReasonCode.CONTAINER_INCOMPLETE, "packets end before the duration the header states")
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
    for s in decoded.streams:
        too_small = s.width < rules.min_width or s.height < rules.min_height
        too_big = s.width > rules.max_width or s.height > rules.max_height
        if too_small or too_big or s.width * s.height > rules.max_pixels:
            reject(
                ReasonCode.RESOLUTION_OUT_OF_BOUNDS,
                f"stream {s.index}: {s.width}x{s.height} outside bounds",
            )
    if stream.non_monotonic_count:
        reject(
            ReasonCode.NON_MONOTONIC_TIMESTAMPS,
            f"{stream.non_monotonic_count} packets with non-increasing decode timestamps",
        )
    if stream.max_gap_s > rules.max_gap_s:
        reject(ReasonCode.TIMESTAMP_GAP, f"gap of {stream.max_gap_s:.3f}s > {rules.max_gap_s}s")
    if stream.corrupt_packet_count:
        reject(ReasonCode.CORRUPT_PACKETS, f"{stream.corrupt_packet_count} packets flagged corrupt")
    if keyframes is not None and (keyframes.failed or keyframes.decoded < stream.keyframe_count):
        reject(
            ReasonCode.KEYFRAME_UNDECODABLE,
            f"{keyframes.failed} decode errors, {keyframes.decoded}/{stream.keyframe_count} "
            f"keyframes decoded: {keyframes.first_error or 'frames missing'}",
        )
    _imu_rules(decoded, rules, reject, warnings)
    if reasons:
        return Verdict.REJECT, reasons, warnings
    return (Verdict.ACCEPT_WITH_WARNINGS if warnings else Verdict.ACCEPT), reasons, warnings


def _imu_rules(
    decoded: EpisodeDecoded,
    rules: RuleSet,
    add: Callable[[ReasonCode, str], None],
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
    if decoded.imu_cols != 6:
        add(ReasonCode.IMU_UNREADABLE, f"IMU has {decoded.imu_cols} columns, expected 6")
    if abs(decoded.imu_rows - stream.frame_count) > rules.imu_row_tolerance:
        add(
            ReasonCode.IMU_ROW_MISMATCH,
            f"{decoded.imu_rows} IMU rows for {stream.frame_count} frames",
        )
