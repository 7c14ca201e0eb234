"""Reverse lineage without a database: clip bitmaps, a manifest's members, the manifest diff
and the held-out rules."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.manifest.diff import diff_manifests
from services.manifest.heldout import (
    EarlierEval,
    GroupUse,
    find_dropped_eval,
    find_leaks,
)
from services.manifest.index import resolve_manifest_id
from services.manifest.load import layer_versions
from services.manifest.members import (
    bitmap_indexes,
    clip_bitmaps,
    members_of_manifest,
    popcounts,
)


@given(st.lists(st.sets(st.integers(min_value=0, max_value=200), max_size=30), max_size=40))
def test_a_bitmap_holds_exactly_its_episodes_clip_indexes(episodes: list[set[int]]) -> None:
    parent = np.repeat(np.arange(len(episodes)), [len(s) for s in episodes])
    # any order within an episode; the dense ones (0..n-1) take the per-episode path
    clip_index = np.array([i for s in episodes for i in sorted(s, reverse=True)], dtype=np.int64)
    bitmaps = clip_bitmaps(parent, clip_index, len(episodes))
    assert [bitmap_indexes(b) for b in bitmaps.to_pylist()] == [sorted(s) for s in episodes]
    assert popcounts(bitmaps).tolist() == [len(s) for s in episodes]
    assert [len(b) for b in bitmaps.to_pylist()] == [max(s) // 8 + 1 if s else 0 for s in episodes]


def test_ten_clips_are_two_bytes_least_significant_bit_first() -> None:
    bitmaps = clip_bitmaps(np.array([0] * 10 + [1, 1]), np.array([*range(10), 0, 9]), 2)
    assert bitmaps.to_pylist() == [b"\xff\x03", b"\x01\x02"]


def test_a_manifest_without_clips_has_no_bitmaps() -> None:
    empty = np.zeros(0, dtype=np.int64)
    assert clip_bitmaps(empty, empty, 0).to_pylist() == []
    assert clip_bitmaps(empty, empty, 2).to_pylist() == [b"", b""]
    assert popcounts(clip_bitmaps(empty, empty, 2)).tolist() == [0, 0]


def test_clips_out_of_episode_order_are_refused() -> None:
    with pytest.raises(ValueError, match="grouped by episode"):
        clip_bitmaps(np.array([1, 0]), np.array([0, 0]), 2)
    with pytest.raises(ValueError, match="negative"):
        clip_bitmaps(np.array([0]), np.array([-1]), 1)


def manifest(
    clips: dict[str, list[int]],
    split: dict[str, str] | None = None,
    version: dict[str, str] | None = None,
    layers: dict[str, str] | None = None,
) -> pa.Table:
    """A manifest's identifying columns (what members, diff and check read), rows shuffled."""
    rows = [
        (episode, index, (split or {}).get(episode, "train"), (version or {}).get(episode, "v1"))
        for episode, indexes in clips.items()
        for index in indexes
    ]
    order = np.random.default_rng(7).permutation(len(rows))
    rows = [rows[i] for i in order]
    table = pa.table(
        {
            "episode_id": pa.array([r[0] for r in rows]).dictionary_encode(),
            "clip_index": pa.array([r[1] for r in rows], type=pa.int32()),
            "split": pa.array([r[2] for r in rows]).dictionary_encode(),
            "pipeline_version": pa.array([r[3] for r in rows]).dictionary_encode(),
        }
    )
    if layers is None:
        return table
    return table.replace_schema_metadata({b"egoline.layers": json.dumps(layers).encode()})


def test_members_of_a_manifest_are_its_episodes_sorted_with_their_clips() -> None:
    members = members_of_manifest(manifest({"ep2": [0, 1, 2], "ep1": [3], "ep3": [0, 0]}))
    assert members.column("episode_id").to_pylist() == ["ep1", "ep2", "ep3"]
    assert [bitmap_indexes(b) for b in members.column("clips").to_pylist()] == [[3], [0, 1, 2], [0]]
    assert members.column("split").to_pylist() == ["train"] * 3


def test_an_episode_under_two_splits_in_one_manifest_is_refused() -> None:
    table = manifest({"ep1": [0, 1]})
    split = pa.array(["train", "eval"]).dictionary_encode()
    with pytest.raises(ValueError, match="split"):
        members_of_manifest(table.set_column(2, "split", split))


def test_layer_versions_are_the_files_egoline_layers_object_or_nothing() -> None:
    assert layer_versions(None) == {} and layer_versions({b"other": b"1"}) == {}
    assert layer_versions({b"egoline.layers": b'{"labels": "v2", "calibration": 3}'}) == {
        "calibration": "3",
        "labels": "v2",
    }
    with pytest.raises(ValueError, match="JSON object"):
        layer_versions({b"egoline.layers": b'["v1"]'})
    # format version 5 names them under egoline.manifest.layers, read first
    written = {b"egoline.manifest.layers": b'{"labels": "v3"}', b"egoline.layers": b"{}"}
    assert layer_versions(written) == {"labels": "v3"}


