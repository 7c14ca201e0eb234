"""`egoline up`'s supervision decisions and its live view, as plain data (no processes)."""

from __future__ import annotations

import random

from rich.console import Console

from services.stack.supervisor import (
    RestartPolicy,
    ServiceRecord,
    ServiceState,
    UpState,
)
from services.stack.view import render


def test_consecutive_crashes_grow_the_backoff_bound_until_the_cap() -> None:
    policy = RestartPolicy(base_s=0.5, cap_s=4.0, stable_after_s=30.0)
    random.seed(7)
    for crashes, bound in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)):
        delays = [policy.delay_s(crashes) for _ in range(200)]
        assert all(0 <= d <= bound for d in delays)
        assert max(delays) > 0.8 * bound  # full jitter reaches up to the bound


def test_a_crash_after_a_stable_run_starts_counting_again() -> None:
    policy = RestartPolicy(stable_after_s=30.0)
    assert policy.consecutive(previous=5, ran_s=2.0) == 6  # a crash loop keeps growing
    assert policy.consecutive(previous=5, ran_s=31.0) == 1  # an hour later is not a loop


def test_a_crashed_service_waits_for_its_backoff_then_counts_a_restart() -> None:
    policy = RestartPolicy(base_s=1.0, cap_s=1.0)
    random.seed(3)
    rec = ServiceRecord(name="decode", port=1, log="decode-0.log")
    rec.spawned(pid=100, now=0.0, restart=False)
    # when: it exits on its own after 2 s
    rec.crashed(exit_code=-9, now=2.0, policy=policy)
    # then: backoff, no pid, restart due only once its delay has passed
    assert rec.state is ServiceState.BACKOFF and rec.pid is None and rec.last_exit == -9
    assert rec.next_start is not None and 2.0 <= rec.next_start <= 3.0
    assert not rec.due(rec.next_start - 1e-6)
    assert rec.due(3.0)
    restarted = rec
    restarted.spawned(pid=101, now=3.0, restart=True)
    assert restarted.state is ServiceState.STARTING
    assert (restarted.pid, restarted.restarts, restarted.next_start) == (101, 1, None)
    assert not rec.due(100.0)  # a running service is never "due"


def test_up_state_survives_its_json_file() -> None:
    state = UpState(supervisor_pid=1, started_at=2.0, url="http://x/", log_dir="/l")
    state.services["lag"] = ServiceRecord(name="lag", port=9308, log="/l/lag-0.log", pid=5)
    state.services["lag"].state = ServiceState.RUNNING
    back = UpState.from_json(state.to_json())
    assert back == state
    assert back.services["lag"].state is ServiceState.RUNNING


def test_the_live_view_shows_services_episodes_throughput_rejects_lag_and_the_page() -> None:
    doc = {
        "url": "http://127.0.0.1:9308/",
        "uptime_s": 12.0,
        "services": {
            "decode": {"state": "running", "pid": 11, "restarts": 2, "last_exit": -9},
            "validate": {"state": "backoff", "pid": None, "restarts": 0, "last_exit": 1},
        },
        "episodes": {"sharded": 1234, "rejected": 5, "uploaded": 0},
        "throughput": {"window_s": 60, "episodes_per_min": 42.0, "video_hours_per_hour": 3.5},
        "rejects": {"keyframe_undecodable": 4, "imu_gap": 1},
        "lag": {"egoline-decode": {"lag": 17, "lag_seconds": 2.5, "status": "WARN"}},
    }
    console = Console(width=140, record=True)
    console.print(render(doc))
    text = console.export_text()
    for shown in (
        "http://127.0.0.1:9308/",
        "decode",
        "backoff",
        "1,234",
        "42 episodes/min",
        "keyframe_undecodable",
        "egoline-decode",
        "WARN",
        "2.5",
    ):
        assert shown in text, shown
    assert "uploaded" not in text  # states with no episodes are left out
