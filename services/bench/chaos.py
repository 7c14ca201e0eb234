"""`egoline bench chaos`: the whole pipeline under crashes and outages, checked against the truth.

On the embedded stack, with every stage a process (`Fleet`):
1. synthesise N short episodes, a known share of them defective (`services.synth` defects),
2. upload them in waves; after each wave, at a random moment while the wave is in flight, one
   fault: SIGKILL of a stage process and its workers (round the stages in a shuffled order;
   then restarted, and joined before the next fault), a broker pause (SIGSTOP / SIGCONT: the
   embedded broker keeps nothing across a restart, so a pause is the outage it can survive),
   or a Postgres restart (same data dir and port);
3. wait until every episode is in a terminal state, then check the warehouse against the
   ground truth (valid episodes sharded, defective ones rejected or dead-lettered with a
   reason), build a manifest and read back and decode every row's clip.

4. audit the shards from the object store (every shard's index read back: clips listed by more
   than one stored shard, shards no clip row points to), collect the unreferenced ones
   (`egoline gc shards --apply --min-age-h 0`: the pipeline is quiet), and audit again.

`lost`, `duplicates` (= `duplicate_clips_in_shards` after gc), `unreferenced_shards` (after
gc) and `unreadable_rows` must be 0; the audit before gc is reported beside them.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from services.agent.runner import Progress as AgentProgress
from services.agent.runner import make_agent
from services.common.objectstore import ObjectStore, object_store
from services.common.settings import Settings
from services.manifest.build import build_manifest
from services.manifest.load import load_manifest, manifest_rows
from services.manifest.query import ManifestFilter
from services.media.av_io import decode_frames
from services.metadata.core import TERMINAL
from services.metadata.gc import audit_shards, collect_shards
from services.metadata.warehouse import dead_letters, episodes, make_engine, verdicts
from services.reader.clips import read_clip
from services.stack.fleet import Fleet
from services.stack.launcher import Stack
from services.synth.writer import Defect, EpisodeSpec, plan_episodes, write_episode

# Every defect the agent will upload (it refuses zero-byte files itself).
CHAOS_DEFECTS = (
    Defect.TRUNCATED,
    Defect.CORRUPT_PACKETS,
    Defect.NOT_VIDEO,
    Defect.IMU_MISMATCH,
    Defect.NON_MONOTONIC,
)
FAULT_KILL = "kill"
FAULT_BROKER_PAUSE = "broker_pause"
FAULT_POSTGRES_RESTART = "postgres_restart"


@dataclass(frozen=True)
class ChaosConfig:
    episodes: int
    kills: int
    seed: int
    duration_s: tuple[float, float] = (3.0, 6.0)
    defect_share: float = 0.15
    broker_pause_s: float = 5.0
    broker_pauses: int = 1
    postgres_restarts: int = 1
    max_fault_delay_s: float = 4.0  # a fault lands uniformly in (0.2, this] after its wave
    timeout_s: float = 1800.0


@dataclass
class FaultLog:
    done: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, at_s: float, **details: Any) -> None:
        self.done.append({"fault": kind, "at_s": round(at_s, 1), **details})


def chaos_specs(config: ChaosConfig) -> list[EpisodeSpec]:
    """N episodes, the first round(N * share) (at least 1) defective, cycling the defects."""
    defective = max(1, round(config.episodes * config.defect_share))
    defects = tuple(CHAOS_DEFECTS[i % len(CHAOS_DEFECTS)] for i in range(defective))
    return plan_episodes(
        config.episodes, seed=config.seed, duration_s=config.duration_s, defects=defects
    )


def fault_schedule(config: ChaosConfig, rng: random.Random) -> list[str]:
    faults = [FAULT_KILL] * config.kills
    faults += [FAULT_BROKER_PAUSE] * config.broker_pauses
    faults += [FAULT_POSTGRES_RESTART] * config.postgres_restarts
    rng.shuffle(faults)
    return faults


def waves(items: list[Path], count: int) -> list[list[Path]]:
    """`items` cut into `count` consecutive, nearly equal waves (some empty if too few)."""
    size, extra = divmod(len(items), count)
    out: list[list[Path]] = []
    start = 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def pause_broker(settings: Settings, seconds: float) -> None:
    """SIGSTOP the embedded broker for `seconds`, then SIGCONT (always)."""
    kafka = Stack(settings.stack_dir).read_state().get("kafka")
    if kafka is None or not kafka.started_by_us or kafka.pid is None:
        raise RuntimeError("the broker is not an embedded service of this stack")
    os.kill(kafka.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(kafka.pid, signal.SIGCONT)


def kill_and_restart(fleet: Fleet, name: str, ready_timeout_s: float = 120.0) -> float:
    """SIGKILL a stage process with its workers, start it again and wait until it has joined
    its group (stopping a member mid-join can wedge a group on the embedded broker); returns
    the seconds it took to be ready again."""
    started = time.monotonic()
    fleet.kill(name, signal.SIGKILL)
    fleet.spawn(name)
    fleet.wait_ready(ready_timeout_s)
    return time.monotonic() - started


def statuses(engine: Engine, ids: list[str]) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(episodes.c.episode_id, episodes.c.status).where(episodes.c.episode_id.in_(ids))
        ).all()
    return {str(r[0]): str(r[1]) for r in rows}


def reasons_by_episode(engine: Engine, ids: list[str]) -> dict[str, set[str]]:
    """Reason codes of each episode: its dead letters and its verdict's reasons."""
    out: dict[str, set[str]] = {i: set() for i in ids}
    with engine.connect() as conn:
        for episode_id, code in conn.execute(
            select(dead_letters.c.episode_id, dead_letters.c.reason_code).where(
                dead_letters.c.episode_id.in_(ids)
            )
        ).all():
            out[str(episode_id)].add(str(code))
        for episode_id, reasons in conn.execute(
            select(verdicts.c.episode_id, verdicts.c.reasons).where(verdicts.c.episode_id.in_(ids))
        ).all():
            out[str(episode_id)] |= {str(r["code"]) for r in reasons}
    return out


