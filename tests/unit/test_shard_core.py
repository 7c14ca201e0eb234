"""Clip planning, bin-packing and the shard tar layout, without a broker or object store."""

from __future__ import annotations

import io
import itertools
import json
import tarfile
from pathlib import Path

import pytest
import webdataset as wds
from hypothesis import given
from hypothesis import strategies as st

from services.shard.core import (
    Member,
    build_tar,
    pack_first_fit_decreasing,
    plan_clips,
    shard_keys,
)


def test_clips_start_on_keyframes_and_cover_the_episode() -> None:
    keyframes = [float(k) for k in range(0, 34)]  # one keyframe a second, 34 s episode
    clips = plan_clips(keyframes, 34.0, target_s=10.0)
    assert clips == [(0.0, 10.0), (10.0, 20.0), (20.0, 34.0)]  # the 4 s tail is merged


def test_short_episode_is_one_clip() -> None:
    assert plan_clips([0.0, 1.0, 2.0], 2.5, target_s=10.0) == [(0.0, 2.5)]


@given(
    keyframes=st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=50),
    target=st.floats(0.5, 20),
)
def test_clips_are_contiguous_and_keyframe_aligned(keyframes: list[float], target: float) -> None:
    duration = max(keyframes) + 1.0
    clips = plan_clips(keyframes, duration, target)
    assert clips[0][0] == min(keyframes)
    assert clips[-1][1] == duration
    for (_, end), (start, _) in itertools.pairwise(clips):
        assert end == start and start in keyframes


@given(
    sizes=st.lists(st.integers(1, 1000), max_size=60),
    capacity=st.integers(100, 2000),
)
def test_first_fit_decreasing_places_each_item_once_within_capacity(
    sizes: list[int], capacity: int
) -> None:
    bins = pack_first_fit_decreasing(sizes, capacity)
    placed = sorted(i for b in bins for i in b)
    assert placed == list(range(len(sizes)))
    for b in bins:
        assert sum(sizes[i] for i in b) <= capacity or len(b) == 1


def test_first_fit_decreasing_fills_bins() -> None:
    # 7 opens bin A, 6 bin B, the 5s fill bin C, 4 tops up B and 3 tops up A: three full bins
    assert pack_first_fit_decreasing([6, 4, 5, 5, 3, 7], 10) == [[4, 5], [0, 1], [2, 3]]


def _members() -> list[Member]:
    return [
        Member("ep1_00000.mp4", b"\x00" * 1000),
        Member("ep1_00000.json", json.dumps({"clip_key": "ep1_00000"}).encode()),
        Member("ep1_00001.mp4", b"\x01" * 3000),
        Member("ep1_00001.json", json.dumps({"clip_key": "ep1_00001"}).encode()),
    ]


def test_tar_spans_point_at_member_bytes() -> None:
    data, spans = build_tar(_members())
    for member, span in zip(_members(), spans, strict=True):
        assert data[span.offset : span.offset + span.length] == member.data
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getnames() == [m.name for m in _members()]


def test_tar_is_deterministic() -> None:
    assert build_tar(_members())[0] == build_tar(_members())[0]


def test_webdataset_reads_a_shard_without_egoline_code(tmp_path: Path) -> None:
    data, _ = build_tar(_members())
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    samples = list(wds.WebDataset(str(path), shardshuffle=False))
    assert [s["__key__"] for s in samples] == ["ep1_00000", "ep1_00001"]
    assert samples[1]["mp4"] == b"\x01" * 3000
    assert json.loads(samples[0]["json"]) == {"clip_key": "ep1_00000"}


def test_shard_keys_are_content_addressed() -> None:
    sha = "ab" + "0" * 62
    assert shard_keys("v1", sha) == (f"shards/v1/ab/{sha}.tar", f"shards/v1/ab/{sha}.index.json")


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        pack_first_fit_decreasing([1], 0)
