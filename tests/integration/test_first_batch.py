"""`bench first-batch` at small scale on the real stack: seeded rows reuse real clips, and the
first batch read through the reader from the object store decodes to what the rows say."""

from __future__ import annotations

import psycopg
import pytest

from services.bench.first_batch import BenchShape, bench_first_batch
from services.common.objectstore import object_store
from services.common.settings import Settings

pytestmark = pytest.mark.connected


def test_the_first_batch_decodes_to_the_frame_counts_its_manifest_rows_say(
    stack: Settings,
) -> None:
    # given 1,000 seeded episodes (10,000 clip rows) whose rows reuse 256 real 1 s clips
    shape = BenchShape(
        episodes=1000, batch=64, frames_per_clip=0, frame_height=0, workers=2, real_shards=1,
        clips_per_shard=256, clip_s=1, width=160, height=120, naive_rows=256,
    )  # fmt: skip
    store = object_store(stack)
    kept = set(store.list_keys("shards/bench-first-batch/"))  # an earlier run's `--keep`
    # when the manifest is built and loaded and the first batch read, cold, decoding every frame
    result = bench_first_batch(stack, shape, keep=False, log=lambda _line: None, settle_limit_s=0)
    # then every clip decoded to exactly its row's frame count, into one batch array
    assert result["rows"] == 10_000
    assert result["batch"] == 64
    assert result["frame_counts_ok"] is True
    assert result["frames_decoded"] == result["frames_expected"] == 64 * 30
    assert result["batch_shape"] == [64, 30, 120, 160, 3]
    # and every clip was a distinct byte range fetched from the object store (a cold cache)
    assert result["batch_spans_distinct"] == 64
    assert result["fetched_mb"] >= result["batch_mb"] > 0
    assert result["time_to_first_batch_s"] == pytest.approx(
        result["build_s"] + result["load_s"] + result["first_batch_s"], abs=0.005
    )
    # and nothing is left behind: the seeded database and the real shards are gone
    assert set(store.list_keys("shards/bench-first-batch/")) <= kept
    base, _, current = stack.database_libpq_url.rpartition("/")
    with psycopg.connect(f"{base}/postgres") as conn:
        name = current.split("?")[0] + "_bench_first_batch"
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert found is None
