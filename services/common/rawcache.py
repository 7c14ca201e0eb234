"""A node-local cache of raw objects shared by the stage processes on one machine.

Raw objects are immutable (their key holds their sha256 and is never overwritten), so any
process may serve them from local disk. Decode, validate and shard each need the raw video; on
one node the cache makes that one GET instead of three. Fills are atomic (download to a
temporary name, rename); consumers get a hard link (no copy); eviction removes the least
recently used entries beyond the size cap. Without a configured directory it is a plain GET.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from pathlib import Path

from services.common.objectstore import ObjectStore


class RawCache:
    def __init__(self, directory: Path, cap_bytes: int) -> None:
        self.directory = directory
        self.cap_bytes = cap_bytes
        directory.mkdir(parents=True, exist_ok=True)

    def fetch(self, store: ObjectStore, key: str, dest: Path) -> None:
        """Put object `key` at `dest`, from the cache when present, filling it otherwise."""
        cached = self.directory / hashlib.sha256(key.encode()).hexdigest()
        if not cached.exists():
            partial = self.directory / f".{cached.name}.{uuid.uuid4().hex}.part"
            try:
                store.download(key, partial)
                os.replace(partial, cached)
            finally:
                partial.unlink(missing_ok=True)
            self._evict(keep=cached)
        with contextlib.suppress(OSError):
            os.utime(cached)  # recency for LRU
        try:
            os.link(cached, dest)
        except OSError:
            shutil.copyfile(cached, dest)

    def _evict(self, keep: Path) -> None:
        entries = []
        for path in self.directory.iterdir():
            if path.name.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.cap_bytes:
                break
            if path != keep:
                path.unlink(missing_ok=True)
                total -= size


def fetch_raw(store: ObjectStore, cache: RawCache | None, key: str, dest: Path) -> None:
    if cache is None:
        store.download(key, dest)
    else:
        cache.fetch(store, key, dest)
