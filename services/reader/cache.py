"""The training node's clip cache: byte spans of shards on local disk, one entry per clip.

Granularity is the clip span (docs/reader.md says why, against whole shards): a miss is one
ranged GET of exactly the bytes a manifest row names, so a manifest that selects a subset of a
shard's clips (one split, some devices) fetches only those. Shards are immutable
(content-addressed keys), so a span never goes stale. The disk side is
`services.common.localcache.LocalCache`, the same cache the stages use for raw objects.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO

from services.common.localcache import LocalCache
from services.common.objectstore import ObjectStore
from services.common.settings import Settings
from services.reader.clips import ClipSpan


def span_entry_name(span: ClipSpan) -> str:
    """The cache entry of a span: sha256 of `shard_key`, offset and length."""
    return hashlib.sha256(f"{span.shard_key}\0{span.offset}\0{span.length}".encode()).hexdigest()


class ClipCache:
    """Reads clip spans through the node-local cache, filling misses with one ranged GET."""

    def __init__(self, cache: LocalCache, store: ObjectStore) -> None:
        self.cache = cache
        self.store = store

    def open(self, span: ClipSpan) -> BinaryIO:
        """An open file holding exactly the span's bytes, from local disk when cached (the
        caller closes it; an eviction meanwhile doesn't disturb it)."""
        return self.cache.open(
            span_entry_name(span), lambda path: self._download(span, path), span.length
        )

    def read(self, span: ClipSpan) -> bytes:
        """The span's bytes, from local disk when cached."""
        with self.open(span) as handle:
            return handle.read()

    def ensure(self, span: ClipSpan) -> None:
        """Make sure the span is on local disk (prefetch, `egoline cache warm`). An entry
        already there is left alone and not counted as a hit: hits count reads."""
        if not self.cache.contains(span_entry_name(span)):
            self.open(span).close()

    def _download(self, span: ClipSpan, path: Path) -> None:
        path.write_bytes(self.store.get_range(span.shard_key, span.offset, span.length))


def clip_cache(settings: Settings, store: ObjectStore) -> ClipCache:
    """The node's clip cache as configured (`EGOLINE_READER_CACHE_DIR`, `_MB`)."""
    return ClipCache(
        LocalCache(settings.reader.cache_dir, settings.reader.cache_mb * 1024 * 1024, "clips"),
        store,
    )
