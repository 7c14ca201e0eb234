"""Each realistic fixture really has the real-world property it is named for.

The realistic matrix (services/synth/realistic.py) exists because easy synthetic files hid bugs;
these tests keep a case from silently becoming easy again (a preset that turns off scene cuts,
a muxer default that closes the GOP, a depth stream squeezed into 8 bits...). Every case is
encoded once per session, on first use. Media is read through services.media.av_io.inspect_media.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from services.agent.recordings import COMPLETION_MARKER, describe
from services.media.av_io import InspectedStream as StreamInfo
from services.media.av_io import MediaInfo, PacketInfo, decode_first_frame, inspect_media
from services.synth import scene
from services.synth.realistic import RealisticCase, realistic_cases, write_case

CASES = {case.name: case for case in realistic_cases()}
EPISODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
HEVC_IDR, HEVC_CRA, HEVC_RASL = {19, 20}, 21, {8, 9}
X26X_DEFAULT_KEYINT = 250  # frames

EpisodeOf = Callable[[str], Path]


@pytest.fixture(scope="session")
def episode_of(tmp_path_factory: pytest.TempPathFactory) -> EpisodeOf:
    """The folder of a realistic case by name, written on first use (once per session)."""
    out = tmp_path_factory.mktemp("realistic_media")
    written: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in written:
            written[name] = write_case(CASES[name], out, seed=0)
        return written[name]

    return get


def _meta(directory: Path) -> dict[str, object]:
    meta = json.loads((directory / COMPLETION_MARKER).read_text())
    assert isinstance(meta, dict)
    return meta


def _synthetic(directory: Path) -> dict[str, object]:
    synthetic = _meta(directory)["synthetic"]
    assert isinstance(synthetic, dict)
    return synthetic


def _main_video(directory: Path) -> Path:
    return directory / str(_meta(directory)["video"])


def _only_video(info: MediaInfo) -> StreamInfo:
    (video,) = info.video()
    return video


def _frame_numbers(stream: StreamInfo, fps: int, keyframes_only: bool = False) -> list[int]:
    """Nominal frame number of each packet (pts x fps), in decode order."""
    return [
        round(p.pts_s * fps)
        for p in stream.packets
        if p.pts_s is not None and (p.keyframe or not keyframes_only)
    ]


def _keyframes_with_leading_pictures(packets: tuple[PacketInfo, ...]) -> list[int]:
    """Indices (decode order) of keyframes followed, before the next keyframe, by a packet that
    is shown earlier: open-GOP leading pictures, which reference the GOP before."""
    found = []
    for i, packet in enumerate(packets):
        if not packet.keyframe or packet.pts_s is None:
            continue
        for later in packets[i + 1 :]:
            if later.keyframe:
                break
            if later.pts_s is not None and later.pts_s < packet.pts_s:
                found.append(i)
                break
    return found


def _pts_in_decode_order_is_reordered(stream: StreamInfo) -> bool:
    pts = [p.pts_s for p in stream.packets if p.pts_s is not None]
    return any(b < a for a, b in itertools.pairwise(pts))


def _top_level_boxes(data: bytes) -> list[tuple[str, int, int]]:
    """(type, offset, declared size) of each top-level ISO-BMFF box; a last box may run past
    the end of a truncated file."""
    boxes, offset = [], 0
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        kind = data[offset + 4 : offset + 8].decode("latin-1")
        if size == 1:
            size = int.from_bytes(data[offset + 8 : offset + 16], "big")
        if size < 8:
            break
        boxes.append((kind, offset, size))
        offset += size
    return boxes


# --- every case -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_case_is_a_finished_episode_folder_the_agent_accepts(
    episode_of: EpisodeOf, name: str
) -> None:
    directory = episode_of(name)
    meta = _meta(directory)
    for key in ("episode_id", "device_id", "session_id", "started_at", "video", "tags"):
        assert key in meta, key
    assert EPISODE_ID.fullmatch(str(meta["episode_id"]))
    assert datetime.fromisoformat(str(meta["started_at"])).tzinfo is not None
    synthetic = _synthetic(directory)
    assert synthetic["case"] == name
    assert synthetic["expect"] in ("accept", "accept_with_warnings")
    assert not list(directory.glob("*.tmp")), "the marker is written last, by rename"
    episode = describe(directory)
    assert episode.ref.episode_id == meta["episode_id"]
    assert episode.video.size_bytes > 10_000


# --- GOP structure: encoder defaults ----------------------------------------------------------


def test_x264_default_has_b_frames_and_scene_cut_keyframes_off_any_fixed_grid(
    episode_of: EpisodeOf,
) -> None:
    case = CASES["h264_default_mp4"]
    info = inspect_media(_main_video(episode_of(case.name)))
    video = _only_video(info)
    assert video.codec == "h264"
    assert _pts_in_decode_order_is_reordered(video), "B-frames: decode order != display order"
    keys = _frame_numbers(video, case.fps, keyframes_only=True)
    assert keys[0] == 0 and len(keys) >= 2
    assert any(k % X26X_DEFAULT_KEYINT for k in keys[1:]), f"only periodic keyframes: {keys}"
    gaps = np.diff(keys)
    assert len(set(gaps.tolist())) > 1 or len(keys) == 2, f"a fixed GOP: {keys}"
    assert gaps.max() > case.fps, f"keyframes every second or less, not x264 defaults: {keys}"


@pytest.mark.parametrize("name", ["h265_default_open_gop_mp4", "h265_10bit_mkv"])
def test_x265_default_is_open_gop_cra_keyframes_with_leading_pictures(
    episode_of: EpisodeOf, name: str
) -> None:
    case = CASES[name]
    video = _only_video(inspect_media(_main_video(episode_of(name))))
    assert video.codec == "hevc"
    leading = _keyframes_with_leading_pictures(video.packets)
    assert leading, "no keyframe has leading pictures: the GOP is closed"
    for index in leading:
        assert HEVC_CRA in video.packets[index].nal_types
        assert HEVC_RASL & set(video.packets[index + 1].nal_types), "leading pictures are RASL"
    # a keyint-triggered CRA, 250 frames (x265's default keyint) after the keyframe before it:
    # the easy writer's x265 files are open GOP too, but with a short fixed GOP
    keys = [i for i, p in enumerate(video.packets) if p.keyframe]
    frame_of = {i: round((video.packets[i].pts_s or 0.0) * case.fps) for i in keys}
    keyint_cras = [
        b for a, b in itertools.pairwise(keys) if frame_of[b] - frame_of[a] == X26X_DEFAULT_KEYINT
    ]
    assert set(keyint_cras) & set(leading), f"no keyint-250 CRA with leading pictures: {frame_of}"


def test_x265_closed_gop_has_idr_keyframes_and_no_leading_pictures(episode_of: EpisodeOf) -> None:
    video = _only_video(inspect_media(_main_video(episode_of("h265_closed_gop_mp4"))))
    keyframes = [p for p in video.packets if p.keyframe]
    assert len(keyframes) >= 2
    assert all(HEVC_IDR & set(p.nal_types) for p in keyframes)
    assert not _keyframes_with_leading_pictures(video.packets)
    assert _pts_in_decode_order_is_reordered(video), "still B-frames inside each GOP"


def test_av1_default_keeps_svt_av1s_own_multi_second_keyframe_interval(
    episode_of: EpisodeOf,
) -> None:
    case = CASES["av1_default_mp4"]
    video = _only_video(inspect_media(_main_video(episode_of(case.name))))
    assert video.codec == "av1"
    keys = _frame_numbers(video, case.fps, keyframes_only=True)
    assert len(keys) >= 2
    assert min(np.diff(keys)) > 2 * case.fps, f"SVT-AV1's default keyint is ~5 s: {keys}"


@pytest.mark.parametrize(("name", "codec"), [("h265_10bit_mkv", "hevc"), ("av1_10bit_mkv", "av1")])
def test_ten_bit_cases_are_yuv420p10le_in_matroska(
    episode_of: EpisodeOf, name: str, codec: str
) -> None:
    info = inspect_media(_main_video(episode_of(name)))
    video = _only_video(info)
    assert "matroska" in info.format_name
    assert (video.codec, video.pix_fmt) == (codec, "yuv420p10le")


# --- timing ----------------------------------------------------------------------------------


def test_vfr_has_jittered_intervals_and_dropped_frames_on_a_fine_clock(
    episode_of: EpisodeOf,
) -> None:
    case = CASES["h264_vfr_mp4"]
    video = _only_video(inspect_media(_main_video(episode_of(case.name))))
    assert video.time_base.denominator >= 1000, f"coarse clock {video.time_base}"
    pts = np.sort([p.pts_s for p in video.packets if p.pts_s is not None])
    deltas = np.diff(pts)
    nominal = 1.0 / case.fps
    assert deltas.std() > 0.001, "constant frame rate"
    off_grid = np.abs(pts * case.fps - np.round(pts * case.fps)) * nominal
    assert (off_grid > 0.0005).mean() > 0.5, "frame times sit on the 1/fps grid"
    assert (deltas > 1.5 * nominal).sum() >= 3, "no dropped frames"


def test_120fps_has_120_frames_a_second(episode_of: EpisodeOf) -> None:
    case = CASES["h264_120fps_mp4"]
    video = _only_video(inspect_media(_main_video(episode_of(case.name))))
    pts = np.sort([p.pts_s for p in video.packets if p.pts_s is not None])
    assert case.fps == 120
    assert float(np.median(np.diff(pts))) == pytest.approx(1 / 120, rel=0.01)
    assert len(pts) == pytest.approx(case.duration_s * 120, abs=2)


@pytest.mark.parametrize("name", ["h264_audio_mp4", "rgbd_ffv1_depth_mkv"])
def test_audio_track_spans_the_video_and_is_interleaved_by_time(
    episode_of: EpisodeOf, name: str
) -> None:
    case = CASES[name]
    info = inspect_media(_main_video(episode_of(name)))
    (audio,) = info.audio()
    assert audio.codec in ("aac", "opus")
    audio_pts = [p.pts_s for p in audio.packets if p.pts_s is not None]
    frame_s = audio_pts[-1] - audio_pts[-2]
    assert audio_pts[-1] + frame_s == pytest.approx(case.duration_s, abs=0.1)
    # interleaved: no stream runs for more than ~1 s of packets before the other shows up
    runs, run = [], 1
    for a, b in itertools.pairwise(info.demux_order):
        run = run + 1 if a == b else 1
        runs.append(run)
    assert max(runs) < 60, "audio and video are not interleaved by time"


def test_rotated_video_carries_a_display_matrix(episode_of: EpisodeOf) -> None:
    video = _only_video(inspect_media(_main_video(episode_of("h264_rotated_mp4"))))
    assert video.rotation_deg in (90, -90, 270)


# --- streams and layouts ---------------------------------------------------------------------


def test_rgbd_mkv_has_titled_rgb_and_lossless_16_bit_depth_at_the_same_times(
    episode_of: EpisodeOf,
) -> None:
    path = _main_video(episode_of("rgbd_ffv1_depth_mkv"))
    info = inspect_media(path)
    rgb, depth = info.video()
    assert (rgb.title, rgb.codec) == ("rgb", "h264")
    assert (depth.title, depth.codec, depth.pix_fmt) == ("depth", "ffv1", "gray16le")
    rgb_times = sorted(p.pts_s for p in rgb.packets if p.pts_s is not None)
    assert rgb_times == sorted(p.pts_s for p in depth.packets if p.pts_s is not None)
    assert len(rgb_times) == len(rgb.packets) == len(depth.packets)
    frame = decode_first_frame(path, depth.index)
    assert frame.dtype == np.uint16 and frame.ndim == 2
    assert int(frame.max()) > 255, "depth squeezed into 8 bits"


def test_fragmented_mp4_is_moof_fragments_after_an_empty_moov(episode_of: EpisodeOf) -> None:
    data = _main_video(episode_of("h264_fragmented_mp4")).read_bytes()
    kinds = [kind for kind, _, _ in _top_level_boxes(data)]
    assert kinds[:2] == ["ftyp", "moov"]
    assert kinds.count("moof") >= 2, kinds
    assert kinds.index("moov") < kinds.index("moof") < kinds.index("mdat")


def test_power_cut_fragmented_mp4_keeps_a_prefix_of_whole_fragments_and_a_torn_tail(
    episode_of: EpisodeOf,
) -> None:
    whole = _main_video(episode_of("h264_fragmented_mp4"))
    cut = _main_video(episode_of("h264_fragmented_cut_mp4"))
    data = cut.read_bytes()
    assert len(data) < 0.8 * whole.stat().st_size
    kind, offset, size = _top_level_boxes(data)[-1]
    assert offset + size > len(data), f"the last box ({kind}) is whole: not cut mid-write"
    frames = len(_only_video(inspect_media(cut)).packets)
    assert 0 < frames < int(str(_synthetic(episode_of("h264_fragmented_cut_mp4"))["frames"]))
    assert _synthetic(episode_of("h264_fragmented_cut_mp4"))["expect"] == "accept_with_warnings"


def test_power_cut_mkv_is_shorter_and_demuxes_only_a_prefix(episode_of: EpisodeOf) -> None:
    directory = episode_of("h264_mkv_cut")
    cut = _main_video(directory)
    whole = episode_of("h264_chunked_mkv")  # the same recording, written whole
    whole_size = sum(p.stat().st_size for p in whole.glob("video.mkv.*"))
    assert cut.stat().st_size < 0.8 * whole_size
    frames = len(_only_video(inspect_media(cut)).packets)
    assert 0 < frames < int(str(_synthetic(directory)["frames"]))
    assert _synthetic(directory)["expect"] == "accept_with_warnings"


def test_chunked_mkv_is_byte_contiguous_pieces_of_one_whole_file(
    episode_of: EpisodeOf, tmp_path: Path
) -> None:
    case = CASES["h264_chunked_mkv"]
    directory = episode_of(case.name)
    assert _meta(directory)["video"] == "video.mkv"
    assert not (directory / "video.mkv").exists()
    pieces = sorted(directory.glob("video.mkv.*"))
    assert [p.suffix for p in pieces] == [f".{n:03d}" for n in range(len(pieces))]
    assert len(pieces) >= 2
    assert case.chunk_bytes is not None
    assert all(p.stat().st_size == case.chunk_bytes for p in pieces[:-1])
    joined = tmp_path / "video.mkv"
    joined.write_bytes(b"".join(p.read_bytes() for p in pieces))
    packets = _only_video(inspect_media(joined)).packets
    assert len(packets) == int(str(_synthetic(directory)["frames"]))


def test_multicam_names_two_camera_files_and_the_wrist_starts_late(episode_of: EpisodeOf) -> None:
    case = CASES["multicam_mp4"]
    directory = episode_of(case.name)
    videos = _meta(directory)["videos"]
    assert isinstance(videos, dict) and set(videos) == {"head", "wrist"}
    wrist = videos["wrist"]
    wrist_file = wrist["file"] if isinstance(wrist, dict) else wrist
    assert isinstance(wrist, dict) and wrist["offset_s"] == pytest.approx(0.2)
    for name in (videos["head"], wrist_file):
        assert len(_only_video(inspect_media(directory / str(name))).packets) > case.fps


# --- IMU -------------------------------------------------------------------------------------


def _imu_rate(case: RealisticCase) -> float:
    match = re.fullmatch(r"(npy|csv)(\d+)", case.imu)
    assert match, case.imu
    return float(match.group(2))


def _load_imu(path: Path) -> NDArray[np.float64]:
    if path.suffix == ".csv":
        assert path.read_text().splitlines()[0] == "t,ax,ay,az,gx,gy,gz"
        return np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64)
    return np.asarray(np.load(path, allow_pickle=False))


@pytest.mark.parametrize(
    "name", sorted(n for n, c in CASES.items() if c.imu.startswith(("npy", "csv")))
)
def test_timed_imu_is_n_by_7_at_its_own_rate_and_brackets_the_video(
    episode_of: EpisodeOf, name: str
) -> None:
    case = CASES[name]
    directory = episode_of(name)
    imu = _load_imu(directory / str(_meta(directory)["imu"]))
    rate = _imu_rate(case)
    assert imu.dtype == np.float64 and imu.ndim == 2 and imu.shape[1] == 7
    t = imu[:, 0]
    dt = np.diff(t)
    assert (dt > 0).all(), "timestamps strictly increase"
    assert float(np.median(dt)) == pytest.approx(1 / rate, rel=0.02)
    assert dt.std() > 0, "a real IMU clock jitters"
    assert t[0] < 0 < case.duration_s < t[-1], "starts before the video, ends after"
    assert len(t) == pytest.approx((t[-1] - t[0]) * rate, rel=0.01)
    assert float(np.median(imu[:, 3])) == pytest.approx(9.81, abs=0.5), "gravity on z"


def test_frame_synced_imu_is_one_float32_row_of_six_per_frame(episode_of: EpisodeOf) -> None:
    directory = episode_of("imu_frame_synced_mp4")
    imu = np.load(directory / str(_meta(directory)["imu"]), allow_pickle=False)
    frames = len(_only_video(inspect_media(_main_video(directory))).packets)
    assert imu.dtype == np.float32 and imu.shape == (frames, 6)


# --- the encoder module itself ---------------------------------------------------------------


def _cut_frames(count: int, cut_at: int, width: int, height: int) -> list[NDArray[np.uint8]]:
    frames = list(scene.rgb_frames(count, width, height, seed=3))
    return [255 - f if i >= cut_at else f for i, f in enumerate(frames)]


def _first_frame_phash(directory: Path) -> int:
    import cv2

    from services.media.signals import frame_signal

    rgb = decode_first_frame(_main_video(directory), 0)
    gray = cv2.cvtColor(np.asarray(rgb, dtype=np.uint8), cv2.COLOR_RGB2GRAY)
    luma = np.asarray(gray, dtype=np.uint8)
    return int(frame_signal(0.0, luma).phash, 16)


def test_each_case_of_the_mix_is_a_recording_of_its_own(episode_of: EpisodeOf) -> None:
    # Written with one seed (as `egoline synth --realistic` writes them), two cases must not
    # show the same picture: the warehouse would rightly call one a near duplicate of the other
    # (pHashes within 7 bits). Unrelated pictures differ in about half of the 64 bits.
    assert len({case.seed_offset for case in CASES.values()}) == len(CASES)
    a = _first_frame_phash(episode_of("h264_default_mp4"))
    b = _first_frame_phash(episode_of("imu_frame_synced_mp4"))
    assert bin(a ^ b).count("1") > 16
