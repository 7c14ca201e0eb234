"""The `egoline` command. Thin: every command delegates to the package that owns the work."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from services.common.settings import Settings, get_settings

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

    from services.agent.runner import Agent
    from services.agent.runner import Progress as AgentProgress

app = typer.Typer(help="egoline: streaming ingestion for robotics video", no_args_is_help=True)
stack_app = typer.Typer(
    help="The embedded stack (Tansu, PostgreSQL, moto S3)", no_args_is_help=True
)
schemas_app = typer.Typer(help="Event schemas", no_args_is_help=True)
db_app = typer.Typer(help="The Postgres warehouse", no_args_is_help=True)
manifest_app = typer.Typer(help="Manifests: build, inspect", no_args_is_help=True)
agent_app = typer.Typer(help="The device upload agent", no_args_is_help=True)
cache_app = typer.Typer(help="The training node's clip cache", no_args_is_help=True)
gc_app = typer.Typer(help="Garbage collection in the object store", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
app.add_typer(schemas_app, name="schemas")
app.add_typer(db_app, name="db")
app.add_typer(manifest_app, name="manifest")
app.add_typer(agent_app, name="agent")
app.add_typer(cache_app, name="cache")
app.add_typer(gc_app, name="gc")

err = Console(stderr=True)


def print_json_line(payload: object) -> None:
    """The one JSON line every measuring command prints last."""
    sys.stdout.write(json.dumps(payload, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


# --- stack -------------------------------------------------------------------------------
@stack_app.command("up")
def stack_up() -> None:
    """Start what is not configured, wait until usable, create topics, bucket and tables."""
    from services.stack.provision import stack_up as bring_up

    report = bring_up(get_settings(), log=lambda line: err.print(f"[dim]stack:[/] {line}"))
    for name, h in report.items():
        err.print(f"[green]ok[/] {name:9} {h.endpoint}")


@stack_app.command("status")
def stack_status(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON line")] = False,
) -> None:
    """Probe each service with a real round trip."""
    from services.stack import health

    report = health.check(get_settings())
    status = {
        n: {"ok": h.ok, "endpoint": h.endpoint, "detail": h.detail} for n, h in report.items()
    }
    if not as_json:
        for name, h in report.items():
            mark = "[green]ok[/]" if h.ok else "[red]down[/]"
            err.print(f"{mark} {name:9} {h.endpoint or '-'} {h.detail}")
    print_json_line({"status": status})
    if not all(h.ok for h in report.values()):
        raise typer.Exit(1)


@stack_app.command("check-broker")
def stack_check_broker(
    groups: Annotated[bool, typer.Option(help="also the group-rejoin check (up to 30 s)")] = False,
) -> None:
    """Measure the broker's deviations from Apache Kafka (see docs/stack.md)."""
    from services.stack.broker_check import check_broker

    print_json_line(check_broker(get_settings(), groups=groups))


@stack_app.command("down")
def stack_down() -> None:
    """Stop only the processes `stack up` started."""
    from services.stack.launcher import Stack

    stopped = Stack(get_settings().stack_dir).down()
    err.print(f"stopped: {', '.join(stopped) or 'nothing'}")


# --- services ----------------------------------------------------------------------------
SERVE_STAGES = ("decode", "validate", "shard", "metadata", "lag")


@app.command("serve")
def serve(
    stage: Annotated[str, typer.Argument(help="decode | validate | shard | metadata | lag")],
    group: Annotated[
        list[str] | None,
        typer.Option(help="lag only: more consumer groups to watch besides the pipeline's"),
    ] = None,
) -> None:
    """Run one pipeline service (its own consumer group) until SIGTERM/SIGINT; it serves
    /metrics, /healthz and /readyz on EGOLINE_METRICS_PORT (docs/metrics.md)."""
    import asyncio
    import logging
    import random
    import time

    from faststream import FastStream

    from services.common.scheduling import start_delay_s

    if stage not in SERVE_STAGES:
        raise typer.BadParameter(f"unknown stage {stage!r}; one of {', '.join(SERVE_STAGES)}")
    if group and stage != "lag":
        raise typer.BadParameter("--group applies to `serve lag` only")
    from services.common.redact import install_log_redaction

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = get_settings()
    install_log_redaction(settings)
    if stage == "lag":
        import signal
        import threading

        from services.lag.app import serve_lag

        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        serve_lag(settings, settings.metrics_port or 9308, group or [], stop)
        return
    # Staggered start: a fleet restarted together doesn't stampede the broker and object store.
    time.sleep(start_delay_s(settings.start_jitter_s, random.Random()))
    apps = {
        "decode": "services.decode.app",
        "validate": "services.validate.app",
        "shard": "services.shard.app",
        "metadata": "services.metadata.app",
    }
    import importlib

    from services.common.health import Liveness
    from services.common.metrics import serve_stage_http

    liveness = Liveness()
    serve_stage_http(settings.metrics_port, settings.metrics_host, stage, liveness)
    stream_app: FastStream = importlib.import_module(apps[stage]).build_app(settings)

    async def run() -> None:
        heartbeat = asyncio.create_task(liveness.beat_forever())
        try:
            await stream_app.run()
        finally:
            heartbeat.cancel()

    asyncio.run(run())


