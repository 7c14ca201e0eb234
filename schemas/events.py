"""Every event egoline puts on Kafka, as versioned pydantic models.

Each model carries `schema_version`; a consumer rejects (dead-letters) versions it doesn't know.
Compatibility rule: a new version may add optional fields only, so consumers of version N+1 read
version N events (backward compatible); consumers ignore unknown fields (forward compatible).
The committed JSON Schemas in `schemas/jsonschema/` are checked against these models by tests.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# An episode id never holds a dot: WebDataset splits a member name at its first dot.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
EpisodeId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
DeviceId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
SessionId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
Tag = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:=-]{0,63}$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
ObjectKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9/_.=-]{0,1023}$")]

TOPIC_UPLOADED = "episodes.uploaded"
TOPIC_DECODED = "episodes.decoded"
TOPIC_VALIDATED = "episodes.validated"
TOPIC_SHARDS = "shards.written"
STAGE_TOPICS = (TOPIC_UPLOADED, TOPIC_DECODED, TOPIC_VALIDATED, TOPIC_SHARDS)


def dlq_topic(topic: str) -> str:
    """The dead-letter topic of a stage's input topic."""
    return f"{topic}.dlq"


# Where the metadata service puts records of a DLQ topic that are themselves unreadable.
TOPIC_METADATA_DLQ = "metadata.dlq"
DLQ_TOPICS = tuple(dlq_topic(t) for t in STAGE_TOPICS)
ALL_TOPICS = (*STAGE_TOPICS, *DLQ_TOPICS, TOPIC_METADATA_DLQ)


