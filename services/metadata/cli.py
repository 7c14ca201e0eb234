"""`egoline db ...` and `egoline gc ...`: the warehouse schema, and shards no clip points to."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from services.common.output import err, print_json_line
from services.common.settings import get_settings

if TYPE_CHECKING:
    from schemas.layers import LayerKind

app = typer.Typer()
db_app = typer.Typer(help="The Postgres warehouse", no_args_is_help=True)
gc_app = typer.Typer(help="Garbage collection in the object store", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(gc_app, name="gc")
layer_app = typer.Typer(
    help="Layers: versioned calibration and labels attached to episodes", no_args_is_help=True
)
app.add_typer(layer_app, name="layer")
# One Kafka message carries a whole version; larger versions go through `layer ingest`.
MAX_EVENT_BYTES = 900_000


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the warehouse schema."""
    from services.metadata.warehouse import upgrade

    upgrade(
        get_settings(),
        progress=lambda done: err.print(f"manifest_episodes: {done:,} episodes recomputed"),
    )
    err.print("warehouse schema is current")


@app.command("backfill")
def backfill(
    pipeline_version: Annotated[str, typer.Option(help="the new version to derive under")],
    episode: Annotated[
        list[str] | None, typer.Option(help="these episodes only (default: every one)")
    ] = None,
    from_version: Annotated[
        str | None, typer.Option(help="only episodes already derived under this version")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="count, publish nothing")] = False,
) -> None:
    """Recompute signals, clips and shards of ingested episodes under a new pipeline version:
    re-announce them on episodes.uploaded (no re-upload). The old version's values stay."""
    from confluent_kafka import Producer

    from schemas.events import TOPIC_UPLOADED
    from services.common import kafka
    from services.metadata.backfill import backfill_events, select_refs
    from services.metadata.warehouse import make_engine

    settings = get_settings()
    engine = make_engine(settings)
    try:
        refs = select_refs(engine, pipeline_version, episode or (), from_version)
    finally:
        engine.dispose()
    events = backfill_events(refs, pipeline_version)
    if not dry_run and events:
        producer = Producer(kafka.producer_config(settings))
        for event in events:
            producer.produce(
                TOPIC_UPLOADED,
                key=event.episode.episode_id.encode(),
                value=event.model_dump_json().encode(),
                headers={"event_id": event.event_id, "content-type": "application/json"},
            )
        if producer.flush(60) != 0:
            raise typer.Exit(1)
    err.print(f"{'would re-announce' if dry_run else 're-announced'} {len(events)} episodes")
    print_json_line(
        {"pipeline_version": pipeline_version, "episodes": len(events), "dry_run": dry_run}
    )


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


@layer_app.command("ingest")
def layer_ingest(
    kind: Annotated[str, typer.Argument(help="calibration or labels")],
    file: Annotated[Path, typer.Argument(help="JSON Lines, or Parquet (.parquet)", exists=True)],
    version: Annotated[str, typer.Option(help="the version's name (not `latest`)")],
    author: Annotated[str | None, typer.Option(help="default: $USER")] = None,
    source: Annotated[str | None, typer.Option(help="default: the file's name")] = None,
) -> None:
    """Ingest a layer version from a file, in one transaction: schema-checked (a bad file is
    refused with its line numbers and changes nothing); the same version again is a no-op
    with the same content, refused with other content. Reads no video."""
    from services.metadata.layer_ingest import ingest_layer_file
    from services.metadata.layers import LayerConflictError, LayerRecordError

    layer_kind, name = _layer_kind(kind), _layer_version_name(version)
    settings = get_settings()
    try:
        stored = ingest_layer_file(
            settings.database_libpq_url,
            layer_kind,
            file,
            name,
            author or _user(),
            source or file.name,
        )
    except LayerRecordError as exc:
        err.print(f"[red]refused, nothing ingested ({exc.total} problems):[/]")
        err.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc
    except LayerConflictError as exc:
        err.print("[red]refused:[/]")
        err.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(3) from exc
    if stored.unknown_episodes:
        err.print(f"[yellow]{stored.unknown_episodes} episode ids not in the warehouse (yet)[/]")
    err.print(
        f"{stored.kind.value} {stored.version}: {stored.rows:,} rows "
        f"{'ingested' if stored.created else 'already there (no-op)'}"
    )
    print_json_line(
        {
            "kind": stored.kind.value,
            "version": stored.version,
            "rows": stored.rows,
            "digest": stored.digest,
            "created": stored.created,
            "unknown_episodes": stored.unknown_episodes,
            "store_s": round(stored.store_s, 4),
        }
    )


