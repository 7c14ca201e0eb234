"""Build a manifest: fetch the episode rows in one snapshot (services/manifest/snapshot.py),
explode them into clip rows (services/manifest/explode.py), write the Arrow IPC file named by
its sha256 (services/manifest/write.py), store it, record it in the warehouse.

This module is the orchestration and the two effects that publish a manifest (object store,
`manifests` row); the steps are pure or I/O of their own in the modules above.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.dialects.postgresql import insert

from services.common.objectstore import ObjectStore
from services.manifest.explode import Exploder
from services.manifest.query import ManifestFilter, build_query
from services.manifest.snapshot import Progress, fetch_episodes
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
    query_s: float  # query + transfer into Arrow
    explode_s: float  # episode-level dictionaries and the clip -> episode index
    write_s: float  # clip rows exploded batch by batch, IPC write, sha256
    publish_s: float  # upload to the object store + warehouse row
    layers: dict[str, str]  # the layer versions pinned, resolved (kind -> version)


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


def build_manifest(
    database_url: str,
    engine: Engine,
    store: ObjectStore,
    flt: ManifestFilter,
    out_dir: Path,
    progress: Progress | None = None,
    parallel: int = 2,
) -> BuiltManifest:
    """Fetch, explode, write, store and record the manifest of `flt`; the local file stays in
    `out_dir` as `<sha256>.arrow`. Layer versions given as `latest` are resolved first: the
    file and its `manifests` row name the concrete ones."""
    flt = resolve_layers(engine, flt)
    sql, params = build_query(flt)
    started = time.perf_counter()
    episodes = fetch_episodes(database_url, flt, progress, parallel)
    fetched = time.perf_counter()
    exploder = Exploder(episodes)
    schema = exploder.schema.with_metadata(schema_metadata(flt, sql))
    exploded = time.perf_counter()
    staging = out_dir / "manifest.arrow.partial"
    manifest_id = write_batches(schema, exploder.batches(reuse=True), staging)
    rows = exploder.rows
    del exploder, episodes
    final = out_dir / f"{manifest_id}.arrow"
    staging.replace(final)
    written = time.perf_counter()
    key = f"manifests/{manifest_id}.arrow"
    size = final.stat().st_size
    if not store.exists(key):
        store.put_file(key, final, content_type="application/vnd.apache.arrow.file")
    record_manifest(engine, manifest_id, key, sql, params, rows, size, flt.layers)
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
    )
