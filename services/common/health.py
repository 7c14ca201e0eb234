"""The one small HTTP server every long-running service exposes: /metrics, /healthz, /readyz
(and whatever else a service adds, such as the lag service's page).

- `/healthz` (liveness): the service's main loop is still turning. A stage's asyncio loop beats
  a `Liveness` every second; a loop blocked for longer than `max_silence_s` fails the check, so
  an orchestrator restarts the process.
- `/readyz` (readiness): the service can do its work now. For a stage that means its consumer
  holds partitions: librdkafka assigns them only after joining the group through a reachable
  coordinator, and drops them (the `on_lost` callback) when the coordinator stays unreachable
  past the session timeout.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

log = logging.getLogger("egoline.health")

# status code, content type, body
Response = tuple[int, str, bytes]
Route = Callable[[], Response]


def text(ok: bool, yes: str, no: str) -> Response:
    """200 with `yes` when ok, else 503 with `no` (the shape of every probe answer)."""
    if ok:
        return 200, "text/plain; charset=utf-8", yes.encode()
    return 503, "text/plain; charset=utf-8", no.encode()


def metrics_route(registry: CollectorRegistry = REGISTRY) -> Route:
    return lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry))


def start_http(host: str, port: int, routes: dict[str, Route]) -> ThreadingHTTPServer:
    """Serve GET `routes` (exact paths; a query string is ignored) on host:port from a daemon
    thread; returns the server (`.shutdown()` stops it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                code, content_type, body = 404, "text/plain", b"not found"
            else:
                try:
                    code, content_type, body = route()
                except Exception as exc:  # a failing probe answers 500; the server stays up
                    log.exception("GET %s failed", self.path)
                    code, content_type, body = 500, "text/plain", str(exc).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # probes every few seconds would drown the service's own log

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


class Liveness:
    """The heartbeat of a service's main loop (monotonic seconds)."""

    def __init__(self, max_silence_s: float = 30.0) -> None:
        self.max_silence_s = max_silence_s
        self._last = time.monotonic()

    def beat(self) -> None:
        self._last = time.monotonic()

    def silence_s(self) -> float:
        return time.monotonic() - self._last

    def alive(self) -> bool:
        return self.silence_s() <= self.max_silence_s

    async def beat_forever(self, interval_s: float = 1.0) -> None:
        """Beat from the asyncio loop: if the loop is blocked, the beats stop."""
        while True:
            self.beat()
            await asyncio.sleep(interval_s)
