"""The training read path on the real stack: shards in the embedded S3, a node cache on disk."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.common.localcache import LocalCache
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.manifest.load import load_manifest
from services.reader.cache import ClipCache
from services.reader.clips import Clip, clip_span
from services.reader.loader import ClipLoader, open_reader
from services.reader.order import reader_part, resume_position
from tests.fixtures.reader import Corpus, clip_digest

pytestmark = pytest.mark.connected
MB = 1024 * 1024


def _reader(stack: Settings, corpus: Corpus, cache_dir: Path, cap: int = 1 << 30) -> ClipLoader:
    cache = ClipCache(LocalCache(cache_dir, cap, "clips"), object_store(stack))
    return ClipLoader(load_manifest(corpus.manifest), cache, seed=3, shuffle_buffer=4, prefetch=4)


def _read_all(
    settings: Settings,
    manifest: Path,
    cache_dir: Path,
    seed: int,
    prefetch: int,
    start: Any,
    results: Any,
) -> None:
    """One of the concurrent processes: read every clip through the shared cache."""
    store = object_store(settings)
    cache = ClipCache(LocalCache(cache_dir, 1 << 30, "clips"), store)
    loader = ClipLoader(load_manifest(manifest), cache, seed=seed, prefetch=prefetch)
    start.wait()
    digests = {str(c.row["clip_key"]): clip_digest(c) for c in loader.clips(epoch=0)}
    counts = cache.cache.counts
    results.put((counts.misses, counts.hits, store.bytes_read, digests))


def test_eight_processes_share_one_cache_fetching_each_clip_once_with_identical_bytes(
    stack: Settings, corpus: Corpus, tmp_path: Path
) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(8), ctx.Queue()
    procs = [
        # two read orders (seeds) so processes collide on the same clips from both ends;
        # half prefetch, so prefetch threads race the readers too
        ctx.Process(
            target=_read_all,
            args=(stack, corpus.manifest, tmp_path / "cache", i % 2, 4 * (i % 2), start, results),
        )
        for i in range(8)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    n = len(corpus.rows)
    assert sum(o[0] for o in outcomes) == n, "every clip fetched exactly once across processes"
    # every read not filled by its own reader is a hit (a prefetched clip is a hit when read)
    assert sum(o[1] for o in outcomes) >= 8 * n - n
    assert sum(o[2] for o in outcomes) == corpus.span_bytes, "bytes from S3: each span once"
    for _, _, _, digests in outcomes:
        assert digests == corpus.digests
    assert LocalCache(tmp_path / "cache", 1 << 30).usage().bytes == corpus.span_bytes


def test_the_cache_stays_at_its_cap_evicting_least_recently_used(
    stack: Settings, corpus: Corpus, tmp_path: Path
) -> None:
    biggest = max(clip_span(r).length for r in corpus.rows)
    loader = _reader(stack, corpus, tmp_path / "cache", cap=3 * biggest)
    loader.prefetch = 0
    local = loader.cache.cache
    order = [int(i) for i in loader.order(epoch=0)]
    for index in order:
        clip = loader.read(index)
        assert clip_digest(clip) == corpus.digests[clip.row["clip_key"]]
        assert local.usage().bytes <= local.cap_bytes
    entries = local.usage().entries
    assert 3 <= entries < len(order) and local.counts.evictions == len(order) - entries
    fetched = loader.cache.store.bytes_read
    loader.read(order[-1])  # the most recent entry is still there
    assert loader.cache.store.bytes_read == fetched
    loader.read(order[0])  # the oldest was evicted: fetched again, same bytes
    assert loader.cache.store.bytes_read == fetched + clip_span(loader.row(order[0])).length


def test_resuming_mid_epoch_reads_exactly_the_remaining_clips(
    stack: Settings, corpus: Corpus, tmp_path: Path
) -> None:
    loader = _reader(stack, corpus, tmp_path / "cache")
    full = [str(c.row["clip_key"]) for c in loader.clips(epoch=2)]
    assert sorted(full) == sorted(corpus.digests)
    k = 11
    assert [str(c.row["clip_key"]) for c in loader.clips(epoch=2, start=k)] == full[k:]
    other_epoch = [str(c.row["clip_key"]) for c in loader.clips(epoch=3)]
    assert other_epoch != full and sorted(other_epoch) == sorted(full)
    # 2 readers that each read 4 clips, then stopped: resume gives every unread clip once
    first = [str(c.row["clip_key"]) for p in range(2) for c in _take(loader, 2, p, 2, 0, 4)]
    at = resume_position(0, 4, 2)
    rest = [str(c.row["clip_key"]) for p in range(2) for c in _take(loader, 2, p, 2, at, None)]
    assert sorted(first + rest) == sorted(full) and not set(first) & set(rest)


def _take(
    loader: ClipLoader, epoch: int, part: int, parts: int, start: int, n: int | None
) -> list[Clip]:
    clips: list[Clip] = []
    for clip in loader.clips(epoch, start=start, part=part, parts=parts):
        if n is not None and len(clips) == n:
            break
        clips.append(clip)
    return clips


def test_ranks_and_workers_partition_every_clip_exactly_once(
    stack: Settings, corpus: Corpus, tmp_path: Path
) -> None:
    loader = _reader(stack, corpus, tmp_path / "cache")
    seen: list[str] = []
    for rank in range(3):
        for worker in range(2):
            part, parts = reader_part(rank, 3, worker, 2)
            for clip in loader.clips(epoch=1, part=part, parts=parts):
                assert clip_digest(clip) == corpus.digests[clip.row["clip_key"]]
                seen.append(str(clip.row["clip_key"]))
    assert sorted(seen) == sorted(corpus.digests)


def test_open_reader_fetches_the_manifest_by_key_and_decodes_frames(
    stack: Settings, corpus: Corpus, tmp_path: Path
) -> None:
    settings = stack.model_copy(update={"reader_cache_dir": tmp_path / "cache"})
    reader = open_reader(corpus.manifest_key, settings, seed=1, decode=True)
    clip = next(reader.clips(epoch=0))
    frames = int(clip.row["frame_count"])
    assert clip.frames is not None and clip.frames.shape == (frames, 240, 320, 3)
    assert clip.imu is not None and clip.imu.shape == (frames, 6)
    assert clip.meta["clip_key"] == clip.row["clip_key"]
    stats = reader.stats()
    assert stats["misses"] >= 2 and stats["disk_entries"] >= 2  # the manifest and a clip


def test_cache_commands_warm_report_and_clear(
    stack: Settings, corpus: Corpus, tmp_path: Path
) -> None:
    env = {**os.environ, "EGOLINE_READER_CACHE_DIR": str(tmp_path / "cache")}

    def egoline(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "services.cli", "cache", *args],
            env=env, capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        return done.stdout.strip().splitlines()[-1]

    warm = egoline("warm", str(corpus.manifest))
    assert f'"clips": {len(corpus.rows)}' in warm and f'"misses": {len(corpus.rows)}' in warm
    stats = egoline("stats")
    assert f'"entries": {len(corpus.rows)}' in stats and f'"bytes": {corpus.span_bytes}' in stats
    assert f'"removed": {len(corpus.rows)}' in egoline("clear")
    assert '"entries": 0' in egoline("stats")
