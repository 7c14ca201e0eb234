"""Every stage service of the session fleet serves /metrics, /healthz and /readyz on its
metrics port."""

from __future__ import annotations

from functools import partial

import pytest

from services.stack.fleet import Fleet, ready
from tests.fixtures.http import http_get
from tests.fixtures.polling import wait_for

pytestmark = pytest.mark.connected


def test_every_stage_serves_metrics_healthz_and_readyz(fleet: Fleet) -> None:
    assert {name.rsplit("-", 1)[0] for name in fleet.metrics_ports} == {
        "decode",
        "validate",
        "shard",
        "metadata",
    }
    for name, port in sorted(fleet.metrics_ports.items()):
        stage = name.rsplit("-", 1)[0]
        wait_for(partial(ready, port), 90, f"{name} answering 200 on /readyz")
        assert http_get(port, "/readyz") == (200, "ready")
        assert http_get(port, "/healthz") == (200, "ok")
        code, body = http_get(port, "/metrics")
        assert code == 200
        assigned = [
            float(line.rsplit(" ", 1)[1])
            for line in body.splitlines()
            if line.startswith(f'egoline_stage_assigned_partitions{{stage="{stage}"}}')
        ]
        assert assigned and assigned[0] > 0, f"{name}: {assigned}"
        assert http_get(port, "/nothing-here")[0] == 404
