"""Training runs and the manifests they read (`egoline runs register`, or the reader given a
run name), and the reverse lineage of an episode: the manifests that hold it and the runs that
read them (`egoline lineage --episode ID --used-by`; docs/warehouse.md "Reverse lineage")."""

from __future__ import annotations

import getpass
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.dialects.postgresql import insert

from services.manifest.members import bitmap_indexes
from services.metadata.warehouse import (
    indexed_manifests,
    manifest_members,
    manifests,
    training_runs,
)


class UnknownManifestError(ValueError):
    """A run names a manifest the warehouse has no record of."""


@dataclass(frozen=True)
class Run:
    run_name: str
    manifest_id: str
    registered_at: datetime
    host: str
    username: str
    note: str


@dataclass(frozen=True)
class ManifestUse:
    """One manifest holding the episode: which clips, under which split and layer versions."""

    manifest_id: str
    object_key: str
    created_at: datetime
    family: str | None
    pipeline_version: str
    layer_versions: dict[str, str]
    split: str
    clip_indexes: list[int]
    runs: list[str]


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers) and no USER variable
        return "unknown"


def register_run(
    engine: Engine,
    run_name: str,
    manifest_id: str,
    note: str = "",
    host: str | None = None,
    username: str | None = None,
) -> bool:
    """Record that run `run_name` reads manifest `manifest_id` (idempotent: the first
    registration is kept; True when this one is new). Raises UnknownManifestError when the
    warehouse has no such manifest, ValueError on an empty run name."""
    if not run_name.strip():
        raise ValueError("a run needs a name")
    with engine.begin() as conn:
        known = conn.execute(
            select(manifests.c.manifest_id).where(manifests.c.manifest_id == manifest_id)
        ).one_or_none()
        if known is None:
            raise UnknownManifestError(
                f"manifest {manifest_id} is not in the warehouse: build it with `egoline manifest"
                " build`, or record the file with `egoline manifest index FILE`"
            )
        result = conn.execute(
            insert(training_runs)
            .values(
                run_name=run_name,
                manifest_id=manifest_id,
                host=host or socket.gethostname(),
                username=username or _current_user(),
                note=note,
            )
            .on_conflict_do_nothing()
        )
        return bool(result.rowcount)


def list_runs(engine: Engine, run_name: str | None = None) -> list[Run]:
    query = select(training_runs).order_by(
        training_runs.c.registered_at, training_runs.c.run_name, training_runs.c.manifest_id
    )
    if run_name is not None:
        query = query.where(training_runs.c.run_name == run_name)
    with engine.connect() as conn:
        return [Run(**row._mapping) for row in conn.execute(query)]


def used_by(engine: Engine, episode_id: str) -> tuple[list[ManifestUse], list[Run]]:
    """Every indexed manifest holding the episode (oldest first) and the runs that read them:
    one lookup of each manifest partition's episode index, then the runs by manifest."""
    members = (
        select(
            indexed_manifests.c.manifest_id,
            manifests.c.object_key,
            manifests.c.created_at,
            indexed_manifests.c.family,
            indexed_manifests.c.pipeline_version,
            indexed_manifests.c.layer_versions,
            manifest_members.c.split,
            manifest_members.c.clips,
        )
        .select_from(manifest_members)
        .join(indexed_manifests, indexed_manifests.c.manifest_no == manifest_members.c.manifest_no)
        .join(manifests, manifests.c.manifest_id == indexed_manifests.c.manifest_id)
        .where(manifest_members.c.episode_id == episode_id)
        .order_by(manifests.c.created_at, indexed_manifests.c.manifest_id)
    )
    with engine.connect() as conn:
        rows: list[Any] = list(conn.execute(members))
        ids = [row.manifest_id for row in rows]
        runs = (
            [
                Run(**row._mapping)
                for row in conn.execute(
                    select(training_runs)
                    .where(training_runs.c.manifest_id.in_(ids))
                    .order_by(training_runs.c.registered_at, training_runs.c.run_name)
                )
            ]
            if ids
            else []
        )
    by_manifest: dict[str, list[str]] = {}
    for run in runs:
        by_manifest.setdefault(run.manifest_id, []).append(run.run_name)
    uses = [
        ManifestUse(
            manifest_id=row.manifest_id,
            object_key=row.object_key,
            created_at=row.created_at,
            family=row.family,
            pipeline_version=row.pipeline_version,
            layer_versions=dict(row.layer_versions),
            split=row.split,
            clip_indexes=bitmap_indexes(bytes(row.clips)),
            runs=by_manifest.get(row.manifest_id, []),
        )
        for row in rows
    ]
    return uses, runs
