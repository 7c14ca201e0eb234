"""Shards no warehouse row points to: find them from the object store, count the clips stored
twice, and delete what nothing references (`egoline gc shards`).

Why they exist: the shard stage writes its shards, then the episodes' markers, then publishes
the events. A stage killed between the first and the last step is redelivered its episodes and
packs them again, possibly with other episodes, into shards with other content (so other keys);
the warehouse then points every clip at one shard and the first one is orphaned. Nothing reads
it, but it costs storage and makes "every clip is stored once" untrue until it is collected.

The audit is counted from outside the warehouse's keys: every `.index.json` under
`shards/<pipeline version>/` is read from the object store, and a clip is a duplicate when it is
listed by more than one shard whose tar exists. The core below is pure (listings in, plans out).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Engine, delete, exists, select

from services.common.objectstore import ListedObject, ObjectStore
from services.metadata.warehouse import clips, shards

TAR = ".tar"
INDEX = ".index.json"


@dataclass(frozen=True)
class StoredShard:
    """One shard as the object store has it: its tar and/or its index."""

    shard_key: str  # the .tar key
    index_key: str
    tar: ListedObject | None
    index: ListedObject | None

    @property
    def last_modified(self) -> datetime:
        times = [o.last_modified for o in (self.tar, self.index) if o is not None]
        return max(times)

    @property
    def size_bytes(self) -> int:
        return sum(o.size for o in (self.tar, self.index) if o is not None)


@dataclass(frozen=True)
class GcPlan:
    delete: list[StoredShard]  # unreferenced and older than the threshold
    too_young: list[StoredShard]  # unreferenced, but maybe not yet catalogued
    referenced: int

    @property
    def delete_keys(self) -> list[str]:
        return [o.key for s in self.delete for o in (s.tar, s.index) if o is not None]

    @property
    def delete_bytes(self) -> int:
        return sum(s.size_bytes for s in self.delete)


@dataclass
class ShardAudit:
    shards: int = 0  # shard tars in the store
    unreferenced_shards: int = 0  # tars (or lone indexes) no clip row points to
    duplicate_clips_in_shards: int = 0  # clips listed by more than one stored shard
    unreferenced_bytes: int = 0
    examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "shards": self.shards,
            "unreferenced_shards": self.unreferenced_shards,
            "duplicate_clips_in_shards": self.duplicate_clips_in_shards,
            "unreferenced_bytes": self.unreferenced_bytes,
            "examples": self.examples[:5],
        }


def shard_prefix(pipeline_version: str) -> str:
    return f"shards/{pipeline_version}/"


def group_shards(listed: Iterable[ListedObject]) -> list[StoredShard]:
    """Pair each shard's `.tar` and `.index.json` (episode markers are not shards)."""
    tars: dict[str, ListedObject] = {}
    indexes: dict[str, ListedObject] = {}
    for obj in listed:
        if "/episodes/" in obj.key:
            continue
        if obj.key.endswith(INDEX):
            indexes[obj.key[: -len(INDEX)]] = obj
        elif obj.key.endswith(TAR):
            tars[obj.key[: -len(TAR)]] = obj
    return [
        StoredShard(base + TAR, base + INDEX, tars.get(base), indexes.get(base))
        for base in sorted(tars.keys() | indexes.keys())
    ]


def plan_gc(
    stored: Iterable[StoredShard], referenced: set[str], now: datetime, min_age: timedelta
) -> GcPlan:
    """Unreferenced shards older than `min_age` go; younger ones may be a shard whose event the
    metadata service has not applied yet, so they stay."""
    delete_, young, kept = [], [], 0
    for shard in stored:
        if shard.shard_key in referenced:
            kept += 1
        elif now - shard.last_modified >= min_age:
            delete_.append(shard)
        else:
            young.append(shard)
    return GcPlan(delete_, young, kept)


