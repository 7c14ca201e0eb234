"""Synthetic episodes and the PyAV module: every named defect shows up where the stages look."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from schemas.events import ReasonCode
from services.decode.core import classify_unreadable
from services.media.av_io import (
    decode_frames,
    decode_keyframes,
    probe_container,
    remux_clips,
)
from services.media.model import ProbeError
from services.shard.core import plan_clips
from services.synth import scene
from services.synth.writer import Defect
from tests.fixtures.media import EpisodeFactory, video_of


def test_same_seed_same_bytes(episode_factory: EpisodeFactory) -> None:
    first, second = episode_factory(1, seed=5), episode_factory(1, seed=5)
    digest = [hashlib.sha256(video_of(d[0]).read_bytes()).hexdigest() for d in (first, second)]
    assert digest[0] == digest[1]


def test_scene_moves() -> None:
    frames = list(scene.rgb_frames(3, 64, 48, seed=1))
    assert not np.array_equal(frames[0], frames[1])
    assert frames[0].std() > 10  # not a flat colour


@pytest.mark.parametrize(
    ("codec", "container"), [("h264", "mp4"), ("h265", "mp4"), ("h264", "mkv")]
)
def test_probe_indexes_gops_at_30fps(
    episode_factory: EpisodeFactory, codec: str, container: str
) -> None:
    (directory,) = episode_factory(1, seed=3, codecs=(codec,), containers=(container,))
    probe = probe_container(video_of(directory))
    stream = probe.streams[0]
    assert probe.complete
    assert stream.codec == {"h264": "h264", "h265": "hevc", "av1": "libdav1d"}.get(
        codec, stream.codec
    )
    assert stream.codec in ("h264", "hevc", "av1", "libdav1d", "libaom-av1")
    assert stream.fps == pytest.approx(30.0)
    assert stream.frame_count == np.load(directory / "imu.npy").shape[0]
    # one keyframe a second (GOP of 30 frames at 30 fps)
    assert stream.keyframe_times_s[:3] == pytest.approx([0.0, 1.0, 2.0], abs=1e-3)


def test_packet_index_has_a_row_per_frame(episode_factory: EpisodeFactory) -> None:
    (directory,) = episode_factory(1, seed=8)
    stream = probe_container(video_of(directory)).streams[0]
    index = stream.packet_index
    assert len(index) == stream.frame_count
    assert int(index["keyframe"].sum()) == len(stream.keyframe_times_s)
    assert (index["size"] > 0).all() and (index["pos"] >= 0).all()


def test_multi_stream_mkv_has_rgb_and_depth(episode_factory: EpisodeFactory) -> None:
    (directory,) = episode_factory(1, seed=4, depth=True)
    probe = probe_container(video_of(directory))
    assert probe.format_name.startswith("matroska")
    assert len(probe.streams) == 2


def test_remuxed_clips_hold_every_frame_once(episode_factory: EpisodeFactory) -> None:
    (directory,) = episode_factory(1, seed=6, duration_s=(5.0, 5.0))
    video = video_of(directory)
    stream = probe_container(video).streams[0]
    spans = plan_clips(stream.keyframe_times_s, stream.duration_s, target_s=2.0)
    clips = remux_clips(video, stream.index, [s for s, _ in spans] + [spans[-1][1]])
    decoded = [sum(1 for _ in decode_frames(mp4)) for mp4, _ in clips]
    assert decoded == [count for _, count in clips]
    assert sum(decoded) == stream.frame_count


def test_truncated_mp4_is_an_incomplete_container(defect_episodes: dict[Defect, Path]) -> None:
    video = video_of(defect_episodes[Defect.TRUNCATED])
    with pytest.raises(ProbeError):
        probe_container(video)
    head = video.read_bytes()[:16]
    assert classify_unreadable(head, video.stat().st_size) is ReasonCode.CONTAINER_INCOMPLETE


def test_zero_byte_file_is_empty(defect_episodes: dict[Defect, Path]) -> None:
    video = video_of(defect_episodes[Defect.ZERO_BYTE])
    with pytest.raises(ProbeError):
        probe_container(video)
    assert classify_unreadable(b"", 0) is ReasonCode.EMPTY_FILE


def test_random_bytes_are_not_a_video(defect_episodes: dict[Defect, Path]) -> None:
    video = video_of(defect_episodes[Defect.NOT_VIDEO])
    with pytest.raises(ProbeError):
        probe_container(video)
    assert (
        classify_unreadable(video.read_bytes()[:16], video.stat().st_size) is ReasonCode.NOT_A_VIDEO
    )


def test_corrupt_keyframes_fail_to_decode(defect_episodes: dict[Defect, Path]) -> None:
    video = video_of(defect_episodes[Defect.CORRUPT_PACKETS])
    probe = probe_container(video)  # the container itself is intact
    stream = probe.streams[0]
    check = decode_keyframes(video, stream.index)
    # H.265 reports the garbage as errors; H.264 drops the bad NAL units and yields no frame
    assert check.failed > 0 or check.decoded < len(stream.keyframe_times_s)


def test_non_monotonic_timestamps_are_counted(defect_episodes: dict[Defect, Path]) -> None:
    probe = probe_container(video_of(defect_episodes[Defect.NON_MONOTONIC]))
    assert probe.streams[0].non_monotonic_count > 0


def test_imu_rows_mismatch_frames(defect_episodes: dict[Defect, Path]) -> None:
    directory = defect_episodes[Defect.IMU_MISMATCH]
    frames = probe_container(video_of(directory)).streams[0].frame_count
    assert np.load(directory / "imu.npy").shape == (frames - 7, 6)
