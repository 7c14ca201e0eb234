"""`egoline manifest ...` and `egoline lineage`: build and inspect manifests, and trace a
manifest row (or an episode's clips) back to the raw object that made it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from services.common.output import err, print_json_line
from services.common.settings import get_settings

app = typer.Typer()
manifest_app = typer.Typer(
    help="Manifests: build, inspect, index, diff, check", no_args_is_help=True
)
app.add_typer(manifest_app, name="manifest")
runs_app = typer.Typer(help="Training runs and the manifests they read", no_args_is_help=True)
app.add_typer(runs_app, name="runs")


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
    min_sharpness: Annotated[
        float | None, typer.Option(help="every clip at least this sharp (variance of Laplacian)")
    ] = None,
    max_frozen_fraction: Annotated[
        float | None, typer.Option(min=0, max=1, help="every clip frozen at most this share")
    ] = None,
    exposure_ok: Annotated[
        bool, typer.Option(help="every clip within the EGOLINE_CURATION_* exposure bounds")
    ] = False,
    min_motion: Annotated[
        float | None,
        typer.Option(help="every clip's gyro RMS at least this, rad/s (clips without IMU: out)"),
    ] = None,
    exclude_duplicates: Annotated[
        bool, typer.Option(help="leave out exact and near duplicates of earlier episodes")
    ] = False,
    layer: Annotated[
        list[str] | None,
        typer.Option(
            help="pin a layer: KIND=VERSION or KIND=latest (resolved now, recorded), repeatable"
        ),
    ] = None,
    label_contains: Annotated[
        list[str] | None,
        typer.Option(
            help="episodes with a label containing this text (case-insensitive), repeatable; "
            "pins labels=latest unless --layer labels=V"
        ),
    ] = None,
    pipeline_version: Annotated[str | None, typer.Option(help="default: configured")] = None,
    parallel: Annotated[int, typer.Option(min=1, help="parallel query slices")] = 2,
    family: Annotated[
        str | None,
        typer.Option(help="the dataset this manifest is a version of (`manifest check`)"),
    ] = None,
    index: Annotated[
        bool,
        typer.Option(help="record its members for --used-by now (else: `manifest index` later)"),
    ] = True,
) -> None:
    """Build a manifest with one SQL query into an Arrow IPC file (stored under its hash),
    recorded in the warehouse with its members (reverse lineage: `lineage --used-by`).
    Quality filters keep an episode when every clip passes; a clip lacking the value (older
    shards, no IMU for --min-motion) fails them. Pinned layers are joined in the same query."""
    from datetime import datetime

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from services.common.objectstore import object_store
    from services.manifest.build import build_manifest
    from services.manifest.index import FamilyConflictError
    from services.manifest.query import ExposureBounds, ManifestFilter
    from services.metadata.layers import LayerVersionError, parse_layer_option
    from services.metadata.warehouse import make_engine

    settings = get_settings()
    try:
        layers = parse_layer_option(layer or [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if label_contains:
        layers.setdefault("labels", "latest")
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
        min_sharpness=min_sharpness,
        max_frozen_fraction=max_frozen_fraction,
        exposure_ok=ExposureBounds.of(settings.curation) if exposure_ok else None,
        min_motion=min_motion,
        exclude_duplicates=exclude_duplicates,
        layers=layers,
        label_contains=list(label_contains or []),
    )
    engine = make_engine(settings)
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err
    ) as progress:
        task = progress.add_task("querying the warehouse", total=None)

        def show(episodes: int, clips: int) -> None:
            progress.update(task, description=f"{episodes:,} episodes, {clips:,} clips")

        try:
            built = build_manifest(
                settings.database_libpq_url,
                engine,
                object_store(settings),
                flt,
                out,
                progress=show,
                parallel=parallel,
                family=family,
                index=index,
            )
        except (LayerVersionError, FamilyConflictError) as exc:  # family: recorded, in its old one
            engine.dispose()
            err.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from exc
    engine.dispose()
    indexed = built.indexed
    print_json_line(
        {
            "manifest": built.object_key,
            "manifest_id": built.manifest_id,
            "path": str(built.local_path),
            "rows": built.rows,
            "bytes": built.size_bytes,
            "build_s": round(built.query_s + built.explode_s + built.write_s, 4),
            "publish_s": round(built.publish_s, 4),
            "layers": built.layers,
            "index_s": round(built.index_s, 4),
            "indexed_episodes": indexed.episodes if indexed else None,
            "family": family,
        }
    )


@manifest_app.command("index")
def manifest_index(
    manifest: Annotated[
        str | None, typer.Argument(help="manifest file, or its id / object key in the store")
    ] = None,
    family: Annotated[str | None, typer.Option(help="put it in this family")] = None,
    every: Annotated[
        bool, typer.Option("--all", help="every manifest of the warehouse not indexed yet")
    ] = False,
) -> None:
    """Record a manifest's members from its file (manifests built before the reverse-lineage
    index, or elsewhere): idempotent; a file the warehouse does not know is recorded too."""
    from services.common.objectstore import object_store
    from services.manifest.index import (
        FamilyConflictError,
        index_manifest_file,
        local_manifest,
        unindexed_manifests,
    )
    from services.metadata.warehouse import make_engine

    if (manifest is None) == (not every):
        raise typer.BadParameter("give a manifest, or --all")
    settings = get_settings()
    engine, store = make_engine(settings), object_store(settings)
    directory = settings.stack_dir / "manifests"
    refs = [manifest] if manifest is not None else []
    if every:
        refs = [str(row["object_key"]) for row in unindexed_manifests(engine)]
    done = []
    try:
        for ref in refs:
            path = local_manifest(ref, store, directory)
            try:
                manifest_id, indexed = index_manifest_file(
                    settings.database_libpq_url, engine, store, path, family
                )
            except FamilyConflictError as exc:
                err.print(f"[red]{exc}[/]")
                raise typer.Exit(2) from exc
            err.print(
                f"{manifest_id}: {indexed.episodes:,} episodes, {indexed.clips:,} clips"
                + ("" if indexed.new else " (indexed before)")
            )
            done.append(
                {
                    "manifest_id": manifest_id,
                    "episodes": indexed.episodes,
                    "clips": indexed.clips,
                    "new": indexed.new,
                }
            )
    finally:
        engine.dispose()
    print_json_line({"indexed": done, "family": family})


@manifest_app.command("diff")
def manifest_diff(
    a: Annotated[str, typer.Argument(help="the older manifest: file, id or object key")],
    b: Annotated[str, typer.Argument(help="the newer manifest: file, id or object key")],
    limit: Annotated[int, typer.Option(help="ids listed per kind of change (-1: all)")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """What B changes against A: episodes and clips added and removed, episodes whose clips
    or split changed, layer versions changed, split counts (memory-mapped files, no SQL)."""
    from rich.table import Table

    from services.common.objectstore import object_store
    from services.manifest.diff import diff_manifests
    from services.manifest.index import local_manifest, manifest_id_of
    from services.manifest.load import load_manifest

    del as_json  # the JSON line is always last on stdout; the table goes to stderr
    settings = get_settings()
    store = object_store(settings)
    directory = settings.stack_dir / "manifests"
    path_a, path_b = (local_manifest(ref, store, directory) for ref in (a, b))
    diff = diff_manifests(load_manifest(path_a), load_manifest(path_b))
    summary = diff.summary(None if limit < 0 else limit)
    table = Table(title="manifest diff (B against A)")
    for column in ("", "A", "B", "added", "removed"):
        table.add_column(column, justify="right" if column else "left")
    table.add_row(
        "episodes",
        f"{diff.episodes_a:,}",
        f"{diff.episodes_b:,}",
        f"{len(diff.episodes_added):,}",
        f"{len(diff.episodes_removed):,}",
    )
    table.add_row(
        "clips",
        f"{diff.clips_a:,}",
        f"{diff.clips_b:,}",
        f"{diff.clips_added:,}",
        f"{diff.clips_removed:,}",
    )
    for name, counts in diff.splits.items():
        table.add_row(
            f"{name} episodes", f"{counts.episodes_a:,}", f"{counts.episodes_b:,}", "", ""
        )
        table.add_row(f"{name} clips", f"{counts.clips_a:,}", f"{counts.clips_b:,}", "", "")
    for kind, (old, new) in diff.layers_changed.items():
        table.add_row(f"layer {kind}", old or "-", new or "-", "", "")
    err.print(table)
    if diff.episodes_changed:
        err.print(f"episodes with other clips: {len(diff.episodes_changed):,}")
    if diff.episodes_moved_split:
        err.print(f"[red]episodes under another split: {len(diff.episodes_moved_split):,}[/]")
    print_json_line({"a": manifest_id_of(path_a), "b": manifest_id_of(path_b), **summary})


@manifest_app.command("check")
def manifest_check(
    manifest: Annotated[str, typer.Argument(help="manifest file, id or object key")],
    key: Annotated[
        str | None,
        typer.Option(help="grouping key: session or device (default: EGOLINE_SPLIT_KEY)"),
    ] = None,
    limit: Annotated[int, typer.Option(help="offenders listed in the JSON (-1: all)")] = 20,
) -> None:
    """Held-out integrity against the manifest's family: no group (session or device) of an
    eval split in a train split of any manifest of the family, and the eval set only grows.
    Exit code 1 on a violation, with the offending groups listed."""
    from dataclasses import asdict

    from rich.table import Table

    from services.manifest.check import NotIndexedError, check_heldout
    from services.manifest.index import resolve_manifest_id
    from services.metadata.warehouse import make_engine

    settings = get_settings()
    if (key or settings.split_key) not in ("session", "device"):
        raise typer.BadParameter("--key is session or device")
    grouping: Literal["session", "device"] = (
        "device" if (key or settings.split_key) == "device" else "session"
    )
    engine = make_engine(settings)
    try:
        report = check_heldout(engine, resolve_manifest_id(manifest), grouping)
    except (NotIndexedError, ValueError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc
    finally:
        engine.dispose()
    if report.family is None:
        err.print("[yellow]not in a family: checked against itself only[/]")
    cut = None if limit < 0 else limit
    if report.leaks:
        table = Table(title=f"{grouping}s in eval and in train")
        for column in (grouping, "eval in", "train in"):
            table.add_column(column)
        for leak in report.leaks[:cut]:
            table.add_row(leak.group, "\n".join(leak.eval_in), "\n".join(leak.train_in))
        err.print(table)
    if report.dropped_eval:
        table = Table(title="eval episodes of earlier manifests missing from this eval split")
        for column in ("episode", grouping, "eval in"):
            table.add_column(column)
        for dropped in report.dropped_eval[:cut]:
            table.add_row(dropped.episode_id, dropped.group, "\n".join(dropped.eval_in))
        err.print(table)
    err.print("[green]held-out integrity holds[/]" if report.ok else "[red]violations[/]")
    print_json_line(
        {
            "manifest_id": report.manifest_id,
            "family": report.family,
            "key": report.key,
            "ok": report.ok,
            "family_manifests": len(report.family_manifests),
            "earlier_manifests": len(report.earlier_manifests),
            "leaks": len(report.leaks),
            "leaked_groups": [asdict(leak) for leak in report.leaks[:cut]],
            "eval_dropped": len(report.dropped_eval),
            "dropped_sessions": sorted({d.group for d in report.dropped_eval})[:cut],
            "dropped_episodes": [asdict(d) for d in report.dropped_eval[:cut]],
        }
    )
    if not report.ok:
        raise typer.Exit(1)


@runs_app.command("register")
def runs_register(
    manifest: Annotated[str, typer.Option(help="manifest file, id or object key")],
    run: Annotated[str, typer.Option(help="the training run's name")],
    note: Annotated[str, typer.Option(help="free text kept with the run")] = "",
) -> None:
    """Record that a training run reads a manifest (idempotent: the first one is kept)."""
    from services.manifest.index import resolve_manifest_id
    from services.manifest.runs import UnknownManifestError, register_run
    from services.metadata.warehouse import make_engine

    engine = make_engine(get_settings())
    try:
        manifest_id = resolve_manifest_id(manifest)
        new = register_run(engine, run, manifest_id, note)
    except (UnknownManifestError, ValueError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc
    finally:
        engine.dispose()
    print_json_line({"run": run, "manifest_id": manifest_id, "new": new})


@runs_app.command("list")
def runs_list(
    run: Annotated[str | None, typer.Option(help="only this run")] = None,
) -> None:
    """Every registered run and the manifests it reads, oldest first."""
    from dataclasses import asdict

    from rich.table import Table

    from services.manifest.runs import list_runs
    from services.metadata.warehouse import make_engine

    engine = make_engine(get_settings())
    try:
        runs = list_runs(engine, run)
    finally:
        engine.dispose()
    table = Table(title="training runs")
    for column in ("run", "manifest", "registered", "host", "user", "note"):
        table.add_column(column)
    for entry in runs:
        table.add_row(
            entry.run_name,
            entry.manifest_id[:16],
            entry.registered_at.isoformat(timespec="seconds"),
            entry.host,
            entry.username,
            entry.note,
        )
    err.print(table)
    print_json_line({"runs": json.loads(json.dumps([asdict(r) for r in runs], default=str))})


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
            "layers": meta.get("layers", {}),
            **quality_summary(table),
        }
    )


def quality_summary(table: Any) -> dict[str, Any]:
    """Per quality column its min, max and unknown (null) count; the rows that duplicate an
    earlier episode and the episodes they name (absent from manifests before version 4)."""
    import pyarrow.compute as pc

    from services.manifest.explode import QUALITY_FIELDS

    quality: dict[str, Any] = {}
    for name in QUALITY_FIELDS:
        if name in table.column_names:
            column = table.column(name)
            bounds = pc.min_max(column).as_py()
            quality[name] = {**bounds, "nulls": column.null_count}
    if "duplicate_of" not in table.column_names:
        return {"quality": quality}
    duplicate = table.column("duplicate_of")
    named = sorted({str(v) for v in pc.unique(duplicate.drop_null().cast("string")).to_pylist()})
    return {
        "quality": quality,
        "duplicate_rows": table.num_rows - duplicate.null_count,
        "duplicates_of": named,
    }


@app.command("lineage")
def lineage_cmd(
    manifest: Annotated[
        str | None, typer.Argument(help="manifest file, or its id / object key in the store")
    ] = None,
    row: Annotated[int | None, typer.Option(help="row number in the manifest")] = None,
    episode: Annotated[str | None, typer.Option(help="an episode id instead of a row")] = None,
    pipeline_version: Annotated[str | None, typer.Option(help="default: configured")] = None,
    used_by: Annotated[
        bool,
        typer.Option(help="with --episode: the manifests holding it and the runs that read them"),
    ] = False,
) -> None:
    """Where a manifest row (or an episode's clips) came from: raw object and sha256, device,
    session, pipeline version, verdict, shard and byte range. With --used-by, the other way:
    every manifest holding the episode (its clips, split, layer versions) and the runs."""
    from rich.table import Table

    if used_by:
        if episode is None or manifest is not None:
            raise typer.BadParameter("--used-by goes with --episode")
        show_used_by(episode)
        return

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


def show_used_by(episode_id: str) -> None:
    """`lineage --episode ID --used-by`: a table per manifest and run, one JSON line last."""
    import time
    from dataclasses import asdict

    from rich.table import Table

    from services.manifest.runs import used_by
    from services.metadata.warehouse import make_engine

    engine = make_engine(get_settings())
    try:
        started = time.perf_counter()
        uses, runs = used_by(engine, episode_id)
        lookup_ms = (time.perf_counter() - started) * 1000
    finally:
        engine.dispose()
    table = Table(title=f"manifests holding {episode_id}")
    for column in ("manifest", "created", "family", "split", "clips", "layers", "runs"):
        table.add_column(column)
    for use in uses:
        table.add_row(
            use.manifest_id[:16],
            use.created_at.isoformat(timespec="seconds"),
            use.family or "",
            use.split,
            ",".join(str(i) for i in use.clip_indexes),
            ", ".join(f"{k}={v}" for k, v in use.layer_versions.items()),
            ", ".join(use.runs),
        )
    err.print(table)
    if not uses:
        err.print(
            f"no indexed manifest holds {episode_id} (manifests built before the index: "
            "`egoline manifest index --all`)"
        )
    print_json_line(
        {
            "episode_id": episode_id,
            "manifests": json.loads(json.dumps([asdict(u) for u in uses], default=str)),
            "runs": json.loads(json.dumps([asdict(r) for r in runs], default=str)),
            "lookup_ms": round(lookup_ms, 2),
        }
    )