@layer_app.command("publish")
def layer_publish(
    kind: Annotated[str, typer.Argument(help="calibration or labels")],
    file: Annotated[Path, typer.Argument(help="JSON Lines, or Parquet (.parquet)", exists=True)],
    version: Annotated[str, typer.Option(help="the version's name (not `latest`)")],
    author: Annotated[str | None, typer.Option(help="default: $USER")] = None,
    source: Annotated[str | None, typer.Option(help="default: the file's name")] = None,
) -> None:
    """Publish a layer version from a file as one `episodes.annotated` event (the metadata
    service stores it; the same rule as `layer ingest`)."""
    from confluent_kafka import Producer

    from schemas.events import TOPIC_ANNOTATED
    from services.common import kafka
    from services.metadata.layer_ingest import read_layer_rows
    from services.metadata.layers import LayerRecordError, annotated_event

    layer_kind, name = _layer_kind(kind), _layer_version_name(version)
    settings = get_settings()
    try:
        rows = read_layer_rows(layer_kind, file)
    except LayerRecordError as exc:
        err.print(f"[red]refused, nothing published ({exc.total} problems):[/]")
        err.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc
    event = annotated_event(layer_kind, name, author or _user(), source or file.name, rows)
    value = event.model_dump_json().encode()
    if len(value) > MAX_EVENT_BYTES:
        err.print(f"[red]{len(value):,} bytes: too large for one event, use `layer ingest`[/]")
        raise typer.Exit(2)
    producer = Producer(kafka.producer_config(settings))
    producer.produce(
        TOPIC_ANNOTATED,
        key=f"{layer_kind.value}:{name}".encode(),
        value=value,
        headers={"event_id": event.event_id, "content-type": "application/json"},
    )
    if producer.flush(60) != 0:
        raise typer.Exit(1)
    print_json_line(
        {"kind": layer_kind.value, "version": name, "rows": len(rows), "event_id": event.event_id}
    )


@layer_app.command("list")
def layer_list(
    kind: Annotated[str | None, typer.Argument(help="one kind (default: all)")] = None,
) -> None:
    """Stored layer versions in ingest order (the last of a kind is its `latest`)."""
    from dataclasses import asdict

    from rich.table import Table

    from services.metadata.layer_ingest import list_versions

    versions = list_versions(get_settings().database_libpq_url, kind)
    table = Table("kind", "version", "rows", "author", "source", "created", "digest")
    for v in versions:
        table.add_row(v.kind, v.version, f"{v.rows:,}", v.author, v.source, v.created_at, v.digest)
    err.print(table)
    print_json_line({"versions": [asdict(v) for v in versions]})


def _layer_kind(kind: str) -> LayerKind:
    from schemas.layers import LayerKind

    try:
        return LayerKind(kind)
    except ValueError as exc:
        raise typer.BadParameter(f"{kind}: one of {', '.join(k.value for k in LayerKind)}") from exc


def _layer_version_name(version: str) -> str:
    from pydantic import TypeAdapter, ValidationError

    from schemas.layers import LayerVersionName

    try:
        return str(TypeAdapter(LayerVersionName).validate_python(version))
    except ValidationError as exc:
        raise typer.BadParameter(
            f"{version!r}: letters, digits, `_.-`, up to 64, not `latest`"
        ) from exc


def _user() -> str:
    import getpass

    return getpass.getuser()