def count_dead_letters(engine: Engine, ids: list[str]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(dead_letters)
                .where(dead_letters.c.episode_id.in_(ids))
            ).scalar_one()
        )


def clip_readable(store: ObjectStore, row: dict[str, Any]) -> bool:
    """One ranged GET of the row's clip, then its MP4 decodes to at least one frame."""
    try:
        clip = read_clip(store, row)
        return next(iter(decode_frames(clip.mp4)), None) is not None
    except Exception:
        return False


def check_manifest(
    settings: Settings, engine: Engine, store: ObjectStore, ids: set[str], out_dir: Path
) -> dict[str, int]:
    """Build a manifest, keep the rows of `ids`, read back every row's clip."""
    out_dir.mkdir(parents=True, exist_ok=True)
    built = build_manifest(
        settings.database_libpq_url,
        engine,
        store,
        ManifestFilter(pipeline_version=settings.pipeline_version),
        out_dir,
    )
    rows = [r for r in manifest_rows(load_manifest(built.local_path)) if r["episode_id"] in ids]
    distinct = {(r["episode_id"], r["clip_index"]) for r in rows}
    unreadable = sum(1 for r in rows if not clip_readable(store, r))
    return {
        "manifest_rows": len(rows),
        "duplicates": len(rows) - len(distinct),
        "unreadable_rows": unreadable,
        "episodes_in_manifest": len({r["episode_id"] for r in rows}),
    }


