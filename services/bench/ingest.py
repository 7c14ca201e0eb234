"""`egoline bench ingest`: the pipeline against the object store's floor, a careful serial
baseline and the naive approach, in one run on the embedded stack:

1. synthesise the episodes (not timed; reused across runs by seed),
2. the pipeline: every stage as its own process (`egoline serve`), already joined (a warm-up
   episode goes through first); timed from the agent's first upload until the warehouse has
   every episode in a terminal state; CPU seconds of each stage process (and its workers),
3. the I/O floor: the object-store work this design cannot avoid, at the same concurrency
   (3 threads): PUT every raw file, GET it once, PUT the bytes of the shards the pipeline wrote
   (`io_limit_ratio` = those seconds over the pipeline's wall time),
4. the serial baseline (what a careful engineer writes first): one process ingesting episodes
   one after another with the same functions (`services.bench.serial`), on extra episodes of
   the same mix; `speedup_vs_serial` compares throughput per video-hour,
5. the naive approach on a few episodes: download, decode every frame, re-encode with libx264
   (default preset), upload; as many processes as cores; scaled per video-hour.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, select

from services.agent.runner import Progress as AgentProgress
from services.agent.runner import make_agent
from services.bench.serial import run_serial
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.demo.run import count_cataloged
from services.media.av_io import transcode_full
from services.metadata.warehouse import clips, make_engine
from services.stack.fleet import Fleet
from services.stack.launcher import Stack
from services.synth.writer import plan_episodes, write_episode, write_from_templates

WEEK_S = 7 * 24 * 3600


IO_THREADS = 3


def io_floor_seconds(settings: Settings, raw: list[Path], shard_keys: list[str]) -> float:
    """Seconds for the object-store work the design cannot avoid, `IO_THREADS` at a time: PUT
    every raw file, GET each once, PUT the bytes of every shard written (the shards are
    fetched to local disk first, untimed, so the PUTs read from disk as the shard stage does)."""
    store = object_store(settings)
    prefix = f"bench/io/{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(prefix="egoline-io-") as tmp:
        local_shards = [Path(tmp) / f"shard-{i}.tar" for i in range(len(shard_keys))]
        with ThreadPoolExecutor(IO_THREADS) as pool:
            list(pool.map(store.download, shard_keys, local_shards))

        def raw_round_trip(i: int, path: Path) -> None:
            store.put_file(f"{prefix}/raw-{i}", path)
            store.get_bytes(f"{prefix}/raw-{i}")

        def put_shard(i: int, path: Path) -> None:
            size = path.stat().st_size
            store.put_file(f"{prefix}/shard-{i}", path, "application/x-tar", single_put_max=size)

        started = time.perf_counter()
        with ThreadPoolExecutor(IO_THREADS) as pool:
            list(pool.map(raw_round_trip, range(len(raw)), raw))
            list(pool.map(put_shard, range(len(local_shards)), local_shards))
        elapsed = time.perf_counter() - started
    for key in store.list_keys(prefix):
        store.delete(key)
    return elapsed


def shards_of(engine: Engine, episode_ids: list[str]) -> list[str]:
    """Keys of every shard holding a clip of these episodes."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(clips.c.shard_key).where(clips.c.episode_id.in_(episode_ids)).distinct()
        )
        return sorted(str(r[0]) for r in rows)


def _serial_run(settings: Settings, directories: list[Path]) -> tuple[float, int, float]:
    """The serial baseline in a fresh process: (wall seconds, clips, CPU seconds)."""
    before = psutil.Process().cpu_times()
    wall, n = run_serial(settings, directories)
    after = psutil.Process().cpu_times()
    return wall, n, (after.user - before.user) + (after.system - before.system)


def _naive_one(settings: Settings, video: Path) -> None:
    store = object_store(settings)
    with tempfile.TemporaryDirectory(prefix="egoline-naive-") as tmp:
        raw = Path(tmp) / "raw.mp4"
        key = f"bench/naive/{uuid.uuid4().hex}"
        store.put_file(key, video)
        store.download(key, raw)
        out = Path(tmp) / "out.mp4"
        transcode_full(raw, out)
        store.put_file(f"{key}.transcoded.mp4", out)
        store.delete(key)
        store.delete(f"{key}.transcoded.mp4")


