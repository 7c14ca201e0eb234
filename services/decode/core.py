"""Pure decode logic: classify unreadable files and turn container probes into an event."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

from schemas.events import (
    AudioInfo,
    CameraProbe,
    EpisodeDecoded,
    EpisodeUploaded,
    ImuInfo,
    ImuSignature,
    ReasonCode,
    StreamInfo,
    derive_event_id,
)
from services.media.model import ContainerProbe
from services.sensors.imu import ImuSummary
from services.sensors.imu_signature import SIGNATURE_VERSION, ImuDescriptor

MP4_BOX_TYPES = (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip", b"styp", b"moof")
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


def stream_infos(probe: ContainerProbe) -> list[StreamInfo]:
    """The event's view of every video stream of one probed file."""
    return [
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
            start_s=s.start_s,
            title=(s.title or None) and s.title[:200],
            bit_depth=s.bit_depth,
            intra_only=s.intra_only,
            jitter_s=s.jitter_s,
            drift_ppm=s.drift_ppm,
            vfr=s.vfr,
            clean_cut_count=len(s.clean_cut_times_s),
        )
        for s in probe.streams
    ]


def audio_infos(probe: ContainerProbe) -> list[AudioInfo]:
    return [
        AudioInfo(
            index=a.index,
            codec=a.codec,
            sample_rate=a.sample_rate,
            channels=a.channels,
            start_s=a.start_s,
            duration_s=a.duration_s,
            packet_count=a.packet_count,
        )
        for a in probe.audio
    ]


def camera_probe(
    name: str, key: str, offset_s: float, probe: ContainerProbe, observed_sha256: str
) -> CameraProbe:
    """One more camera's file, as the decoded event carries it."""
    return CameraProbe(
        name=name,
        key=key,
        offset_s=offset_s,
        container_format=probe.format_name,
        container_complete=probe.complete,
        duration_s=probe.duration_s,
        salvaged_s=probe.salvaged_s,
        salvage_limit_bytes=probe.salvage_limit_bytes,
        streams=stream_infos(probe),
        audio_streams=audio_infos(probe),
        observed_sha256=observed_sha256,
        keyframe_times_s=probe.streams[0].entry_times_s,
    )


def decoded_event(
    uploaded: EpisodeUploaded,
    probe: ContainerProbe,
    observed_sha256: str,
    imu_shape: tuple[int, ...] | None,
    imu_error: str | None,
    pipeline_version: str,
    now: datetime,
    packet_index_key: str | None = None,
    imu: ImuSummary | None = None,
    cameras: list[CameraProbe] | None = None,
    imu_signature: ImuDescriptor | None = None,
) -> EpisodeDecoded:
    """The `episodes.decoded` event for one probed episode. The event id derives from the
    upload event id and pipeline version, so a redelivered upload gives the same event.

    `keyframe_times_s` lists the primary stream's *entry points* (keyframes where decoding can
    start); the shard stage cuts clips there.
    """
    primary = 0  # the first video stream is the RGB stream by convention (depth follows)
    return EpisodeDecoded(
        event_id=derive_event_id("decoded", uploaded.event_id, pipeline_version),
        produced_at=now,
        pipeline_version=pipeline_version,
        episode=uploaded.episode,
        container_format=probe.format_name,
        container_complete=probe.complete,
        duration_s=probe.duration_s,
        streams=stream_infos(probe),
        primary_stream=primary,
        keyframe_times_s=probe.streams[primary].entry_times_s,
        observed_sha256=observed_sha256,
        packet_index_key=packet_index_key,
        imu_rows=imu_shape[0] if imu_shape else None,
        imu_cols=imu_shape[1] if imu_shape and len(imu_shape) > 1 else None,
        imu_error=imu_error,
        imu=None if imu is None else ImuInfo(**asdict(imu)),
        imu_signature=None if imu_signature is None else signature_model(imu_signature),
        audio_streams=audio_infos(probe),
        salvaged_s=probe.salvaged_s,
        salvage_limit_bytes=probe.salvage_limit_bytes,
        cameras=cameras or [],
    )


def signature_model(descriptor: ImuDescriptor) -> ImuSignature:
    """The IMU signature as the decoded event carries it."""
    return ImuSignature(
        version=SIGNATURE_VERSION,
        rate_hz=descriptor.rate_hz,
        start_s=descriptor.start_s,
        values=list(descriptor.values),
        peaks=descriptor.peaks,
        landmarks=list(descriptor.landmarks),
        landmark_t_s=list(descriptor.landmark_t_s),
    )