# --- synthetic data and the agent ---------------------------------------------------------
@app.command("synth")
def synth(
    episodes: Annotated[int, typer.Option(min=1, help="how many episodes")] = 10,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("episodes"),
    seed: Annotated[int, typer.Option(help="same seed, same episodes")] = 0,
    min_s: Annotated[float, typer.Option(help="shortest duration, seconds")] = 4.0,
    max_s: Annotated[float, typer.Option(help="longest duration, seconds")] = 6.0,
    width: int = 320,
    height: int = 240,
    fps: int = 30,
    codecs: Annotated[
        str, typer.Option(help="comma list cycled over episodes: h264,h265,av1")
    ] = "h264",
    containers: Annotated[str, typer.Option(help="comma list: mp4,mkv")] = "mp4",
    depth: Annotated[bool, typer.Option(help="add a depth stream (multi-stream MKV)")] = False,
    defects: Annotated[str, typer.Option(help="comma list, one per leading episode")] = "",
    realistic: Annotated[
        bool,
        typer.Option(
            help="write the device-made matrix instead (encoder defaults, open GOP, VFR, 10-bit, "
            "audio, RGB-D, two cameras, cut files, IMU at its own rate): docs/formats.md"
        ),
    ] = False,
    cases: Annotated[str, typer.Option(help="with --realistic: comma list of case names")] = "",
) -> None:
    """Write deterministic synthetic episodes (video + IMU + episode.json)."""
    from rich.progress import track

    from services.synth.writer import Defect, plan_episodes, write_episode

    if realistic:
        from services.synth.realistic import realistic_cases, write_case

        chosen = [c for c in realistic_cases() if not cases or c.name in _csv(cases)]
        for case in track(chosen, description="synthesize", console=err):
            write_case(case, out, seed=seed)
        print_json_line(
            {"episodes": len(chosen), "out": str(out), "cases": [c.name for c in chosen]}
        )
        return

    specs = plan_episodes(
        episodes,
        seed=seed,
        duration_s=(min_s, max_s),
        fps=fps,
        width=width,
        height=height,
        codecs=tuple(codecs.split(",")),
        containers=tuple(containers.split(",")),
        depth=depth,
        defects=tuple(Defect(d) for d in defects.split(",") if d),
    )
    for spec in track(specs, description="synthesize", console=err):
        write_episode(spec, out)
    print_json_line({"episodes": len(specs), "out": str(out)})


def _agent_progress(progress: RichProgress) -> AgentProgress:
    """Wire the agent's callbacks to a rich progress display: one bar per file, one total."""
    from services.agent.runner import Progress

    total = progress.add_task("total", total=0)
    tasks: dict[str, TaskID] = {}

    def start(queue_id: str, size: int) -> None:
        tasks[queue_id] = progress.add_task(Path(queue_id).name[:28], total=size)
        progress.update(total, total=(progress.tasks[total].total or 0) + size)

    def advance(queue_id: str, n: int) -> None:
        progress.advance(tasks[queue_id], n)
        progress.advance(total, n)

    def done(queue_id: str, state: str, why: str | None) -> None:
        if why:
            err.print(f"[yellow]{state}[/] {Path(queue_id).name}: {why}")

    return Progress(start, advance, done)


def _transfer_progress() -> RichProgress:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    return Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
    )


def _agent(progress: AgentProgress) -> Agent:
    from services.agent.runner import make_agent
    from services.common.objectstore import object_store

    settings = get_settings()
    return make_agent(settings, object_store(settings), progress)


