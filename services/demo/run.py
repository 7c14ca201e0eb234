"""`egoline demo`: the main job on the embedded stack, end to end, with a summary."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import Engine, func, select

from services.agent.runner import Progress as AgentProgress
from services.agent.runner import make_agent
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.manifest.build import build_manifest
from services.manifest.load import load_manifest, manifest_row
from services.manifest.query import ManifestFilter
from services.media.av_io import decode_frames
from services.metadata.core import TERMINAL
from services.metadata.warehouse import clips, episodes, make_engine
from services.reader.clips import read_clip
from services.stack.fleet import running_fleet
from services.synth.writer import plan_episodes, write_episode


@dataclass
class DemoResult:
    episodes: int
    cataloged: int
    clips: int
    shards: int
    manifest: str
    manifest_rows: int
    clip_frames_read_back: int
    wall_s: float


def count_cataloged(engine: Engine, episode_ids: list[str]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(episodes)
                .where(episodes.c.episode_id.in_(episode_ids), episodes.c.status.in_(TERMINAL))
            ).scalar_one()
        )


def wait_until_cataloged(
    engine: Engine,
    episode_ids: list[str],
    timeout_s: float,
    on_progress: Callable[[int], None],
    check_alive: Callable[[], None],
) -> int:
    """Poll the warehouse until every episode reached a terminal status, or the deadline."""
    deadline = time.monotonic() + timeout_s
    done = 0
    while time.monotonic() < deadline:
        done = count_cataloged(engine, episode_ids)
        on_progress(done)
        if done >= len(episode_ids):
            break
        check_alive()
        time.sleep(0.5)
    return done


def run_demo(
    settings: Settings, count: int, seed: int, work_dir: Path, timeout_s: float
) -> DemoResult:
    started = time.monotonic()
    episodes_dir = work_dir / "episodes"
    specs = plan_episodes(
        count,
        seed=seed,
        duration_s=(12.0, 24.0),
        codecs=("h264", "h265"),
        containers=("mp4", "mkv"),
    )
    progress = Progress(
        TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )
    store = object_store(settings)
    engine = make_engine(settings)
    with progress, running_fleet(work_dir / "logs") as fleet:
        synth = progress.add_task("synthesize", total=count)
        for spec in specs:
            write_episode(spec, episodes_dir)
            progress.advance(synth)
        upload = progress.add_task("upload", total=count)
        # A fresh journal per demo: the embedded stack may be new, and a journal that remembers
        # publishing to a previous broker would skip the upload.
        shutil.rmtree(work_dir / "agent", ignore_errors=True)
        agent = make_agent(
            settings.for_agent(work_dir / "agent"),
            store,
            AgentProgress(
                on_episode_done=lambda _q, state, _why: (
                    progress.advance(upload) if state == "published" else None
                )
            ),
        )
        counts = agent.run_once([episodes_dir / s.episode_id for s in specs], 60.0)
        if counts.get("published", 0) != count:
            raise RuntimeError(f"agent did not publish every episode: {counts}")
        catalog = progress.add_task("cataloged", total=count)

        def alive() -> None:
            if dead := fleet.dead():
                raise RuntimeError(f"services exited: {dead}; see {work_dir / 'logs'}")

        cataloged = wait_until_cataloged(
            engine,
            [s.episode_id for s in specs],
            timeout_s,
            lambda n: progress.update(catalog, completed=n),
            alive,
        )
    ids = [s.episode_id for s in specs]
    with engine.connect() as conn:
        clip_count = int(
            conn.execute(
                select(func.count()).select_from(clips).where(clips.c.episode_id.in_(ids))
            ).scalar_one()
        )
        shard_count = int(
            conn.execute(
                select(func.count(func.distinct(clips.c.shard_key))).where(
                    clips.c.episode_id.in_(ids)
                )
            ).scalar_one()
        )
    built = build_manifest(
        settings.database_libpq_url,
        engine,
        store,
        ManifestFilter(pipeline_version=settings.pipeline_version),
        work_dir / "manifests",
    )
    table = load_manifest(built.local_path)
    frames = 0
    if table.num_rows:
        clip = read_clip(store, manifest_row(table, 0))
        frames = sum(1 for _ in decode_frames(clip.mp4))
    engine.dispose()
    return DemoResult(
        episodes=count,
        cataloged=cataloged,
        clips=clip_count,
        shards=shard_count,
        manifest=built.object_key,
        manifest_rows=built.rows,
        clip_frames_read_back=frames,
        wall_s=round(time.monotonic() - started, 2),
    )
