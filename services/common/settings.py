"""One frozen settings object for every egoline process.

Values come from `EGOLINE_*` environment variables first, then from the endpoints file that
`egoline stack up` writes (`.stack/endpoints.env`), then from the defaults below. Nothing else in
egoline reads `os.environ`.
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

STACK_DIR_DEFAULT = Path(".stack")
ENDPOINTS_FILE = "endpoints.env"


def _endpoints_file() -> Path:
    # The stack dir may itself be moved with EGOLINE_STACK_DIR; resolve it before the model loads
    # so the endpoints file written by `stack up` is found by every process in the same tree.
    import os

    return Path(os.environ.get("EGOLINE_STACK_DIR", str(STACK_DIR_DEFAULT))) / ENDPOINTS_FILE


class Settings(BaseSettings):
    """Endpoints, credentials and tuning for every service.

    Kafka consumer timings default to values that make group joins fast (seconds, not tens of
    seconds) on both Apache Kafka and the embedded broker; see docs/stack.md.
    """

    model_config = SettingsConfigDict(
        env_prefix="EGOLINE_",
        frozen=True,
        extra="ignore",
        populate_by_name=True,
    )

    stack_dir: Path = STACK_DIR_DEFAULT

    # --- Kafka ---------------------------------------------------------------------------
    kafka_bootstrap: str | None = None
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    # TLS to the brokers (security protocol SSL or SASL_SSL): CA bundle, and for mutual TLS the
    # client certificate and key.
    kafka_ssl_ca_location: str | None = None
    kafka_ssl_certificate_location: str | None = None
    kafka_ssl_key_location: str | None = None
    kafka_ssl_key_password: SecretStr | None = None
    kafka_session_timeout_ms: int = Field(default=6000, ge=1000)
    kafka_heartbeat_interval_ms: int = Field(default=1000, ge=100)
    kafka_assignment_strategy: str = "cooperative-sticky"
    topic_partitions: int = Field(default=4, ge=1)
    # Topic durability, used when `stack up` (the init job) creates topics. The embedded broker
    # is one memory-only node: 1/1 there. On a real cluster one replica loses data with a broker,
    # so creating production topics with it is refused unless allowed explicitly.
    topic_replication_factor: int = Field(default=1, ge=1)
    topic_min_insync_replicas: int = Field(default=1, ge=1)
    topic_allow_single_replica: bool = False

    # --- Postgres ------------------------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("EGOLINE_DATABASE_URL", "DATABASE_URL"),
    )

    # --- S3 / MinIO ----------------------------------------------------------------------
    s3_endpoint: str | None = None  # host:port or http(s)://host:port
    s3_access_key: SecretStr = SecretStr("egoline")
    s3_secret_key: SecretStr = SecretStr("egoline-secret")
    s3_region: str = "us-east-1"
    # TLS to the object store (an https:// endpoint): a CA bundle for a private CA; verification
    # can be turned off only explicitly.
    s3_ca_bundle: str | None = None
    s3_tls_verify: bool = True
    s3_bucket: str = "egoline"
    s3_part_size_mb: int = Field(default=16, ge=5)
    embedded_s3_memory_mb: int = Field(
        default=1024, ge=5, description="moto keeps objects up to this size in memory"
    )

    # --- pipeline ------------------------------------------------------------------------
    pipeline_version: str = "v1"
    clip_target_s: float = Field(default=10.0, gt=0)
    shard_target_mb: float = Field(default=512.0, gt=0)
    # Audio tracks of a recording go into each clip's video member (True), or are dropped with
    # an `audio_dropped` warning on the verdict (False): never silently.
    keep_audio: bool = True
    split_key: str = Field(default="session", pattern="^(session|device)$")
    eval_fraction: float = Field(default=0.1, ge=0, le=1)
    metrics_port: int | None = Field(default=None, description="serve /metrics on this port")
    metrics_host: str = "127.0.0.1"
    start_jitter_s: float = Field(default=1.0, ge=0, description="staggered start: max delay")
    stage_workers: int = Field(default=2, ge=1, le=64, description="worker processes per stage")
    # Each worker process runs under an address-space limit (RLIMIT_AS; 0: none) and each job
    # (one episode) under a wall-time limit (0: none): a file that makes a decoder allocate or
    # loop without bound is dead-lettered as `resource_limit`, it does not take the node down.
    worker_memory_limit_mb: int = Field(default=4096, ge=0)
    job_time_limit_s: float = Field(default=1800.0, ge=0)
    batch_max_records: int = Field(default=32, ge=1, le=10_000)
    batch_wait_s: float = Field(default=1.0, gt=0, description="how long to fill a batch")
    spool_dir: Path | None = Field(default=None, description="shard stage scratch (default: tmp)")
    raw_cache_dir: Path | None = Field(
        default=None, description="node-local cache of raw objects shared by the stages"
    )
    raw_cache_mb: int = Field(default=8192, ge=1)

    # --- training read path ----------------------------------------------------------------
    reader_cache_dir: Path = Field(
        default=Path(".stack/cache/clips"), description="node-local cache of clip spans"
    )
    reader_cache_mb: int = Field(default=20480, ge=1, description="clip cache size cap")
    reader_prefetch_clips: int = Field(
        default=16, ge=0, le=4096, description="clips fetched ahead of the reader (0: off)"
    )
    reader_shuffle_buffer: int = Field(
        default=256, ge=0, description="clips mix within a window this wide (0/1: shard order)"
    )

    # --- device upload agent --------------------------------------------------------------
    agent_state_dir: Path = Field(default=Path(".stack/agent"), description="journal location")
    agent_part_size_mb: int = Field(default=16, ge=5, le=5120, description="multipart part size")
    agent_upload_concurrency: int = Field(default=3, ge=1, le=64)
    agent_bandwidth_mb_s: float | None = Field(default=None, gt=0, description="upload cap")
    agent_ready_mode: Literal["marker", "stable"] = "marker"
    agent_stable_s: float = Field(default=5.0, ge=0, description="stable mode: quiet period")
    agent_after_publish: Literal["keep", "delete", "archive"] = "keep"
    agent_archive_dir: Path | None = None
    agent_poll_s: float = Field(default=2.0, gt=0)
    agent_retry_max_s: float = Field(default=300.0, gt=0, description="give up a pass after this")
    agent_message_timeout_s: float = Field(default=300.0, gt=0)

    @property
    def spool_path(self) -> Path:
        """The shard stage's scratch: `EGOLINE_SPOOL_DIR`, or `egoline-spool` in the temp dir."""
        return self.spool_dir or Path(tempfile.gettempdir()) / "egoline-spool"

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

    def require(self, name: str) -> str:
        """Return a configured endpoint or raise a clear error naming how to set it."""
        value = getattr(self, name)
        if not value:
            raise RuntimeError(
                f"{name} is not configured: set EGOLINE_{name.upper()} or run `egoline stack up`"
            )
        return str(value)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings: environment first, then the stack's endpoints file."""
    return Settings(_env_file=_endpoints_file())


def reset_settings_cache() -> None:
    """Forget the cached settings (after `stack up` writes new endpoints)."""
    get_settings.cache_clear()
