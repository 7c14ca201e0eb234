"""The node-local cache: LRU eviction policy (pure) and the disk cache's fill/evict behaviour."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.localcache import EntryStat, LocalCache, plan_evictions

entry_lists = st.lists(
    st.builds(
        EntryStat,
        st.text("abcdef0123", min_size=1, max_size=6),
        st.integers(0, 1000),
        st.integers(0, 10**6),
    ),
    max_size=40,
    unique_by=lambda e: e.name,
)


@given(entries=entry_lists, cap=st.integers(0, 20_000))
def test_eviction_removes_the_least_recently_used_until_the_rest_fits(
    entries: list[EntryStat], cap: int
) -> None:
    chosen = plan_evictions(entries, cap)
    kept = [e for e in entries if e not in chosen]
    assert sum(e.size for e in kept) <= cap
    if chosen:  # minimal: without the last (most recent) victim it would not fit
        assert sum(e.size for e in kept) + chosen[-1].size > cap
        newest_victim = max((e.last_used_ns, e.name) for e in chosen)
        assert all((e.last_used_ns, e.name) > newest_victim for e in kept)


@given(entries=entry_lists, cap=st.integers(0, 5000))
def test_the_entry_just_filled_is_never_evicted(entries: list[EntryStat], cap: int) -> None:
    if not entries:
        return
    keep = frozenset({entries[0].name})
    assert entries[0] not in plan_evictions(entries, cap, keep)


def _writer(data: bytes, calls: list[str]) -> Callable[[Path], None]:
    def fill(path: Path) -> None:
        calls.append(path.name)
        path.write_bytes(data)

    return fill


def test_a_miss_fills_once_and_later_opens_are_hits(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "c", cap_bytes=1 << 20)
    calls: list[str] = []
    for _ in range(3):
        with cache.open("a" * 64, _writer(b"x" * 100, calls), 100) as handle:
            assert handle.read() == b"x" * 100
    assert len(calls) == 1
    assert (cache.counts.misses, cache.counts.hits) == (1, 2)
    assert (cache.counts.fetched_bytes, cache.counts.hit_bytes) == (100, 200)


def test_eviction_keeps_the_cache_at_its_cap_and_drops_the_oldest(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "c", cap_bytes=3 * 1000)
    names = [f"e{i}" for i in range(6)]
    for i, name in enumerate(names):
        cache.open(name, _writer(bytes([i]) * 1000, []), 1000).close()
        os.utime(cache.directory / name, ns=(i * 10**9, i * 10**9))  # explicit recency
        assert cache.usage().bytes <= cache.cap_bytes
    cache.open("e6", _writer(b"z" * 1000, []), 1000).close()
    assert {e.name for e in cache.scan()} == {"e4", "e5", "e6"}
    assert cache.counts.evictions == 4 and cache.counts.evicted_bytes == 4000


def test_a_hit_refreshes_recency_so_a_used_entry_survives(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "c", cap_bytes=2 * 1000)
    for i, name in enumerate(("old", "mid")):
        cache.open(name, _writer(b"a" * 1000, []), 1000).close()
        os.utime(cache.directory / name, ns=(i * 10**9, i * 10**9))
    cache.open("old", _writer(b"a" * 1000, []), 1000).close()
    cache.open("new", _writer(b"b" * 1000, []), 1000).close()
    assert {e.name for e in cache.scan()} == {"old", "new"}


def test_a_wrong_sized_entry_is_refilled_and_a_failed_fill_caches_nothing(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "c", cap_bytes=1 << 20)
    (cache.directory / "torn").write_bytes(b"half")
    calls: list[str] = []
    with cache.open("torn", _writer(b"complete", calls), 8) as handle:
        assert handle.read() == b"complete"
    assert len(calls) == 1

    def failing(path: Path) -> None:
        path.write_bytes(b"partial")
        raise ConnectionError("store went away")

    with pytest.raises(ConnectionError):
        cache.open("lost", failing, 100)
    assert not cache.contains("lost")
    assert not [p for p in cache.directory.iterdir() if p.name.endswith(".part")]


def test_an_open_entry_stays_readable_after_clear(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "c", cap_bytes=1 << 20)
    handle = cache.open("k", _writer(b"payload", []), 7)
    assert cache.clear() == 1 and cache.usage().entries == 0
    assert handle.read() == b"payload"
    handle.close()


def test_names_that_could_escape_the_directory_are_refused(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "c", cap_bytes=10)
    for bad in ("../x", ".hidden", ""):
        with pytest.raises(ValueError):
            cache.open(bad, _writer(b"", []))
