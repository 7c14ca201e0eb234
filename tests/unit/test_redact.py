"""Secrets stay out of logs and output; TLS settings reach the clients."""

from __future__ import annotations

import logging
import sys

from pydantic import SecretStr

from services.common import kafka
from services.common.objectstore import minio_client
from services.common.redact import RedactingFilter, redact_url, secret_values
from services.common.settings import Settings


def settings(**values: object) -> Settings:
    kafka = {"bootstrap": "k:9092", "sasl_password": SecretStr("sasl-pass-456")}
    s3 = {
        "endpoint": "https://s3.example:9000",
        "access_key": "egoline-pipeline",
        "secret_key": SecretStr("s3-secret-xyz"),
    }
    return Settings(
        _env_file=None,
        kafka={**kafka, **values.pop("kafka", {})},  # type: ignore[dict-item]
        s3={**s3, **values.pop("s3", {})},  # type: ignore[dict-item]
        database_url="postgresql://egoline:pg-pass-123@db:5432/egoline",
        **values,  # type: ignore[arg-type]
    )


def test_urls_lose_their_password_and_nothing_else() -> None:
    text = "connect postgresql://egoline:pg-pass-123@db:5432/egoline failed; see http://h:1/x"
    assert redact_url(text) == (
        "connect postgresql://egoline:***@db:5432/egoline failed; see http://h:1/x"
    )


def test_every_configured_secret_is_redacted_from_a_log_record() -> None:
    cfg = settings()
    assert set(secret_values(cfg)) == {"s3-secret-xyz", "sasl-pass-456", "pg-pass-123"}
    assert "s3-secret-xyz" not in repr(cfg) and "sasl-pass-456" not in repr(cfg)
    try:
        raise RuntimeError("auth failed with s3-secret-xyz")
    except RuntimeError:
        record = logging.LogRecord(
            "egoline.test",
            logging.ERROR,
            __file__,
            1,
            "login %s to %s",
            ("sasl-pass-456", "postgresql://egoline:pg-pass-123@db/egoline"),
            sys.exc_info(),
        )
    assert RedactingFilter(secret_values(cfg)).filter(record)
    line = logging.Formatter("%(message)s").format(record)
    for secret in secret_values(cfg):
        assert secret not in line
    assert "login *** to postgresql://egoline:***@db/egoline" in line
    assert "auth failed with ***" in line


def test_kafka_and_s3_tls_settings_reach_the_clients() -> None:
    cfg = settings(
        kafka={
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "egoline",
            "ssl_ca_location": "/etc/ssl/kafka-ca.pem",
        },
        s3={"ca_bundle": "/etc/ssl/minio-ca.pem"},
    )
    config = kafka.client_config(cfg)
    assert config["security.protocol"] == "sasl_ssl"
    assert config["ssl.ca.location"] == "/etc/ssl/kafka-ca.pem"
    assert config["sasl.password"] == "sasl-pass-456"
    client = minio_client(cfg)
    pool_kw = client._http.connection_pool_kw
    assert (
        pool_kw["ca_certs"] == "/etc/ssl/minio-ca.pem" and pool_kw["cert_reqs"] == "CERT_REQUIRED"
    )
    assert client._base_url.is_https