def run_chaos(
    settings: Settings,
    fleet: Fleet,
    config: ChaosConfig,
    work: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The chaos routine against a running, joined `fleet`; returns the report (see module)."""
    rng = random.Random(config.seed)
    specs = chaos_specs(config)
    truth = {s.episode_id: s.defect for s in specs}
    ids = list(truth)
    engine = make_engine(settings)
    store = object_store(settings)
    try:
        if statuses(engine, ids):
            raise RuntimeError(f"seed {config.seed}: these episodes are already in the warehouse")
        started = time.perf_counter()
        shutil.rmtree(work / "episodes", ignore_errors=True)
        dirs = [write_episode(s, work / "episodes") for s in specs]
        log(f"synthesised {len(dirs)} episodes ({sum(1 for d in truth.values() if d)} defective)")
        rng.shuffle(dirs)
        shutil.rmtree(work / "agent", ignore_errors=True)
        agent = make_agent(settings.for_agent(work / "agent"), store, AgentProgress())
        faults = fault_schedule(config, rng)
        log(f"faults, in order: {', '.join(faults)}")
        # Kills go round the stages in a shuffled order, so every stage is killed (K >= 4).
        names = sorted(fleet.procs)
        rng.shuffle(names)
        victims = [names[i % len(names)] for i in range(faults.count(FAULT_KILL))]
        faults_done = FaultLog()
        run_started = time.perf_counter()
        for fault, wave in zip([*faults, None], waves(dirs, len(faults) + 1), strict=True):
            if wave:
                agent.run_once(wave, 300.0)
            if fault is None:
                break
            time.sleep(rng.uniform(0.2, config.max_fault_delay_s))
            at = time.perf_counter() - run_started
            if fault == FAULT_KILL:
                name = victims.pop(0)
                ready_s = kill_and_restart(fleet, name)
                faults_done.add(fault, at, process=name, back_in_s=round(ready_s, 1))
            elif fault == FAULT_BROKER_PAUSE:
                pause_broker(settings, config.broker_pause_s)
                faults_done.add(fault, at, paused_s=config.broker_pause_s)
            else:
                Stack(settings.stack_dir).restart_postgres()
                faults_done.add(fault, at)
            log(f"{faults_done.done[-1]}")
        counts = agent.run_once([], 300.0)
        log(f"uploaded: {counts}")
        deadline = time.monotonic() + config.timeout_s
        done = 0
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the warehouse may be restarting
                done = sum(1 for s in statuses(engine, ids).values() if s in TERMINAL)
            if done >= len(ids):
                break
            if dead := fleet.dead():
                raise RuntimeError(f"services exited on their own: {dead}; see {fleet.log_dir}")
            time.sleep(1.0)
        pipeline_s = time.perf_counter() - run_started
        log(f"{done}/{len(ids)} episodes terminal after {pipeline_s:.0f}s; checking")

        state = statuses(engine, ids)
        reasons = reasons_by_episode(engine, ids)
        valid = [e for e, d in truth.items() if d is None]
        defective = [e for e, d in truth.items() if d is not None]
        lost_valid = [e for e in valid if state.get(e) != "sharded"]
        lost_defective = [e for e in defective if state.get(e) not in TERMINAL]
        accepted_defective = [e for e in defective if state.get(e) == "sharded"]
        with_reason = [
            e for e in defective if state.get(e) in ("rejected", "dead_lettered") and reasons[e]
        ]
        pv = settings.pipeline_version
        before = audit_shards(engine, store, pv)
        log(f"shards before gc: {before.as_dict()}")
        gc = collect_shards(engine, store, pv, datetime.now(UTC), timedelta(0), apply=True)
        after = audit_shards(engine, store, pv)
        log(f"shards after gc: {after.as_dict()}")
        manifest = check_manifest(settings, engine, store, set(valid), work / "manifests")
        missing_rows = len(valid) - manifest["episodes_in_manifest"]
        return {
            "expected": len(ids),
            "cataloged": sum(1 for s in state.values() if s in TERMINAL),
            "duplicates": after.duplicate_clips_in_shards,
            "duplicate_clips_in_shards": after.duplicate_clips_in_shards,
            "unreferenced_shards": after.unreferenced_shards,
            "duplicate_clips_in_shards_before_gc": before.duplicate_clips_in_shards,
            "unreferenced_shards_before_gc": before.unreferenced_shards,
            "gc_deleted_shards": gc["deleted_shards"],
            "shards": after.shards,
            "manifest_duplicate_rows": manifest["duplicates"],
            "lost": len(lost_valid) + len(lost_defective) + max(0, missing_rows),
            "unreadable_rows": manifest["unreadable_rows"],
            "dlq": count_dead_letters(engine, ids),
            "defective": len(defective),
            "rejected_with_reason": len(with_reason),
            "defective_accepted": len(accepted_defective),
            "valid": len(valid),
            "sharded": sum(1 for e in valid if state.get(e) == "sharded"),
            "manifest_rows": manifest["manifest_rows"],
            "kills": sum(1 for f in faults_done.done if f["fault"] == FAULT_KILL),
            "broker_pauses": sum(1 for f in faults_done.done if f["fault"] == FAULT_BROKER_PAUSE),
            "postgres_restarts": sum(
                1 for f in faults_done.done if f["fault"] == FAULT_POSTGRES_RESTART
            ),
            "faults": faults_done.done,
            "lost_ids": sorted(lost_valid + lost_defective)[:20],
            "pipeline_s": round(pipeline_s, 1),
            "wall_s": round(time.perf_counter() - started, 1),
            "seed": config.seed,
        }
    finally:
        engine.dispose()


def bench_chaos(
    settings: Settings,
    episodes: int,
    kills: int,
    seed: int,
    log: Callable[[str], None],
    duration_s: tuple[float, float] = (3.0, 6.0),
) -> dict[str, Any]:
    """`egoline bench chaos`: a fleet of its own, the chaos routine, the fleet stopped."""
    if seed < 0:  # fresh episode ids each run
        seed = int(time.time()) % 9000 + 1000
    work = settings.stack_dir / "bench-chaos"
    fleet = Fleet(work / "logs", env={"EGOLINE_START_JITTER_S": "0", "EGOLINE_BATCH_WAIT_S": "0.5"})
    fleet.start_all()
    try:
        fleet.wait_ready()
        return run_chaos(
            settings,
            fleet,
            ChaosConfig(episodes=episodes, kills=kills, seed=seed, duration_s=duration_s),
            work,
            log,
        )
    finally:
        fleet.stop()
