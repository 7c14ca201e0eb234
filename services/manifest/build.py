"""Build a manifest: fetch the episode rows in one snapshot (services/manifest/snapshot.py),
explode them into clip rows (services/manifest/explode.py), write the Arrow IPC file named by
its sha256 (services/manifest/write.py), store it, record it in the warehouse with its members
(services/manifest/index.py: COPYed in a background thread while the file is written).

This module is the orchestration and the two effects that publish a manifest (object store,
`manifests` row); the steps are pure or I/O of their own in the modules above.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa
from sqlalchemy import Engine, select
from sqlalchemy.dialects.postgresql import insert

from services.common.objectstore import ObjectStore
from services.manifest.explode import Exploder
from services.manifest.index import Indexed, IndexFacts, ManifestRecord, MemberCopy, set_family
from services.manifest.members import members_of_episodes
from services.manifest.query import ManifestFilter, build_query
from services.manifest.snapshot import Bodies, Progress, Snapshot
from services.manifest.write import schema_metadata, write_batches
from services.metadata.layers import resolve_versions
from services.metadata.warehouse import layer_versions, manifests


@dataclass(frozen=True)
class BuiltManifest:
    manifest_id: str  # sha256 of the file bytes
    object_key: str
    local_path: Path
    rows: int
    size_bytes: int
    query_s: float  # the heads pass: query + transfer into Arrow
    explode_s: float  # (0: the explode runs inside the stream, in write_s)
    write_s: float  # bodies streamed, exploded batch by batch, IPC write, sha256 (overlapped)
    publish_s: float  # upload to the object store + warehouse rows (+ waiting for the members)
    layers: dict[str, str]  # the layer versions pinned, resolved (kind -> version)
    indexed: Indexed | None = None  # its members in the reverse-lineage index (None: not asked)
    index_s: float = 0.0  # of publish_s: waiting for the members' COPY and committing them


def record_manifest(
    engine: Engine,
    manifest_id: str,
    key: str,
    sql: str,
    params: list[object],
    rows: int,
    size: int,
    layers: dict[str, str] | None = None,
) -> None:
    """The warehouse's `manifests` row for a stored file (idempotent: same id, same row), with
    the layer versions it pinned."""
    with engine.begin() as conn:
        conn.execute(
            insert(manifests)
            .values(
                manifest_id=manifest_id,
                object_key=key,
                query=sql,
                params=json.loads(json.dumps(params, default=str)),
                row_count=rows,
                size_bytes=size,
                layers=layers or {},
            )
            .on_conflict_do_nothing()
        )


def resolve_layers(engine: Engine, flt: ManifestFilter) -> ManifestFilter:
    """The filter with every requested layer version concrete (`latest`: the kind's last
    ingested version, now). Raises ValueError for an unknown kind or version."""
    if not flt.layers:
        return flt
    known: dict[str, list[str]] = {}
    with engine.connect() as conn:
        for kind, version in conn.execute(
            select(layer_versions.c.kind, layer_versions.c.version)
            .where(layer_versions.c.kind.in_(sorted(flt.layers)))
            .order_by(layer_versions.c.seq)
        ):
            known.setdefault(str(kind), []).append(str(version))
    return flt.model_copy(update={"layers": resolve_versions(flt.layers, known)})


def _members(heads: pa.Table, exploder: Exploder) -> pa.Table:
    """The manifest's members (run in the indexing thread: numpy work, the GIL released)."""
    return members_of_episodes(heads, exploder.parent, exploder.clip_index)


def _reporting(
    bodies: Iterator[pa.RecordBatch], exploder: Exploder, progress: Progress | None
) -> Iterator[pa.RecordBatch]:
    for body in bodies:
        yield body
        if progress is not None:
            done = exploder.episodes_seen
            progress(done, int(exploder.episode_rows[done]))


def _stream(
    heads: pa.Table,
    bodies: Bodies,
    staging: Path,
    metadata: dict[bytes, bytes],
    progress: Progress | None,
) -> tuple[str, Exploder]:
    """Stream the bodies through the explode into the file."""
    exploder = Exploder(heads)
    try:
        batches = exploder.batches(_reporting(iter(bodies), exploder, progress))
        return write_batches(batches, staging, metadata), exploder
    finally:
        bodies.close()


def build_manifest(
    database_url: str,
    engine: Engine,
    store: ObjectStore,
    flt: ManifestFilter,
    out_dir: Path,
    progress: Progress | None = None,
    parallel: int = 2,
    *,
    family: str | None = None,
    index: bool = True,
) -> BuiltManifest:
    """Fetch, explode, write, store and record the manifest of `flt`; the local file stays in
    `out_dir` as `<sha256>.arrow`. Layer versions given as `latest` are resolved first: the
    file and its `manifests` row name the concrete ones. With `index` (the default) its
    members go into the reverse-lineage index in the transaction that records it; `family`
    puts it in a family (FamilyConflictError if it is in another one already).

    Two passes over the query's rows in one snapshot: the heads (the strings whose dictionaries
    open the file), then the bodies streamed through the explode into the file as they arrive.
    """
    if family is not None and not index:
        raise ValueError("a family needs the index (the held-out check reads members)")
    flt = resolve_layers(engine, flt)
    sql, params = build_query(flt)
    metadata = schema_metadata(flt, sql)
    staging = out_dir / "manifest.arrow.partial"
    started = time.perf_counter()
    with Snapshot(database_url, flt, parallel) as snapshot:
        bodies = snapshot.bodies()  # read from now on, while the heads come
        try:
            heads = snapshot.heads()
        except BaseException:
            bodies.close()
            raise
        fetched = time.perf_counter()
        manifest_id, exploder = _stream(heads, bodies, staging, metadata, progress)
    exploded = fetched  # the explode runs inside the stream (write_s)
    members: MemberCopy | None = None
    if index:
        members = MemberCopy(database_url, partial(_members, heads, exploder))
    rows = exploder.rows
    final = out_dir / f"{manifest_id}.arrow"
    staging.replace(final)
    written = time.perf_counter()
    key = f"manifests/{manifest_id}.arrow"
    size = final.stat().st_size
    try:
        if not store.exists(key):
            store.put_file(key, final, content_type="application/vnd.apache.arrow.file")
    except BaseException:
        if members is not None:
            members.abort()
        raise
    indexed: Indexed | None = None
    index_s = 0.0
    if members is None:
        record_manifest(engine, manifest_id, key, sql, params, rows, size, flt.layers)
    else:
        record = ManifestRecord(manifest_id, key, sql, params, rows, size, dict(flt.layers))
        facts = IndexFacts(
            family=family,
            pipeline_version=flt.pipeline_version,
            layer_versions=dict(flt.layers),
            source="build",
        )
        committing = time.perf_counter()
        indexed = members.commit(record, facts)
        index_s = time.perf_counter() - committing
        if family is not None and not indexed.new:
            set_family(engine, manifest_id, family)
    return BuiltManifest(
        manifest_id,
        key,
        final,
        rows,
        size,
        query_s=fetched - started,
        explode_s=exploded - fetched,
        write_s=written - exploded,
        publish_s=time.perf_counter() - written,
        layers=dict(flt.layers),
        indexed=indexed,
        index_s=index_s,
    )
