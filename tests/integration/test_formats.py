"""Real recordings end to end: every format a device writes is accepted whole, or refused with a
reason; nothing a device recorded is lost (counted from the raw files and the shards, not from
the warehouse's own tables)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pytest
import webdataset as wds

from services.bench.formats import FormatsRun, run_formats
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.manifest.build import build_manifest
from services.manifest.load import load_manifest
from services.manifest.query import ManifestFilter
from services.metadata.warehouse import make_engine

pytestmark = pytest.mark.connected


@pytest.fixture(scope="module")
def formats(stack: Settings) -> Iterator[FormatsRun]:
    yield run_formats(stack, seed=-1, timeout_s=900.0, log=print)


def by_case(run: FormatsRun) -> dict[str, dict[str, object]]:
    return {r.case: r.line() | {"accepted": r.accepted, "hostile": r.hostile} for r in run.results}


def test_every_realistic_format_is_accepted_whole(formats: FormatsRun) -> None:
    summary = formats.summary
    assert summary["good_cases"] >= 15, summary
    assert summary["false_rejects"] == 0, summary
    assert summary["frames_lost"] == 0, summary
    assert summary["frames_duplicated"] == 0, summary
    assert summary["streams_lost"] == 0, summary
    assert summary["imu_samples_lost"] == 0, summary
    assert summary["unreadable_members"] == 0, summary
    assert summary["frames_in"] > 0 and summary["frames_out"] == summary["frames_in"]


def test_every_hostile_file_is_refused_with_a_reason(formats: FormatsRun) -> None:
    hostile = [r for r in formats.results if r.hostile]
    assert hostile and formats.summary["hostile_accepted"] == 0
    for result in hostile:
        assert not result.accepted and result.clips == 0, result.line()
        assert result.reasons, result.line()


def test_open_gop_hevc_and_av1_keep_their_codec_names_and_every_frame(
    formats: FormatsRun, stack: Settings
) -> None:
    cases = by_case(formats)
    open_gop = next(r for r in formats.results if "open_gop" in r.case)
    # (how many clips depends on where x265 put its keyframes; the cut at a CRA is unit-tested)
    assert open_gop.accepted and open_gop.clips >= 1, open_gop.line()
    assert open_gop.frames_in == open_gop.frames_out
    av1 = next(r for r in formats.results if r.case.startswith("av1"))
    assert av1.accepted, cases[av1.case]
    engine = make_engine(stack)
    with engine.connect() as conn:
        codec = conn.exec_driver_sql(
            "SELECT codec FROM decode_meta WHERE episode_id = %s", (av1.episode_id,)
        ).scalar_one()
    engine.dispose()
    assert codec == "av1"


def test_depth_and_second_camera_reach_the_shards_readable_by_webdataset_alone(
    formats: FormatsRun, stack: Settings, tmp_path: Path
) -> None:
    rgbd = next(r for r in formats.results if "depth" in r.case)
    multicam = next(r for r in formats.results if "multicam" in r.case)
    assert rgbd.streams_in == rgbd.streams_out >= 2, rgbd.line()
    assert multicam.streams_in == multicam.streams_out >= 2, multicam.line()
    store = object_store(stack)
    engine = make_engine(stack)
    with engine.connect() as conn:
        shard_key = conn.exec_driver_sql(
            "SELECT shard_key FROM clips WHERE episode_id = %s LIMIT 1", (rgbd.episode_id,)
        ).scalar_one()
    engine.dispose()
    local = tmp_path / "shard.tar"
    local.write_bytes(store.get_bytes(str(shard_key)))
    samples = [
        s
        for s in wds.WebDataset(str(local), shardshuffle=False)
        if str(s["__key__"]).startswith(rgbd.episode_id)
    ]
    assert samples
    for sample in samples:
        meta = json.loads(sample["json"])
        assert "mp4" in sample and "depth.mp4" in sample, sorted(sample)
        depth = next(m for m in meta["streams"] if m["label"] == "depth")
        assert depth["pix_fmt"] == "gray16le" and depth["codec"] == "ffv1"
        assert len(sample["depth.mp4"]) == depth["length"]


def test_the_manifest_exposes_every_stream_to_polars_and_duckdb(
    formats: FormatsRun, stack: Settings, tmp_path: Path
) -> None:
    rgbd = next(r for r in formats.results if "depth" in r.case)
    engine = make_engine(stack)
    built = build_manifest(
        stack.database_libpq_url,
        engine,
        object_store(stack),
        ManifestFilter(pipeline_version=stack.pipeline_version, streams=["depth"]),
        tmp_path,
    )
    engine.dispose()
    manifest = load_manifest(built.local_path)  # DuckDB scans it by this name
    frame = pl.read_ipc(io.BytesIO(built.local_path.read_bytes()))
    assert manifest.num_rows == frame.height
    ids = set(frame["episode_id"].cast(pl.String).to_list())
    assert rgbd.episode_id in ids
    assert all("depth" in str(v).split(",") for v in frame["stream_labels"].cast(pl.String))
    relation = duckdb.sql("SELECT max(stream_count), max(max_jitter_s) FROM manifest")
    assert relation is not None
    ((streams, _jitter),) = relation.fetchall()
    assert streams >= 2


def test_lineage_names_every_member_and_every_camera_file(
    formats: FormatsRun, stack: Settings
) -> None:
    from services.manifest.lineage import lineage

    multicam = next(r for r in formats.results if "multicam" in r.case)
    engine = make_engine(stack)
    rows = lineage(engine, multicam.episode_id, stack.pipeline_version)
    engine.dispose()
    assert rows and rows[0]["stream_labels"].startswith("head,wrist")
    for row in rows:
        labels = {m["label"] for m in row["members"]}
        assert {"head", "wrist", "imu"} <= labels, labels
    assert [c["name"] for c in rows[0]["cameras"]] == ["wrist"]
    assert rows[0]["cameras"][0]["key"].startswith("raw/")


def test_every_clip_of_every_accepted_recording_reads_back_whole_through_the_reader(
    formats: FormatsRun, stack: Settings, tmp_path: Path
) -> None:
    """What a training node gets: each clip of each recording a device wrote, read through the
    node cache and decoded by the reader, has the frames its manifest row and its `.json` say,
    for every camera and depth stream (x264 B-frames, x265 open GOP, 10 bit, AV1, VFR, rotated,
    fragmented, cut by power loss...)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from services.media.av_io import decode_frames
    from services.reader.cache import clip_cache
    from services.reader.loader import ClipLoader

    accepted = {r.episode_id: r.case for r in formats.results if r.accepted and not r.hostile}
    assert len(accepted) >= 15, [r.line() for r in formats.results]
    engine = make_engine(stack)
    store = object_store(stack)
    built = build_manifest(
        stack.database_libpq_url,
        engine,
        store,
        ManifestFilter(pipeline_version=stack.pipeline_version),
        tmp_path,
    )
    engine.dispose()
    table = load_manifest(built.local_path)
    mine = table.filter(
        pc.is_in(table.column("episode_id").cast(pa.string()), pa.array(sorted(accepted)))
    )
    seen = set(mine.column("episode_id").cast(pa.string()).to_pylist())
    assert seen == set(accepted), sorted(set(accepted) - seen)
    settings = stack.model_copy(update={"reader_cache_dir": tmp_path / "cache"})
    loader = ClipLoader(mine, clip_cache(settings, store), decode=True, frame_height=32)
    wrong: list[str] = []
    for index in range(len(loader)):
        clip = loader.read(index)
        case = accepted[str(clip.row["episode_id"])]
        where = f"{case} clip {clip.row['clip_index']}"
        assert clip.frames is not None
        if len(clip.frames) != clip.row["frame_count"]:
            wrong.append(
                f"{where}: {len(clip.frames)} frames decoded, row says {clip.row['frame_count']}"
            )
        entries = {e["label"]: e for e in clip.meta["streams"] if e["kind"] == "video"}
        assert set(clip.streams) <= set(entries), (where, sorted(clip.streams), sorted(entries))
        for label, data in clip.streams.items():
            decoded = sum(1 for _ in decode_frames(data, None, 32))
            if decoded != entries[label]["frame_count"]:
                wrong.append(
                    f"{where} {label}: {decoded} frames, .json says {entries[label]['frame_count']}"
                )
    assert wrong == []
