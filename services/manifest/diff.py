"""What changed between two manifests (pure: two Arrow tables in, counts and ids out).

Episodes are matched by id; a clip is (episode, clip index) under the manifest's pipeline
version, so an episode re-cut under another version has all its clips removed and added. Split
counts are per side; an episode whose split differs between the two is listed apart (splits
never move in one warehouse: a move means the manifests come from different split settings,
which the held-out check cares about). Layer versions come from each file's schema metadata
(`services.manifest.load.layer_versions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from services.manifest.load import layer_versions
from services.manifest.members import members_of_manifest, popcounts


@dataclass(frozen=True)
class SplitCounts:
    episodes_a: int
    episodes_b: int
    clips_a: int
    clips_b: int


@dataclass(frozen=True)
class ManifestDiff:
    episodes_a: int
    episodes_b: int
    clips_a: int
    clips_b: int
    episodes_added: list[str]
    episodes_removed: list[str]
    episodes_changed: list[str]  # in both, with other clips or another pipeline version
    episodes_moved_split: list[str]  # in both, under another split
    clips_added: int
    clips_removed: int
    layers_changed: dict[str, tuple[str | None, str | None]]  # kind -> (A's, B's); None: absent
    splits: dict[str, SplitCounts] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return not (
            self.episodes_added
            or self.episodes_removed
            or self.episodes_changed
            or self.episodes_moved_split
            or self.layers_changed
        )

    def summary(self, limit: int | None = 20) -> dict[str, Any]:
        """Counts, and up to `limit` ids of each list (None: every id)."""

        def ids(values: list[str]) -> list[str]:
            return values if limit is None else values[:limit]

        return {
            "identical": self.identical,
            "episodes_a": self.episodes_a,
            "episodes_b": self.episodes_b,
            "clips_a": self.clips_a,
            "clips_b": self.clips_b,
            "episodes_added": len(self.episodes_added),
            "episodes_removed": len(self.episodes_removed),
            "episodes_changed": len(self.episodes_changed),
            "episodes_moved_split": len(self.episodes_moved_split),
            "clips_added": self.clips_added,
            "clips_removed": self.clips_removed,
            "layers_changed": {k: list(v) for k, v in self.layers_changed.items()},
            "splits": {name: vars(counts) for name, counts in self.splits.items()},
            "added_ids": ids(self.episodes_added),
            "removed_ids": ids(self.episodes_removed),
            "changed_ids": ids(self.episodes_changed),
            "moved_split_ids": ids(self.episodes_moved_split),
        }


def _popcount(value: bytes) -> int:
    return int.from_bytes(value, "little").bit_count()


def _split_counts(members: pa.Table, clips: np.ndarray[Any, Any]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    splits = members.column("split").to_numpy(zero_copy_only=False)
    for name in sorted(set(splits.tolist())):
        mask = splits == name
        out[str(name)] = (int(mask.sum()), int(clips[mask].sum()))
    return out


def diff_manifests(a: pa.Table, b: pa.Table) -> ManifestDiff:
    """B against A: what B adds, what it drops, what it holds otherwise."""
    members_a, members_b = members_of_manifest(a), members_of_manifest(b)
    clips_a, clips_b = popcounts(members_a.column("clips")), popcounts(members_b.column("clips"))
    ids_a, ids_b = members_a.column("episode_id"), members_b.column("episode_id")
    in_b = pc.is_in(ids_a, value_set=ids_b.combine_chunks()).to_numpy(zero_copy_only=False)
    in_a = pc.is_in(ids_b, value_set=ids_a.combine_chunks()).to_numpy(zero_copy_only=False)
    removed = ids_a.filter(pa.array(~in_b)).to_pylist()
    added = ids_b.filter(pa.array(~in_a)).to_pylist()
    # Both are sorted by id, so the episodes they share line up.
    both_a, both_b = members_a.filter(pa.array(in_b)), members_b.filter(pa.array(in_a))
    clips_added = int(clips_b[~in_a].sum())
    clips_removed = int(clips_a[~in_b].sum())
    same_version = pc.equal(both_a.column("pipeline_version"), both_b.column("pipeline_version"))
    same_clips = pc.and_(pc.equal(both_a.column("clips"), both_b.column("clips")), same_version)
    changed: list[str] = []
    for index in np.flatnonzero(~same_clips.to_numpy(zero_copy_only=False)):
        i = int(index)
        episode = str(both_a.column("episode_id")[i].as_py())
        old = int.from_bytes(both_a.column("clips")[i].as_py(), "little")
        new = int.from_bytes(both_b.column("clips")[i].as_py(), "little")
        if not same_version[i].as_py():  # other cuts: every clip is another clip
            clips_removed += old.bit_count()
            clips_added += new.bit_count()
        else:
            clips_removed += (old & ~new).bit_count()
            clips_added += (new & ~old).bit_count()
        changed.append(episode)
    moved_mask = pc.invert(pc.equal(both_a.column("split"), both_b.column("split")))
    moved = both_a.column("episode_id").filter(moved_mask).to_pylist()
    layers_a, layers_b = layer_versions(a.schema.metadata), layer_versions(b.schema.metadata)
    layers_changed = {
        kind: (layers_a.get(kind), layers_b.get(kind))
        for kind in sorted(set(layers_a) | set(layers_b))
        if layers_a.get(kind) != layers_b.get(kind)
    }
    counts_a, counts_b = _split_counts(members_a, clips_a), _split_counts(members_b, clips_b)
    splits = {
        name: SplitCounts(
            episodes_a=counts_a.get(name, (0, 0))[0],
            episodes_b=counts_b.get(name, (0, 0))[0],
            clips_a=counts_a.get(name, (0, 0))[1],
            clips_b=counts_b.get(name, (0, 0))[1],
        )
        for name in sorted(set(counts_a) | set(counts_b))
    }
    return ManifestDiff(
        episodes_a=members_a.num_rows,
        episodes_b=members_b.num_rows,
        clips_a=int(clips_a.sum()),
        clips_b=int(clips_b.sum()),
        episodes_added=[str(e) for e in added],
        episodes_removed=[str(e) for e in removed],
        episodes_changed=changed,
        episodes_moved_split=[str(e) for e in moved],
        clips_added=clips_added,
        clips_removed=clips_removed,
        layers_changed=layers_changed,
        splits=splits,
    )
