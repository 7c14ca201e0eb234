"""`egoline manifest check`: the held-out rules (services/manifest/heldout.py) over the
reverse-lineage index. Reads only the warehouse: each manifest's members with the split it gave
them, the episodes' grouping key from `episodes` (an episode the warehouse does not know is a
group of its own, `episode:<id>`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import ColumnElement, Engine, String, cast, distinct, func, literal_column, select

from services.manifest.heldout import (
    EVAL,
    DroppedEval,
    EarlierEval,
    GroupUse,
    Leak,
    find_dropped_eval,
    find_leaks,
)
from services.metadata.warehouse import episodes, indexed_manifests, manifest_members, manifests


class NotIndexedError(ValueError):
    """The manifest has no members in the index."""


@dataclass(frozen=True)
class HeldoutReport:
    manifest_id: str
    family: str | None
    key: str
    family_manifests: list[str]  # oldest first, M included
    earlier_manifests: list[str]
    leaks: list[Leak] = field(default_factory=list)
    dropped_eval: list[DroppedEval] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.leaks and not self.dropped_eval


def _group(key: Literal["session", "device"]) -> ColumnElement[str]:
    column = episodes.c.session_id if key == "session" else episodes.c.device_id
    # A constant, rendered inline: a bound one would differ between SELECT and GROUP BY.
    unknown = literal_column("'episode:'", String) + manifest_members.c.episode_id
    return func.coalesce(column, unknown)


def check_heldout(
    engine: Engine, manifest_id: str, key: Literal["session", "device"]
) -> HeldoutReport:
    """Both rules for one indexed manifest against its family. Raises NotIndexedError."""
    with engine.connect() as conn:
        target = conn.execute(
            select(indexed_manifests.c.manifest_no, indexed_manifests.c.family).where(
                indexed_manifests.c.manifest_id == manifest_id
            )
        ).one_or_none()
        if target is None:
            raise NotIndexedError(
                f"manifest {manifest_id} is not indexed: `egoline manifest index {manifest_id}`"
            )
        family_rows = (
            list(
                conn.execute(
                    select(indexed_manifests.c.manifest_no, indexed_manifests.c.manifest_id)
                    .join(manifests, manifests.c.manifest_id == indexed_manifests.c.manifest_id)
                    .where(indexed_manifests.c.family == target.family)
                    .order_by(manifests.c.created_at, indexed_manifests.c.manifest_no)
                )
            )
            if target.family is not None
            else [(target.manifest_no, manifest_id)]
        )
        numbers = [int(row[0]) for row in family_rows]
        position = numbers.index(int(target.manifest_no))
        earlier = numbers[:position]
        group = _group(key).label("grp")
        members = manifest_members.outerjoin(
            episodes, episodes.c.episode_id == manifest_members.c.episode_id
        )
        target_groups = (
            select(_group(key))
            .select_from(members)
            .where(manifest_members.c.manifest_no == target.manifest_no)
            .distinct()
        )
        uses = [
            GroupUse(row.grp, row.split, tuple(row.manifests))
            for row in conn.execute(
                select(
                    group,
                    manifest_members.c.split,
                    func.array_agg(distinct(indexed_manifests.c.manifest_id)).label("manifests"),
                )
                .select_from(
                    members.join(
                        indexed_manifests,
                        indexed_manifests.c.manifest_no == manifest_members.c.manifest_no,
                    )
                )
                .where(
                    manifest_members.c.manifest_no.in_(numbers),
                    _group(key).in_(target_groups),
                )
                .group_by(_group(key), manifest_members.c.split)
            )
        ]
        target_eval = {
            str(row[0])
            for row in conn.execute(
                select(manifest_members.c.episode_id).where(
                    manifest_members.c.manifest_no == target.manifest_no,
                    manifest_members.c.split == EVAL,
                )
            )
        }
        earlier_eval = (
            [
                EarlierEval(row.episode_id, row.grp, tuple(row.manifests))
                for row in conn.execute(
                    select(
                        manifest_members.c.episode_id,
                        group,
                        func.array_agg(cast(indexed_manifests.c.manifest_id, String)).label(
                            "manifests"
                        ),
                    )
                    .select_from(
                        members.join(
                            indexed_manifests,
                            indexed_manifests.c.manifest_no == manifest_members.c.manifest_no,
                        )
                    )
                    .where(
                        manifest_members.c.manifest_no.in_(earlier),
                        manifest_members.c.split == EVAL,
                    )
                    .group_by(manifest_members.c.episode_id, _group(key))
                )
            ]
            if earlier
            else []
        )
    ids = [str(row[1]) for row in family_rows]
    return HeldoutReport(
        manifest_id=manifest_id,
        family=target.family,
        key=key,
        family_manifests=ids,
        earlier_manifests=ids[:position],
        leaks=find_leaks(manifest_id, uses),
        dropped_eval=find_dropped_eval(target_eval, earlier_eval),
    )
