"""`egoline bench ...`: each benchmark brings up (or reuses) the embedded stack, shows progress
on stderr and prints its JSON line last on stdout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from services.common.output import err, print_json_line
from services.common.settings import Settings, get_settings

app = typer.Typer()
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
    shard_mb: Annotated[int, typer.Option(min=1, help="shard size, MiB")] = 64,
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


@bench_app.command("layers")
def bench_layers(
    episodes: Annotated[
        int, typer.Option(min=10, help="episodes to seed (10 clips each)")
    ] = 100_000,
    keep: Annotated[bool, typer.Option(help="keep the seeded database")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """Release a calibration layer for every episode (JSONL, then a newer one from Parquet),
    pin a manifest to it and rebuild it, build the unpinned one; the object store's GETs
    counted from its own request log (`video_bytes_read` must be 0)."""
    from services.bench.layers import bench_layers as run

    del as_json
    result = _run_bench(lambda settings, log: run(settings, episodes, keep, log=log))
    if result["video_bytes_read"] or not result["byte_identical_rebuild"]:
        raise typer.Exit(1)


@bench_app.command("used-by")
def bench_used_by(
    episodes: Annotated[
        int, typer.Option(min=100, help="seeded episodes (10 clips each)")
    ] = 100_000,
    manifests: Annotated[int, typer.Option(min=1, help="indexed manifests, one run each")] = 100,
    share: Annotated[
        float, typer.Option(min=0.01, max=1.0, help="share of the episodes each manifest holds")
    ] = 1.0,
    lookups: Annotated[int, typer.Option(min=1, help="random episodes looked up")] = 1000,
    keep: Annotated[bool, typer.Option(help="keep the seeded database")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """`lineage --episode ID --used-by` over N indexed manifests (episodes x share x
    manifests member rows): p50/p99 lookup ms, checked against the seeded membership."""
    from services.bench.lineage_bench import bench_used_by as run

    del as_json
    _run_bench(
        lambda settings, log: run(settings, episodes, manifests, share, lookups, keep, log=log)
    )


@bench_app.command("first-batch")
def bench_first_batch(
    episodes: Annotated[int, typer.Option(min=100, help="episodes to seed (10 clips each)")] = (
        1_000_000
    ),
    batch: Annotated[int, typer.Option(min=1, help="clips in the training batch")] = 64,
    frames_per_clip: Annotated[
        int, typer.Option(min=0, help="frames decoded per clip (0: every frame)")
    ] = 16,
    frame_height: Annotated[
        int, typer.Option(min=0, help="frames scaled to this many rows, aspect kept (0: as stored)")
    ] = 224,
    workers: Annotated[int, typer.Option(min=1, help="readers (threads) sharing the order")] = 2,
    real_shards: Annotated[int, typer.Option(min=1, help="real shards the rows reuse")] = 2,
    clips_per_shard: Annotated[int, typer.Option(min=1, help="real clips a shard")] = 256,
    clip_s: Annotated[int, typer.Option(min=1, help="real clip length, seconds")] = 10,
    width: int = 1280,
    height: int = 720,
    naive_rows: Annotated[int, typer.Option(min=256, help="rows for the naive walk")] = 5120,
    keep: Annotated[bool, typer.Option(help="keep the seeded database and real shards")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """Time to first batch: manifest build + load + the first training batch decoded through
    the reader from the object store, cold cache, over N seeded episodes whose clip rows reuse
    real clips. Exit 1 unless every clip decoded to the frames its row says."""
    from services.bench.first_batch import BenchShape
    from services.bench.first_batch import bench_first_batch as run

    del as_json
    shape = BenchShape(
        episodes, batch, frames_per_clip, frame_height, workers, real_shards, clips_per_shard,
        clip_s, width, height, naive_rows,
    )  # fmt: skip
    result = _run_bench(lambda settings, log: run(settings, shape, keep, log=log))
    if not result["frame_counts_ok"]:
        raise typer.Exit(1)


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


@bench_app.command("poison")
def bench_poison(
    good: Annotated[int, typer.Option(min=1, help="good episodes")] = 16,
    per_stage: Annotated[int, typer.Option(min=1, help="planted episodes per stage")] = 2,
    outage_s: Annotated[float, typer.Option(min=0, help="S3 pause mid-run; 0: none")] = 6.0,
    seed: Annotated[int, typer.Option(help="-1: fresh episode ids each run")] = -1,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """Planted bugs in every batch step (decode, validate, shard, the warehouse transaction)
    among good episodes, with an S3 pause and a Postgres restart mid-run: every planted record
    isolated, every good episode cataloged within 60 s, none dead-lettered (exit 1 otherwise)."""
    from services.bench.poison import PoisonConfig
    from services.bench.poison import bench_poison as run

    del as_json
    config = PoisonConfig(good=good, per_stage=per_stage, seed=seed, outage_s=outage_s)
    result = _run_bench(lambda settings, log: run(settings, config, log=log))
    ok = (
        result["isolated"] == result["planted"]
        and result["good_cataloged"] == result["good_expected"]
        and result["good_in_manifest"] == result["good_expected"]
        and result["dependency_outage_dlq"] == 0
        and result["max_stall_s"] <= 60
        and result["lag_saw_stall"]
        and result["uncommitted_lag"] == 0
    )
    if not ok:
        raise typer.Exit(1)


@bench_app.command("curate")
def bench_curate(
    episodes: Annotated[int, typer.Option(min=16)] = 200,
    seed: Annotated[int, typer.Option(help="-1: fresh episode ids each run")] = -1,
    lookup_episodes: Annotated[
        int, typer.Option(min=1000, help="signatures seeded for the near-duplicate lookups")
    ] = 1_000_000,
    imu_lookup_episodes: Annotated[
        int,
        typer.Option(min=0, help="IMU signatures seeded for the IMU lookups (0: skip them)"),
    ] = 100_000,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """Content signals and duplicates against labelled media: per class precision and recall,
    the validate stage's extra CPU for the signals, near-duplicate lookup time at scale (pHash
    and IMU signature)."""
    from services.bench.curate import bench_curate as run

    del as_json
    _run_bench(
        lambda settings, log: run(
            settings, episodes, seed, log, lookup_episodes, imu_lookup_episodes=imu_lookup_episodes
        )
    )
