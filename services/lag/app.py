"""`egoline serve lag`: polls offsets, evaluates lag, serves the lag page (`/`), /metrics,
/lag.json, /history.json, /healthz and /readyz.

Metric names follow kafka-lag-exporter (docs/metrics.md). A failed reading (broker down) keeps
the service up: every group reports status UNKNOWN until readings succeed again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from importlib import resources
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from services.common.health import Liveness, Response, Route, metrics_route, start_http, text
from services.common.settings import Settings
from services.lag.collector import OffsetReader, StatusReader
from services.lag.history import LagHistory
from services.lag.monitor import LagMonitor, LagReport, report_json, watched_groups

log = logging.getLogger("egoline.lag")


class LagMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        part = ["group", "topic", "partition"]
        self.lag = Gauge(
            "kafka_consumergroup_group_lag", "Messages behind", part, registry=self.registry
        )
        self.lag_s = Gauge(
            "kafka_consumergroup_group_lag_seconds", "Seconds behind", part, registry=self.registry
        )
        self.max_lag = Gauge(
            "kafka_consumergroup_group_max_lag",
            "Largest partition lag",
            ["group"],
            registry=self.registry,
        )
        self.max_lag_s = Gauge(
            "kafka_consumergroup_group_max_lag_seconds",
            "Largest partition lag in seconds",
            ["group"],
            registry=self.registry,
        )
        self.sum_lag = Gauge(
            "kafka_consumergroup_group_sum_lag", "Total lag", ["group"], registry=self.registry
        )
        self.latest = Gauge(
            "kafka_partition_latest_offset",
            "Log-end offset",
            ["topic", "partition"],
            registry=self.registry,
        )
        self.status = Gauge(
            "egoline_consumergroup_status",
            "Burrow status: 0 OK, 1 WARN, 2 UNKNOWN, 3 STALL, 4 STOP, 5 REWIND, 6 ERR",
            ["group"],
            registry=self.registry,
        )

    def update(self, report: LagReport) -> None:
        for group, entry in report.items():
            for p in entry.partitions:
                labels = (group, p.topic, str(p.partition))
                if p.lag is not None:
                    self.lag.labels(*labels).set(p.lag)
                if p.lag_seconds is not None:
                    self.lag_s.labels(*labels).set(p.lag_seconds)
                self.latest.labels(p.topic, str(p.partition)).set(p.end)
            self.max_lag.labels(group).set(entry.max_lag)
            self.max_lag_s.labels(group).set(entry.max_lag_seconds)
            self.sum_lag.labels(group).set(entry.total_lag)
            self.status.labels(group).set(entry.status.value)


class LagService:
    def __init__(
        self, settings: Settings, groups: dict[str, tuple[str, ...]], interval_s: float = 2.0
    ) -> None:
        self.settings = settings
        self.groups = groups  # group -> the topics it consumes (watched_groups)
        self.interval_s = interval_s
        self.monitor = LagMonitor(groups=tuple(groups))
        self.metrics = LagMetrics()
        self.history = LagHistory()
        # one poll can wait ~10 s per admin request while the broker is unreachable
        self.liveness = Liveness(max_silence_s=max(60.0, 10 * interval_s))
        self.report: LagReport = {}
        self.last_ok: float | None = None
        self.error: str | None = None
        self._lock = threading.Lock()

    def poll_forever(self, stop: threading.Event) -> None:
        reader: OffsetReader | None = None
        statuses: StatusReader | None = None
        while not stop.is_set():
            self.liveness.beat()
            try:
                reader = reader or OffsetReader(self.settings)
                statuses = statuses or StatusReader(self.settings)
                self.monitor.observe(reader.read(self.groups))
                self.monitor.observe_status(statuses.read(max_s=0.5))
                self.last_ok, self.error = time.time(), None
            except Exception as exc:  # the broker is down: report UNKNOWN, keep polling
                # name the exception: a timed-out admin request's message is empty
                self.error = f"{type(exc).__name__}: {exc}".removesuffix(": ")[:300]
                log.warning("lag reading failed: %s", self.error)
            # evaluate on a timer, not only on commits: a dead consumer's status moves to STOP
            report = self.monitor.report(time.time())
            if self.error is not None:
                report = {group: entry.unknown() for group, entry in report.items()}
            with self._lock:
                self.report = report
                self.history.record(report, time.time(), readable=self.error is None)
            self.metrics.update(report)
            stop.wait(self.interval_s)
        if reader is not None:
            reader.close()
        if statuses is not None:
            statuses.close()

    def snapshot(self) -> dict[str, Any]:
        """The `/lag.json` document: the latest report per group (every watched group, with
        `never_committed` and `reason`), the groups watched, and the reading's health."""
        with self._lock:
            return {
                "groups": report_json(self.report),
                "watched": list(self.groups),
                "interval_s": self.interval_s,
                "last_ok": self.last_ok,
                "error": self.error,
            }

    def history_json(self) -> dict[str, Any]:
        with self._lock:
            return self.history.to_json()

    def ready(self) -> bool:
        return self.last_ok is not None and self.error is None


