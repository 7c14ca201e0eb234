"""Keeping secrets out of logs and output (pure, plus one logging filter).

Credentials live in the settings as `SecretStr` (their repr is `**********`), events never carry
them, and every `egoline serve` process installs `RedactingFilter`, which replaces any configured
secret value (and the password of any URL) in a log record before it is written.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit

from services.common.settings import Settings

MASK = "***"
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^@\s]+(?P<at>@)")


def redact_url(text: str) -> str:
    """Hide the password of every URL in `text` (`user:secret@host` -> `user:***@host`)."""
    return _URL_PASSWORD.sub(lambda m: m["head"] + MASK + m["at"], text)


def secret_values(settings: Settings) -> list[str]:
    """Every credential the settings hold, as plain strings (to look for, never to print)."""
    values = [settings.s3.secret_key.get_secret_value()]
    for secret in (settings.kafka.sasl_password, settings.kafka.ssl_key_password):
        if secret is not None:
            values.append(secret.get_secret_value())
    if settings.database_dsn is not None:
        password = urlsplit(settings.database_dsn).password
        if password:
            values.append(password)
    return [v for v in values if len(v) >= 4]  # a 1-3 character "secret" would mask noise


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, MASK)
    return redact_url(text)


class RedactingFilter(logging.Filter):
    """Rewrites each record's message (with its arguments and any exception text) redacted."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = redact(message, self.secrets), None
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        return True


def install_log_redaction(settings: Settings) -> None:
    """Redact every handler of the root logger (call after logging is configured)."""
    redacting = RedactingFilter(secret_values(settings))
    for handler in logging.getLogger().handlers:
        handler.addFilter(redacting)
