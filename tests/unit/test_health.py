"""The stage probes' answers, from a real HTTP server on a free port."""

from __future__ import annotations

import asyncio

from services.common import metrics
from services.common.health import Liveness
from services.stack.launcher import free_port
from tests.fixtures.http import http_get


def test_readyz_follows_the_assigned_partitions_and_healthz_the_heartbeat() -> None:
    stage = "probe-unit-test"
    port = free_port()
    liveness = Liveness(max_silence_s=3600)
    server = metrics.serve_stage_http(port, "127.0.0.1", stage, liveness)
    assert server is not None
    try:
        assert http_get(port, "/healthz") == (200, "ok")
        code, body = http_get(port, "/readyz")
        assert code == 503 and "no partitions assigned" in body
        metrics.ASSIGNED_PARTITIONS.labels(stage).inc(2)
        assert http_get(port, "/readyz") == (200, "ready")
        metrics.ASSIGNED_PARTITIONS.labels(stage).dec(2)  # revoked or lost
        assert http_get(port, "/readyz")[0] == 503
        code, body = http_get(port, "/metrics")
        assert code == 200
        assert f'egoline_stage_assigned_partitions{{stage="{stage}"}} 0.0' in body
        assert http_get(port, "/nothing-here")[0] == 404
        # a loop that stopped beating fails liveness, and readiness with it
        metrics.ASSIGNED_PARTITIONS.labels(stage).inc(1)
        liveness.max_silence_s = 0.0
        code, body = http_get(port, "/healthz")
        assert code == 503 and "event loop silent" in body
        assert http_get(port, "/readyz")[0] == 503
    finally:
        server.shutdown()
        server.server_close()


def test_no_port_means_no_server() -> None:
    assert metrics.serve_stage_http(None, "127.0.0.1", "x", Liveness()) is None


async def test_the_heartbeat_beats_from_the_event_loop() -> None:
    liveness = Liveness(max_silence_s=0.5)
    liveness._last -= 10  # as if the loop had been blocked for 10 s
    assert not liveness.alive()
    beating = asyncio.create_task(liveness.beat_forever(interval_s=0.01))
    await asyncio.sleep(0.05)
    beating.cancel()
    assert liveness.silence_s() < 0.5
    assert liveness.alive()
