"""The service bootstrap: signals stop a threaded service, and a stage is alive on /healthz
before its (slow to import) app is built, then runs that app to its end."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from unittest.mock import MagicMock

import pytest
from faststream import FastStream

from services.common.serve import run_service, run_threaded_service, stop_on_signals
from services.common.settings import Settings
from services.stack.launcher import free_port
from tests.fixtures.http import http_get


@pytest.fixture
def restored_process_state() -> Iterator[None]:
    """The bootstrap installs signal handlers and configures the root logger: undo both."""
    on_signal = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    root = logging.getLogger()
    root_handlers, filters = list(root.handlers), {h: list(h.filters) for h in root.handlers}
    try:
        yield
    finally:
        for number, previous in on_signal.items():
            signal.signal(number, previous)
        root.handlers = root_handlers
        for handler, kept in filters.items():
            handler.filters = kept


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, start_jitter_s=0, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_termination_signal_sets_the_stop_event(
    restored_process_state: None, signum: signal.Signals
) -> None:
    stop = stop_on_signals()
    assert not stop.is_set()
    os.kill(os.getpid(), signum)
    assert stop.wait(5)


def test_a_threaded_service_gets_the_event_the_signals_set(restored_process_state: None) -> None:
    seen: list[threading.Event] = []

    def serve(stop: threading.Event) -> None:
        seen.append(stop)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)

    run_threaded_service(settings(), serve)
    assert len(seen) == 1 and seen[0].is_set()


def test_a_stage_is_alive_before_its_app_is_built_and_runs_the_app(
    restored_process_state: None,
) -> None:
    port = free_port()
    healthz_while_building: list[tuple[int, str]] = []
    stream_app = MagicMock(spec_set=FastStream)

    def build_app(given: Settings) -> FastStream:
        assert given.metrics_port == port
        healthz_while_building.append(http_get(port, "/healthz"))
        return stream_app

    run_service(settings(metrics_port=port, metrics_host="127.0.0.1"), "serve-unit-test", build_app)
    assert healthz_while_building == [(200, "ok")]
    stream_app.run.assert_awaited_once()
