"""Hostile files through decode's probe and validate's rules, each in a worker process set up
as the stages set theirs up (the production `apply_memory_limit` initializer and `run_jobs`
with the job time limit, from `Settings`): every one is rejected with a reason, within a time
and memory bound."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from services.common.batch import run_jobs
from services.common.limits import apply_memory_limit
from services.common.settings import Settings
from services.common.stage import Failure
from services.synth.writer import plan_episodes, write_episode

MAX_WALL_S = 30.0
MAX_RSS_MB = 600.0
# what a stage's workers run under: an address space in which a decoder allocating a huge
# frame fails, and a per-job time limit past the bound the test asserts
LIMITS = Settings(_env_file=None, worker_memory_limit_mb=2048, job_time_limit_s=MAX_WALL_S * 2)


def check_in_child(path: str) -> dict[str, object]:
    """A worker's job: the decode stage's probe, then the validate stage's rules (keyframes
    decoded only if the size guard passes), as the stages run them."""
    import shutil

    from schemas.events import EpisodeRef, EpisodeUploaded, SourceFile
    from services.decode.core import decoded_event
    from services.media.av_io import probe_container
    from services.media.model import ProbeError
    from services.validate.app import validate_episode
    from services.validate.rules import RuleSet

    started = time.perf_counter()
    video = Path(path)
    sha = hashlib.sha256(video.read_bytes()).hexdigest()
    outcome: dict[str, object]
    try:
        probe = probe_container(video)
    except ProbeError as exc:
        outcome = {"outcome": "probe_error", "reasons": [str(exc)[:200]]}
    else:
        uploaded = EpisodeUploaded(
            event_id="0" * 32,
            produced_at=datetime.now(UTC),
            episode=EpisodeRef(
                episode_id="hostile",
                device_id="dev",
                session_id="s",
                started_at=datetime.now(UTC),
                video=SourceFile(key="raw/x.mp4", sha256=sha, size_bytes=video.stat().st_size),
            ),
        )
        decoded = decoded_event(uploaded, probe, sha, None, None, "v1", datetime.now(UTC))

        def fetch(_key: str, dest: Path) -> None:
            shutil.copyfile(video, dest)

        validated = validate_episode(fetch, decoded, RuleSet())
        outcome = {
            "outcome": validated.verdict.value,
            "reasons": [r.code.value for r in validated.reasons],
            "warnings": [w.code.value for w in validated.warnings],
        }
    outcome["wall_s"] = time.perf_counter() - started
    outcome["maxrss_mb"] = peak_rss_mb()
    return outcome


def peak_rss_mb() -> float:
    """This process image's peak RSS (VmHWM). Not `ru_maxrss`: Linux keeps that across fork
    and exec, so a spawned worker would report its parent's size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_bounded(path: Path) -> dict[str, object]:
    """One fresh worker (so its peak RSS is this file's), set up like a stage's."""
    started = time.monotonic()
    with ProcessPoolExecutor(
        1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=apply_memory_limit,
        initargs=(LIMITS.worker_memory_limit_mb,),
    ) as worker:
        results, _, _ = worker.submit(
            run_jobs, check_in_child, [str(path)], LIMITS.job_time_limit_s
        ).result(timeout=MAX_WALL_S * 3)
    (result,) = results
    if isinstance(result, Failure):  # over a limit (or a bug): a dead letter with a reason
        assert not result.transient, result
        outcome: dict[str, object] = {
            "outcome": "dead_letter",
            "reasons": [result.code.value, result.message],
            "wall_s": time.monotonic() - started,
            "maxrss_mb": 0.0,
        }
        return outcome
    assert isinstance(result, dict)
    result["process_s"] = time.monotonic() - started
    return result


