"""Curation end to end on the real stack: recordings with labelled content defects, made the
way devices make them (`synth.realistic`), uploaded by the device agent through the fleet; the
signals validate and shard compute reach the warehouse, and the manifest filters leave out
exactly the flagged episodes. A re-encoded copy of a recording (another resolution and bitrate)
uploaded under another id is marked a duplicate of the original and left out by
`--exclude-duplicates`, while the original stays. A recording whose pictures are another's but
whose IMU sidecar is the original's is found by the IMU signature alone; two recordings of a
device resting on a table are not duplicates of each other."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import psycopg
import pytest

from services.common.objectstore import object_store
from services.common.settings import Settings
from services.manifest.build import build_manifest
from services.manifest.load import load_manifest
from services.manifest.query import ExposureBounds, ManifestFilter
from services.metadata.warehouse import make_engine
from services.stack.fleet import Fleet
from services.synth.realistic import RealisticCase, write_case
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected


def cases() -> list[tuple[RealisticCase, RealisticCase | None]]:
    """Each its own recording (`seed_offset`), but the copy: the original's frames again."""
    original = RealisticCase("cur_original", duration_s=12.0, seed_offset=1)
    return [
        (original, None),
        (RealisticCase("cur_clean_h265", codec="h265", duration_s=10.0, seed_offset=2), None),
        (RealisticCase("cur_blur", content="blur", duration_s=10.0, seed_offset=3), None),
        (RealisticCase("cur_frozen", content="frozen", duration_s=12.0, seed_offset=4), None),
        (RealisticCase("cur_bright", content="overexposed", duration_s=10.0, seed_offset=5), None),
        (
            RealisticCase(
                "cur_copy",
                content="dup_reencoded",
                duplicate_of="cur_original",
                duration_s=12.0,
                seed_offset=1,
            ),
            original,
        ),
    ]


def selected(settings: Settings, out: Path, flt: ManifestFilter) -> set[str]:
    engine = make_engine(settings)
    try:
        built = build_manifest(
            settings.database_libpq_url, engine, object_store(settings), flt, out
        )
    finally:
        engine.dispose()
    return {str(e) for e in load_manifest(built.local_path).column("episode_id").to_pylist()}


def test_flagged_episodes_and_a_reencoded_copy_are_filtered_out_of_manifests(
    stack: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    seed = int(time.time()) % 9000 + 1000
    device = f"curdev{seed}"
    dirs, ids = [], {}
    for case, original in cases():
        folder = write_case(case, tmp_path / "episodes", seed=seed, original=original)
        meta = json.loads((folder / "episode.json").read_text())
        meta["device_id"] = device  # this test's episodes only, in a shared warehouse
        (folder / "episode.json").write_text(json.dumps(meta))
        dirs.append(folder)
        ids[case.name] = str(meta["episode_id"])
    agent = device_agent(stack, tmp_path / "agent")
    assert agent.run_once(dirs, 60).get("published") == len(dirs)
    every = sorted(ids.values())
    wait_for(
        lambda: set(episode_states(stack, every).values()) == {"sharded"},
        300,
        "every curation episode sharded",
    )

    def pick(**kwargs: object) -> set[str]:
        flt = ManifestFilter.model_validate({"devices": [device], **kwargs})
        return selected(stack, tmp_path / f"m{len(list(tmp_path.glob('m*')))}", flt)

    assert pick() == set(every)
    assert pick(min_sharpness=100.0) == set(every) - {ids["cur_blur"]}
    assert pick(max_frozen_fraction=0.2) == set(every) - {ids["cur_frozen"]}
    bounds = ExposureBounds.of(stack.curation).model_dump()
    assert pick(exposure_ok=bounds) == set(every) - {ids["cur_bright"]}
    # the copy (another resolution and bitrate, another id, uploaded later) goes, the original stays
    assert pick(exclude_duplicates=True) == set(every) - {ids["cur_copy"]}
    assert pick(
        min_sharpness=100.0, max_frozen_fraction=0.2, exposure_ok=bounds, exclude_duplicates=True
    ) == {ids["cur_original"], ids["cur_clean_h265"]}


def test_the_imu_finds_a_copy_the_pictures_miss_and_resting_devices_are_not_copies(
    stack: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    """Given a hand-held recording, another recording with other pictures (its own scene, so
    its frame hashes are unrelated) but the original's IMU file, uploaded later, and two
    recordings of one device resting on a table: then only the IMU copy is a duplicate, of the
    original, kind `imu`; `--exclude-duplicates` leaves it out and keeps the resting two."""
    seed = int(time.time()) % 9000 + 1000
    device = f"imudev{seed}"
    cases = [
        RealisticCase("imu_original", duration_s=12.0, seed_offset=21),
        RealisticCase("imu_copy", codec="h265", duration_s=12.0, seed_offset=29),
        RealisticCase("imu_rest_a", content="static", duration_s=10.0, seed_offset=23),
        RealisticCase("imu_rest_b", content="static", duration_s=10.0, seed_offset=24),
    ]
    dirs, ids = {}, {}
    for case in cases:
        folder = write_case(case, tmp_path / "episodes", seed=seed)
        meta = json.loads((folder / "episode.json").read_text())
        meta["device_id"] = device
        (folder / "episode.json").write_text(json.dumps(meta))
        dirs[case.name], ids[case.name] = folder, str(meta["episode_id"])
    # The copy's IMU sidecar is the original's file: the same trace, the same clock.
    shutil.copyfile(dirs["imu_original"] / "imu.npy", dirs["imu_copy"] / "imu.npy")
    agent = device_agent(stack, tmp_path / "agent")
    assert agent.run_once(list(dirs.values()), 60).get("published") == len(dirs)
    every = sorted(ids.values())
    wait_for(
        lambda: set(episode_states(stack, every).values()) == {"sharded"},
        300,
        "every IMU-signature episode sharded",
    )
    with psycopg.connect(stack.database_libpq_url) as conn:
        marked = conn.execute(
            "SELECT episode_id, duplicate_of, duplicate_kind FROM manifest_episodes "
            "WHERE episode_id = ANY(%s) AND duplicate_of IS NOT NULL",
            (every,),
        ).fetchall()
        signatures: dict[str, int] = dict(
            conn.execute(
                "SELECT episode_id, landmarks FROM imu_signatures WHERE episode_id = ANY(%s)",
                (every,),
            ).fetchall()
        )
    assert marked == [(ids["imu_copy"], ids["imu_original"], "imu")]
    assert signatures[ids["imu_rest_a"]] == 0 and signatures[ids["imu_rest_b"]] == 0
    assert signatures[ids["imu_original"]] > 0
    flt = ManifestFilter.model_validate({"devices": [device], "exclude_duplicates": True})
    assert selected(stack, tmp_path / "m", flt) == set(every) - {ids["imu_copy"]}
