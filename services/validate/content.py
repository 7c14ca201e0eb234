"""What validate's reject mode judges (pure): an episode's clips' content signals over the same
windows the shard stage will cut and summarise (`media.cutting.clip_windows`,
`media.signals.clip_quality`), so an episode is rejected for exactly the values its clips would
have carried into the warehouse (docs/curation.md)."""

from __future__ import annotations

from schemas.events import ClipQuality, EpisodeDecoded, EpisodeSignals
from services.media.content import EpisodeContent
from services.media.cutting import clip_windows, episode_clock
from services.media.signals import clip_quality, signals_on_clock
from services.sensors.imu import ImuSamples, slice_imu_by_windows


def clip_qualities(
    decoded: EpisodeDecoded,
    signals: EpisodeSignals,
    imu: ImuSamples | None,
    clip_target_s: float,
    dark_luma: float,
    flat_std: float,
) -> list[ClipQuality]:
    """Each future clip's signals (the shard stage's `quality`): windows of about
    `clip_target_s` seconds at the main stream's keyframes, the signals moved onto the episode
    clock, the IMU (on the main stream's clock) sliced by the same windows. Empty only when
    the episode spans no time."""
    clock = episode_clock(decoded)
    windows = clip_windows(decoded, clock, clip_target_s)
    streams = signals_on_clock(signals, clock.starts_s)
    slices = (
        None if imu is None else slice_imu_by_windows(imu, windows, clock.primary_shift_s(decoded))
    )
    return [
        clip_quality(streams, a, b, None if slices is None else slices[i], dark_luma, flat_std)
        for i, (a, b) in enumerate(windows)
    ]


def episode_content(
    decoded: EpisodeDecoded,
    signals: EpisodeSignals,
    imu: ImuSamples | None,
    clip_target_s: float,
    dark_luma: float,
    flat_std: float,
) -> EpisodeContent | None:
    """The episode's worst clip values, None when it has no clip to judge."""
    qualities = clip_qualities(decoded, signals, imu, clip_target_s, dark_luma, flat_std)
    return EpisodeContent.of_clips(qualities) if qualities else None
