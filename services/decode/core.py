"""Pure decode logic: classify unreadable files and turn a container probe into an event."""

from __future__ import annotations

from datetime import datetime

from schemas.events import (
    EpisodeDecoded,
    EpisodeUploaded,
    ReasonCode,
    StreamInfo,
    derive_event_id,
)
from services.media.av_io import ContainerProbe

MP4_BOX_TYPES = (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip")
EBML_MAGIC = b"\x1a\x45\xdf\xa3"


def classify_unreadable(head: bytes, size_bytes: int) -> ReasonCode:
    """Why a file that won't open as a container failed: empty, cut short, or not video at all.

    `head` is the file's first bytes (16 are enough): a file that starts like an MP4 box or an
    EBML (Matroska) header but won't open is an incomplete container.
    """
    if size_bytes == 0:
        return ReasonCode.EMPTY_FILE
    if head[4:8] in MP4_BOX_TYPES or head[:4] == EBML_MAGIC:
        return ReasonCode.CONTAINER_INCOMPLETE
    return ReasonCode.NOT_A_VIDEO


def packet_index_key(pipeline_version: str, episode_id: str, video_sha256: str) -> str:
    """Where decode stores an episode's packet index (content-addressed by the video)."""
    return f"index/{pipeline_version}/{episode_id}/{video_sha256}.packets.npy"


def decoded_event(
    uploaded: EpisodeUploaded,
    probe: ContainerProbe,
    observed_sha256: str,
    imu_shape: tuple[int, ...] | None,
    imu_error: str | None,
    pipeline_version: str,
    now: datetime,
    packet_index_key: str | None = None,
) -> EpisodeDecoded:
    """The `episodes.decoded` event for one probed episode. The event id derives from the
    upload event id and pipeline version, so a redelivered upload gives the same event."""
    streams = [
        StreamInfo(
            index=s.index,
            codec=s.codec,
            width=s.width,
            height=s.height,
            fps=s.fps,
            pix_fmt=s.pix_fmt,
            bit_rate=s.bit_rate,
            rotation_deg=s.rotation_deg,
            duration_s=s.duration_s,
            frame_count=s.frame_count,
            keyframe_count=len(s.keyframe_times_s),
            non_monotonic_count=s.non_monotonic_count,
            corrupt_packet_count=s.corrupt_packet_count,
            max_gap_s=s.max_gap_s,
        )
        for s in probe.streams
    ]
    primary = 0  # the first video stream is the RGB stream by convention (depth follows)
    return EpisodeDecoded(
        event_id=derive_event_id("decoded", uploaded.event_id, pipeline_version),
        produced_at=now,
        pipeline_version=pipeline_version,
        episode=uploaded.episode,
        container_format=probe.format_name,
        container_complete=probe.complete,
        duration_s=probe.duration_s,
        streams=streams,
        primary_stream=primary,
        keyframe_times_s=probe.streams[primary].keyframe_times_s,
        observed_sha256=observed_sha256,
        packet_index_key=packet_index_key,
        imu_rows=imu_shape[0] if imu_shape else None,
        imu_cols=imu_shape[1] if imu_shape and len(imu_shape) > 1 else None,
        imu_error=imu_error,
    )
