"""A node-local disk cache of immutable objects, shared by every process on one machine.

Both caches of the system are this one: the stages' raw-object cache (`rawcache.py`) and the
training reader's clip cache (`services/reader/cache.py`). Entries are immutable (their name is
derived from a content-addressed key), so the only hard parts are filling and evicting safely
while other processes read:

- **Atomic fills**: an entry is written to `.<name>.<uuid>.part` and renamed into place, so a
  reader sees either no file or the whole file, never a torn one. A reader that knows the size
  (`expected_size`) also rejects and replaces a file of the wrong size (left by a crash between
  write and rename on a filesystem that reordered them).
- **One fetch per missing entry**: a miss takes an exclusive `flock` on the entry's lock stripe
  (`.locks/NNNN.lock`, a fixed set of files, so no lock file is ever deleted under a waiter),
  checks again, and only then fills. A process that waited finds the entry and counts a hit.
  `flock` locks belong to open file descriptions, so threads of one process exclude each other
  too (each opens the stripe itself).
- **No reads broken by eviction**: callers get an open file, not a path; POSIX keeps an unlinked
  file's data until the last descriptor closes.
- **LRU eviction at a byte cap**: after each fill, under `.locks/evict.lock`, entries beyond the
  cap are removed oldest-use first (`plan_evictions`, a pure function). A hit records its use by
  setting the file's mtime.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from prometheus_client import Counter

LOCK_STRIPES = 1024
STALE_PART_S = 3600.0  # a `.part` file this old belongs to a fill that crashed

HITS = Counter("egoline_cache_hits_total", "Node-local cache lookups served from disk", ["cache"])
MISSES = Counter(
    "egoline_cache_misses_total", "Node-local cache lookups that fetched the object", ["cache"]
)
HIT_BYTES = Counter(
    "egoline_cache_hit_bytes_total", "Bytes of entries served from the node cache", ["cache"]
)
FETCHED_BYTES = Counter(
    "egoline_cache_fetched_bytes_total", "Bytes fetched from the object store on misses", ["cache"]
)
EVICTIONS = Counter("egoline_cache_evictions_total", "Entries evicted at the size cap", ["cache"])
EVICTED_BYTES = Counter(
    "egoline_cache_evicted_bytes_total", "Bytes evicted at the size cap", ["cache"]
)


@dataclass(frozen=True)
class EntryStat:
    name: str
    size: int  # bytes
    last_used_ns: int  # mtime: set at fill, refreshed on every hit


def plan_evictions(
    entries: Sequence[EntryStat], cap_bytes: int, keep: frozenset[str] = frozenset()
) -> list[EntryStat]:
    """The least recently used entries to remove so the rest fit in `cap_bytes`.

    Ties on last use go by name, so the plan is deterministic. Entries named in `keep` (the one
    just filled) are never chosen; if they alone exceed the cap, everything else goes and the
    total stays above the cap.
    """
    if cap_bytes < 0:
        raise ValueError("cap_bytes must be >= 0")
    total = sum(e.size for e in entries)
    chosen: list[EntryStat] = []
    for entry in sorted(entries, key=lambda e: (e.last_used_ns, e.name)):
        if total <= cap_bytes:
            break
        if entry.name in keep:
            continue
        chosen.append(entry)
        total -= entry.size
    return chosen


@dataclass
class CacheStats:
    """What this process's cache object did (the Prometheus counters hold the same, per cache)."""

    hits: int = 0
    misses: int = 0
    hit_bytes: int = 0
    fetched_bytes: int = 0
    evictions: int = 0
    evicted_bytes: int = 0


@dataclass(frozen=True)
class DiskUsage:
    entries: int
    bytes: int
    cap_bytes: int


def _valid_name(name: str) -> str:
    if not name or name.startswith(".") or "/" in name or "\0" in name:
        raise ValueError(f"bad cache entry name {name!r}")
    return name


