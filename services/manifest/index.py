"""The reverse-lineage index: which manifests hold an episode (docs/warehouse.md "Reverse
lineage").

A manifest's members (services/manifest/members.py) go into their own partition of
`manifest_members`, in a background thread while the build writes the file: COPY (ADBC bulk
ingest) into a fresh table, one sorted `CREATE INDEX` on the episode, a CHECK matching the
partition bound. The manifest's id is its file's hash, known only once the file is written, so
the partition is attached, and the `manifests` and `indexed_manifests` rows written, in the
same transaction afterwards: a manifest is recorded with its members or not at all. Manifests
built before the index (or elsewhere) are indexed from their file: `index_manifest_file`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import adbc_driver_postgresql.dbapi as adbc
import numpy as np
import pyarrow as pa
from sqlalchemy import Engine, select, update

from services.common.objectstore import ObjectStore
from services.manifest.load import layer_versions, load_manifest, manifest_metadata
from services.manifest.members import members_of_manifest, popcounts
from services.metadata.warehouse import indexed_manifests, manifests

MANIFEST_ID = re.compile(r"[0-9a-f]{64}")


class FamilyConflictError(ValueError):
    """A manifest already belongs to another family (a family is set once: it is history)."""


def partition_name(manifest_no: int) -> str:
    return f"manifest_members_{int(manifest_no)}"


@dataclass(frozen=True)
class ManifestRecord:
    """The `manifests` row of a stored file."""

    manifest_id: str
    object_key: str
    query: str
    params: list[object]
    rows: int
    size_bytes: int
    layers: dict[str, str] = field(default_factory=dict)  # pinned, resolved (manifests.layers)


@dataclass(frozen=True)
class IndexFacts:
    """What the `indexed_manifests` row says beside the members."""

    family: str | None
    pipeline_version: str
    layer_versions: dict[str, str]
    source: Literal["build", "file"]


@dataclass(frozen=True)
class Indexed:
    manifest_no: int
    episodes: int
    clips: int
    new: bool  # False: the manifest was indexed before (its members were left as they were)


class MemberCopy:
    """A manifest's members written into a fresh partition in a background thread, on one ADBC
    connection whose transaction `commit` finishes (or `abort` rolls back).

    `members` runs in the thread too (the bitmaps are numpy work that releases the GIL), so the
    build's explode and write go on meanwhile.
    """

    def __init__(self, database_url: str, members: Callable[[], pa.Table]) -> None:
        self._conn = adbc.connect(database_url)  # autocommit off: one transaction
        self._error: BaseException | None = None
        self.manifest_no = 0
        self.episodes = 0
        self.clips = 0
        self._thread = threading.Thread(
            target=self._run, args=(members,), name="egoline-members", daemon=True
        )
        self._thread.start()

    def _run(self, members: Callable[[], pa.Table]) -> None:
        try:
            with self._conn.cursor() as cur:
                cur.execute(
                    "SELECT nextval(pg_get_serial_sequence('indexed_manifests', 'manifest_no'))"
                )
                found = cur.fetchone()
                assert found is not None
                number = int(found[0])
                table = members()
                name = partition_name(number)
                data = pa.table(
                    {
                        "manifest_no": pa.array(np.full(table.num_rows, number, dtype=np.int32)),
                        "episode_id": table.column("episode_id"),
                        "split": table.column("split"),
                        "clips": table.column("clips"),
                    }
                )
                cur.execute(f"CREATE TABLE {name} (LIKE manifest_members)")
                cur.adbc_ingest(name, data, mode="append")
                cur.execute(f"CREATE INDEX {name}_episode ON {name} (episode_id)")
                # Matches the partition bound, so ATTACH needs no scan to validate it.
                cur.execute(
                    f"ALTER TABLE {name} ADD CONSTRAINT {name}_bound "
                    f"CHECK (manifest_no IS NOT NULL AND manifest_no = {number})"
                )
                self.episodes = table.num_rows
                self.clips = int(popcounts(table.column("clips")).sum())
                self.manifest_no = number
        except BaseException as exc:  # re-raised in the caller's thread by `commit`
            self._error = exc

    def commit(self, record: ManifestRecord, facts: IndexFacts) -> Indexed:
        """Record the manifest (its `manifests` row unless there) and, unless it was indexed
        before, its `indexed_manifests` row and partition, in one transaction."""
        self._thread.join()
        try:
            if self._error is not None:
                raise self._error
            with self._conn.cursor() as cur:
                # Two builds of the same manifest at once: the second waits for the first's
                # commit here, then finds it indexed.
                cur.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 19))",
                    (record.manifest_id,),
                )
                cur.fetchall()
                cur.execute(
                    "INSERT INTO manifests (manifest_id, object_key, query, params, row_count,"
                    " size_bytes, layers) VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7::jsonb)"
                    " ON CONFLICT (manifest_id) DO NOTHING",
                    (
                        record.manifest_id,
                        record.object_key,
                        record.query,
                        json.dumps(record.params, default=str),
                        record.rows,
                        record.size_bytes,
                        json.dumps(record.layers, sort_keys=True),
                    ),
                )
                cur.execute(
                    "SELECT manifest_no, episode_count, clip_count FROM indexed_manifests"
                    " WHERE manifest_id = $1",
                    (record.manifest_id,),
                )
                before = cur.fetchone()
                if before is not None:  # same file indexed before: its rows are the same
                    self._conn.rollback()
                    return Indexed(int(before[0]), int(before[1]), int(before[2]), new=False)
                cur.execute(
                    "INSERT INTO indexed_manifests (manifest_no, manifest_id, family,"
                    " pipeline_version, layer_versions, episode_count, clip_count, source)"
                    " VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8)",
                    (
                        self.manifest_no,
                        record.manifest_id,
                        facts.family,
                        facts.pipeline_version,
                        json.dumps(facts.layer_versions, sort_keys=True),
                        self.episodes,
                        self.clips,
                        facts.source,
                    ),
                )
                cur.execute(
                    f"ALTER TABLE manifest_members ATTACH PARTITION "
                    f"{partition_name(self.manifest_no)} FOR VALUES IN ({self.manifest_no})"
                )
            self._conn.commit()
            return Indexed(self.manifest_no, self.episodes, self.clips, new=True)
        finally:
            self._conn.close()

    def abort(self) -> None:
        """Roll back (the build failed): no partition, no rows."""
        self._thread.join()
        try:
            self._conn.rollback()
        finally:
            self._conn.close()


def set_family(engine: Engine, manifest_id: str, family: str) -> None:
    """Put an indexed manifest in a family. Raises FamilyConflictError if it is in another."""
    with engine.begin() as conn:
        current = conn.execute(
            select(indexed_manifests.c.family).where(indexed_manifests.c.manifest_id == manifest_id)
        ).one_or_none()
        if current is None:
            raise ValueError(f"manifest {manifest_id} is not indexed")
        if current.family not in (None, family):
            raise FamilyConflictError(
                f"manifest {manifest_id} is in family {current.family!r}, not {family!r}"
            )
        conn.execute(
            update(indexed_manifests)
            .where(indexed_manifests.c.manifest_id == manifest_id)
            .values(family=family)
        )


def manifest_id_of(path: Path) -> str:
    """A manifest file's id: its name when that is `<sha256>.arrow`, else its hash."""
    if MANIFEST_ID.fullmatch(path.stem):
        return path.stem
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_manifest_id(ref: str) -> str:
    """A manifest's id from a local file, an id, or an object key `manifests/<id>.arrow`.
    Raises ValueError when `ref` is none of these."""
    path = Path(ref)
    if path.is_file():
        return manifest_id_of(path)
    name = Path(ref).name.removesuffix(".arrow")
    if MANIFEST_ID.fullmatch(name):
        return name
    raise ValueError(f"{ref!r} is neither a manifest file nor a manifest id or key")


