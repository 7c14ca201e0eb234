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

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from schemas.layers import CalibrationLayer, LabelsLayer, LayerVersionName

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
# Layers attached to episodes after ingestion (calibration, labels): read by the metadata service.
TOPIC_ANNOTATED = "episodes.annotated"
LAYER_TOPICS = (TOPIC_ANNOTATED,)
METADATA_TOPICS = (*STAGE_TOPICS, *LAYER_TOPICS)


def dlq_topic(topic: str) -> str:
    """The dead-letter topic of a stage's input topic."""
    return f"{topic}.dlq"


# Where the metadata service puts records of a DLQ topic that are themselves unreadable.
TOPIC_METADATA_DLQ = "metadata.dlq"
DLQ_TOPICS = tuple(dlq_topic(t) for t in METADATA_TOPICS)
# Observability: consumers' retry/isolation/rewind state, read by the lag monitor.
TOPIC_CONSUMER_STATUS = "egoline.consumer-status"
ALL_TOPICS = (*METADATA_TOPICS, *DLQ_TOPICS, TOPIC_METADATA_DLQ, TOPIC_CONSUMER_STATUS)


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
    IMU_TIMESTAMPS = "imu_timestamps"
    IMU_GAP = "imu_gap"
    IMU_COVERAGE = "imu_coverage"
    CONTAINER_TRUNCATED = "container_truncated"
    CAMERA_OVERLAP = "camera_overlap"
    AUDIO_DROPPED = "audio_dropped"
    # Content classes (`ContentClass`) rejected by the opt-in reject mode of curation
    # (`EGOLINE_CURATION_REJECT`, docs/curation.md); by default they are only flagged.
    CONTENT_COVERED = "content_covered"
    CONTENT_OVEREXPOSED = "content_overexposed"
    CONTENT_UNDEREXPOSED = "content_underexposed"
    CONTENT_BLUR = "content_blur"
    CONTENT_FROZEN = "content_frozen"
    CONTENT_STATIC = "content_static"
    SHARD_WRITE_FAILED = "shard_write_failed"
    RESOURCE_LIMIT = "resource_limit"
    LAYER_CONFLICT = "layer_conflict"
    INTERNAL_ERROR = "internal_error"


class ContentClass(StrEnum):
    """What an episode's content signals say is wrong with it (docs/curation.md). Duplicates
    are not a content class: they are found later, in the warehouse (`--exclude-duplicates`)."""

    COVERED = "covered"
    OVEREXPOSED = "overexposed"
    UNDEREXPOSED = "underexposed"
    BLUR = "blur"
    FROZEN = "frozen"
    STATIC = "static"

    @property
    def reason_code(self) -> ReasonCode:
        """The reason code of a reject for this class (`content_<class>`)."""
        return ReasonCode(f"content_{self.value}")


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class SourceFile(Model):
    """One raw file of an episode in the object store."""

    key: ObjectKey
    sha256: Sha256
    size_bytes: int = Field(ge=0)


CameraName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")]


class CameraFile(Model):
    """One more camera of a multi-camera episode: its own raw object, on the episode's clock
    shifted by `offset_s` (seconds to add to the file's timestamps)."""

    file: SourceFile
    offset_s: float = 0.0


class EpisodeRef(Model):
    """Who and what an episode is; carried by every event so each stage stands alone."""

    episode_id: EpisodeId
    device_id: DeviceId
    session_id: SessionId
    started_at: datetime
    video: SourceFile
    imu: SourceFile | None = None
    camera: CameraName = Field(default="main", description="name of the camera of `video`")
    cameras: dict[CameraName, CameraFile] = Field(
        default_factory=dict, max_length=16, description="the other cameras, by name"
    )
    imu_offset_s: float = Field(
        default=0.0, description="seconds to add to the IMU timestamps to reach the video clock"
    )
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
    start_s: float = Field(default=0.0, description="first pts on the file's clock, seconds")
    title: str | None = Field(default=None, max_length=200)
    bit_depth: int = Field(default=8, ge=1)
    intra_only: bool = False
    jitter_s: float = Field(default=0.0, ge=0, description="std of frame intervals")
    drift_ppm: float = Field(default=0.0, description="mean frame rate vs nominal fps, ppm")
    vfr: bool = Field(default=False, description="frame intervals vary by more than 1 %")
    clean_cut_count: int = Field(
        default=0, ge=0, description="keyframes with no open-GOP leading pictures"
    )


class AudioInfo(Model):
    """One audio stream, as probed. Times in seconds on the file's clock."""

    index: int = Field(ge=0)
    codec: str
    sample_rate: int = Field(ge=0)
    channels: int = Field(ge=0)
    start_s: float = 0.0
    duration_s: float = Field(ge=0)
    packet_count: int = Field(ge=0)