def derive_event_id(*parts: str) -> str:
    """A stable event id: the same input always yields the same id, so redelivery dedups."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


class ReasonCode(StrEnum):
    """Why a stage rejected (or warned about) an episode. Shared by rules, DLQ and docs."""

    MALFORMED_EVENT = "malformed_event"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    OBJECT_MISSING = "object_missing"
    SHA256_MISMATCH = "sha256_mismatch"
    NOT_A_VIDEO = "not_a_video"
    EMPTY_FILE = "empty_file"
    CONTAINER_INCOMPLETE = "container_incomplete"
    NO_VIDEO_STREAM = "no_video_stream"
    CORRUPT_PACKETS = "corrupt_packets"
    KEYFRAME_UNDECODABLE = "keyframe_undecodable"
    DURATION_OUT_OF_BOUNDS = "duration_out_of_bounds"
    FPS_OUT_OF_BOUNDS = "fps_out_of_bounds"
    RESOLUTION_OUT_OF_BOUNDS = "resolution_out_of_bounds"
    NON_MONOTONIC_TIMESTAMPS = "non_monotonic_timestamps"
    TIMESTAMP_GAP = "timestamp_gap"
    IMU_UNREADABLE = "imu_unreadable"
    IMU_ROW_MISMATCH = "imu_row_mismatch"
    SHARD_WRITE_FAILED = "shard_write_failed"
    INTERNAL_ERROR = "internal_error"


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class SourceFile(Model):
    """One raw file of an episode in the object store."""

    key: ObjectKey
    sha256: Sha256
    size_bytes: int = Field(ge=0)


class EpisodeRef(Model):
    """Who and what an episode is; carried by every event so each stage stands alone."""

    episode_id: EpisodeId
    device_id: DeviceId
    session_id: SessionId
    started_at: datetime
    video: SourceFile
    imu: SourceFile | None = None
    tags: list[Tag] = Field(
        default_factory=list,
        max_length=64,
        description="free labels from the recording (task, site, rig...); manifests filter on them",
    )


class Event(Model):
    event_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    produced_at: datetime
    pipeline_version: str = Field(default="v1", max_length=64)


class EpisodeUploaded(Event):
    """`episodes.uploaded`: the raw files are complete and verified in the object store."""

    schema_version: Literal[1] = 1
    episode: EpisodeRef


class StreamInfo(Model):
    """One video stream, as probed by demuxing (no decoding). Times in seconds."""

    index: int = Field(ge=0)
    codec: str
    width: int = Field(ge=0)
    height: int = Field(ge=0)
    fps: float = Field(ge=0)
    pix_fmt: str | None = None
    bit_rate: int | None = None
    rotation_deg: int = 0
    duration_s: float = Field(ge=0)
    frame_count: int = Field(ge=0)
    keyframe_count: int = Field(ge=0)
    non_monotonic_count: int = Field(default=0, ge=0)
    corrupt_packet_count: int = Field(default=0, ge=0)
    max_gap_s: float = Field(default=0, ge=0)


class EpisodeDecoded(Event):
    """`episodes.decoded`: container probe and the GOP index of the primary stream."""

    schema_version: Literal[1] = 1
    episode: EpisodeRef
    container_format: str
    container_complete: bool
    duration_s: float = Field(ge=0)
    streams: list[StreamInfo]
    primary_stream: int = Field(ge=0, description="index into `streams` of the RGB stream")
    keyframe_times_s: list[float] = Field(
        description="seconds from the primary stream's first pts to each of its keyframes"
    )
    observed_sha256: Sha256 = Field(description="sha256 of the video bytes decode read")
    packet_index_key: ObjectKey | None = Field(
        default=None,
        description="object key of the primary stream's packet index (.npy structured array: "
        "pts, dts, pos, size, keyframe), kept out of the event because it is large",
    )
    imu_rows: int | None = Field(default=None, ge=0)
    imu_cols: int | None = Field(default=None, ge=0)
    imu_error: str | None = Field(default=None, max_length=2000)


class Finding(Model):
    code: ReasonCode
    message: str = Field(max_length=2000)


class Verdict(StrEnum):
    ACCEPT = "accept"
    ACCEPT_WITH_WARNINGS = "accept_with_warnings"
    REJECT = "reject"


class EpisodeValidated(Event):
    """`episodes.validated`: the verdict with its reasons; carries the probe for the shard stage."""

    schema_version: Literal[1] = 1
    decoded: EpisodeDecoded
    verdict: Verdict
    reasons: list[Finding] = Field(default_factory=list)
    warnings: list[Finding] = Field(default_factory=list)


class ClipRecord(Model):
    """One clip inside a shard: a GOP-aligned remuxed MP4 plus its IMU slice and metadata.

    Byte ranges are offsets of the member's data inside the shard tar.
    """

    clip_key: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,200}$")]
    episode_id: EpisodeId
    clip_index: int = Field(ge=0)
    start_s: float = Field(ge=0)
    duration_s: float = Field(ge=0)
    frame_count: int = Field(ge=0)
    mp4_offset: int = Field(ge=0)
    mp4_length: int = Field(gt=0)
    imu_offset: int | None = Field(default=None, ge=0)
    imu_length: int | None = Field(default=None, gt=0)
    json_offset: int = Field(ge=0)
    json_length: int = Field(gt=0)


class ShardsWritten(Event):
    """`shards.written`: one complete shard published under its final content-addressed key."""

    schema_version: Literal[1] = 1
    shard_key: ObjectKey
    index_key: ObjectKey
    shard_sha256: Sha256
    size_bytes: int = Field(gt=0)
    episodes: list[EpisodeRef]
    clips: list[ClipRecord]


class DlqRecord(Model):
    """`<topic>.dlq`: what a stage rejected, why, and the original record untouched."""

    schema_version: Literal[1] = 1
    event_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    failed_at: datetime
    stage: str
    source_topic: str
    source_partition: int
    source_offset: int
    reason_code: ReasonCode
    reason: str = Field(max_length=4000)
    original_key: str | None = None
    original_value: str = Field(description="the original record value, UTF-8 or base64")
    original_encoding: Literal["utf-8", "base64"] = "utf-8"
    original_size: int | None = Field(
        default=None, ge=0, description="bytes of the original value when it was cut short"
    )
    original_truncated: bool = Field(
        default=False,
        description="only the first 256 KiB of a huge record are kept, so that the envelope "
        "always fits in a Kafka message",
    )


EVENT_MODELS: dict[str, type[Model]] = {
    TOPIC_UPLOADED: EpisodeUploaded,
    TOPIC_DECODED: EpisodeDecoded,
    TOPIC_VALIDATED: EpisodeValidated,
    TOPIC_SHARDS: ShardsWritten,
    "dlq": DlqRecord,
}
