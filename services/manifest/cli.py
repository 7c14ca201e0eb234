"""`egoline manifest ...` and `egoline lineage`: build and inspect manifests, and trace a
manifest row (or an episode's clips) back to the raw object that made it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from services.common.output import err, print_json_line
from services.common.settings import get_settings

app = typer.Typer()
manifest_app = typer.Typer(help="Manifests: build, inspect", no_args_is_help=True)
app.add_typer(manifest_app, name="manifest")


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
) -> None:
    """Build a manifest with one SQL query into an Arrow IPC file (stored under its hash).
    Quality filters keep an episode when every clip passes; a clip lacking the value (older
    shards, no IMU for --min-motion) fails them. Pinned layers are joined in the same query."""
    from datetime import datetime

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from services.common.objectstore import object_store
    from services.manifest.build import build_manifest
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
            )
        except LayerVersionError as exc:
            engine.dispose()
            err.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from exc
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
            "layers": built.layers,
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
