"""`egoline bench poison`: planted bugs in every batch step, among good episodes, on the real
stack, with a dependency outage in the middle.

A fleet of its own runs with `EGOLINE_FAILPOINTS` (services/common/failpoints.py): the batch
step (`finish`) of decode, validate and shard raises for any batch holding a record of an
episode planted for that stage, and the metadata service's warehouse transaction raises for any
batch holding a record of any planted episode. Good episodes share their batches and
partitions. In the middle, the S3 server is paused (SIGSTOP / SIGCONT) and Postgres restarted:
those are retried, never bisected, so no good episode may be dead-lettered.

Everything is counted from outside the consumers:
- `planted` / `isolated`: planted records (a planted episode's input record at its stage, and
  each planted episode's `episodes.uploaded` record at the metadata service) found in the
  dead-letter topic of that consumer as `internal_error` with the failpoint's exception type;
- `good_cataloged` / `good_expected`: good episodes sharded, and found in a manifest whose
  clips are read back from the shards;
- `dependency_outage_dlq`: good episodes in any dead-letter topic (must be 0);
- `max_stall_s`: the longest a good episode took from the end of the upload to sharded;
- `lag_saw_stall`: `egoline lag --json`, run in a loop meanwhile, showed a group as not OK
  with the reason (retrying, isolating, or rewinding the same batch);
- `uncommitted_lag`: records still waiting on every pipeline group at the end (must be 0).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from schemas.events import (
    TOPIC_DECODED,
    TOPIC_METADATA_DLQ,
    TOPIC_UPLOADED,
    TOPIC_VALIDATED,
    DlqRecord,
    ReasonCode,
    dlq_topic,
)
from services.agent.runner import Progress as AgentProgress
from services.agent.runner import make_agent
from services.bench.chaos import check_manifest, statuses
from services.common.kafka import read_topic
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.lag.collector import OffsetReader
from services.lag.monitor import PIPELINE_TOPICS
from services.metadata.warehouse import make_engine
from services.stack.fleet import Fleet
from services.stack.launcher import Stack
from services.synth.writer import EpisodeSpec, plan_episodes, write_episode

# The stage whose batch step a planted episode breaks, and the topic that stage consumes.
PLANTED_STAGES = {"decode": TOPIC_UPLOADED, "validate": TOPIC_DECODED, "shard": TOPIC_VALIDATED}
TRIPPED = "FailpointTripped"


@dataclass(frozen=True)
class PoisonConfig:
    good: int = 16
    per_stage: int = 2  # planted episodes per stage of PLANTED_STAGES
    seed: int = 0
    duration_s: tuple[float, float] = (3.0, 5.0)
    outage_s: float = 6.0  # the S3 pause; 0: no outage
    postgres_restart: bool = True
    step_backoff_s: float = 1.0
    timeout_s: float = 600.0


def marker(seed: int, stage: str = "") -> str:
    """The failpoint marker of a stage's planted episodes (all planted episodes: no stage)."""
    return f"poison{seed:04d}-{stage}-" if stage else f"poison{seed:04d}-"


def failpoints_spec(seed: int) -> str:
    """`EGOLINE_FAILPOINTS` for the fleet: each stage trips on its own planted episodes, the
    metadata service on every planted episode."""
    stages = [f"{stage}.finish={marker(seed, stage)}" for stage in PLANTED_STAGES]
    return ",".join([*stages, f"metadata.finish={marker(seed)}"])


def poison_specs(config: PoisonConfig) -> tuple[list[EpisodeSpec], dict[str, str]]:
    """Good episodes, then planted ones (id carrying the marker) -> (specs, planted id -> stage)."""
    planted_count = config.per_stage * len(PLANTED_STAGES)
    specs = plan_episodes(
        config.good + planted_count, seed=config.seed, duration_s=config.duration_s
    )
    planted: dict[str, str] = {}
    for i, spec in enumerate(specs[config.good :]):
        stage = list(PLANTED_STAGES)[i % len(PLANTED_STAGES)]
        episode_id = f"{marker(config.seed, stage)}{i:03d}"
        specs[config.good + i] = replace(spec, episode_id=episode_id)
        planted[episode_id] = stage
    return specs, planted


def episode_of(record: DlqRecord) -> str | None:
    """The episode id of a dead letter's original event (None if it has none)."""
    try:
        body = json.loads(record.original_value)
    except ValueError:
        return None
    for path in (("episode",), ("decoded", "episode")):
        node: Any = body
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get("episode_id"), str):
            return str(node["episode_id"])
    return None