class ImuInfo(Model):
    """The IMU sidecar as read by decode: its own rate and timing against the video span."""

    source_format: str
    rows: int = Field(ge=0)
    t_first_s: float
    t_last_s: float
    rate_hz: float = Field(ge=0)
    nominal_rate_hz: float = Field(ge=0)
    jitter_s: float = Field(ge=0)
    max_gap_s: float = Field(ge=0)
    gap_count: int = Field(ge=0)
    non_monotonic_count: int = Field(ge=0)
    drift_ppm: float
    coverage: float = Field(ge=0, le=1)
    start_skew_s: float
    end_skew_s: float
    samples_before_video: int = Field(ge=0)
    samples_after_video: int = Field(ge=0)


class ImuSignature(Model):
    """The IMU trace's motion signature, as decode computes it (near duplicates; docs/curation.md):
    the gyro magnitude (rad/s) smoothed and resampled, value i at `start_s + i / rate_hz` on
    the video's clock, and its landmark hashes with their anchor times (seconds, same clock).
    No landmarks: the trace is uninformative (a device at rest), and matches nothing."""

    version: int = Field(default=1, ge=1, description="the signature algorithm's version")
    rate_hz: float = Field(gt=0)
    start_s: float
    values: list[float] = Field(default_factory=list, max_length=100_000)
    peaks: int = Field(default=0, ge=0)
    landmarks: list[int] = Field(default_factory=list, max_length=200_000)
    landmark_t_s: list[float] = Field(default_factory=list, max_length=200_000)

    @model_validator(mode="after")
    def _parallel(self) -> ImuSignature:
        if len(self.landmarks) != len(self.landmark_t_s):
            raise ValueError("landmarks and landmark_t_s must be parallel lists")
        return self


class CameraProbe(Model):
    """The probe of one more camera's file (multi-camera episodes)."""

    name: CameraName
    key: ObjectKey
    offset_s: float = 0.0
    container_format: str
    container_complete: bool
    duration_s: float = Field(ge=0)
    salvaged_s: float | None = None
    salvage_limit_bytes: int | None = None
    streams: list[StreamInfo]
    audio_streams: list[AudioInfo] = Field(default_factory=list)
    observed_sha256: Sha256
    keyframe_times_s: list[float] = Field(default_factory=list)


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
    imu: ImuInfo | None = None
    imu_signature: ImuSignature | None = Field(
        default=None, description="the IMU's motion signature (None: no IMU, or older decoders)"
    )
    audio_streams: list[AudioInfo] = Field(default_factory=list)
    salvaged_s: float | None = Field(
        default=None, description="seconds kept of a file cut short mid-write (power loss)"
    )
    salvage_limit_bytes: int | None = Field(
        default=None, ge=0, description="bytes of a cut-short file that hold whole packets"
    )
    cameras: list[CameraProbe] = Field(default_factory=list)


class Finding(Model):
    code: ReasonCode
    message: str = Field(max_length=2000)


class Verdict(StrEnum):
    ACCEPT = "accept"
    ACCEPT_WITH_WARNINGS = "accept_with_warnings"
    REJECT = "reject"


class StreamSignals(Model):
    """Content signals of one video stream, from the frames validate decodes anyway (its
    keyframes, at most one per `sample_s`), as columns: element i of each list is frame i.
    Times are seconds from the stream's first pts; luma values are 0-255 (8-bit scale)."""

    camera: CameraName
    stream_index: int = Field(ge=0)
    t_s: list[float] = Field(default_factory=list)
    sharpness: list[float] = Field(
        default_factory=list, description="variance of the Laplacian of the luma, 320 px wide"
    )
    mean_luma: list[float] = Field(default_factory=list)
    std_luma: list[float] = Field(default_factory=list)
    highlights: list[float] = Field(
        default_factory=list, description="fraction of pixels clipped at the top (luma >= 250)"
    )
    shadows: list[float] = Field(
        default_factory=list, description="fraction of pixels crushed at the bottom (luma <= 5)"
    )
    phash: list[str] = Field(
        default_factory=list, description="64-bit DCT perceptual hash (OpenCV img_hash), hex"
    )
    still_spans_s: list[tuple[float, float]] = Field(
        default_factory=list,
        description="[start, end) spans whose inter frames the encoder coded as near-empty: a "
        "frozen picture (read from packet sizes, no decoding)",
    )


class EpisodeSignals(Model):
    """Content signals of an episode (curation): per video stream (depth streams excluded)."""

    version: int = Field(default=1, ge=1, description="the signal algorithms' version")
    sample_s: float = Field(gt=0, description="at most one signal frame per this many seconds")
    streams: list[StreamSignals] = Field(default_factory=list)


class EpisodeValidated(Event):
    """`episodes.validated`: the verdict with its reasons; carries the probe for the shard stage."""

    schema_version: Literal[1] = 1
    decoded: EpisodeDecoded
    verdict: Verdict
    reasons: list[Finding] = Field(default_factory=list)
    warnings: list[Finding] = Field(default_factory=list)
    signals: EpisodeSignals | None = Field(
        default=None, description="content signals (curation); None from older validators"
    )


