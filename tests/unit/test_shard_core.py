"""Clip planning, bin-packing, the shard tar layout, and each clip's JSON and the shard index,
without a broker or object store."""

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

from schemas.events import EpisodeValidated, Verdict
from services.shard.core import (
    Member,
    build_tar,
    clip_metadata,
    clip_record,
    encode_json,
    imu_member_entry,
    pack_first_fit_decreasing,
    place_members,
    plan_clips,
    shard_index,
    shard_keys,
    video_member_entry,
)
from tests.unit.test_rules import decoded


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


def test_clip_json_and_shard_index_say_where_every_member_lies() -> None:
    # Given an accepted episode's second clip: its main video member and its IMU slice
    validated = EpisodeValidated(
        event_id="1" * 32,
        produced_at=decoded().produced_at,
        pipeline_version="v9",
        decoded=decoded(),
        verdict=Verdict.ACCEPT,
    )
    stream = validated.decoded.streams[0]
    data = {"ep1_00001.mp4": b"v" * 700, "ep1_00001.imu.npy": b"i" * 100}
    streams = [
        video_member_entry("ep1_00001.mp4", "main", "main", stream, 300, 0),
        imu_member_entry("ep1_00001.imu.npy", "main", 10),
    ]
    # When its JSON is built and the clip is written into a tar with the JSON last
    place_members(streams, [len(b) for b in data.values()])
    meta = clip_metadata(validated, 1, (10.0, 20.0000004), 300, 300, streams)
    members = [Member(n, b) for n, b in data.items()] + [
        Member("ep1_00001.json", encode_json(meta))
    ]
    tar, spans = build_tar(members)
    by_name = {s.name: (s.offset, s.length) for s in spans}
    record = clip_record(meta, by_name)
    index = json.loads(encode_json(shard_index("k.tar", "f" * 64, len(tar), spans, [record])))
    # Then the JSON names the clip and places each member relative to the first one's data
    assert meta["clip_key"] == record.clip_key == "ep1_00001"
    assert (meta["start_s"], meta["duration_s"], meta["first_frame"]) == (10.0, 10.0, 300)
    assert meta["pipeline_version"] == "v9" and meta["raw_key"] == "raw/dev1/ep1/v.mp4"
    first = spans[0].offset
    for entry in streams:
        offset, length = by_name[str(entry["name"])]
        assert (entry["offset_in_clip"], entry["length"]) == (offset - first, length)
        assert tar[offset : offset + length] == data[str(entry["name"])]
    # and the record and the index give the same spans the tar has
    assert (record.mp4_offset, record.imu_offset, record.json_offset) == (
        by_name["ep1_00001.mp4"][0],
        by_name["ep1_00001.imu.npy"][0],
        by_name["ep1_00001.json"][0],
    )
    assert [m.kind for m in record.members] == ["video", "imu"]
    assert index["members"] == [
        {"name": s.name, "offset": s.offset, "length": s.length} for s in spans
    ]
    assert index["clips"] == [json.loads(record.model_dump_json())]
    assert index["format"] == "egoline-shard-index" and index["size_bytes"] == len(tar)


def test_place_members_refuses_entries_without_files() -> None:
    with pytest.raises(ValueError, match="2 stream entries for 1 member files"):
        place_members([imu_member_entry("a", "main", 1), imu_member_entry("b", "main", 1)], [5])