def json_response(payload: dict[str, Any]) -> Response:
    return 200, "application/json", json.dumps(payload).encode()


def page(name: str = "page.html") -> bytes:
    """A page of this service: one self-contained HTML file shipped in this package (no CDN)."""
    return resources.files("services.lag").joinpath(name).read_bytes()


# The corpus view's panels (services/stack/corpus.py computes them; this package only serves
# them: the warehouse's tables are above it in the layer order). Each is a no-argument function
# returning the panel's JSON, with an `error` field when the warehouse cannot answer.
CorpusPanels = Mapping[str, Callable[[], dict[str, Any]]]
CORPUS_PANELS = ("summary", "rejects", "duplicates", "freshness")


def corpus_routes(panels: CorpusPanels | None) -> dict[str, Route]:
    """`/corpus` (the page), `/corpus/<panel>.json` per panel and `/corpus.json` (all of them).
    Without panels (a lag service given no warehouse reader) every panel answers an error."""

    def one(name: str) -> dict[str, Any]:
        read = (panels or {}).get(name)
        if read is None:
            return {"panel": name, "error": "this lag service has no warehouse reader"}
        return read()

    def answer(name: str) -> Response:
        return json_response(one(name))

    html = page("corpus.html")
    routes: dict[str, Route] = {
        "/corpus": lambda: (200, "text/html; charset=utf-8", html),
        "/corpus.json": lambda: json_response({name: one(name) for name in CORPUS_PANELS}),
    }
    for name in CORPUS_PANELS:
        routes[f"/corpus/{name}.json"] = partial(answer, name)
    return routes


def routes(service: LagService, corpus: CorpusPanels | None = None) -> dict[str, Route]:
    html = page()
    return {
        **corpus_routes(corpus),
        "/": lambda: (200, "text/html; charset=utf-8", html),
        "/metrics": metrics_route(service.metrics.registry),
        "/lag.json": lambda: json_response(service.snapshot()),
        "/history.json": lambda: json_response(service.history_json()),
        "/healthz": lambda: text(
            service.liveness.alive(), "ok", f"poll loop silent {service.liveness.silence_s():.0f}s"
        ),
        "/readyz": lambda: text(service.ready(), "ready", f"not ready: {service.error}"),
    }


def serve_lag(
    settings: Settings,
    port: int,
    extra_groups: list[str],
    stop: threading.Event,
    corpus: CorpusPanels | None = None,
) -> None:
    service = LagService(settings, watched_groups(extra_groups))
    server = start_http(settings.metrics_host, port, routes(service, corpus))
    log.info(
        "lag service on http://%s:%d (/, /corpus, /metrics, /lag.json)",
        settings.metrics_host,
        port,
    )
    try:
        service.poll_forever(stop)
    finally:
        server.shutdown()
