"""`egoline up --detach` runs the whole pipeline from one command; `egoline down` stops it all.

Given an empty stack dir and no configured endpoints, `up --detach` starts its own embedded
Kafka, Postgres and S3 and the fleet (decode, validate, shard, metadata, lag); `agent upload`
on device-made episodes is then all it takes: `status --json` shows every episode sharded. A
service killed with SIGKILL is restarted by the supervisor. `down` leaves no process behind:
counted from the outside, by every process whose session or process group is one `up` made.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from services.stack.launcher import Stack, free_port
from services.stack.supervisor import read_up_state
from tests.fixtures.polling import wait_for

pytestmark = pytest.mark.connected

CASES = "h264_default_mp4,h265_default_open_gop_mp4,rgbd_ffv1_depth_mkv,multicam_mp4"


def egoline(env: dict[str, str], *args: str, timeout_s: float = 240) -> dict[str, Any]:
    """Run one `egoline` command; its last stdout line is its JSON document."""
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, f"egoline {' '.join(args)}: {done.stderr[-3000:]}"
    doc: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return doc


def processes_of(sessions: set[int], groups: set[int]) -> list[str]:
    """Every live process (not a zombie) in one of these sessions or process groups."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            pid = proc.info["pid"]
            if os.getsid(pid) in sessions or os.getpgid(pid) in groups:
                found.append(f"{pid} {proc.info['name']}")
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


@pytest.fixture
def up_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment with no endpoint configured and a stack dir of its own; whatever the
    test leaves running is stopped at the end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EGOLINE_", "DATABASE_URL"))}
    env |= {
        "EGOLINE_STACK_DIR": str(tmp_path / "stack"),
        "EGOLINE_PAGE_PORT": str(free_port()),
        "EGOLINE_START_JITTER_S": "0",
        "EGOLINE_BATCH_WAIT_S": "0.5",
        "EGOLINE_AGENT_STATE_DIR": str(tmp_path / "agent"),
    }
    yield env
    subprocess.run(
        [sys.executable, "-m", "services.cli", "down"], env=env, capture_output=True, check=False
    )
    Stack(tmp_path / "stack").down()  # whatever a failed `down` left of the embedded stack


def test_up_detach_shards_uploaded_episodes_restarts_a_crash_and_down_leaves_nothing(
    up_env: dict[str, str], tmp_path: Path
) -> None:
    # given: the fleet up in the background, from nothing
    up = egoline(up_env, "up", "--detach")
    assert up["status"] == "up"
    assert set(up["services"]) == {"decode", "validate", "shard", "metadata", "lag"}
    stack_dir = Path(up_env["EGOLINE_STACK_DIR"])
    stack_pids = {n: s.pid for n, s in Stack(stack_dir).read_state().items() if s.started_by_us}
    assert set(stack_pids) == {"kafka", "postgres", "s3"}

    # when: a device uploads episodes made the way recorders make them
    episodes = tmp_path / "episodes"
    synth = egoline(
        up_env, "synth", "--realistic", "--cases", CASES, "--out", str(episodes), timeout_s=300
    )
    ids = sorted(p.parent.name for p in episodes.glob("*/episode.json"))
    assert len(ids) == synth["episodes"] == 4
    uploaded = egoline(up_env, "agent", "upload", str(episodes))
    assert uploaded["published"] == 4

    # then: status shows every one sharded, none rejected
    def all_sharded() -> dict[str, Any] | None:
        doc = egoline(up_env, "status", "--json")
        return doc if doc.get("episodes", {}).get("sharded") == len(ids) else None

    doc = wait_for(all_sharded, 240, "every uploaded episode sharded")
    assert doc is not None and doc["up"] is True
    assert doc["episodes"]["rejected"] == 0 and doc["episodes"]["dead_lettered"] == 0
    assert all(s["state"] == "running" for s in doc["services"].values())

    # and: the lag service sees every stage's group caught up (commits trail the effects)
    def caught_up() -> bool:
        lag = egoline(up_env, "status", "--json")["lag"]
        groups = {"egoline-decode", "egoline-validate", "egoline-shard", "egoline-metadata"}
        return set(lag) >= groups and all(lag[g]["lag"] == 0 for g in groups)

    wait_for(caught_up, 60, "every pipeline group at lag 0")

    # and: a service that dies is started again
    decode_pid = doc["services"]["decode"]["pid"]
    os.kill(decode_pid, signal.SIGKILL)

    def decode_restarted() -> bool:
        svc = egoline(up_env, "status", "--json")["services"]["decode"]
        return bool(svc["restarts"] == 1 and svc["state"] == "running" and svc["pid"] != decode_pid)

    wait_for(decode_restarted, 90, "decode restarted by the supervisor")

    # when: down
    state = read_up_state(stack_dir)
    assert state is not None
    sessions = {state.supervisor_pid}
    groups = {rec.pid for rec in state.services.values() if rec.pid is not None}
    groups.add(decode_pid)  # the killed decode's group: its pool workers, orphaned
    groups |= {pid for pid in stack_pids.values() if pid is not None}
    assert processes_of(sessions, groups), "the check must see the running fleet first"
    down = egoline(up_env, "down")

    # then: nothing it started is left, counted from the process table
    assert down["stopped"] is True and down["leftover"] == []
    assert processes_of(sessions, groups) == []
    assert not (stack_dir / "up.json").exists()
    assert egoline(up_env, "status", "--json")["up"] is False