def dead_letters(settings: Settings) -> list[DlqRecord]:
    """Every dead letter of the stages' inputs and of the metadata service, from the topics."""
    topics = [*(dlq_topic(t) for t in PLANTED_STAGES.values()), TOPIC_METADATA_DLQ]
    out = []
    for topic in topics:
        for msg in read_topic(settings, topic):
            out.append(DlqRecord.model_validate_json(msg.value() or b""))
    return out


def isolated_plantings(
    letters: list[DlqRecord], planted: dict[str, str]
) -> tuple[set[tuple[str, str]], set[str]]:
    """(consumer, episode) plantings found dead-lettered as the planted bug, and the good
    episodes found in any dead letter."""
    found: set[tuple[str, str]] = set()
    good_dead: set[str] = set()
    for letter in letters:
        episode = episode_of(letter)
        if episode is None:
            continue
        if episode not in planted:
            good_dead.add(episode)
            continue
        tripped = (
            letter.reason_code is ReasonCode.INTERNAL_ERROR and letter.exception_type == TRIPPED
        )
        if not tripped:
            continue
        if letter.stage == planted[episode]:
            found.add((letter.stage, episode))
        elif letter.stage == "metadata" and letter.source_topic == TOPIC_UPLOADED:
            found.add(("metadata", episode))
    return found, good_dead