def test_diff_counts_episodes_and_clips_added_removed_and_changed() -> None:
    a = manifest(
        {"ep1": [0, 1, 2], "ep2": [0, 1], "ep3": [0], "ep4": [0, 1]},
        split={"ep3": "eval"},
        layers={"calibration": "v1", "labels": "v2"},
    )
    b = manifest(
        {"ep1": [0, 1, 2], "ep2": [0, 2, 3], "ep4": [0, 1], "ep5": [0, 1, 2, 3]},
        split={"ep4": "eval"},
        version={"ep1": "v2"},
        layers={"calibration": "v3", "captions": "v1"},
    )
    diff = diff_manifests(a, b)
    assert diff.episodes_added == ["ep5"] and diff.episodes_removed == ["ep3"]
    assert diff.episodes_changed == ["ep1", "ep2"]  # ep1: re-cut under v2; ep2: other clips
    assert diff.episodes_moved_split == ["ep4"]
    # added: ep5's 4, ep1's 3 (new cut), ep2's 2 and 3; removed: ep3's 1, ep1's 3, ep2's 1
    assert (diff.clips_added, diff.clips_removed) == (4 + 3 + 2, 1 + 3 + 1)
    assert diff.layers_changed == {
        "calibration": ("v1", "v3"),
        "captions": (None, "v1"),
        "labels": ("v2", None),
    }
    assert vars(diff.splits["eval"]) == {
        "episodes_a": 1,
        "episodes_b": 1,
        "clips_a": 1,
        "clips_b": 2,
    }
    assert vars(diff.splits["train"]) == {
        "episodes_a": 3,
        "episodes_b": 3,
        "clips_a": 7,
        "clips_b": 10,
    }
    summary: dict[str, Any] = diff.summary(limit=1)
    assert summary["episodes_changed"] == 2 and summary["changed_ids"] == ["ep1"]
    assert not summary["identical"]


def test_a_manifest_diffed_with_itself_is_identical() -> None:
    a = manifest({"ep1": [0, 1], "ep2": [4]}, layers={"labels": "v1"})
    diff = diff_manifests(a, a)
    assert diff.identical and diff.clips_added == diff.clips_removed == 0


def test_a_group_in_eval_of_the_manifest_and_train_of_another_leaks() -> None:
    uses = [
        GroupUse("s1", "eval", ("M",)),
        GroupUse("s1", "train", ("A",)),
        GroupUse("s2", "train", ("M", "A")),
        GroupUse("s3", "train", ("M",)),
        GroupUse("s3", "eval", ("B",)),  # M trains on what B held out: a leak too
        GroupUse("s4", "eval", ("A",)),
        GroupUse("s4", "train", ("B",)),  # between two others: their own check's business
    ]
    leaks = find_leaks("M", uses)
    assert [(leak.group, leak.eval_in, leak.train_in) for leak in leaks] == [
        ("s1", ("M",), ("A",)),
        ("s3", ("B",), ("M",)),
    ]


def test_a_group_split_inside_the_manifest_itself_leaks() -> None:
    leaks = find_leaks("M", [GroupUse("s1", "eval", ("M",)), GroupUse("s1", "train", ("M",))])
    assert [leak.group for leak in leaks] == ["s1"]


def test_eval_episodes_of_earlier_manifests_missing_from_the_eval_split_are_dropped() -> None:
    earlier = [
        EarlierEval("ep1", "s1", ("A",)),
        EarlierEval("ep3", "s2", ("B", "A")),
        EarlierEval("ep2", "s1", ("A",)),
    ]
    dropped = find_dropped_eval({"ep1"}, earlier)
    assert [(d.episode_id, d.group, d.eval_in) for d in dropped] == [
        ("ep2", "s1", ("A",)),
        ("ep3", "s2", ("A", "B")),
    ]
    assert find_dropped_eval({"ep1", "ep2", "ep3", "ep9"}, earlier) == []


def test_a_manifest_is_named_by_its_file_id_or_key(tmp_path: Path) -> None:
    digest = "ab" * 32
    assert resolve_manifest_id(digest) == digest
    assert resolve_manifest_id(f"manifests/{digest}.arrow") == digest
    named = tmp_path / f"{digest}.arrow"
    named.write_bytes(b"not hashed: the name is the id")
    assert resolve_manifest_id(str(named)) == digest
    other = tmp_path / "copy.arrow"
    other.write_bytes(b"some bytes")
    assert resolve_manifest_id(str(other)) == hashlib.sha256(b"some bytes").hexdigest()
    with pytest.raises(ValueError, match="neither"):
        resolve_manifest_id("not-a-manifest")
