"""`egoline cache ...`: the training node's clip cache (stats, clear, warm from a manifest)."""

from __future__ import annotations

from typing import Annotated

import typer

from services.common.output import err, print_json_line
from services.common.settings import get_settings

app = typer.Typer()
cache_app = typer.Typer(help="The training node's clip cache", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("stats")
def cache_stats() -> None:
    """Entries and bytes in the node cache (`EGOLINE_READER_CACHE_DIR`) against its cap."""
    from dataclasses import asdict

    from services.common.localcache import LocalCache

    settings = get_settings()
    cache = LocalCache(settings.reader.cache_dir, settings.reader.cache_mb * 1024 * 1024, "clips")
    usage = cache.usage()
    err.print(
        f"{settings.reader.cache_dir}: {usage.entries} entries, "
        f"{usage.bytes / 2**20:.1f} of {usage.cap_bytes / 2**20:.0f} MiB"
    )
    print_json_line({"directory": str(settings.reader.cache_dir), **asdict(usage)})


@cache_app.command("clear")
def cache_clear() -> None:
    """Remove every entry of the node cache (readers holding one open keep reading it)."""
    from services.common.localcache import LocalCache

    settings = get_settings()
    cache = LocalCache(settings.reader.cache_dir, settings.reader.cache_mb * 1024 * 1024, "clips")
    print_json_line({"directory": str(settings.reader.cache_dir), "removed": cache.clear()})


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