def naive_seconds(settings: Settings, videos: list[Path]) -> float:
    started = time.perf_counter()
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(_naive_one, [settings] * len(videos), videos))
    return time.perf_counter() - started


def scrape(port: int) -> dict[str, float]:
    """Sum of each sample name on a process's /metrics (labels folded)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    return totals


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User+system CPU seconds of each process and its children (workers), by name; this
    process (the bench and its in-process agent) without its children (the fleet)."""
    totals: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            proc = psutil.Process(pid)
            children = [] if pid == os.getpid() else proc.children(recursive=True)
            procs = [proc, *children]
            totals[name] = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        except psutil.Error:
            totals[name] = 0.0
    return totals


def _duration_s(directory: Path) -> float:
    meta = json.loads((directory / "episode.json").read_text())
    return float(meta["frames"]) / float(meta["fps"])


def bench_ingest(
    settings: Settings,
    episodes: int,
    naive_episodes: int,
    serial_episodes: int,
    seed: int,
    duration_s: tuple[float, float],
    size: tuple[int, int],
    log: Callable[[str], None],
    timeout_s: float = 3600.0,
) -> dict[str, Any]:
    work = settings.stack_dir / "bench-ingest"
    engine = make_engine(settings)
    if seed < 0:  # a fresh set of episode ids each run (templates are cached, remuxes cheap)
        seed = int(time.time()) % 9000 + 1000
    # One plan for both sides (same mix of durations, same templates); the serial baseline
    # gets the last `serial_episodes` of it, the pipeline the rest.
    specs = plan_episodes(
        episodes + serial_episodes,
        seed=seed,
        duration_s=duration_s,
        width=size[0],
        height=size[1],
        devices=8,
    )
    started = time.perf_counter()
    if count_cataloged(engine, [s.episode_id for s in specs]):
        raise RuntimeError(f"seed {seed}: these episodes are already in the warehouse")
    shutil.rmtree(work / "episodes", ignore_errors=True)
    every_dir = write_from_templates(specs, work / "episodes", templates=3)
    # templates live in work/.templates: keep them across runs
    dirs, serial_dirs = every_dir[:episodes], every_dir[episodes:]
    specs = specs[:episodes]

    log(f"synthesised {len(every_dir)} episodes in {time.perf_counter() - started:.0f}s")
    video_s = sum(_duration_s(d) for d in dirs)
    files = [f for d in dirs for f in (d / "video.mp4", d / "imu.npy")]
    raw_bytes = sum(f.stat().st_size for f in files)
    log(f"{video_s / 3600:.2f} video-hours, {raw_bytes / 1e9:.2f} GB")

    ids = [s.episode_id for s in specs]
    fleet = Fleet(work / "logs", env={"EGOLINE_START_JITTER_S": "0"})
    shutil.rmtree(work / "agent", ignore_errors=True)
    agent = make_agent(
        settings.for_agent(work / "agent"),
        object_store(settings),
        AgentProgress(),
    )
    fleet.start_all()
    try:
        fleet.wait_ready()
        warm = plan_episodes(1, seed=seed + 10_000, duration_s=(4.0, 4.0))
        warm_dir = write_episode(warm[0], work / "warmup")
        agent.run_once([warm_dir], 60.0)
        deadline = time.monotonic() + 120
        while count_cataloged(engine, [warm[0].episode_id]) < 1:
            if time.monotonic() > deadline or fleet.dead():
                raise RuntimeError(f"warm-up episode not cataloged; see {work / 'logs'}")
            time.sleep(0.5)
        before = {name: scrape(port) for name, port in fleet.metrics_ports.items()}
        pids = {name: proc.pid for name, proc in fleet.procs.items()}
        stage_procs = list(fleet.procs)
        pids |= {
            name: state.pid
            for name, state in Stack(settings.stack_dir).read_state().items()
            if state.pid is not None
        }
        pids["bench+agent"] = os.getpid()
        cpu_before = cpu_seconds(pids)
        log("pipeline: uploading and processing")
        started = time.perf_counter()
        agent.run_once(dirs, 120.0)
        uploaded_s = time.perf_counter() - started
        deadline = time.monotonic() + timeout_s
        done = 0
        while done < len(ids):
            if time.monotonic() > deadline or fleet.dead():
                raise RuntimeError(f"{done}/{len(ids)} cataloged; see {work / 'logs'}")
            time.sleep(1.0)
            done = count_cataloged(engine, ids)
        wall_s = time.perf_counter() - started
        after = {name: scrape(port) for name, port in fleet.metrics_ports.items()}
        cpu_after = cpu_seconds(pids)
    finally:
        fleet.stop()
    log(f"pipeline: {wall_s:.1f}s (agent upload {uploaded_s:.1f}s)")
    shard_keys = shards_of(engine, ids)
    engine.dispose()
    log(f"I/O floor: PUT + GET the raw files, PUT {len(shard_keys)} shards' bytes")
    io_s = io_floor_seconds(settings, files, shard_keys)
    log(f"I/O floor: {io_s:.1f}s")
    serial_video_s = sum(_duration_s(d) for d in serial_dirs)
    log(f"serial baseline: {len(serial_dirs)} episodes ({serial_video_s:.0f}s of video)")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        serial_s, serial_clips, serial_cpu_s = pool.submit(
            _serial_run, settings, serial_dirs
        ).result()
    log(f"serial baseline: {serial_s:.1f}s, {serial_clips} clips")

    def delta(metric: str, process: str) -> float:
        return after[process].get(metric, 0.0) - before[process].get(metric, 0.0)

    bytes_read = sum(delta("egoline_stage_object_bytes_read_total", p) for p in after)
    makespan = {
        p.split("-")[0]: round(
            delta("egoline_stage_batch_makespan_ratio_sum", p)
            / max(1.0, delta("egoline_stage_batch_makespan_ratio_count", p)),
            3,
        )
        for p in after
        if delta("egoline_stage_batch_makespan_ratio_count", p) > 0
    }

    naive_dirs = sorted(dirs, key=_duration_s)[:naive_episodes]
    naive_video_s = sum(_duration_s(d) for d in naive_dirs)
    log(f"naive: full decode + re-encode of {len(naive_dirs)} episodes ({naive_video_s:.0f}s)")
    naive_s = naive_seconds(settings, [d / "video.mp4" for d in naive_dirs])
    hours = video_s / 3600
    per_week = hours / wall_s * WEEK_S
    naive_per_week = naive_video_s / 3600 / naive_s * WEEK_S
    serial_per_week = serial_video_s / 3600 / serial_s * WEEK_S
    cpu = {n: cpu_after[n] - cpu_before.get(n, 0.0) for n in cpu_after}
    per_stage: dict[str, float] = {}
    for name in stage_procs:  # the stages only: not the emulators, not the agent
        stage = name.rsplit("-", 1)[0]
        per_stage[stage] = per_stage.get(stage, 0.0) + cpu[name] / hours
    return {
        "episodes": len(dirs),
        "video_hours": round(hours, 3),
        "raw_gb": round(raw_bytes / 1e9, 3),
        "resolution": f"{size[0]}x{size[1]}",
        "wall_s": round(wall_s, 1),
        "episode_hours_per_week": round(per_week),
        "naive_episode_hours_per_week": round(naive_per_week),
        "speedup_vs_naive": round(per_week / naive_per_week, 1),
        "serial_episode_hours_per_week": round(serial_per_week),
        "speedup_vs_serial": round(per_week / serial_per_week, 2),
        "cpu_s_per_video_hour": round(sum(per_stage.values()), 2),
        "cpu_s_per_video_hour_by_stage": {k: round(v, 2) for k, v in sorted(per_stage.items())},
        "serial_cpu_s_per_video_hour": round(serial_cpu_s / (serial_video_s / 3600), 2),
        "io_floor_s": round(io_s, 1),
        "io_limit_ratio": round(io_s / wall_s, 3),
        "bytes_read_per_byte": round(bytes_read / raw_bytes, 3),
        "makespan_ratio": makespan,
        "cpu_s": {n: round(v, 1) for n, v in cpu.items()},
        "naive_episodes": len(naive_dirs),
        "serial_episodes": len(serial_dirs),
        "serial_clips": serial_clips,
        "seed": seed,
        "stage_workers": settings.stage_workers,
        "cores": os.cpu_count(),
    }
