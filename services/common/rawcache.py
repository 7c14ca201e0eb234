"""A node-local cache of raw objects shared by the stage processes on one machine.

Raw objects are immutable (their key holds their sha256 and is never overwritten), so any
process may serve them from local disk. Decode, validate and shard each need the raw video; on
one node the cache makes that one GET instead of three. The cache itself (atomic fills, one
fetch per missing object across processes, LRU cap) is `services.common.localcache`, shared
with the training reader; consumers get a hard link to the entry (no copy). Without a
configured directory it is a plain GET.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from services.common.localcache import LocalCache
from services.common.objectstore import ObjectStore


class RawCache:
    def __init__(self, directory: Path, cap_bytes: int) -> None:
        self.cache = LocalCache(directory, cap_bytes, label="raw")

    @property
    def directory(self) -> Path:
        return self.cache.directory

    def fetch(self, store: ObjectStore, key: str, dest: Path) -> None:
        """Put object `key` at `dest`, from the cache when present, filling it otherwise."""
        name = hashlib.sha256(key.encode()).hexdigest()
        with self.cache.open(name, lambda path: store.download(key, path)) as handle:
            try:
                os.link(self.directory / name, dest)
            except OSError:  # evicted meanwhile, or another filesystem: copy the open file
                with dest.open("wb") as out:
                    shutil.copyfileobj(handle, out, 8 << 20)


def fetch_raw(store: ObjectStore, cache: RawCache | None, key: str, dest: Path) -> None:
    if cache is None:
        store.download(key, dest)
    else:
        cache.fetch(store, key, dest)