@dataclass
class LagWatch:
    """`egoline lag --json` in a loop (a subprocess each time, as a user runs it): every group
    seen not OK, with its reason."""

    stalls: list[dict[str, Any]] = field(default_factory=list)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, started: float) -> None:
        self._thread = threading.Thread(target=self._loop, args=(started,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _loop(self, started: float) -> None:
        egoline = str(Path(sys.executable).with_name("egoline"))
        command = [egoline, "lag", "--json", "--samples", "2"]
        command += ["--interval-s", "1"]
        while not self._stop.is_set():
            done = subprocess.run(command, capture_output=True, timeout=120, check=False)
            lines = done.stdout.decode().strip().splitlines()
            if done.returncode == 0 and lines:
                self.samples += 1
                for group, entry in json.loads(lines[-1])["groups"].items():
                    if entry["status"] != "OK" and entry.get("reason"):
                        at = round(time.monotonic() - started, 1)
                        self.stalls.append(
                            {
                                "at_s": at,
                                "group": group,
                                "status": entry["status"],
                                "reason": entry["reason"][:200],
                            }
                        )
            self._stop.wait(1.0)

    def saw_stall(self) -> bool:
        """A group reported stuck on a batch (not merely never committed yet)."""
        return any(not s["reason"].startswith("never committed") for s in self.stalls)


def pause_s3(settings: Settings, seconds: float) -> None:
    """SIGSTOP the embedded S3 server for `seconds`, then SIGCONT (always)."""
    s3 = Stack(settings.stack_dir).read_state().get("s3")
    if s3 is None or not s3.started_by_us or s3.pid is None:
        raise RuntimeError("the S3 server is not an embedded service of this stack")
    os.kill(s3.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(s3.pid, signal.SIGCONT)


def uncommitted_lag(settings: Settings) -> dict[str, int]:
    """Records waiting per pipeline group (committed, or from the log start if never)."""
    reader = OffsetReader(settings)
    try:
        waiting: dict[str, int] = {}
        for r in reader.read(PIPELINE_TOPICS):
            waiting[r.group] = waiting.get(r.group, 0) + max(0, r.end - r.committed)
        return waiting
    finally:
        reader.close()


def run_poison(
    settings: Settings, fleet: Fleet, config: PoisonConfig, work: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """The routine against a running, joined `fleet` started with `failpoints_spec(seed)`."""
    specs, planted = poison_specs(config)
    good = [s.episode_id for s in specs if s.episode_id not in planted]
    engine = make_engine(settings)
    store = object_store(settings)
    watch = LagWatch()
    try:
        if statuses(engine, [s.episode_id for s in specs]):
            raise RuntimeError(f"seed {config.seed}: these episodes are already in the warehouse")
        shutil.rmtree(work / "episodes", ignore_errors=True)
        dirs = [write_episode(s, work / "episodes") for s in specs]
        random.Random(config.seed).shuffle(dirs)
        log(f"synthesised {len(good)} good and {len(planted)} planted episodes")
        shutil.rmtree(work / "agent", ignore_errors=True)
        agent = make_agent(settings.for_agent(work / "agent"), store, AgentProgress())
        started = time.monotonic()
        watch.start(started)
        agent.run_once(dirs, 300.0)
        uploaded = time.monotonic()
        log(f"uploaded in {uploaded - started:.1f}s; planted bugs are tripping")
        outages = []
        if config.outage_s > 0:
            time.sleep(2.0)  # batches in flight
            log(f"pausing S3 for {config.outage_s:.0f}s")
            pause_s3(settings, config.outage_s)
            outages.append({"outage": "s3_pause", "s": config.outage_s})
        if config.postgres_restart:
            log("restarting Postgres")
            Stack(settings.stack_dir).restart_postgres()
            outages.append({"outage": "postgres_restart"})
        sharded_at: dict[str, float] = {}
        deadline = time.monotonic() + config.timeout_s
        while time.monotonic() < deadline and len(sharded_at) < len(good):
            try:
                state = statuses(engine, good)
            except Exception:  # the warehouse is restarting
                state = {}
            now = time.monotonic()
            for episode, status in state.items():
                if status == "sharded":
                    sharded_at.setdefault(episode, now)
            if dead := fleet.dead():
                raise RuntimeError(f"services exited on their own: {dead}; see {fleet.log_dir}")
            time.sleep(1.0)
        pipeline_s = time.monotonic() - started
        log(f"{len(sharded_at)}/{len(good)} good episodes sharded after {pipeline_s:.0f}s")
        time.sleep(3.0)  # the last dead letters and commits
        watch.stop()
        letters = dead_letters(settings)
        found, good_dead = isolated_plantings(letters, planted)
        manifest = check_manifest(settings, engine, store, set(good), work / "manifests")
        waiting = uncommitted_lag(settings)
        stall = max((at - uploaded for at in sharded_at.values()), default=pipeline_s)
        return {
            "planted": len(planted) * 2,  # at its stage, and at the metadata service
            "isolated": len(found),
            "planted_by_consumer": {
                c: sum(1 for stage in planted.values() if stage == c) for c in PLANTED_STAGES
            }
            | {"metadata": len(planted)},
            "isolated_by_consumer": {
                c: sum(1 for who, _ in found if who == c) for c in (*PLANTED_STAGES, "metadata")
            },
            "good_expected": len(good),
            "good_cataloged": len(sharded_at),
            "good_in_manifest": manifest["episodes_in_manifest"],
            "unreadable_rows": manifest["unreadable_rows"],
            "dependency_outage_dlq": len(good_dead),
            "max_stall_s": round(stall, 1),
            "lag_saw_stall": watch.saw_stall(),
            "lag_samples": watch.samples,
            "lag_stalls": _first_per_group(watch.stalls),
            "uncommitted_lag": sum(waiting.values()),
            "outages": outages,
            "pipeline_s": round(pipeline_s, 1),
            "seed": config.seed,
        }
    finally:
        watch.stop()
        engine.dispose()


def _first_per_group(stalls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first stuck-on-a-batch report of each group (the JSON line stays short)."""
    seen: dict[str, dict[str, Any]] = {}
    for s in stalls:
        if not s["reason"].startswith("never committed"):
            seen.setdefault(s["group"], s)
    return list(seen.values())


def poison_fleet(log_dir: Path, seed: int, backoff_s: float) -> Fleet:
    return Fleet(
        log_dir,
        env={
            "EGOLINE_START_JITTER_S": "0",
            "EGOLINE_BATCH_WAIT_S": "0.5",
            "EGOLINE_FAILPOINTS": failpoints_spec(seed),
            "EGOLINE_BATCH_STEP_BACKOFF_S": str(backoff_s),
        },
    )


def bench_poison(
    settings: Settings, config: PoisonConfig, log: Callable[[str], None]
) -> dict[str, Any]:
    """`egoline bench poison`: a fleet of its own with the failpoints, the routine, stopped."""
    if config.seed < 0:  # fresh episode ids each run
        config = replace(config, seed=int(time.time()) % 9000 + 1000)
    work = settings.stack_dir / "bench-poison"
    fleet = poison_fleet(work / "logs", config.seed, config.step_backoff_s)
    fleet.start_all()
    try:
        fleet.wait_ready()
        return run_poison(settings, fleet, config, work, log)
    finally:
        fleet.stop()
