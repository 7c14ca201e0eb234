"""The packed clip columns, the explode of episode rows into clip rows, query slicing and the
lineage query, without a database."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects import postgresql

from services.manifest.explode import (
    MANIFEST_COLUMNS,
    Exploder,
    explode,
    heads_and_bodies,
)
from services.manifest.lineage import lineage_query, mismatches
from services.manifest.load import load_manifest, with_clip_key
from services.manifest.query import ManifestFilter, build_query, key_ranges, split_points
from services.manifest.write import write_batches
from services.metadata.packing import (
    FACT_FIELDS,
    FACTS,
    FIELDS,
    PACKED_COLUMN,
    RECORD,
    fact_records,
    facts_sql,
    pack,
    pack_facts,
    pack_sql,
    unpack,
)


# float4 fields hold integers exactly up to 2^24
@given(st.lists(st.integers(min_value=-1, max_value=2**24 - 40), max_size=50))
def test_packing_round_trips_every_field(values: list[int]) -> None:
    clips = [{name: v + i for i, (name, *_) in enumerate(FIELDS)} for v in values]
    packed = pack(clips)
    assert len(packed) == RECORD.itemsize * len(values)
    for i, (name, *_) in enumerate(FIELDS):
        assert unpack(name, packed).tolist() == [v + i for v in values]


def test_a_record_is_the_fields_back_to_back_big_endian() -> None:
    clip = {name: i + 1 for i, (name, *_) in enumerate(FIELDS)}
    packed = pack([clip])
    assert RECORD.itemsize == 92 and packed[:8] == (1).to_bytes(8, "big")
    assert packed[8:12] == (2).to_bytes(4, "big")  # length: int4
    assert packed[64:68] == struct.pack(">f", 12.0)  # sharpness: float4, after the 64 bytes


def test_missing_quality_values_pack_as_nan_and_explode_as_null() -> None:
    clips = [clip(0, 0), {**clip(1, 0), "sharpness": None, "motion": None}]
    packed = pack(clips)
    assert np.isnan(unpack("motion", packed)[1]) and unpack("sharpness", packed)[0] == 250.0
    rows = explode(episode_rows([episode("ep1", "dev1", ["sA"], clips)])).to_pylist()
    assert rows[0]["sharpness"] == 250.0 and rows[1]["sharpness"] is None
    assert rows[1]["motion"] is None and rows[1]["frozen_fraction"] == 0.0


def test_pack_sql_concatenates_every_field_in_order_and_orders_clips_by_index() -> None:
    aggregate = pack_sql()
    positions = [aggregate.index(f"{fn}({expr})") for _, expr, fn, _ in FIELDS]
    assert positions == sorted(positions)
    assert aggregate.endswith("ORDER BY c.clip_index)")


def test_facts_round_trip_field_by_field_as_native_values() -> None:
    # Given two episodes' facts, every value distinct (microseconds since the epoch, counts,
    # frame size and rate, timing figures)
    rows = [
        {
            "started_at": 1_767_225_600_123_456 + n,
            "warning_count": 2 + n,
            "width": 1920 + n,
            "height": 1080 + n,
            "fps": 29.97 + n,
            "clip_count": 7 + n,
            "stream_count": 3 + n,
            "max_jitter_s": 0.001 + n,
            "max_frame_gap_s": 0.05 + n,
            "max_drift_ppm": -12.5 + n,
            "camera_skew_s": 0.02 + n,
            "imu_skew_s": -0.003 + n,
            "imu_rate_hz": 200.0 + n,
        }
        for n in range(2)
    ]
    # When packed and read back
    packed = pack_facts(rows)
    records = fact_records(packed)
    # Then each record is 84 bytes and each field comes back as the native value it was
    assert FACTS.itemsize == 84 and len(packed) == 2 * 84
    assert [name for name, *_ in FACT_FIELDS] == list(rows[0])
    for name in FACTS.names or ():
        native = records[name].astype(records[name].dtype.newbyteorder("="))
        assert native.tolist() == [row[name] for row in rows], name
        assert type(native.tolist()[0]) is type(rows[0][name]), name
    assert packed[:8] == int(rows[0]["started_at"]).to_bytes(8, "big")  # int8, big-endian


def test_facts_sql_concatenates_every_field_in_order() -> None:
    expression = facts_sql()
    positions = [expression.index(f"{fn}({expr})") for _, expr, fn, _ in FACT_FIELDS]
    assert positions == sorted(positions) and len(positions) == 13


def episode_rows(episodes: list[dict[str, Any]]) -> pa.Table:
    """Episode rows shaped as the manifest query returns them."""
    columns: dict[str, list[Any]] = {
        "episode_id": [],
        "device_id": [],
        "session_id": [],
        "started_at": [],
        "split": [],
        "verdict": [],
        "warning_count": [],
        "codec": [],
        "width": [],
        "height": [],
        "fps": [],
        "raw_key": [],
        "raw_sha256": [],
        "pipeline_version": [],
        "clip_count": [],
        "shard_keys": [],
        "stream_labels": [],
        "stream_count": [],
        "max_jitter_s": [],
        "max_frame_gap_s": [],
        "max_drift_ppm": [],
        "camera_skew_s": [],
        "imu_skew_s": [],
        "imu_rate_hz": [],
        "duplicate_of": [],
    }
    packed: list[bytes] = []
    for ep in episodes:
        for name in columns:
            columns[name].append(ep[name] if name != "clip_count" else len(ep["clips"]))
        packed.append(pack(ep["clips"]))
    table = pa.table(columns)
    return table.append_column(PACKED_COLUMN, pa.array(packed, type=pa.binary()))


def clip(index: int, shard_no: int, imu: bool = True) -> dict[str, Any]:
    return {
        "byte_offset": 512 + 1000 * index,
        "length": 900,
        "imu_offset": 2000 * index if imu else None,
        "imu_length": 96 if imu else None,
        "json_offset": 3000 * index,
        "json_length": 80,
        "clip_start_s": 10.0 * index,
        "clip_duration_s": 10.0,
        "clip_index": index,
        "frame_count": 300,
        "shard_no": shard_no,
        "sharpness": 250.0,
        "mean_luma": 110.0,
        "highlights": 0.0,
        "shadows": 0.125,
        "frozen_fraction": 0.0,
        "blocked_fraction": 0.0,
        "motion": 0.5,
    }


def episode(
    eid: str, device: str, shards: list[str], clips: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "episode_id": eid,
        "device_id": device,
        "session_id": f"s-{eid}",
        "started_at": datetime(2026, 1, 1, tzinfo=UTC),
        "split": "train",
        "verdict": "accept",
        "warning_count": 0,
        "codec": "h264",
        "width": 1280,
        "height": 720,
        "fps": 30.0,
        "raw_key": f"raw/{device}/{eid}.mp4",
        "raw_sha256": eid * 4,
        "pipeline_version": "v1",
        "shard_keys": shards,
        "clips": clips,
        "stream_labels": "main,depth,imu",
        "stream_count": 2,
        "max_jitter_s": 0.001,
        "max_frame_gap_s": 0.034,
        "max_drift_ppm": 12.5,
        "camera_skew_s": 0.0,
        "imu_skew_s": 0.05,
        "imu_rate_hz": 200.0,
        "duplicate_of": None,
    }


def test_explode_gives_one_row_per_clip_with_its_episode_facts_and_shard() -> None:
    table = explode(
        episode_rows(
            [
                episode("ep1", "dev1", ["sA", "sB"], [clip(0, 0), clip(1, 1, imu=False)]),
                {**episode("ep2", "dev1", ["sB"], [clip(0, 0)]), "duplicate_of": "ep1"},
                episode("ep3", "dev2", [], []),
            ]
        )
    )
    assert table.column_names == list(MANIFEST_COLUMNS)
    rows = [with_clip_key(r) for r in table.to_pylist()]
    assert [(r["episode_id"], r["clip_index"], r["shard_key"]) for r in rows] == [
        ("ep1", 0, "sA"),
        ("ep1", 1, "sB"),
        ("ep2", 0, "sB"),
    ]
    assert rows[1]["imu_offset"] is None and rows[0]["imu_offset"] == 0
    assert rows[1]["clip_key"] == "ep1_00001" and rows[2]["raw_key"] == "raw/dev1/ep2.mp4"
    assert rows[1]["byte_offset"] == 1512 and rows[1]["clip_start_s"] == 10.0
    assert all(r["device_id"] == "dev1" and r["width"] == 1280 for r in rows)
    assert rows[0]["started_at"] == datetime(2026, 1, 1, tzinfo=UTC)
    assert [r["duplicate_of"] for r in rows] == [None, None, "ep1"]
    assert rows[0]["shadows"] == 0.125 and rows[0]["motion"] == 0.5
    # Repeated strings are dictionaries: the shard keys once each, not once per clip.
    shard = table.column("shard_key").chunk(0)
    assert pa.types.is_dictionary(shard.type) and shard.dictionary.to_pylist() == ["sA", "sB"]


def test_explode_rejects_packed_values_that_disagree_with_the_clip_count() -> None:
    rows = episode_rows([episode("ep1", "dev1", ["sA"], [clip(0, 0), clip(1, 0)])])
    broken = rows.set_column(
        rows.column_names.index("clip_count"), "clip_count", pa.array([3], type=pa.int64())
    )
    with pytest.raises(ValueError, match="clip_count"):
        explode(broken)


def test_key_ranges_slice_the_query_without_gaps_or_overlap() -> None:
    histogram = [f"ep{i:03d}" for i in range(101)]
    points = split_points(histogram, 2)
    assert points == ["ep050"]
    assert key_ranges(points) == [(None, "ep050"), ("ep050", None)]
    assert split_points(None, 2) == [] and key_ranges([]) == [(None, None)]
    sql, params = build_query(ManifestFilter(), ("ep050", None))
    assert "m.episode_id >= $3" in sql and params[-1] == "ep050"


def test_lineage_query_binds_the_episode_id() -> None:
    hostile = "ep1'; DROP TABLE clips; --"
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    compiled = lineage_query(hostile, "v1", 3).compile(dialect=dialect)
    assert hostile not in str(compiled) and hostile in compiled.params.values()
    assert mismatches({"shard_key": "a", "length": 3}, {"shard_key": "a", "length": 4}) == [
        "length"
    ]


def test_batches_cut_across_result_chunks_and_cache_runs_give_the_same_rows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    episodes = [
        episode(f"ep{i}", f"dev{i % 3}", [f"s{i}", f"s{i + 1}"], [clip(j, j % 2) for j in range(i)])
        for i in range(9)
    ]
    whole = episode_rows(episodes)
    # The query's result arrives in several chunks; the explode copies 2 records at a time.
    chunked = pa.concat_tables([episode_rows(episodes[i : i + 2]) for i in range(0, 9, 2)])
    assert chunked.column(PACKED_COLUMN).num_chunks == 5
    monkeypatch.setattr("services.manifest.explode.CACHE_RECORDS", 2)
    heads, bodies = heads_and_bodies(chunked)
    assert len(bodies) == 5
    batches = list(Exploder(heads, size=5).batches(bodies, reuse=False))
    assert [b.num_rows for b in batches] == [5] * 7 + [1]
    got = pa.Table.from_batches(batches).to_pylist()
    assert got == explode(whole).to_pylist()
    assert [(r["episode_id"], r["clip_index"]) for r in got] == [
        (f"ep{i}", j) for i in range(9) for j in range(i)
    ]
    # Reused buffers (the write path): each batch is written before the next overwrites them;
    # the bodies' chunking does not change a byte.
    path, again = tmp_path / "reused.arrow", tmp_path / "whole.arrow"
    exploder = Exploder(heads, size=5)
    first = write_batches(exploder.batches(bodies), path)
    heads, bodies = heads_and_bodies(whole)
    assert len(bodies) == 1
    assert write_batches(Exploder(heads, size=5).batches(bodies), again) == first
    assert load_manifest(path).to_pylist() == got


def test_shard_keys_stream_as_delta_dictionaries_in_the_type_of_the_row_bound(
    tmp_path: Path,
) -> None:
    # 200 clips in 200 shards: the first batch of 100 sees 100 of them, the second the rest;
    # the index type (fixed before the last shard is seen) is the one for 200 rows.
    whole = episode_rows(
        [episode(f"ep{i:03d}", "dev", [f"shard{i:03d}"], [clip(0, 0)]) for i in range(200)]
    )
    heads, bodies = heads_and_bodies(whole)
    batches = list(Exploder(heads, size=100).batches(bodies, reuse=False))
    assert [len(b.column("shard_key").dictionary) for b in batches] == [100, 200]
    assert {b.column("shard_key").type.index_type for b in batches} == {pa.int16()}
    path = tmp_path / "deltas.arrow"
    write_batches(Exploder(heads, size=100).batches(heads_and_bodies(whole)[1]), path)
    loaded = load_manifest(path)
    assert loaded.column("shard_key").to_pylist() == [f"shard{i:03d}" for i in range(200)]
    assert loaded.to_pylist() == explode(whole).to_pylist()


SHARED_TEXT = st.sampled_from(["", "a", "b:c", "rig-07", "main,depth,imu", "é", "train"])
# the labels come from containers: anything, the separator included
LABELS_TEXT = st.sampled_from(["main", "main,depth", "a\x1fb", "\x1f", "é,x"])


@given(
    st.lists(
        st.tuples(SHARED_TEXT, SHARED_TEXT, SHARED_TEXT, SHARED_TEXT, LABELS_TEXT),
        max_size=40,
    )
)
def test_unpacked_heads_encode_exactly_as_the_columns_themselves(
    rows: list[tuple[str, ...]],
) -> None:
    from services.manifest.explode import _encode, unpack_heads
    from services.manifest.query import FETCHED_HEADS, HEAD_COLUMNS, PACKED_HEADS

    # What the heads query returns (services/manifest/query.py `_packed_heads`: the values
    # joined by the unit separator, which the labels, last, may hold themselves)...
    n = len(rows)
    fetched = {name: pa.array([f"x{i}" for i in range(n)], pa.string()) for name in FETCHED_HEADS}
    fetched["clip_count"] = pa.array(np.ones(n, dtype=np.int32))
    fetched["duplicate_of"] = pa.array([None] * n, pa.string())
    packed = ["\x1f".join(row) for row in rows]
    table = pa.table({**fetched, "packed_heads": pa.array(packed, pa.string())})
    heads = unpack_heads(table, "v7")
    # ...unpacks to the HEAD_COLUMNS, each shared string with the dictionary and codes that
    # encoding the column itself gives (so the manifest's bytes do not change)
    assert heads.column_names == list(HEAD_COLUMNS)
    for k, name in enumerate(PACKED_HEADS):
        plain = pa.chunked_array([pa.array([row[k] for row in rows], pa.string())])
        assert heads.column(name).cast(pa.string()).to_pylist() == plain.to_pylist()
        got, expected = _encode(heads.column(name)), _encode(plain)
        assert got[0].equals(expected[0]), name
        assert got[1].dtype == expected[1].dtype and np.array_equal(got[1], expected[1]), name
    assert heads.column("pipeline_version").cast(pa.string()).to_pylist() == ["v7"] * n
    pipeline = _encode(heads.column("pipeline_version"))
    assert pipeline[0].to_pylist() == (["v7"] if n else [])


def test_heads_query_packs_the_shared_strings_and_leaves_out_the_pipeline_version() -> None:
    sql, _ = build_query(ManifestFilter(), part="heads")
    select = sql.split("FROM")[0]
    assert "m.pipeline_version" not in select and "m.split" in select
    assert (
        "(m.split || chr(31) || m.verdict || chr(31) || m.device_id || chr(31) || m.codec "
        "|| chr(31) || m.stream_labels) AS packed_heads"
    ) in select