@agent_app.command("upload")
def agent_upload(
    paths: Annotated[list[Path], typer.Argument(help="episode folders, or folders of them")],
    publish_timeout_s: Annotated[float, typer.Option(help="wait this long for Kafka")] = 60.0,
) -> None:
    """Upload finished episodes and announce each on `episodes.uploaded` (one shot)."""
    from services.agent.recordings import find_ready

    dirs: list[Path] = []
    for path in paths:
        dirs += find_ready(path, "marker", 0, 0)
    with _transfer_progress() as bars:
        agent = _agent(_agent_progress(bars))
        counts = agent.run_once(dirs, publish_timeout_s)
    print_json_line({"queued": len(dirs), **counts, "parts_resent": agent.journal.parts_resent()})
    if counts.get("failed") or counts.get("retry") or counts.get("uploaded"):
        raise typer.Exit(1)


@agent_app.command("watch")
def agent_watch(directory: Annotated[Path, typer.Argument(help="where recordings appear")]) -> None:
    """Upload every finished recording that appears under DIR until SIGTERM/SIGINT."""
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with _transfer_progress() as bars:
        agent = _agent(_agent_progress(bars))
        agent.watch(directory, stop)
    print_json_line(agent.journal.counts())


@agent_app.command("status")
def agent_status(
    as_json: Annotated[bool, typer.Option("--json", help="print only the JSON line")] = False,
) -> None:
    """The agent's queue: pending, uploading, published, failed (with reasons)."""
    from rich.table import Table

    from services.agent.journal import Journal

    journal = Journal(get_settings().agent_state_dir / "journal.sqlite")
    rows = journal.episodes()
    if not as_json:
        table = Table(title="egoline agent")
        for column in ("episode folder", "state", "bytes", "reason"):
            table.add_column(column)
        for row in rows:
            table.add_row(
                Path(row.directory).name, row.state, str(row.bytes_total), row.reason or ""
            )
        Console(stderr=True).print(table)
    print_json_line(
        {
            "counts": journal.counts(),
            "parts_resent": journal.parts_resent(),
            "episodes": [
                {"folder": r.directory, "state": r.state, "reason": r.reason} for r in rows
            ],
        }
    )


# --- warehouse, schemas, manifests --------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the warehouse schema."""
    from services.metadata.warehouse import upgrade

    upgrade(get_settings())
    err.print("warehouse schema is current")


@gc_app.command("shards")
def gc_shards(
    apply: Annotated[bool, typer.Option("--apply", help="delete (default: dry run)")] = False,
    min_age_h: Annotated[
        float,
        typer.Option(
            "--min-age-h",
            min=0.0,
            help="keep unreferenced shards younger than this (their event may be in flight)",
        ),
    ] = 24.0,
    pipeline_version: Annotated[str | None, typer.Option(help="default: the configured")] = None,
) -> None:
    """Shards no warehouse clip points to (left by a shard stage killed mid-batch): list them,
    and with --apply delete their tar and index and the `shards` rows no clip points to."""
    from datetime import UTC, datetime, timedelta

    from services.common.objectstore import object_store
    from services.metadata.gc import collect_shards
    from services.metadata.warehouse import make_engine

    settings = get_settings()
    engine = make_engine(settings)
    try:
        result = collect_shards(
            engine,
            object_store(settings),
            pipeline_version or settings.pipeline_version,
            datetime.now(UTC),
            timedelta(hours=min_age_h),
            apply,
            log=err.print,
        )
    finally:
        engine.dispose()
    print_json_line(result)


@schemas_app.command("export")
def schemas_export() -> None:
    """Regenerate the committed JSON Schemas and the AsyncAPI document."""
    from schemas.compat import export
    from services.asyncapi import write_asyncapi

    for path in export():
        err.print(f"wrote {path}")
    err.print(f"wrote {write_asyncapi(Path('docs/asyncapi.json'))}")


def _csv(value: str) -> list[str]:
    return [v for v in value.split(",") if v]


