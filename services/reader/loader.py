"""The training read path: a manifest in, clips out, through the node-local cache.

```python
from services.reader import open_reader

reader = open_reader("manifests/<sha256>.arrow", seed=7, decode=True)
for clip in reader.clips(epoch=0, part=rank, parts=world_size):
    clip.frames, clip.imu, clip.meta, clip.row
```

Order and partitioning are `services.reader.order` (pure); this module only does the I/O: it
reads each clip's span through `ClipCache`, while a background thread fetches the next
`prefetch` spans of the same read order into the cache.
"""

from __future__ import annotations

import hashlib
import mmap
import threading
from collections.abc import Callable, Generator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from numpy.typing import NDArray
from prometheus_client import Counter

from services.common.objectstore import ObjectStore, object_store
from services.common.settings import Settings, get_settings
from services.manifest.load import load_manifest, manifest_row
from services.reader.cache import ClipCache, clip_cache
from services.reader.clips import REQUIRED_COLUMNS, Clip, ClipSpan, clip_span, split_clip
from services.reader.order import LazyOrder, epoch_order, partition, shard_ids

PREFETCH_ERRORS = Counter(
    "egoline_reader_prefetch_errors_total",
    "Prefetches that failed (the reader then fetches the clip itself and raises if it fails)",
)


def shard_labels(column: pa.ChunkedArray) -> NDArray[np.int64]:
    """A label per row, equal for rows of the same shard, without materialising the keys: the
    indices into one unified dictionary (a manifest's `shard_key` is dictionary-encoded; 10M
    rows cast to strings took ~10 s and ~1 GiB here)."""
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    chunks = [chunk for chunk in column.unify_dictionaries().chunks if len(chunk)]
    if not chunks:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in chunks]).astype(
        np.int64, copy=False
    )


class Prefetcher:
    """Fills the cache with `span_of(0..count-1)` in order, at most `ahead` beyond the reader.

    The reader calls `consumed()` after each clip. A failed prefetch is counted, not raised: the
    reader fetches that clip itself and sees the error there, in its own thread.
    """

    def __init__(
        self, cache: ClipCache, span_of: Callable[[int], ClipSpan], count: int, ahead: int
    ) -> None:
        self._cache = cache
        self._span_of = span_of
        self._count = count
        self._room = threading.Semaphore(ahead)
        self._stop = threading.Event()
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="egoline-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for k in range(self._count):
            while not self._room.acquire(timeout=0.2):
                if self._stop.is_set():
                    return
            if self._stop.is_set():
                return
            try:
                self._cache.ensure(self._span_of(k))
            except Exception:  # counted; the reader's own fetch of this clip raises it
                self.errors += 1
                PREFETCH_ERRORS.inc()

    def consumed(self) -> None:
        self._room.release()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class ClipLoader:
    """Clips of one manifest, in a deterministic per-epoch order, through the node cache."""

    def __init__(
        self,
        table: pa.Table,
        cache: ClipCache,
        *,
        seed: int = 0,
        shuffle_buffer: int = 256,
        prefetch: int = 16,
        decode: bool = False,
        frames_per_clip: int | None = None,
        frame_height: int | None = None,
    ) -> None:
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"manifest lacks columns {missing} (docs/formats.md)")
        self.table = table
        self.cache = cache
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.prefetch = prefetch
        self.decode = decode
        if frames_per_clip is not None and frames_per_clip < 1:
            raise ValueError("frames_per_clip must be >= 1 (None: every frame)")
        self.frames_per_clip = frames_per_clip
        self.frame_height = frame_height
        self.shard_of_clip = shard_ids(shard_labels(table.column("shard_key")))
        self.prefetch_errors = 0

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def row(self, index: int) -> dict[str, Any]:
        """Manifest row `index` as a dict of plain Python values (with its `clip_key`)."""
        return manifest_row(self.table, index)

    def order(self, epoch: int, start: int = 0, part: int = 0, parts: int = 1) -> NDArray[np.int64]:
        """Row indexes reader `part` of `parts` reads in `epoch`, from global position `start`."""
        full = epoch_order(self.shard_of_clip, self.seed, epoch, self.shuffle_buffer)
        return partition(full, start, part, parts)

    def clips(
        self, epoch: int = 0, *, start: int = 0, part: int = 0, parts: int = 1
    ) -> Generator[Clip, None, None]:
        """Yield the clips of `order(epoch, start, part, parts)`, prefetching ahead. The order is
        computed a piece at a time as the clips are read (`LazyOrder`), so the first clip of a
        10M-row manifest does not wait for the whole epoch's order."""
        rows = LazyOrder(
            self.shard_of_clip, self.seed, epoch, self.shuffle_buffer, start, part, parts
        )
        lock = threading.Lock()  # the reader and its prefetcher share the lazily computed order

        def row_at(k: int) -> int:
            with lock:
                return rows[k]

        prefetcher = (
            Prefetcher(
                self.cache, lambda k: clip_span(self.row(row_at(k))), len(rows), self.prefetch
            )
            if self.prefetch > 0 and len(rows) > 0
            else None
        )
        try:
            for k in range(len(rows)):
                yield self.read(row_at(k))
                if prefetcher is not None:
                    prefetcher.consumed()
        finally:
            if prefetcher is not None:
                prefetcher.close()
                self.prefetch_errors += prefetcher.errors

    def read(self, index: int) -> Clip:
        """Row `index`'s clip (frames decoded when the loader was built with `decode=True`:
        every frame, or the first `frames_per_clip`; scaled to `frame_height` rows if set)."""
        row = self.row(index)
        with self.cache.open(clip_span(row)) as handle:
            clip = split_clip(handle, row)
        if not self.decode:
            return clip
        from services.media.av_io import decode_frames  # PyAV only when frames are wanted

        frames = np.stack(list(decode_frames(clip.mp4, self.frames_per_clip, self.frame_height)))
        return replace(clip, frames=frames)

    def stats(self) -> dict[str, Any]:
        """This process's cache counters, prefetch errors, and the cache's disk usage."""
        return {
            **asdict(self.cache.cache.counts),
            "prefetch_errors": self.prefetch_errors,
            **{f"disk_{k}": v for k, v in asdict(self.cache.cache.usage()).items()},
        }


