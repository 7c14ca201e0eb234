"""How a long-running egoline service process starts and stops: logging with the settings'
secrets redacted, a staggered start, SIGTERM/SIGINT, and /metrics, /healthz and /readyz on
EGOLINE_METRICS_PORT (docs/metrics.md).

The stage packages build their apps; this module runs one and knows no stage by name."""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from services.common.health import Liveness
from services.common.metrics import serve_stage_http
from services.common.redact import install_log_redaction
from services.common.scheduling import start_delay_s
from services.common.settings import Settings

if TYPE_CHECKING:
    from faststream import FastStream

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def configure_logging(settings: Settings) -> None:
    """INFO and above to stderr, every record scrubbed of the settings' secrets first."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    install_log_redaction(settings)


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM or SIGINT sets, for a loop that runs on threads (faststream
    installs its own handlers)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def run_service(
    settings: Settings, stage: str, build_app: Callable[[Settings], FastStream]
) -> None:
    """Run one stage's faststream app until SIGTERM/SIGINT.

    Sleeps uniformly in [0, settings.start_jitter_s] seconds first, then serves the stage's
    /metrics, /healthz and /readyz (nothing when settings.metrics_port is None) and only then
    calls `build_app`, so a slow import of the stage's app is already visible as alive. The
    heartbeat behind /healthz runs on the app's event loop: a blocked loop goes unhealthy."""
    configure_logging(settings)
    # Staggered start: a fleet restarted together doesn't stampede the broker and object store.
    time.sleep(start_delay_s(settings.start_jitter_s, random.Random()))
    liveness = Liveness()
    serve_stage_http(settings.metrics_port, settings.metrics_host, stage, liveness)
    stream_app = build_app(settings)

    async def run() -> None:
        heartbeat = asyncio.create_task(liveness.beat_forever())
        try:
            await stream_app.run()
        finally:
            heartbeat.cancel()

    asyncio.run(run())


def run_threaded_service(settings: Settings, serve: Callable[[threading.Event], None]) -> None:
    """Run a service whose loop is a thread (the lag monitor, which serves its own HTTP) until
    SIGTERM/SIGINT: `serve` gets the event the signals set and returns once it is set. No
    staggered start: it is one process reading offsets, not a fleet."""
    configure_logging(settings)
    serve(stop_on_signals())
