"""The walking skeleton on the real stack: episodes travel every stage as separate processes."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest
import webdataset as wds
from confluent_kafka import Producer

from schemas.events import TOPIC_UPLOADED
from services.common import kafka
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.manifest.build import build_manifest
from services.manifest.load import load_manifest, manifest_rows
from services.manifest.query import ManifestFilter
from services.media.av_io import decode_frames
from services.metadata.warehouse import make_engine
from services.reader.clips import read_clip
from services.stack.fleet import Fleet
from services.synth.writer import Defect
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected


def test_episodes_travel_every_stage_and_a_clip_reads_back_by_byte_range(
    stack: Settings, fleet: Fleet, episode_factory: EpisodeFactory, tmp_path: Path
) -> None:
    seed = int(time.time()) % 10_000  # fresh episode ids on a reused stack
    dirs = episode_factory(
        3, seed=seed, duration_s=(4.5, 6.0), codecs=("h264", "h265"), defects=(Defect.NOT_VIDEO,)
    )
    bad, good = dirs[0], dirs[1:]
    ids = [d.name for d in dirs]
    store = object_store(stack)
    agent = device_agent(stack, tmp_path / "agent")
    # A poison record in the middle of the stream: the decode stage must dead-letter it and go on.
    assert agent.run_once([good[0]], 30).get("published") == 1
    producer = Producer(kafka.producer_config(stack))
    producer.produce(TOPIC_UPLOADED, key=b"poison", value=b'{"not": "an event"')
    producer.flush(10)
    assert agent.run_once([bad, good[1]], 30).get("published") == 3

    expected = {bad.name: "dead_lettered", good[0].name: "sharded", good[1].name: "sharded"}
    wait_for(lambda: episode_states(stack, ids) == expected, 120, "all episodes cataloged")
    assert not fleet.dead()

    with psycopg.connect(stack.database_libpq_url) as conn:
        reasons = conn.execute(
            "SELECT source_topic, reason_code FROM dead_letters WHERE episode_id = %s", (bad.name,)
        ).fetchall()
        poison = conn.execute(
            "SELECT count(*) FROM dead_letters WHERE source_topic = %s AND reason_code = %s",
            (TOPIC_UPLOADED, "malformed_event"),
        ).fetchone()
    assert reasons == [(TOPIC_UPLOADED, "not_a_video")]
    assert poison is not None and poison[0] >= 1

    engine = make_engine(stack)
    built = build_manifest(
        stack.database_libpq_url, engine, store, ManifestFilter(), tmp_path / "manifests"
    )
    engine.dispose()
    table = load_manifest(built.local_path)
    rows = [r for r in manifest_rows(table) if r["episode_id"] in ids]
    assert {r["episode_id"] for r in rows} == {good[0].name, good[1].name}

    row = rows[0]
    (index_key,) = [k for k in store.list_keys("index/") if f"/{row['episode_id']}/" in k]
    packet_index = np.load(io.BytesIO(store.get_bytes(index_key)), allow_pickle=False)
    assert int(packet_index["keyframe"].sum()) >= 1 and len(packet_index) >= row["frame_count"]

    clip = read_clip(store, row)
    assert sum(1 for _ in decode_frames(clip.mp4)) == row["frame_count"]
    # frame-synced IMU: one sample per frame, (M, 7) with its time from the clip start
    assert clip.imu is not None and clip.imu.shape == (row["frame_count"], 7)

    shard = tmp_path / "shard.tar"
    shard.write_bytes(store.get_bytes(row["shard_key"]))
    samples = list(wds.WebDataset(str(shard), shardshuffle=False))
    assert row["clip_key"] in {s["__key__"] for s in samples}
    meta = json.loads(next(s["json"] for s in samples if s["__key__"] == row["clip_key"]))
    assert meta["raw_sha256"] == row["raw_sha256"]
