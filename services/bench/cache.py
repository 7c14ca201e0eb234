"""`egoline bench cache`: the training reader cold (every clip a ranged GET) against warm (every
clip from the node-local cache), and plain local-disk reads of the same files, in one run.

1. a synthetic corpus of about `mb` MiB of real H.264 clips in shards of `shard_mb` MiB is
   written straight into the object store with its manifest (`services.synth.shards`);
2. cold: one thread reads every clip of the manifest through a `ClipLoader` on an empty cache,
   prefetch off, so each read is one ranged GET plus the cache fill;
3. warm: the same reader, the same order again: every read is a cache hit;
4. disk: the cache's entry files read plainly (open, read, close), the same bytes in the same
   order: the ceiling the warm path is compared with (served by the page cache, as warm is);
5. disk direct: the same files read with O_DIRECT, i.e. from the device itself: what a node
   whose cache no longer fits in RAM gets.
The corpus and the cache are removed at the end.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from services.common.localcache import LocalCache
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.manifest.load import load_manifest
from services.reader.cache import ClipCache, span_entry_name
from services.reader.clips import clip_span
from services.reader.loader import ClipLoader
from services.synth.shards import encode_clip_templates, write_synthetic_corpus

MB = 1024 * 1024


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description:<14}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
    )


def read_direct(path: Path, block: int = 1 << 20) -> int:
    """Read a file with O_DIRECT (from the device, not the page cache); returns its size."""
    buffer = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        total = 0
        while (n := os.readv(fd, [buffer])) > 0:
            total += n
        return total
    finally:
        os.close(fd)
        buffer.close()


def _timed_read(
    clips: Iterator[int], progress: Progress, label: str, total: int
) -> tuple[float, int]:
    task = progress.add_task(label, total=total)
    started = time.perf_counter()
    read = 0
    for size in clips:
        read += size
        progress.advance(task, size)
    return time.perf_counter() - started, read


def bench_cache(
    settings: Settings,
    size_mb: int,
    shard_mb: int,
    log: Callable[[str], None],
    console: Console,
) -> dict[str, Any]:
    store = object_store(settings)
    root = Path(tempfile.mkdtemp(prefix="egoline-bench-cache-", dir=settings.stack_dir))
    prefix = f"shards/bench-{uuid.uuid4().hex[:8]}/"
    try:
        log("encoding clip templates (reused across runs)")
        templates = encode_clip_templates(
            settings.stack_dir / "bench-cache-templates", count=3, clip_s=10, width=1280, height=720
        )
        with _progress(console) as progress:
            task = progress.add_task("shards -> S3", total=size_mb * MB)
            manifest = write_synthetic_corpus(
                store,
                templates,
                size_mb * MB,
                shard_mb * MB,
                root / "scratch",
                root / "manifest.arrow",
                pipeline_version=prefix.removeprefix("shards/").rstrip("/"),
                on_bytes=lambda n: progress.advance(task, n),
            )
        table = load_manifest(manifest)
        local = LocalCache(root / "cache", cap_bytes=2 * size_mb * MB + 64 * MB, label="bench")
        loader = ClipLoader(table, ClipCache(local, store), seed=0, prefetch=0)
        order = loader.order(epoch=0)
        spans = [clip_span(loader.row(int(i))) for i in order]
        total = sum(s.length for s in spans)
        shards = len({s.shard_key for s in spans})
        log(f"{len(spans)} clips, {total / MB:.0f} MiB in {shards} shards of ~{shard_mb} MiB")

        def through_reader() -> Iterator[int]:
            for clip in loader.clips(epoch=0):
                yield len(clip.mp4) + (0 if clip.imu is None else clip.imu.nbytes)

        def plain_files() -> Iterator[int]:
            for span in spans:
                with (local.directory / span_entry_name(span)).open("rb") as handle:
                    yield len(handle.read())

        def device_files() -> Iterator[int]:
            for span in spans:
                yield read_direct(local.directory / span_entry_name(span))

        requests_before = store.bytes_read
        with _progress(console) as progress:
            cold_s, cold_clip_bytes = _timed_read(through_reader(), progress, "cold (S3)", total)
            fetched = store.bytes_read - requests_before
            cold = dict(vars(local.counts))
            warm_s, _ = _timed_read(through_reader(), progress, "warm (cache)", total)
            disk_s, disk_bytes = _timed_read(plain_files(), progress, "plain disk", total)
            device_s, device_bytes = _timed_read(device_files(), progress, "O_DIRECT", total)
        warm_hits = local.counts.hits - cold["hits"]
    finally:
        for key in store.list_keys(prefix):
            store.delete(key)
        shutil.rmtree(root, ignore_errors=True)
    mib = total / MB
    cold_mb_s, warm_mb_s, disk_mb_s = mib / cold_s, mib / warm_s, disk_bytes / MB / disk_s
    return {
        "mb": round(mib, 1),
        "clips": len(spans),
        "clip_mb": round(mib / max(len(spans), 1), 2),
        "shards": shards,
        "shard_mb": shard_mb,
        "cold_s": round(cold_s, 2),
        "warm_s": round(warm_s, 3),
        "cold_mb_s": round(cold_mb_s, 1),
        "warm_mb_s": round(warm_mb_s, 1),
        "speedup": round(warm_mb_s / cold_mb_s, 1),
        "disk_mb_s": round(disk_mb_s, 1),
        "warm_vs_disk": round(warm_mb_s / disk_mb_s, 3),
        "disk_direct_mb_s": round(device_bytes / MB / device_s, 1),
        "warm_vs_disk_direct": round(warm_mb_s / (device_bytes / MB / device_s), 3),
        "cold_misses": cold["misses"],
        "cold_hits": cold["hits"],
        "warm_hits": warm_hits,
        "warm_misses": local.counts.misses - cold["misses"],
        "fetched_mb": round(fetched / MB, 1),
        "clip_payload_mb": round(cold_clip_bytes / MB, 1),
        "threads": 1,
        "prefetch": 0,
    }
