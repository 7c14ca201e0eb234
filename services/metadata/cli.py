"""`egoline db ...` and `egoline gc ...`: the warehouse schema, and shards no clip points to."""

from __future__ import annotations

from typing import Annotated

import typer

from services.common.output import err, print_json_line
from services.common.settings import get_settings

app = typer.Typer()
db_app = typer.Typer(help="The Postgres warehouse", no_args_is_help=True)
gc_app = typer.Typer(help="Garbage collection in the object store", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(gc_app, name="gc")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the warehouse schema."""
    from services.metadata.warehouse import upgrade

    upgrade(get_settings())
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