def local_manifest(ref: str, store: ObjectStore, directory: Path) -> Path:
    """A manifest as a local file: `ref` is a path, a manifest id or its object key (fetched
    from the store into `directory`, named by its id)."""
    path = Path(ref)
    if path.exists():
        return path
    key = ref if ref.startswith("manifests/") else f"manifests/{ref}"
    key = key if key.endswith(".arrow") else f"{key}.arrow"
    local = directory / Path(key).name
    if not local.exists():
        local.parent.mkdir(parents=True, exist_ok=True)
        store.download(key, local)
    return local


def index_manifest_file(
    database_url: str,
    engine: Engine,
    store: ObjectStore,
    path: Path,
    family: str | None = None,
) -> tuple[str, Indexed]:
    """Index a manifest from its file (built before the index, or elsewhere): its members, and
    its `manifests` row if the warehouse lacks it (the file is then stored under its id too).
    Idempotent; `family` is set when given."""
    manifest_id = manifest_id_of(path)
    key = f"manifests/{manifest_id}.arrow"
    table = load_manifest(path)
    meta = manifest_metadata(table)
    versions = sorted({str(v) for v in table.column("pipeline_version").unique().to_pylist()})
    with engine.connect() as conn:
        known = conn.execute(
            select(manifests.c.object_key).where(manifests.c.manifest_id == manifest_id)
        ).one_or_none()
    if known is None and not store.exists(key):
        store.put_file(key, path, content_type="application/vnd.apache.arrow.file")
    record = ManifestRecord(
        manifest_id=manifest_id,
        object_key=known.object_key if known is not None else key,
        query=str(meta.get("query", "")),
        params=[],
        rows=table.num_rows,
        size_bytes=path.stat().st_size,
        layers=layer_versions(table.schema.metadata),
    )
    facts = IndexFacts(
        family=family,
        pipeline_version=",".join(versions),
        layer_versions=layer_versions(table.schema.metadata),
        source="file",
    )
    indexed = MemberCopy(database_url, lambda: members_of_manifest(table)).commit(record, facts)
    if family is not None and not indexed.new:
        set_family(engine, manifest_id, family)
    return manifest_id, indexed


def unindexed_manifests(engine: Engine) -> list[dict[str, Any]]:
    """Manifests recorded in the warehouse without members (built before the index)."""
    query = (
        select(manifests.c.manifest_id, manifests.c.object_key, manifests.c.created_at)
        .outerjoin(indexed_manifests, indexed_manifests.c.manifest_id == manifests.c.manifest_id)
        .where(indexed_manifests.c.manifest_no.is_(None))
        .order_by(manifests.c.created_at)
    )
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(query)]
