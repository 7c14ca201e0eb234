"""`egoline bench upload`: the agent against a plain `fput_object` of the same file, same run.

Both write the same bytes to the same object store with the same part size; the agent's time
includes hashing the file (the raw key is content-addressed) and publishing the event. One
unmeasured upload warms the store up; then the two sides run in ABBA order for `rounds` rounds
and the medians are compared (single runs on the embedded store vary by +-20%, and it slows as
it ages, which the ABBA order cancels).
A second, smaller episode is uploaded by an agent process killed with SIGKILL mid-upload and
restarted, to count parts sent again after the store had acknowledged them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.agent.journal import Journal, count_acked_parts
from services.agent.runner import make_agent, make_producer
from services.common.objectstore import object_store
from services.common.settings import Settings

MB = 1024 * 1024


def write_recording(root: Path, size_mb: int) -> Path:
    episode_id = f"bench-{uuid.uuid4().hex[:10]}"
    folder = root / episode_id
    folder.mkdir(parents=True)
    with (folder / "video.mp4").open("wb") as handle:
        for _ in range(size_mb):
            handle.write(os.urandom(MB))
    (folder / "episode.json").write_text(
        json.dumps(
            {
                "episode_id": episode_id,
                "device_id": "bench",
                "session_id": episode_id,
                "started_at": "2026-01-01T00:00:00+00:00",
                "video": "video.mp4",
            }
        )
    )
    return folder


def kill_and_resume(
    folder: Path,
    state: Path,
    bandwidth_mb_s: float,
    extra_env: dict[str, str] | None = None,
    after_kill: Callable[[Path], None] | None = None,
) -> tuple[int, str]:
    """Upload `folder` with an agent process capped at `bandwidth_mb_s`, SIGKILL it once three
    parts are acknowledged, call `after_kill(journal path)` if given (a test's way to damage
    the journal), then run it again uncapped to the end. Returns (parts acknowledged at the
    kill, the resumed run's stdout)."""
    env = {
        **os.environ,
        "EGOLINE_AGENT_STATE_DIR": str(state),
        "EGOLINE_AGENT_PART_SIZE_MB": "5",
        **(extra_env or {}),
    }
    command = [sys.executable, "-m", "services.cli", "agent", "upload", str(folder)]
    proc = subprocess.Popen(
        command,
        env={**env, "EGOLINE_AGENT_BANDWIDTH_MB_S": str(bandwidth_mb_s)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while count_acked_parts(state / "journal.sqlite") < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    acked = count_acked_parts(state / "journal.sqlite")
    if after_kill is not None:
        after_kill(state / "journal.sqlite")
    resumed = subprocess.run(
        command, env=env, check=True, capture_output=True, text=True, timeout=600
    )
    return acked, resumed.stdout


def resume_after_kill(
    settings: Settings, root: Path, size_mb: int, log: Callable[[str], None]
) -> int:
    """Parts sent again, after the store acknowledged them, by an agent killed mid-upload and
    restarted (the journal counts every send)."""
    state = root / "resume-agent"
    acked, _ = kill_and_resume(write_recording(root / "resume", size_mb), state, 10)
    log(f"killed the agent after {acked} acknowledged parts, then resumed it")
    journal = Journal(state / "journal.sqlite")
    try:
        if journal.counts() != {"published": 1}:
            raise RuntimeError(f"resumed upload did not publish: {journal.counts()}")
        return journal.parts_resent()
    finally:
        journal.close()


def bench_upload(
    settings: Settings, size_mb: int, log: Callable[[str], None], rounds: int = 6
) -> dict[str, Any]:
    store = object_store(settings)
    part_size = settings.agent.part_size_mb * MB
    root = Path(tempfile.mkdtemp(prefix="egoline-bench-upload-"))
    try:
        folder = write_recording(root / "episodes", size_mb)
        video = folder / "video.mp4"
        warmup = f"bench/warmup/{uuid.uuid4().hex}"
        store.client.fput_object(settings.s3.bucket, warmup, str(video), part_size=part_size)
        store.delete(warmup)
        baseline_s: list[float] = []
        agent_s: list[float] = []
        producer = make_producer(settings)  # one per process, as the agent runs on a device

        def run_baseline() -> None:
            key = f"bench/baseline/{uuid.uuid4().hex}"
            started = time.perf_counter()
            store.client.fput_object(settings.s3.bucket, key, str(video), part_size=part_size)
            baseline_s.append(time.perf_counter() - started)
            store.delete(key)

        def run_agent() -> None:
            state = root / f"agent-{len(agent_s)}"
            agent_settings = settings.for_agent(state)
            agent = make_agent(agent_settings, store, producer=producer)
            started = time.perf_counter()
            counts = agent.run_once([folder], 60.0)
            agent_s.append(time.perf_counter() - started)
            if counts != {"published": 1}:
                raise RuntimeError(f"agent run did not publish: {counts}")
            event = agent.journal.episodes()[0].event_json or "{}"
            store.delete(json.loads(event)["episode"]["video"]["key"])
            agent.journal.close()

        # ABBA order: the emulator drifts as it ages, and a drift hits both sides equally.
        for round_no in range(rounds):
            order = (run_baseline, run_agent) if round_no % 2 == 0 else (run_agent, run_baseline)
            for run in order:
                run()
            log(
                f"round {round_no + 1}/{rounds}: fput_object {size_mb / baseline_s[-1]:.1f} MB/s,"
                f" agent {size_mb / agent_s[-1]:.1f} MB/s"
            )
        resent = resume_after_kill(settings, root, min(size_mb, 64), log)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mb_s = size_mb / statistics.median(agent_s)
    baseline = size_mb / statistics.median(baseline_s)
    return {
        "mb": size_mb,
        "part_mb": settings.agent.part_size_mb,
        "concurrency": settings.agent.upload_concurrency,
        "rounds": rounds,
        "mb_s": round(mb_s, 1),
        "baseline_mb_s": round(baseline, 1),
        "ratio": round(mb_s / baseline, 3),
        "resumed_parts_resent": resent,
    }
