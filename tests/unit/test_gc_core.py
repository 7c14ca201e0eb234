"""The shard garbage collector's pure core, and the shard stage's adoption of replayed shards."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from schemas.events import ClipRecord, EpisodeRef, ShardsWritten
from services.common.objectstore import ListedObject
from services.metadata.gc import duplicate_clips, group_shards, plan_gc
from services.shard.app import CutEpisode, SpooledClip, split_covered

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def obj(key: str, age_h: float, size: int = 10) -> ListedObject:
    return ListedObject(key, size, NOW - timedelta(hours=age_h))


def test_shards_pair_tar_and_index_and_skip_episode_markers() -> None:
    stored = group_shards(
        [
            obj("shards/v1/ab/ab1.tar", 1),
            obj("shards/v1/ab/ab1.index.json", 1),
            obj("shards/v1/cd/cd2.index.json", 1),  # a tar lost: the index alone is garbage
            obj("shards/v1/episodes/ep1.json", 1),
        ]
    )
    assert [(s.shard_key, s.tar is not None, s.index is not None) for s in stored] == [
        ("shards/v1/ab/ab1.tar", True, True),
        ("shards/v1/cd/cd2.tar", False, True),
    ]


def test_only_unreferenced_shards_older_than_the_threshold_are_deleted() -> None:
    stored = group_shards(
        [
            obj("shards/v1/a.tar", 48),
            obj("shards/v1/a.index.json", 48),
            obj("shards/v1/b.tar", 48),
            obj("shards/v1/b.index.json", 48),
            obj("shards/v1/c.tar", 2),
            obj("shards/v1/c.index.json", 0.5),  # the newest part decides the age
        ]
    )
    plan = plan_gc(stored, {"shards/v1/a.tar"}, NOW, timedelta(hours=1))
    assert [s.shard_key for s in plan.delete] == ["shards/v1/b.tar"]
    assert [s.shard_key for s in plan.too_young] == ["shards/v1/c.tar"]
    assert plan.referenced == 1
    assert plan.delete_keys == ["shards/v1/b.tar", "shards/v1/b.index.json"]
    assert plan.delete_bytes == 20
    assert plan_gc(stored, set(), NOW, timedelta(0)).delete_keys.__len__() == 6


def test_a_clip_listed_by_two_shards_is_a_duplicate() -> None:
    dups = duplicate_clips({"s1": ["e1-0", "e1-1"], "s2": ["e1-1", "e2-0"], "s3": ["e1-1"]})
    assert dups == {"e1-1": ["s1", "s2", "s3"]}
    assert duplicate_clips({"s1": ["a", "a"], "s2": ["b"]}) == {}


def _construct(model: Any, **fields: Any) -> Any:
    """Only the fields `split_covered` reads (no validation)."""
    return model.model_construct(**fields)


def cut(episode_id: str, clips: int) -> CutEpisode:
    return CutEpisode(
        _construct(EpisodeRef, episode_id=episode_id),
        "v1",
        [SpooledClip(episode_id, i, {}, []) for i in range(clips)],
    )


def event(*clips: tuple[str, int]) -> ShardsWritten:
    records = [_construct(ClipRecord, episode_id=e, clip_index=i) for e, i in clips]
    written: ShardsWritten = _construct(ShardsWritten, clips=records)
    return written


def test_an_unmarked_episode_held_whole_by_a_replayed_shard_is_not_packed_again() -> None:
    replayed = [event(("e1", 0), ("e1", 1), ("e2", 0), ("e2", 1))]  # e1's marker, e2 had none
    todo, covered = split_covered([cut("e2", 2), cut("e3", 1)], replayed)
    assert [c.episode.episode_id for c in todo] == ["e3"]
    assert list(covered) == ["e2"] and covered["e2"] == replayed


def test_an_episode_only_partly_in_replayed_shards_is_packed_again() -> None:
    replayed = [event(("e1", 0), ("e2", 0))]  # e2's second clip went to a shard never written
    todo, covered = split_covered([cut("e2", 2)], replayed)
    assert [c.episode.episode_id for c in todo] == ["e2"] and covered == {}