@manifest_app.command("build")
def manifest_build(
    out: Annotated[Path, typer.Option(help="local directory for the file")] = Path(
        ".stack/manifests"
    ),
    devices: Annotated[str, typer.Option(help="comma list of device ids")] = "",
    splits: Annotated[str, typer.Option(help="comma list: train,eval")] = "",
    tags: Annotated[str, typer.Option(help="comma list: episodes carrying all of them")] = "",
    verdicts: Annotated[
        str, typer.Option(help="comma list of accept, accept_with_warnings, reject")
    ] = "accept,accept_with_warnings",
    since: Annotated[str | None, typer.Option(help="started at or after (ISO 8601)")] = None,
    until: Annotated[str | None, typer.Option(help="episodes started before (ISO 8601)")] = None,
    max_warnings: Annotated[int | None, typer.Option(help="min quality: <= N warnings")] = None,
    min_height: Annotated[int | None, typer.Option(help="min quality: at least N rows")] = None,
    streams: Annotated[
        str, typer.Option(help="comma list: episodes holding all these streams (depth,wrist,imu)")
    ] = "",
    max_jitter_s: Annotated[float | None, typer.Option(help="worst frame jitter, s")] = None,
    max_frame_gap_s: Annotated[float | None, typer.Option(help="largest frame gap, s")] = None,
    max_drift_ppm: Annotated[float | None, typer.Option(help="worst |frame rate drift|")] = None,
    max_camera_skew_s: Annotated[float | None, typer.Option(help="|camera start skew|, s")] = None,
    max_imu_skew_s: Annotated[float | None, typer.Option(help="|IMU start skew|, s")] = None,
    min_imu_rate_hz: Annotated[float | None, typer.Option(help="IMU rate at least, Hz")] = None,
    exclude_salvaged: Annotated[
        bool, typer.Option(help="leave out recordings cut mid-write")
    ] = False,
    pipeline_version: Annotated[str | None, typer.Option(help="default: configured")] = None,
    parallel: Annotated[int, typer.Option(min=1, help="parallel query slices")] = 2,
) -> None:
    """Build a manifest with one SQL query into an Arrow IPC file (stored under its hash)."""
    from datetime import datetime

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from services.common.objectstore import object_store
    from services.manifest.build import build_manifest
    from services.manifest.query import ManifestFilter
    from services.metadata.warehouse import make_engine

    settings = get_settings()
    flt = ManifestFilter(
        pipeline_version=pipeline_version or settings.pipeline_version,
        devices=_csv(devices),
        splits=_csv(splits),
        tags=_csv(tags),
        verdicts=_csv(verdicts),
        started_from=datetime.fromisoformat(since) if since else None,
        started_before=datetime.fromisoformat(until) if until else None,
        max_warnings=max_warnings,
        min_height=min_height,
        streams=_csv(streams),
        max_jitter_s=max_jitter_s,
        max_frame_gap_s=max_frame_gap_s,
        max_drift_ppm=max_drift_ppm,
        max_camera_skew_s=max_camera_skew_s,
        max_imu_skew_s=max_imu_skew_s,
        min_imu_rate_hz=min_imu_rate_hz,
        exclude_salvaged=exclude_salvaged,
    )
    engine = make_engine(settings)
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err
    ) as progress:
        task = progress.add_task("querying the warehouse", total=None)

        def show(episodes: int, clips: int) -> None:
            progress.update(task, description=f"{episodes:,} episodes, {clips:,} clips")

        built = build_manifest(
            settings.database_libpq_url,
            engine,
            object_store(settings),
            flt,
            out,
            progress=show,
            parallel=parallel,
        )
    engine.dispose()
    print_json_line(
        {
            "manifest": built.object_key,
            "manifest_id": built.manifest_id,
            "path": str(built.local_path),
            "rows": built.rows,
            "bytes": built.size_bytes,
            "build_s": round(built.query_s + built.explode_s + built.write_s, 4),
            "publish_s": round(built.publish_s, 4),
        }
    )


@manifest_app.command("inspect")
def manifest_inspect(path: Path, rows: int = 5) -> None:
    """Show a manifest's schema, metadata and first rows (memory-mapped, zero-copy)."""
    import time

    from services.manifest.load import load_manifest, manifest_metadata, manifest_rows

    started = time.perf_counter()
    table = load_manifest(path)
    load_s = time.perf_counter() - started
    meta = manifest_metadata(table)
    err.print(table.schema.remove_metadata())
    err.print(f"[bold]filter[/] {json.dumps(meta.get('filter'))}")
    err.print(f"[bold]query[/]\n{meta.get('query')}")
    for row in manifest_rows(table, 0, rows):
        err.print(row)
    print_json_line(
        {
            "rows": table.num_rows,
            "columns": table.column_names,
            "bytes": path.stat().st_size,
            "load_s": round(load_s, 4),
            "format_version": meta.get("version"),
            "filter": meta.get("filter"),
        }
    )