class LocalCache:
    """Immutable entries in one directory, capped at `cap_bytes`, safe across processes."""

    def __init__(self, directory: Path, cap_bytes: int, label: str = "cache") -> None:
        if cap_bytes <= 0:
            raise ValueError("cap_bytes must be positive")
        self.directory = directory
        self.cap_bytes = cap_bytes
        self.label = label
        self.counts = CacheStats()
        self._locks = directory / ".locks"
        self._locks.mkdir(parents=True, exist_ok=True)

    # --- reading -------------------------------------------------------------------------
    def open(
        self, name: str, fill: Callable[[Path], None], expected_size: int | None = None
    ) -> BinaryIO:
        """An open binary file holding entry `name`, filled by `fill(path)` when missing.

        `fill` must write the whole object at the path it is given (it runs at most once per
        missing entry across all processes on the node, unless an entry is evicted in between).
        The caller closes the file. Raises whatever `fill` raises; nothing is cached then.
        """
        path = self.directory / _valid_name(name)
        handle = self._open_valid(path, expected_size)
        if handle is None:
            with self._stripe_lock(name):
                handle = self._open_valid(path, expected_size)
                if handle is None:
                    handle = self._fill(path, fill, expected_size)
                    self._count_miss(os.fstat(handle.fileno()).st_size)
                    filled = True
                else:
                    filled = False
            if filled:
                self.evict(keep=frozenset({name}))
                return handle
        size = os.fstat(handle.fileno()).st_size
        with contextlib.suppress(OSError):
            os.utime(handle.fileno())  # recency for LRU
        self.counts.hits += 1
        self.counts.hit_bytes += size
        HITS.labels(self.label).inc()
        HIT_BYTES.labels(self.label).inc(size)
        return handle

    def contains(self, name: str) -> bool:
        return (self.directory / _valid_name(name)).exists()

    def _open_valid(self, path: Path, expected_size: int | None) -> BinaryIO | None:
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            return None
        if expected_size is not None and os.fstat(handle.fileno()).st_size != expected_size:
            handle.close()
            path.unlink(missing_ok=True)  # only a crash mid-fill leaves this; refill it
            return None
        return handle

    def _fill(
        self, path: Path, fill: Callable[[Path], None], expected_size: int | None
    ) -> BinaryIO:
        partial = self.directory / f".{path.name}.{uuid.uuid4().hex}.part"
        try:
            fill(partial)
            handle = partial.open("rb")  # opened before the rename: eviction can't take it
            size = os.fstat(handle.fileno()).st_size
            if expected_size is not None and size != expected_size:
                handle.close()
                raise OSError(f"fill of {path.name} wrote {size} bytes, expected {expected_size}")
            os.replace(partial, path)
            return handle
        finally:
            partial.unlink(missing_ok=True)

    def _count_miss(self, size: int) -> None:
        self.counts.misses += 1
        self.counts.fetched_bytes += size
        MISSES.labels(self.label).inc()
        FETCHED_BYTES.labels(self.label).inc(size)

    @contextlib.contextmanager
    def _stripe_lock(self, name: str) -> Iterator[None]:
        stripe = zlib.crc32(name.encode()) % LOCK_STRIPES
        with self._flock(self._locks / f"{stripe:04d}.lock"):
            yield

    @contextlib.contextmanager
    def _flock(self, path: Path) -> Iterator[None]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    # --- size cap --------------------------------------------------------------------------
    def scan(self) -> list[EntryStat]:
        """Every complete entry on disk (removing `.part` files of crashed fills on the way)."""
        entries: list[EntryStat] = []
        stale_before = time.time() - STALE_PART_S
        with os.scandir(self.directory) as it:
            for item in it:
                with contextlib.suppress(FileNotFoundError):
                    if item.name.endswith(".part"):
                        if item.stat().st_mtime < stale_before:
                            os.unlink(item.path)
                        continue
                    if item.name.startswith(".") or not item.is_file(follow_symlinks=False):
                        continue
                    st = item.stat()
                    entries.append(EntryStat(item.name, st.st_size, st.st_mtime_ns))
        return entries

    def evict(self, keep: frozenset[str] = frozenset()) -> list[EntryStat]:
        """Remove least recently used entries until the total fits the cap; returns them."""
        with self._flock(self._locks / "evict.lock"):
            chosen = plan_evictions(self.scan(), self.cap_bytes, keep)
            for entry in chosen:
                (self.directory / entry.name).unlink(missing_ok=True)
        if chosen:
            freed = sum(e.size for e in chosen)
            self.counts.evictions += len(chosen)
            self.counts.evicted_bytes += freed
            EVICTIONS.labels(self.label).inc(len(chosen))
            EVICTED_BYTES.labels(self.label).inc(freed)
        return chosen

    def usage(self) -> DiskUsage:
        entries = self.scan()
        return DiskUsage(len(entries), sum(e.size for e in entries), self.cap_bytes)

    def clear(self) -> int:
        """Remove every entry (readers holding one open keep reading it); returns how many."""
        with self._flock(self._locks / "evict.lock"):
            entries = self.scan()
            for entry in entries:
                (self.directory / entry.name).unlink(missing_ok=True)
        return len(entries)
