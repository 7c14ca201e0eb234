"""One frozen settings object per egoline process.

Values come from `EGOLINE_*` environment variables first, then from the endpoints file that
`egoline stack up` writes (`.stack/endpoints.env`), then from the defaults below. Nothing else in
egoline reads `os.environ`.

Settings are grouped: `kafka`, `s3`, `agent` and `reader` are nested models whose environment
names keep the flat form (`EGOLINE_KAFKA_SASL_USERNAME` is `settings.kafka.sasl_username`:
the first `_` after the prefix splits the group from the field). The device agent runs on
`DeviceSettings` (broker, object store, its own tuning: nothing of the warehouse); the pipeline
services on `Settings`, which adds the warehouse, the stages and the read path.
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PostgresDsn,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from schemas.events import ContentClass

STACK_DIR_DEFAULT = Path(".stack")
ENDPOINTS_FILE = "endpoints.env"
# Credentials that are not secrets: the built-in defaults (the embedded S3 emulator accepts
# any) and the `change-me-...` placeholders of compose/.env.example.
PLACEHOLDER_SECRETS = frozenset({"egoline", "egoline-secret"})
PLACEHOLDER_PREFIX = "change-me"


def _endpoints_file() -> Path:
    # The stack dir may itself be moved with EGOLINE_STACK_DIR; resolve it before the model loads
    # so the endpoints file written by `stack up` is found by every process in the same tree.
    import os

    return Path(os.environ.get("EGOLINE_STACK_DIR", str(STACK_DIR_DEFAULT))) / ENDPOINTS_FILE


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class KafkaSettings(_Group):
    """`EGOLINE_KAFKA_*`: the brokers and the client settings every process shares.

    Consumer timings default to values that make group joins fast (seconds, not tens of
    seconds) on both Apache Kafka and the embedded broker; see docs/stack.md."""

    bootstrap: str | None = None
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    # TLS to the brokers (security protocol SSL or SASL_SSL): CA bundle, and for mutual TLS the
    # client certificate and key.
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    session_timeout_ms: int = Field(default=6000, ge=1000)
    heartbeat_interval_ms: int = Field(default=1000, ge=100)
    assignment_strategy: Literal["cooperative-sticky", "range", "roundrobin"] = "cooperative-sticky"


class S3Settings(_Group):
    """`EGOLINE_S3_*`: the object store (MinIO, S3, or the embedded moto)."""

    endpoint: str | None = None  # host:port or http(s)://host:port
    access_key: SecretStr = SecretStr("egoline")
    secret_key: SecretStr = SecretStr("egoline-secret")
    region: str = "us-east-1"
    # TLS to the object store (an https:// endpoint): a CA bundle for a private CA; verification
    # can be turned off only explicitly.
    ca_bundle: str | None = None
    tls_verify: bool = True
    bucket: str = "egoline"
    part_size_mb: int = Field(default=16, ge=5)


class AgentSettings(_Group):
    """`EGOLINE_AGENT_*`: the device upload agent (docs/agent.md)."""

    state_dir: Path = Field(default=Path(".stack/agent"), description="journal location")
    part_size_mb: int = Field(default=16, ge=5, le=5120, description="multipart part size")
    upload_concurrency: int = Field(default=3, ge=1, le=64)
    bandwidth_mb_s: float | None = Field(default=None, gt=0, description="upload cap")
    ready_mode: Literal["marker", "stable"] = "marker"
    stable_s: float = Field(default=5.0, ge=0, description="stable mode: quiet period")
    after_publish: Literal["keep", "delete", "archive"] = "keep"
    archive_dir: Path | None = None
    poll_s: float = Field(default=2.0, gt=0)
    retry_max_s: float = Field(default=300.0, gt=0, description="give up a pass after this")
    message_timeout_s: float = Field(default=300.0, gt=0)


class ReaderSettings(_Group):
    """`EGOLINE_READER_*`: the training node's read path (docs/reader.md)."""

    cache_dir: Path = Field(
        default=Path(".stack/cache/clips"), description="node-local cache of clip spans"
    )
    cache_mb: int = Field(default=20480, ge=1, description="clip cache size cap")
    prefetch_clips: int = Field(
        default=16, ge=0, le=4096, description="clips fetched ahead of the reader (0: off)"
    )
    shuffle_buffer: int = Field(
        default=256, ge=0, description="clips mix within a window this wide (0/1: shard order)"
    )
    run_name: str | None = Field(
        default=None,
        description="a training run: `open_reader` registers it as reading its manifest",
    )