# --- the training node's clip cache -------------------------------------------------------
@cache_app.command("stats")
def cache_stats() -> None:
    """Entries and bytes in the node cache (`EGOLINE_READER_CACHE_DIR`) against its cap."""
    from dataclasses import asdict

    from services.common.localcache import LocalCache

    settings = get_settings()
    cache = LocalCache(settings.reader_cache_dir, settings.reader_cache_mb * 1024 * 1024, "clips")
    usage = cache.usage()
    err.print(
        f"{settings.reader_cache_dir}: {usage.entries} entries, "
        f"{usage.bytes / 2**20:.1f} of {usage.cap_bytes / 2**20:.0f} MiB"
    )
    print_json_line({"directory": str(settings.reader_cache_dir), **asdict(usage)})


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove every entry of the node cache (readers holding one open keep reading it)."""
    from services.common.localcache import LocalCache

    settings = get_settings()
    cache = LocalCache(settings.reader_cache_dir, settings.reader_cache_mb * 1024 * 1024, "clips")
    print_json_line({"directory": str(settings.reader_cache_dir), "removed": cache.clear()})


@cache_app.command("warm")
def cache_warm(
    manifest: Annotated[str, typer.Argument(help="manifest file, or its manifests/... key")],
    epoch: Annotated[int, typer.Option(help="warm in this epoch's read order")] = 0,
    seed: int = 0,
    part: Annotated[int, typer.Option(help="only this reader's share (rank-major part)")] = 0,
    parts: Annotated[int, typer.Option(min=1, help="how many readers share the epoch")] = 1,
) -> None:
    """Fetch a manifest's clips (or one reader's share) into the node cache, in read order."""
    from rich.progress import track

    from services.reader.clips import clip_span
    from services.reader.loader import open_reader

    reader = open_reader(manifest, seed=seed, prefetch=0)
    rows = reader.order(epoch, 0, part, parts)
    for index in track(rows, description="warm", console=err):
        reader.cache.ensure(clip_span(reader.row(int(index))))
    print_json_line({"clips": len(rows), **reader.stats()})


@app.command("lineage")
def lineage_cmd(
    manifest: Annotated[
        str | None, typer.Argument(help="manifest file, or its id / object key in the store")
    ] = None,
    row: Annotated[int | None, typer.Option(help="row number in the manifest")] = None,
    episode: Annotated[str | None, typer.Option(help="an episode id instead of a row")] = None,
    pipeline_version: Annotated[str | None, typer.Option(help="default: configured")] = None,
) -> None:
    """Where a manifest row (or an episode's clips) came from: raw object and sha256, device,
    session, pipeline version, verdict, shard and byte range."""
    from rich.table import Table

    from services.common.objectstore import object_store
    from services.manifest.lineage import lineage, mismatches
    from services.manifest.load import load_manifest, manifest_row
    from services.metadata.warehouse import make_engine

    settings = get_settings()
    wanted: dict[str, Any] | None = None
    if manifest is not None:
        if row is None:
            raise typer.BadParameter("give --row with a manifest")
        path = Path(manifest)
        if not path.exists():
            key = manifest if manifest.startswith("manifests/") else f"manifests/{manifest}"
            key = key if key.endswith(".arrow") else f"{key}.arrow"
            path = settings.stack_dir / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(object_store(settings).get_bytes(key))
        wanted = manifest_row(load_manifest(path), row)
        episode_id, version = str(wanted["episode_id"]), str(wanted["pipeline_version"])
        clip_index: int | None = int(wanted["clip_index"])
    elif episode is not None:
        episode_id, clip_index = episode, None
        version = pipeline_version or settings.pipeline_version
    else:
        raise typer.BadParameter("give a manifest and --row, or --episode")
    engine = make_engine(settings)
    found = lineage(engine, episode_id, version, clip_index)
    engine.dispose()
    if not found:
        err.print(f"[red]no clips of {episode_id} ({version}) in the warehouse[/]")
        raise typer.Exit(1)
    for entry in found:
        table = Table(show_header=False, title=str(entry["clip_key"]))
        for name, value in entry.items():
            table.add_row(name, str(value))
        err.print(table)
    diff = mismatches(wanted, found[0]) if wanted is not None else []
    if diff:
        err.print(f"[red]the manifest row disagrees with the warehouse on: {', '.join(diff)}[/]")
    print_json_line(
        {"lineage": json.loads(json.dumps(found, default=str)), "manifest_mismatches": diff}
    )
    if diff:
        raise typer.Exit(2)


# --- lag ---------------------------------------------------------------------------------
@app.command("lag")
def lag(
    group: Annotated[
        list[str] | None, typer.Option(help="more groups besides the pipeline's")
    ] = None,
    samples: Annotated[int, typer.Option(min=1, help="readings to take")] = 3,
    interval_s: Annotated[float, typer.Option(help="seconds between readings")] = 2.0,
    watch: Annotated[bool, typer.Option(help="keep reading and redrawing until Ctrl-C")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """Consumer lag per group and partition, in messages and seconds, with Burrow's status."""
    import time

    from rich.live import Live
    from rich.table import Table

    from services.lag.collector import OffsetReader
    from services.lag.monitor import PIPELINE_GROUPS, LagMonitor

    def render(report: dict[str, object]) -> Table:
        table = Table(title="egoline lag")
        for column in ("group", "topic", "partition", "committed", "end", "lag", "lag s", "status"):
            table.add_column(column)
        for name, entry in report.items():
            assert isinstance(entry, dict)
            for p in entry["partitions"]:
                table.add_row(
                    name,
                    p["topic"],
                    str(p["partition"]),
                    str(p["committed"]),
                    str(p["end"]),
                    str(p["lag"]),
                    str(p["lag_seconds"]),
                    p["status"],
                )
            table.add_row(name, "", "", "", "", str(entry["total_lag"]), "", entry["status"])
        return table

    reader = OffsetReader(get_settings())
    monitor = LagMonitor()
    groups = [*PIPELINE_GROUPS, *(group or [])]
    report: dict[str, object] = {}
    try:
        with Live(console=err, auto_refresh=False, transient=as_json) as live:
            taken = 0
            while watch or taken < samples:
                monitor.observe(reader.read(groups))
                taken += 1
                report = monitor.report(time.time())
                live.update(render(report), refresh=True)
                if watch or taken < samples:
                    time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
    print_json_line({"groups": report})


# --- benchmarks ---------------------------------------------------------------------------
bench_app = typer.Typer(help="Benchmarks: each prints one JSON line last", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _run_bench(
    run: Callable[[Settings, Callable[[str], None]], dict[str, Any]],
) -> dict[str, Any]:
    """Start (or reuse) the embedded stack, run a benchmark with progress on stderr, and print
    its JSON line last on stdout (so `--json` needs no special case)."""
    from services.common.settings import reset_settings_cache
    from services.stack.provision import stack_up as bring_up

    bring_up(get_settings(), log=lambda line: err.print(f"[dim]stack:[/] {line}"))
    reset_settings_cache()
    result = run(get_settings(), lambda line: err.print(f"[dim]bench:[/] {line}"))
    print_json_line(result)
    return result


@bench_app.command("upload")
def bench_upload(
    mb: Annotated[int, typer.Option(min=16, help="file size in MiB")] = 512,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """Agent upload throughput against a plain fput_object of the same file, and kill -9 resume."""
    from services.bench.upload import bench_upload as run

    del as_json  # the JSON line is always last on stdout; progress goes to stderr
    print_json_line(run(get_settings(), mb, log=lambda line: err.print(f"[dim]bench:[/] {line}")))


@bench_app.command("cache")
def bench_cache(
    mb: Annotated[int, typer.Option(min=16, help="MiB of clips to read cold and warm")] = 2048,
    shard_mb: Annotated[
        int, typer.Option(min=1, help="shard size (moto copies a whole object per ranged GET)")
    ] = 64,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """The clip reader cold (ranged GETs from S3) vs warm (node cache) vs plain disk reads."""
    from services.bench.cache import bench_cache as run

    del as_json
    _run_bench(lambda settings, log: run(settings, mb, shard_mb, log=log, console=err))


@bench_app.command("ingest")
def bench_ingest(
    episodes: Annotated[int, typer.Option(min=1)] = 200,
    naive_episodes: Annotated[int, typer.Option(min=1, help="episodes for the naive run")] = 2,
    serial_episodes: Annotated[
        int, typer.Option(min=1, help="extra episodes for the serial baseline")
    ] = 24,
    seed: Annotated[int, typer.Option(help="-1: fresh episode ids each run")] = -1,
    min_s: float = 30.0,
    max_s: float = 120.0,
    width: int = 1280,
    height: int = 720,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """Ingest throughput, every stage a process, vs the object store's floor, a serial
    baseline (one process, one episode after another, same work) and a naive transcode."""
    from services.bench.ingest import bench_ingest as run

    del as_json
    _run_bench(
        lambda settings, log: run(
            settings,
            episodes,
            naive_episodes,
            serial_episodes,
            seed,
            (min_s, max_s),
            (width, height),
            log=log,
        )
    )


@bench_app.command("manifest")
def bench_manifest(
    rows: Annotated[int, typer.Option(min=1000, help="clip rows to seed")] = 10_000_000,
    naive_rows: Annotated[int, typer.Option(min=256, help="rows for the naive walk")] = 5120,
    keep: Annotated[bool, typer.Option(help="keep the seeded database")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """Manifest build and load over N seeded clip rows, vs a file-by-file walk of shard indexes."""
    from services.bench.manifest import bench_manifest as run

    del as_json
    _run_bench(lambda settings, log: run(settings, rows, naive_rows, keep, log=log))


@bench_app.command("formats")
def bench_formats(
    seed: Annotated[int, typer.Option(help="-1: fresh episode ids each run")] = -1,
    timeout_s: Annotated[float, typer.Option(help="give up waiting after this long")] = 900.0,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """Every format a device writes (and a hostile set) through the real stack: frames, streams
    and IMU samples in (a full decode of the raw) vs out (every clip member read back by byte
    range). Exit 1 unless nothing was lost, falsely refused or wrongly let in."""
    from services.bench.formats import bench_formats as run

    del as_json
    result = _run_bench(lambda settings, log: run(settings, seed, timeout_s, log=log))
    bad = ("false_rejects", "frames_lost", "streams_lost", "imu_samples_lost", "hostile_accepted")
    if any(result[k] for k in bad):
        raise typer.Exit(1)


@bench_app.command("chaos")
def bench_chaos(
    episodes: Annotated[int, typer.Option(min=2)] = 200,
    kills: Annotated[int, typer.Option(min=0, help="SIGKILLs of random stage processes")] = 10,
    seed: Annotated[int, typer.Option(help="-1: fresh episode ids each run")] = -1,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """The pipeline under SIGKILLs, a broker pause and a Postgres restart, checked against the
    ground truth: `lost`, `duplicates` (clips stored in more than one shard after `gc shards`),
    `unreferenced_shards` (after gc) and `unreadable_rows` must be 0 (exit 1 otherwise)."""
    from services.bench.chaos import bench_chaos as run

    del as_json
    result = _run_bench(lambda settings, log: run(settings, episodes, kills, seed, log=log))
    if any(result[k] for k in ("lost", "duplicates", "unreferenced_shards", "unreadable_rows")):
        raise typer.Exit(1)


# --- the demo -----------------------------------------------------------------------------
@app.command("demo")
def demo(
    episodes: Annotated[int, typer.Option(min=1)] = 20,
    seed: int = 0,
    timeout_s: Annotated[float, typer.Option(help="give up waiting after this long")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="print only the JSON line")] = False,
) -> None:
    """Bring up the stack, synthesize episodes, run every service, upload, catalog, manifest."""
    from dataclasses import asdict

    from rich.table import Table

    from services.common.settings import reset_settings_cache
    from services.demo.run import run_demo
    from services.stack.provision import stack_up as bring_up

    base = get_settings()
    bring_up(base, log=lambda line: err.print(f"[dim]stack:[/] {line}"))
    reset_settings_cache()
    settings = get_settings()
    result = run_demo(settings, episodes, seed, settings.stack_dir / "demo", timeout_s)
    if not as_json:
        table = Table(title="egoline demo")
        table.add_column("what")
        table.add_column("value", justify="right")
        for key, value in asdict(result).items():
            table.add_row(key, str(value))
        Console().print(table)
        err.print("the stack keeps running for inspection; `egoline stack down` stops it")
    print_json_line(asdict(result))
    if result.cataloged != result.episodes:
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
