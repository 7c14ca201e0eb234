"""Settings: grouped, typed, and refusing placeholder secrets outside the embedded stack."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.common.settings import DeviceSettings, Settings, env_fields
from tests.deploy_files import env_example


def from_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    for name in list(env_fields()):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings(_env_file=None)


def test_flat_environment_names_fill_the_nested_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = from_env(
        monkeypatch,
        {
            "EGOLINE_KAFKA_BOOTSTRAP": "k1:9092,k2:9092",
            "EGOLINE_KAFKA_SASL_USERNAME": "pipeline",
            "EGOLINE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "EGOLINE_KAFKA_SASL_PASSWORD": "a-real-sasl-password",
            "EGOLINE_AGENT_PART_SIZE_MB": "32",
            "EGOLINE_READER_CACHE_MB": "100",
            "EGOLINE_STAGE_WORKERS": "3",
            "DATABASE_URL": "postgresql://egoline:a-real-password@db:5432/egoline",
        },
    )
    assert settings.kafka.bootstrap == "k1:9092,k2:9092"
    assert (settings.kafka.sasl_username, settings.kafka.sasl_mechanism) == (
        "pipeline",
        "SCRAM-SHA-512",
    )
    assert (settings.agent.part_size_mb, settings.reader.cache_mb) == (32, 100)
    assert settings.stage_workers == 3
    assert settings.database_libpq_url == "postgresql://egoline:a-real-password@db:5432/egoline"
    assert settings.require("kafka.bootstrap") == "k1:9092,k2:9092"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("EGOLINE_KAFKA_SECURITY_PROTOCOL", "TLS"),
        ("EGOLINE_KAFKA_SASL_MECHANISM", "MD5"),
        ("EGOLINE_DATABASE_URL", "mysql://db/egoline"),
        ("EGOLINE_SPLIT_KEY", "episode"),
    ],
)
def test_values_outside_their_type_are_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    with pytest.raises(ValidationError):
        from_env(monkeypatch, {name: value})


def test_placeholder_secrets_are_refused_with_a_real_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    example = env_example()
    real = {"EGOLINE_S3_ENDPOINT": "https://minio.internal:9000"}
    with pytest.raises(ValidationError, match="EGOLINE_S3_ACCESS_KEY"):
        from_env(monkeypatch, real)  # the built-in default credentials
    with pytest.raises(ValidationError, match="EGOLINE_S3_SECRET_KEY"):
        from_env(
            monkeypatch,
            {
                **real,
                "EGOLINE_S3_ACCESS_KEY": "pipeline-user",
                "EGOLINE_S3_SECRET_KEY": example["EGOLINE_S3_SECRET_KEY"],
            },
        )
    with pytest.raises(ValidationError, match="EGOLINE_DATABASE_URL"):
        from_env(
            monkeypatch,
            {
                "EGOLINE_DATABASE_URL": "postgresql://egoline:"
                + example["POSTGRES_PASSWORD"]
                + "@db:5432/egoline"
            },
        )
    with pytest.raises(ValidationError, match="EGOLINE_KAFKA_SASL_PASSWORD"):
        from_env(
            monkeypatch,
            {"EGOLINE_KAFKA_BOOTSTRAP": "k:9092", "EGOLINE_KAFKA_SASL_PASSWORD": "change-me"},
        )


def test_placeholders_are_accepted_by_the_embedded_stack_and_with_nothing_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    embedded = from_env(
        monkeypatch,
        {"EGOLINE_S3_ENDPOINT": "http://127.0.0.1:9000", "EGOLINE_EMBEDDED_STACK": "true"},
    )
    assert embedded.s3.secret_key.get_secret_value() == "egoline-secret"
    assert from_env(monkeypatch, {}).s3.endpoint is None


def test_the_device_agent_settings_carry_nothing_of_the_warehouse(tmp_path: Path) -> None:
    assert "database_url" not in DeviceSettings.model_fields
    assert not any(name.startswith("EGOLINE_DATABASE") for name in env_fields(DeviceSettings))
    settings = Settings(
        _env_file=None,
        embedded_stack=True,
        database_url="postgresql://egoline@db:5432/egoline",
        kafka={"bootstrap": "k:9092"},
    )
    device = settings.for_agent(tmp_path / "agent")
    assert type(device) is DeviceSettings and not hasattr(device, "database_url")
    assert (device.agent.state_dir, device.kafka.bootstrap) == (tmp_path / "agent", "k:9092")