def manifest_table(manifest: Path | str, store: ObjectStore, cache: ClipCache) -> pa.Table:
    """A manifest memory-mapped: a local Arrow file, or else its object key fetched into the
    node cache (manifests are content-addressed, so a cached copy never goes stale). The map
    holds the file open, so a later eviction of the cache entry doesn't pull it away."""
    local = Path(manifest)
    if local.exists():
        return load_manifest(local)
    key = str(manifest)
    name = hashlib.sha256(f"manifest\0{key}".encode()).hexdigest()
    with cache.cache.open(name, lambda path: store.download(key, path)) as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    return ipc.open_file(pa.BufferReader(pa.py_buffer(mapped))).read_all()


def register_reader_run(settings: Settings, manifest: Path | str, run_name: str) -> None:
    """Record in the warehouse that `run_name` reads `manifest` (a file, id or key)."""
    from services.manifest.index import resolve_manifest_id
    from services.manifest.runs import register_run
    from services.metadata.warehouse import make_engine

    engine = make_engine(settings)
    try:
        register_run(engine, run_name, resolve_manifest_id(str(manifest)), note="reader")
    finally:
        engine.dispose()


def open_reader(
    manifest: Path | str,
    settings: Settings | None = None,
    *,
    seed: int = 0,
    decode: bool = False,
    shuffle_buffer: int | None = None,
    prefetch: int | None = None,
    store: ObjectStore | None = None,
    run_name: str | None = None,
) -> ClipLoader:
    """A `ClipLoader` for a manifest (a local Arrow file or its `manifests/...` key), with the
    node cache, prefetch depth and shuffle window from settings unless given.

    With a run name (`run_name`, else `EGOLINE_READER_RUN_NAME`) the run is registered in the
    warehouse as reading this manifest (`egoline lineage --episode ID --used-by` then lists
    it); every rank and worker may do so, the first registration is kept. Raises
    UnknownManifestError (a ValueError) when the warehouse does not know the manifest."""
    settings = settings or get_settings()
    store = store or object_store(settings)
    cache = clip_cache(settings, store)
    table = manifest_table(manifest, store, cache)
    run = run_name if run_name is not None else settings.reader.run_name
    if run:
        register_reader_run(settings, manifest, run)
    return ClipLoader(
        table,
        cache,
        seed=seed,
        shuffle_buffer=settings.reader.shuffle_buffer if shuffle_buffer is None else shuffle_buffer,
        prefetch=settings.reader.prefetch_clips if prefetch is None else prefetch,
        decode=decode,
    )