def mux_rawvideo(path: Path, width: int, height: int, packets: int) -> None:
    """A Matroska file declaring `width`x`height` whose packets are one byte each: demuxers
    believe the header, so a reader that trusts it allocates width*height per frame."""
    with av.open(str(path), "w", format="matroska") as out:
        stream = out.add_stream("rawvideo", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "gray"
        for i in range(packets):
            packet = av.Packet(b"\x01")
            packet.stream, packet.pts, packet.dts = stream, i, i
            packet.time_base = Fraction(1, 30)
            out.mux(packet)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("hostile")
    good_mp4 = next(write_episode(plan_episodes(1, seed=77)[0], out / "good").glob("video.*"))
    good_mkv = next(
        write_episode(plan_episodes(1, seed=78, containers=("mkv",))[0], out / "goodmkv").glob(
            "video.*"
        )
    )
    data = good_mp4.read_bytes()
    files = {
        # a power cut half way: the whole packets before the cut are a usable recording
        "truncated_mkv": good_mkv.read_bytes()[: good_mkv.stat().st_size // 2],
        # cut after its first few packets: less than the shortest episode accepted
        "truncated_mkv_stub": good_mkv.read_bytes()[: good_mkv.stat().st_size // 20],
        "truncated_mp4": data[: len(data) // 3],
        # every byte of the media data, no moov box (ffmpeg would find one renamed to `free`)
        "missing_moov": data[: data.index(b"moov") - 4],
        "random_bytes": np.random.default_rng(1).bytes(2 << 20),
        "wrong_extension_npy": b"",  # filled below: an .npy array named video.mp4
    }
    paths: dict[str, Path] = {}
    for name, content in files.items():
        paths[name] = out / f"{name}.mp4"
        paths[name].write_bytes(content)
    np.save(out / "array.npy", np.zeros((512, 6), np.float32))
    (out / "array.npy").replace(paths["wrong_extension_npy"])
    paths["absurd_dimensions"] = out / "absurd.mp4"  # wrong extension too: it is Matroska
    mux_rawvideo(paths["absurd_dimensions"], 16000, 16000, 60)
    # a decompression bomb: 4096x4096 frames (inside the size guard) from a few-KB H.264 file
    bomb = plan_episodes(1, seed=79, duration_s=(1.0, 1.0), width=4096, height=4096)[0]
    paths["decompression_bomb"] = next(write_episode(bomb, out / "bomb").glob("video.*"))
    paths["millions_of_packets"] = out / "many.mkv"
    mux_rawvideo(paths["millions_of_packets"], 16, 16, 2_100_000)
    return paths


EXPECTED_REASON = {
    "absurd_dimensions": "resolution_out_of_bounds",
    "truncated_mkv_stub": "container_incomplete",
}


@pytest.mark.parametrize(
    "name",
    [
        "truncated_mkv_stub",
        "truncated_mp4",
        "missing_moov",
        "random_bytes",
        "wrong_extension_npy",
        "absurd_dimensions",
        "decompression_bomb",
        "millions_of_packets",
    ],
)
def test_hostile_file_is_rejected_within_time_and_memory_bounds(
    hostile: dict[str, Path], name: str
) -> None:
    result = run_bounded(hostile[name])
    assert float(str(result["wall_s"])) < MAX_WALL_S, result
    assert float(str(result["maxrss_mb"])) < MAX_RSS_MB, result
    if name == "decompression_bomb":
        # well-formed and inside the size guard: decoding its keyframes stays bounded
        assert result["outcome"] in ("accept", "accept_with_warnings", "reject"), result
        return
    assert result["outcome"] in ("probe_error", "reject"), result
    assert result["reasons"], result
    if name in EXPECTED_REASON:
        assert EXPECTED_REASON[name] in str(result["reasons"]), result


def test_mkv_cut_mid_write_keeps_its_whole_packets_with_a_warning(
    hostile: dict[str, Path],
) -> None:
    result = run_bounded(hostile["truncated_mkv"])
    assert result["outcome"] == "accept_with_warnings", result
    assert "container_truncated" in str(result["warnings"]), result


def test_probe_refuses_more_packets_than_its_bound(hostile: dict[str, Path]) -> None:
    result = run_bounded(hostile["millions_of_packets"])
    assert result["outcome"] == "probe_error"
    assert "packets" in str(result["reasons"]), result
    assert os.path.getsize(hostile["millions_of_packets"]) > 50 << 20