def duplicate_clips(index_clips: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """clip key -> the shards listing it, for clips listed by more than one shard."""
    where: dict[str, list[str]] = defaultdict(list)
    for shard_key, keys in index_clips.items():
        for key in set(keys):
            where[key].append(shard_key)
    return {k: sorted(v) for k, v in where.items() if len(v) > 1}


# --- I/O ----------------------------------------------------------------------------------
def stored_shards(store: ObjectStore, pipeline_version: str) -> list[StoredShard]:
    return group_shards(store.list_objects(shard_prefix(pipeline_version)))


def referenced_shards(engine: Engine, pipeline_version: str) -> set[str]:
    with engine.connect() as conn:
        return set(
            conn.execute(
                select(clips.c.shard_key)
                .where(clips.c.pipeline_version == pipeline_version)
                .distinct()
            ).scalars()
        )


def read_index_clips(store: ObjectStore, stored: list[StoredShard]) -> dict[str, list[str]]:
    """shard key -> the clip keys its index lists (only shards whose tar exists)."""

    def one(shard: StoredShard) -> tuple[str, list[str]]:
        index = json.loads(store.get_bytes(shard.index_key))
        return shard.shard_key, [str(c["clip_key"]) for c in index.get("clips", [])]

    with_both = [s for s in stored if s.tar is not None and s.index is not None]
    with ThreadPoolExecutor(8) as pool:
        return dict(pool.map(one, with_both))


def audit_shards(engine: Engine, store: ObjectStore, pipeline_version: str) -> ShardAudit:
    stored = stored_shards(store, pipeline_version)
    referenced = referenced_shards(engine, pipeline_version)
    dups = duplicate_clips(read_index_clips(store, stored))
    unreferenced = [s for s in stored if s.shard_key not in referenced]
    return ShardAudit(
        shards=sum(1 for s in stored if s.tar is not None),
        unreferenced_shards=len(unreferenced),
        duplicate_clips_in_shards=len(dups),
        unreferenced_bytes=sum(s.size_bytes for s in unreferenced),
        examples=[s.shard_key for s in unreferenced][:5] + sorted(dups)[:5],
    )


def collect_shards(
    engine: Engine,
    store: ObjectStore,
    pipeline_version: str,
    now: datetime,
    min_age: timedelta,
    apply: bool,
    log: Callable[[str], None] = lambda _m: None,
) -> dict[str, object]:
    """Plan (and with `apply`, do) the deletion of unreferenced shards, then the `shards` rows
    no clip points to. The warehouse is read after the listing, so a shard catalogued in
    between counts as referenced: the race can only keep a shard, never delete a live one."""
    stored = stored_shards(store, pipeline_version)
    plan = plan_gc(stored, referenced_shards(engine, pipeline_version), now, min_age)
    log(
        f"{len(stored)} shards, {plan.referenced} referenced, {len(plan.delete)} to delete "
        f"({plan.delete_bytes / 1e6:.1f} MB), {len(plan.too_young)} unreferenced but younger "
        f"than {min_age}"
    )
    rows = 0
    if apply:
        store.delete_many(plan.delete_keys)
        cutoff = now - min_age
        with engine.begin() as conn:
            rows = conn.execute(
                delete(shards).where(
                    shards.c.pipeline_version == pipeline_version,
                    shards.c.created_at <= cutoff,
                    ~exists().where(clips.c.shard_key == shards.c.shard_key),
                )
            ).rowcount
        log(f"deleted {len(plan.delete)} shards ({len(plan.delete_keys)} objects), {rows} rows")
    return {
        "applied": apply,
        "shards": len(stored),
        "referenced": plan.referenced,
        "unreferenced": len(plan.delete) + len(plan.too_young),
        "deleted_shards": len(plan.delete) if apply else 0,
        "would_delete": [s.shard_key for s in plan.delete][:20],
        "delete_bytes": plan.delete_bytes,
        "too_young": len(plan.too_young),
        "deleted_rows": rows,
    }