class CurationSettings(_Group):
    """`EGOLINE_CURATION_*`: content signals and duplicates (docs/curation.md).

    The frame-level ones (`sample_s`, `dark_luma`, `flat_std`, `still_bits_per_pixel`) shape
    the signals the pipeline computes: changing them is a new pipeline version and a backfill.
    The others are thresholds applied when a manifest is built, on the raw values stored:
    changing them needs no re-ingestion, unless the opt-in reject mode (`reject`) applies them
    in validate: then verdicts depend on them, and a change is a new pipeline version."""

    sample_s: float = Field(default=1.0, gt=0, description="at most one signal frame per this")
    dark_luma: float = Field(default=24.0, ge=0, le=255, description="blocked: mean luma below")
    flat_std: float = Field(default=2.0, ge=0, description="blocked: luma std below this")
    still_bits_per_pixel: float = Field(
        default=0.004, gt=0, description="an inter frame coded in fewer bits per pixel is still"
    )
    max_highlights: float = Field(default=0.2, ge=0, le=1, description="--exposure-ok bound")
    max_shadows: float = Field(default=0.3, ge=0, le=1, description="--exposure-ok bound")
    min_mean_luma: float = Field(default=30.0, ge=0, le=255, description="--exposure-ok bound")
    max_mean_luma: float = Field(default=225.0, ge=0, le=255, description="--exposure-ok bound")
    # The content classes and their thresholds: what `services.media.content.content_classes`
    # decides from an episode's worst clip (the bench scores it; the reject mode applies it).
    # The thresholds mean what the manifest filters of the same name mean.
    min_sharpness: float = Field(
        default=100.0, ge=0, description="blur: a well-exposed clip's median Laplacian variance"
    )
    max_frozen_fraction: float = Field(
        default=0.2, ge=0, le=1, description="frozen: a clip's frozen share above this"
    )
    min_blocked_fraction: float = Field(
        default=0.5, ge=0, le=1, description="covered: a clip's covered share at least this"
    )
    min_motion: float = Field(
        default=0.01, ge=0, description="static (device at rest): a clip's gyro RMS below, rad/s"
    )
    # Opt-in reject mode: validate rejects an episode of these classes (reason code
    # `content_<class>`); empty (the default) flags only. A pipeline-version decision: changing
    # it changes verdicts, so it needs a backfill (docs/curation.md).
    reject: Annotated[frozenset[ContentClass], NoDecode] = Field(
        default=frozenset(), description="content classes validate rejects (comma list)"
    )
    near_dup_max_hamming: int = Field(
        default=7, ge=0, le=64, description="two frames' perceptual hashes this close match"
    )
    near_dup_min_shared: float = Field(
        default=0.5, gt=0, le=1, description="share of the shorter episode's frames that match"
    )
    imu_dup_min_votes: int = Field(
        default=2, ge=1, description="IMU landmarks two episodes must share at one lag"
    )
    imu_dup_min_correlation: float = Field(
        default=0.95, gt=0, le=1, description="gyro-magnitude correlation over the overlap"
    )
    imu_dup_min_overlap_s: float = Field(
        default=5.0, gt=0, description="seconds the two IMU traces must overlap at least"
    )
    imu_dup_min_cover: float = Field(
        default=0.8, ge=0, le=1, description="share of the shorter IMU trace the overlap covers"
    )

    @field_validator("reject", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        """`covered,frozen` (the environment's form) -> the classes; `duplicate` is refused:
        duplicates are found after validate, in the warehouse."""
        if isinstance(value, str):
            value = [v.strip().lower() for v in value.split(",") if v.strip()]
        if isinstance(value, list | tuple | set | frozenset) and "duplicate" in value:
            raise ValueError(
                "duplicate cannot be rejected by validate (duplicates are found later, in the "
                "warehouse): build manifests with --exclude-duplicates instead"
            )
        return value


def _is_placeholder(secret: SecretStr | str | None) -> bool:
    if secret is None:
        return False
    value = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    return value in PLACEHOLDER_SECRETS or value.startswith(PLACEHOLDER_PREFIX)


class DeviceSettings(BaseSettings):
    """What the device upload agent needs, and nothing else: the broker it publishes to, the
    object store it uploads to, and its own tuning."""

    model_config = SettingsConfigDict(
        env_prefix="EGOLINE_",
        env_nested_delimiter="_",
        env_nested_max_split=1,
        frozen=True,
        extra="ignore",
        populate_by_name=True,
    )

    stack_dir: Path = STACK_DIR_DEFAULT
    # Set by `egoline stack up` in the endpoints file when it started the services itself: the
    # built-in credentials are then the emulator's own, not secrets.
    embedded_stack: bool = False
    pipeline_version: str = "v1"
    kafka: KafkaSettings = KafkaSettings()
    s3: S3Settings = S3Settings()
    agent: AgentSettings = AgentSettings()

    @model_validator(mode="after")
    def _refuse_placeholder_secrets(self) -> Self:
        if self.embedded_stack:
            return self
        for configured, secret, env in self._secrets():
            if configured and _is_placeholder(secret):
                raise ValueError(
                    f"{env} is a placeholder ({PLACEHOLDER_PREFIX}... or the built-in default) "
                    "while a real endpoint is configured: set a real secret "
                    "(placeholders are accepted only by the embedded stack, `egoline stack up`)"
                )
        return self

    def _secrets(self) -> list[tuple[bool, SecretStr | str | None, str]]:
        """(endpoint configured, secret, env name) of each credential to check."""
        s3 = self.s3.endpoint is not None
        return [
            (s3, self.s3.access_key, "EGOLINE_S3_ACCESS_KEY"),
            (s3, self.s3.secret_key, "EGOLINE_S3_SECRET_KEY"),
            (
                self.kafka.bootstrap is not None,
                self.kafka.sasl_password,
                "EGOLINE_KAFKA_SASL_PASSWORD",
            ),
        ]

    def require(self, name: str) -> str:
        """A configured endpoint by dotted name (`kafka.bootstrap`, `s3.endpoint`,
        `database_url`), or a clear error naming how to set it."""
        value: object = self
        for part in name.split("."):
            value = getattr(value, part)
        if not value:
            env = "EGOLINE_" + name.replace(".", "_").upper()
            raise RuntimeError(f"{name} is not configured: set {env} or run `egoline stack up`")
        return str(value)

    def for_agent(self, state_dir: Path | None = None) -> DeviceSettings:
        """The device agent's settings from these (a `Settings` drops the warehouse's and the
        pipeline's), with its journal in `state_dir` if given."""
        agent = (
            self.agent
            if state_dir is None
            else self.agent.model_copy(update={"state_dir": state_dir})
        )
        fields = {name: getattr(self, name) for name in DeviceSettings.model_fields}
        return DeviceSettings.model_construct(**{**fields, "agent": agent})


class Settings(DeviceSettings):
    """Endpoints, credentials and tuning of the pipeline services (and the CLI)."""

    topic_partitions: int = Field(default=4, ge=1)
    # Topic durability, used when `stack up` (the init job) creates topics. The embedded broker
    # is one memory-only node: 1/1 there. On a real cluster one replica loses data with a broker,
    # so creating production topics with it is refused unless allowed explicitly.
    topic_replication_factor: int = Field(default=1, ge=1)
    topic_min_insync_replicas: int = Field(default=1, ge=1)
    topic_allow_single_replica: bool = False

    # --- Postgres ------------------------------------------------------------------------
    database_url: PostgresDsn | None = Field(
        default=None,
        validation_alias=AliasChoices("EGOLINE_DATABASE_URL", "DATABASE_URL", "database_url"),
    )
    embedded_s3_memory_mb: int = Field(
        default=1024, ge=5, description="moto keeps objects up to this size in memory"
    )

    # --- pipeline ------------------------------------------------------------------------
    clip_target_s: float = Field(default=10.0, gt=0)
    shard_target_mb: float = Field(default=512.0, gt=0)
    # Audio tracks of a recording go into each clip's video member (True), or are dropped with
    # an `audio_dropped` warning on the verdict (False): never silently.
    keep_audio: bool = True
    split_key: Literal["session", "device"] = "session"
    eval_fraction: float = Field(default=0.1, ge=0, le=1)
    metrics_port: int | None = Field(default=None, description="serve /metrics on this port")
    metrics_host: str = "127.0.0.1"
    # `egoline up` serves the lag service (its web page, /lag.json, /metrics) on this port
    page_port: int = Field(default=9308, ge=1, le=65535, description="egoline up's web page")
    start_jitter_s: float = Field(default=1.0, ge=0, description="staggered start: max delay")
    stage_workers: int = Field(default=2, ge=1, le=64, description="worker processes per stage")
    # Each worker process runs under an address-space limit (RLIMIT_AS; 0: none) and each job
    # (one episode) under a wall-time limit (0: none): a file that makes a decoder allocate or
    # loop without bound is dead-lettered as `resource_limit`, it does not take the node down.
    worker_memory_limit_mb: int = Field(default=4096, ge=0)
    job_time_limit_s: float = Field(default=1800.0, ge=0)
    batch_max_records: int = Field(default=32, ge=1, le=10_000)
    batch_wait_s: float = Field(default=1.0, gt=0, description="how long to fill a batch")
    # Poison isolation (docs/architecture.md): a batch-level step (finish) that fails with a bug
    # is tried this many times, with backoff from this base, then bisected to the records that
    # make it fail. A dependency down is a rewind instead, retried without end.
    batch_step_attempts: int = Field(default=3, ge=1, le=20)
    batch_step_backoff_s: float = Field(default=0.5, ge=0, le=60)
    # Planted bugs for fault-handling tests (services/common/failpoints.py); empty in production.
    failpoints: str = Field(default="", max_length=1000)
    spool_dir: Path | None = Field(default=None, description="shard stage scratch (default: tmp)")
    raw_cache_dir: Path | None = Field(
        default=None, description="node-local cache of raw objects shared by the stages"
    )
    raw_cache_mb: int = Field(default=8192, ge=1)

    # --- training read path ----------------------------------------------------------------
    reader: ReaderSettings = ReaderSettings()
    # --- curation: content signals and duplicates ----------------------------------------
    curation: CurationSettings = CurationSettings()

    def _secrets(self) -> list[tuple[bool, SecretStr | str | None, str]]:
        password = None if self.database_url is None else self.database_url.hosts()[0]["password"]
        return [
            *super()._secrets(),
            (self.database_url is not None, password, "the password in EGOLINE_DATABASE_URL"),
        ]

    @property
    def spool_path(self) -> Path:
        """The shard stage's scratch: `EGOLINE_SPOOL_DIR`, or `egoline-spool` in the temp dir."""
        return self.spool_dir or Path(tempfile.gettempdir()) / "egoline-spool"

    @property
    def database_dsn(self) -> str | None:
        """The database URL as configured, or None."""
        return None if self.database_url is None else str(self.database_url)

    @property
    def database_sqlalchemy_url(self) -> str:
        """The database URL with the psycopg 3 driver named, as SQLAlchemy wants it."""
        url = self.require("database_url")
        for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        return url

    @property
    def database_libpq_url(self) -> str:
        """The database URL as libpq (and so ADBC and psql) wants it."""
        url = self.require("database_url")
        return url.replace("postgresql+psycopg://", "postgresql://", 1)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings: environment first, then the stack's endpoints file."""
    return Settings(_env_file=_endpoints_file())


@lru_cache(maxsize=1)
def get_device_settings() -> DeviceSettings:
    """The device agent's settings (broker, object store, its own tuning; no warehouse),
    from the same sources as `get_settings`."""
    return DeviceSettings(_env_file=_endpoints_file())


def reset_settings_cache() -> None:
    """Forget the cached settings (after `stack up` writes new endpoints)."""
    get_settings.cache_clear()
    get_device_settings.cache_clear()


def env_fields(model: type[DeviceSettings] = Settings) -> dict[str, tuple[str, FieldInfo]]:
    """Every environment variable `model` reads -> (the field's dotted path, its FieldInfo):
    `EGOLINE_KAFKA_SASL_USERNAME` -> `kafka.sasl_username`, plus validation aliases
    (`DATABASE_URL`). For the deployment checks and the docs' drift test."""
    prefix = str(model.model_config.get("env_prefix", ""))
    names: dict[str, tuple[str, FieldInfo]] = {}
    for field, info in model.model_fields.items():
        group = info.annotation
        if isinstance(group, type) and issubclass(group, _Group):
            for sub, sub_info in group.model_fields.items():
                names[f"{prefix}{field}_{sub}".upper()] = (f"{field}.{sub}", sub_info)
            continue
        names[(prefix + field).upper()] = (field, info)
        alias = info.validation_alias
        for choice in getattr(alias, "choices", None) or []:
            if str(choice).isupper():
                names[str(choice)] = (field, info)
    return names
