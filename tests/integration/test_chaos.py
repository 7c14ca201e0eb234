"""The chaos routine, small: SIGKILLs of stage processes, a broker pause and a Postgres restart
while episodes flow; nothing is lost, nothing duplicated, every manifest row reads back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.bench.chaos import ChaosConfig, run_chaos
from services.common.settings import Settings
from services.stack.fleet import Fleet

pytestmark = pytest.mark.connected


def test_kills_a_broker_pause_and_a_postgres_restart_lose_and_duplicate_nothing(
    stack: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    seed = 7000 + int(time.time()) % 900
    config = ChaosConfig(
        episodes=12, kills=2, seed=seed, duration_s=(2.0, 4.0), defect_share=0.25, timeout_s=150
    )
    report = run_chaos(stack, fleet, config, tmp_path, log=lambda _line: None)

    assert report["kills"] == 2
    assert report["broker_pauses"] == 1
    assert report["postgres_restarts"] == 1
    assert report["expected"] == report["cataloged"] == 12
    assert report["lost"] == 0, report["lost_ids"]
    assert report["duplicates"] == report["duplicate_clips_in_shards"] == 0
    assert report["unreferenced_shards"] == 0
    assert report["manifest_duplicate_rows"] == 0
    assert report["unreadable_rows"] == 0
    assert report["sharded"] == report["valid"] == report["manifest_rows"] == 9
    assert report["defective"] == report["rejected_with_reason"] == 3
    assert report["defective_accepted"] == 0
    assert not fleet.dead()