class ClipQuality(Model):
    """A clip's content signals over its time span: raw values, so a threshold is applied when
    a manifest is built and changing one never needs re-ingestion (docs/curation.md). Over
    several color streams the worst counts (lowest sharpness, most clipped, most frozen)."""

    sharpness: float | None = Field(
        default=None, ge=0, description="median variance of the Laplacian of the sampled frames"
    )
    mean_luma: float | None = Field(default=None, ge=0, le=255)
    highlights: float | None = Field(
        default=None, ge=0, le=1, description="mean fraction of clipped highlights"
    )
    shadows: float | None = Field(
        default=None, ge=0, le=1, description="mean fraction of crushed shadows"
    )
    frozen_fraction: float = Field(default=0.0, ge=0, le=1, description="share of time frozen")
    blocked_fraction: float = Field(
        default=0.0, ge=0, le=1, description="share of sampled frames dark and flat (lens covered)"
    )
    motion: float | None = Field(
        default=None, ge=0, description="gyro RMS over the clip, rad/s (None: no IMU)"
    )


class ClipMember(Model):
    """One stream's member file of a clip (besides the JSON), where it lies in the shard."""

    name: str = Field(max_length=300, description="tar member name: <clip_key>.<ext>")
    camera: CameraName
    kind: Literal["video", "imu"]
    stream_index: int | None = Field(default=None, ge=0)
    label: str = Field(max_length=64, description="camera, or camera-stream title (depth...)")
    codec: str | None = None
    pix_fmt: str | None = None
    offset: int = Field(ge=0)
    length: int = Field(gt=0)
    frame_count: int = Field(ge=0, description="frames (video) or samples (IMU) in the window")
    audio_streams: int = Field(default=0, ge=0)


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
    members: list[ClipMember] = Field(
        default_factory=list, description="every member but the JSON: each video stream, IMU"
    )
    quality: ClipQuality | None = Field(
        default=None, description="content signals over the clip (None from older shards)"
    )


class ShardsWritten(Event):
    """`shards.written`: one complete shard published under its final content-addressed key."""

    schema_version: Literal[1] = 1
    shard_key: ObjectKey
    index_key: ObjectKey
    shard_sha256: Sha256
    size_bytes: int = Field(gt=0)
    episodes: list[EpisodeRef]
    clips: list[ClipRecord]


class EpisodesAnnotated(Event):
    """`episodes.annotated`: one whole layer version (calibration or labels) for one or more
    episodes. A version is immutable: the same kind and version again with the same rows is a
    no-op, with other rows a `layer_conflict` dead letter. Large versions: `egoline layer
    ingest` from a file (the same rows, the same tables)."""

    schema_version: Literal[1] = 1
    version: LayerVersionName
    author: str = Field(min_length=1, max_length=256)
    source: str = Field(min_length=1, max_length=1024, description="tool, file or URL")
    layer: CalibrationLayer | LabelsLayer = Field(discriminator="kind")


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
    exception_type: str | None = Field(
        default=None,
        max_length=256,
        description="internal_error isolated by bisection: the exception's type",
    )
    traceback_digest: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{16}$",
        description="internal_error isolated by bisection: a digest of where it was raised "
        "(the same bug gives the same digest)",
    )


class ConsumerState(StrEnum):
    """What a consumer is doing with a batch it could not commit (`egoline.consumer-status`)."""

    RETRYING = "retrying"  # a batch-level step failed with a bug; tried again with backoff
    ISOLATING = "isolating"  # every attempt failed: bisecting for the records that break it
    REWINDING = "rewinding"  # the batch was rewound (a dependency down, a worker died)
    COMMITTED = "committed"  # the batch after those was committed: the consumer moves again


class PartitionPosition(Model):
    topic: str = Field(max_length=249)
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)


class ConsumerStatus(Model):
    """`egoline.consumer-status` (keyed by group): published by a stage or the metadata
    service each time it retries, isolates or rewinds a batch, and once when it commits again.
    The lag monitor shows the latest one per group (a group rewinding again and again is STALL,
    with this reason). Observability only: never needed for correctness."""

    schema_version: Literal[1] = 1
    event_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    at: datetime
    group: str = Field(max_length=256)
    stage: str = Field(max_length=64)
    state: ConsumerState
    count: int = Field(ge=0, description="consecutive rewinds, or attempts of the failing step")
    positions: list[PartitionPosition] = Field(
        max_length=10_000, description="the batch's first offset on each of its partitions"
    )
    reason: str = Field(max_length=2000)


EVENT_MODELS: dict[str, type[Model]] = {
    TOPIC_UPLOADED: EpisodeUploaded,
    TOPIC_DECODED: EpisodeDecoded,
    TOPIC_VALIDATED: EpisodeValidated,
    TOPIC_SHARDS: ShardsWritten,
    TOPIC_ANNOTATED: EpisodesAnnotated,
    "dlq": DlqRecord,
    TOPIC_CONSUMER_STATUS: ConsumerStatus,
}
