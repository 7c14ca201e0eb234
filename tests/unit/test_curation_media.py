"""The labelled curation media (services/synth/realistic.py) really has the defect it is labelled
with, measured from the written files (decoded frames, IMU arrays), not from labels.json.

Each content case is a few seconds long and encoded once per session. The numbers these tests
hold the media to (320x240 x264 defaults, seed 0): Laplacian variance ~3600 clean vs ~8 blurred;
~48 % of overexposed pixels at luma >= 250 vs < 1 % clean; underexposed mean luma ~10 vs ~127;
a covered lens mean ~7, spatial std < 1; a frozen span decodes to frames whose consecutive mean
absolute difference is <= 0.1 (x264 converges to +-1 LSB; moving frames differ by ~9-15); on a
table the gyro RMS is ~0.002 rad/s vs ~0.03 hand-held.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
from numpy.typing import NDArray

from services.agent.recordings import COMPLETION_MARKER
from services.media.av_io import decode_frames, decode_stream_times, inspect_media
from services.synth.realistic import (
    CONTENTS,
    DEFECTS,
    DUPLICATES,
    LABELS_FILE,
    RealisticCase,
    curation_cases,
    episode_id_of,
    write_cases,
)

FPS = 30
# Neutral names, as in a curation mix: nothing in episode.json may tell the content.
CASES = {
    "clean": RealisticCase("mix_a", duration_s=12.0),
    "blur": RealisticCase("mix_b", duration_s=4.0, content="blur"),
    "overexposed": RealisticCase("mix_c", duration_s=4.0, content="overexposed"),
    "underexposed": RealisticCase("mix_d", duration_s=4.0, content="underexposed"),
    "covered": RealisticCase("mix_e", duration_s=4.0, content="covered"),
    "static": RealisticCase("mix_f", duration_s=4.0, content="static"),
    "frozen": RealisticCase("mix_g", duration_s=8.0, content="frozen"),
    "dup_reencoded": RealisticCase(
        "mix_h",
        duration_s=12.0,
        content="dup_reencoded",
        duplicate_of="mix_a",
        width=240,
        height=180,
        crf=30,
        seed_offset=5,
    ),
    "dup_trimmed": RealisticCase(
        "mix_i", duration_s=12.0, content="dup_trimmed", duplicate_of="mix_a", seed_offset=6
    ),
}

Gray = NDArray[np.uint8]
FolderOf = Callable[[str], Path]


@pytest.fixture(scope="session")
def folder_of(tmp_path_factory: pytest.TempPathFactory) -> FolderOf:
    """The episode folder of a content kind, written (with its original first) on first use."""
    out = tmp_path_factory.mktemp("curation_media")
    order = list(CASES.values())

    def get(kind: str) -> Path:
        case = CASES[kind]
        needed = [c for c in order if c.name in (case.name, case.duplicate_of)]
        return write_cases(needed, out, seed=0)[-1]

    return get


def _meta(folder: Path) -> dict[str, object]:
    meta = json.loads((folder / COMPLETION_MARKER).read_text())
    assert isinstance(meta, dict)
    return meta


def _labels(folder: Path) -> dict[str, object]:
    labels = json.loads((folder / LABELS_FILE).read_text())
    assert isinstance(labels, dict)
    return labels


def _video(folder: Path) -> Path:
    return folder / str(_meta(folder)["video"])


def _gray(folder: Path) -> list[Gray]:
    frames = decode_frames(_video(folder).read_bytes())
    return [np.asarray(cv2.cvtColor(f, cv2.COLOR_RGB2GRAY), dtype=np.uint8) for f in frames]


def _imu(folder: Path) -> NDArray[np.float64]:
    return np.asarray(np.load(folder / str(_meta(folder)["imu"]), allow_pickle=False))


def _sharpness(frame: Gray) -> float:
    """Variance of the Laplacian: high for edges in focus, near zero for a blurred picture."""
    return float(cv2.Laplacian(frame, cv2.CV_64F).var())


def _motion(frames: list[Gray]) -> NDArray[np.float64]:
    """Mean absolute difference of each frame from the one before (luma levels)."""
    return np.array([np.abs(b.astype(np.int16) - a).mean() for a, b in itertools.pairwise(frames)])


def _longest_still_run(frames: list[Gray], tolerance: float = 0.1) -> tuple[int, int]:
    """(first frame, frames) of the longest run of frames repeating the one before it."""
    best, start = (0, 1), 0
    for i, still in enumerate(_motion(frames) <= tolerance, start=1):
        if not still:
            start = i
        elif i - start + 1 > best[1]:
            best = (start, i - start + 1)
    return best


def _span(labels: dict[str, object], key: str) -> tuple[float, float]:
    spans = labels[key]
    assert isinstance(spans, list) and len(spans) == 1
    first, end = spans[0]
    return float(first), float(end)


# --- labels -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(CASES))
def test_labels_sit_beside_episode_json_which_neither_names_nor_reveals_them(
    folder_of: FolderOf, kind: str
) -> None:
    folder = folder_of(kind)
    labels = _labels(folder)
    assert labels["content"] == kind
    assert labels["episode_id"] == _meta(folder)["episode_id"] == episode_id_of(CASES[kind].name, 0)
    episode_json = (folder / COMPLETION_MARKER).read_text()
    assert LABELS_FILE not in episode_json, "the agent uploads what episode.json names"
    for word in (*CONTENTS, "dup", "frozen", "trim", "label"):
        assert word not in episode_json, word


@pytest.mark.parametrize("kind", DUPLICATES)
def test_a_duplicate_is_labelled_with_its_originals_episode_id(
    folder_of: FolderOf, kind: str
) -> None:
    assert _labels(folder_of(kind))["duplicate_of"] == _meta(folder_of("clean"))["episode_id"]
    assert _labels(folder_of("clean"))["duplicate_of"] is None


# --- picture defects over the whole recording ------------------------------------------------


def test_blurred_recording_has_a_laplacian_variance_far_below_the_clean_one(
    folder_of: FolderOf,
) -> None:
    clean = float(np.median([_sharpness(f) for f in _gray(folder_of("clean"))[::10]]))
    blurred = float(np.median([_sharpness(f) for f in _gray(folder_of("blur"))[::10]]))
    assert clean > 1000, "the clean scene lacks the detail blur would remove"
    assert blurred < clean / 100


def test_overexposed_recording_clips_a_large_share_of_pixels_at_white(
    folder_of: FolderOf,
) -> None:
    def clipped(kind: str) -> float:
        return float(np.mean([(f >= 250).mean() for f in _gray(folder_of(kind))]))

    assert clipped("overexposed") > 0.35
    assert clipped("clean") < 0.02


def test_underexposed_recording_is_dark_with_crushed_shadows(folder_of: FolderOf) -> None:
    dark = _gray(folder_of("underexposed"))
    assert float(np.mean([f.mean() for f in dark])) < 20
    assert float(np.mean([(f <= 2).mean() for f in dark])) > 0.05, "no shadow crushed to black"
    assert float(np.mean([f.mean() for f in _gray(folder_of("clean"))])) > 100


def test_covered_lens_is_near_black_and_flat_for_most_of_the_recording(
    folder_of: FolderOf,
) -> None:
    folder = folder_of("covered")
    frames = _gray(folder)
    start_s, end_s = _span(_labels(folder), "covered_spans_s")
    assert end_s - start_s > 0.6 * CASES["covered"].duration_s
    covered = frames[round(start_s * FPS) : round(end_s * FPS)]
    assert max(float(f.mean()) for f in covered) < 15
    assert max(float(f.std()) for f in covered) < 3, "not flat"
    assert min(float(f.std()) for f in covered) > 0, "no sensor noise at all"
    assert _sharpness(frames[0]) > 1000, "the lens is uncovered before the span"


# --- frozen span ------------------------------------------------------------------------------


def test_frozen_recording_repeats_one_frame_for_the_labelled_span_and_moves_elsewhere(
    folder_of: FolderOf,
) -> None:
    folder = folder_of("frozen")
    start_s, end_s = _span(_labels(folder), "frozen_spans_s")
    assert end_s - start_s >= 4.0
    first, length = _longest_still_run(_gray(folder))
    assert first == pytest.approx(start_s * FPS, abs=2)
    assert length == pytest.approx((end_s - start_s) * FPS, abs=2)
    _, clean_run = _longest_still_run(_gray(folder_of("clean")))
    assert clean_run < FPS // 2, "the clean scene stands still on its own"


# --- a device left on a table -----------------------------------------------------------------


def test_static_device_imu_is_at_rest_and_its_picture_barely_moves(folder_of: FolderOf) -> None:
    def gyro_rms(kind: str) -> float:
        return float(np.sqrt(np.mean(_imu(folder_of(kind))[:, 4:7] ** 2)))

    assert gyro_rms("static") < 0.005
    assert gyro_rms("static") < gyro_rms("clean") / 5
    accel = np.linalg.norm(_imu(folder_of("static"))[:, 1:4], axis=1)
    assert float(accel.mean()) == pytest.approx(9.81, abs=0.05)
    assert float(accel.std()) < 0.05
    assert float(np.median(_motion(_gray(folder_of("static"))))) < 1.0
    assert float(np.median(_motion(_gray(folder_of("clean"))))) > 5.0


# --- duplicates -------------------------------------------------------------------------------


def _bitrate_bps(path: Path) -> float:
    (video,) = inspect_media(path).video()
    times = decode_stream_times(path, video.index).times_s
    seconds = max(times) - min(times) + 1 / FPS
    return 8 * sum(p.size_bytes for p in video.packets) / seconds


def _thumb(frame: Gray) -> NDArray[np.int16]:
    return np.asarray(cv2.resize(frame, (80, 60), interpolation=cv2.INTER_AREA), dtype=np.int16)


def test_reencoded_duplicate_has_another_size_and_bitrate_but_the_same_frames(
    folder_of: FolderOf,
) -> None:
    original, copy = folder_of("clean"), folder_of("dup_reencoded")
    a, b = _gray(original), _gray(copy)
    assert a[0].shape == (240, 320) and b[0].shape == (180, 240)
    assert len(a) == len(b)
    times_a = decode_stream_times(_video(original), 0).times_s
    times_b = decode_stream_times(_video(copy), 0).times_s
    assert max(times_b) - min(times_b) == pytest.approx(max(times_a) - min(times_a), abs=1e-3)
    rate_a, rate_b = _bitrate_bps(_video(original)), _bitrate_bps(_video(copy))
    assert abs(rate_a - rate_b) > 0.2 * rate_a, (rate_a, rate_b)
    same = [float(np.abs(_thumb(x) - _thumb(y)).mean()) for x, y in zip(a, b, strict=True)]
    shifted = [float(np.abs(_thumb(x) - _thumb(y)).mean()) for x, y in zip(a[5:], b, strict=False)]
    assert max(same) < 5, "the downscaled content differs"
    assert min(same) * 2 < float(np.median(shifted)), "any frame of the scene would match"
    assert (_video(original).parent / "imu.npy").read_bytes() == (copy / "imu.npy").read_bytes()


def test_trimmed_duplicate_is_shorter_by_the_labelled_seconds_and_starts_at_that_frame(
    folder_of: FolderOf,
) -> None:
    original, copy = folder_of("clean"), folder_of("dup_trimmed")
    trimmed_s = _labels(copy)["trimmed_s"]
    assert isinstance(trimmed_s, float) and trimmed_s >= 2.0
    times_a = np.array(decode_stream_times(_video(original), 0).times_s)
    times_b = np.array(decode_stream_times(_video(copy), 0).times_s)
    assert times_b.min() == pytest.approx(0.0, abs=1e-3), "timestamps rebased to 0"
    span_a, span_b = np.ptp(times_a), np.ptp(times_b)
    assert span_a - span_b == pytest.approx(trimmed_s, abs=1.5 / FPS)
    a, b = _gray(original), _gray(copy)
    at = int(np.searchsorted(np.sort(times_a), times_a.min() + trimmed_s - 1e-3))
    assert len(a) - len(b) == at
    assert np.array_equal(b[0], a[at]), (
        "stream copy: the first frame is the original's, bit for bit"
    )
    assert not np.array_equal(b[0], a[at - 1])
    # A stream copy of the file written for the original, not of the same recording encoded a
    # second time: x264 with threads once gave other P-frames for the same input (a clean-clone
    # CI run), and then no frame after the first matched.
    packets_a, packets_b = _packets(_video(original)), _packets(_video(copy))
    assert packets_b == packets_a[len(packets_a) - len(packets_b) :], "the original's packets"
    imu_a, imu_b = _imu(original), _imu(copy)
    kept = imu_a[imu_a[:, 0] >= trimmed_s - 0.05]
    assert np.allclose(imu_b[:, 1:], kept[:, 1:]), "the same samples, the start dropped"
    # labels.json rounds times to the microsecond
    rebased = kept[:, 0] - trimmed_s
    assert np.allclose(imu_b[:, 0], rebased, atol=1e-5), "rebased to the trimmed video"


def _packets(path: Path) -> list[bytes]:
    """The video packets' bytes in decode order."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [bytes(p) for p in container.demux(stream) if p.size]


# --- the mix ----------------------------------------------------------------------------------


def test_curation_mix_is_mostly_clean_varied_deterministic_with_duplicates_after_originals() -> (
    None
):
    mix = curation_cases(200, seed=3)
    assert mix == curation_cases(200, seed=3)
    assert mix != curation_cases(200, seed=4)
    assert len(mix) == 200 and len({c.name for c in mix}) == 200
    kinds = Counter(c.content for c in mix)
    assert kinds["clean"] > 120
    assert all(kinds[k] >= 5 for k in (*DEFECTS, *DUPLICATES)), kinds
    assert {c.codec for c in mix} == {"h264", "h265"}
    assert any(c.depth for c in mix) and any(c.imu == "npy200" for c in mix)
    assert all(8.0 <= c.duration_s <= 14.0 for c in mix)
    position = {c.name: i for i, c in enumerate(mix)}
    by_name = {c.name: c for c in mix}
    for case in mix:
        if case.duplicate_of is not None:
            assert position[case.duplicate_of] < position[case.name]
            assert by_name[case.duplicate_of].content == "clean"
        assert case.content not in case.name, "names are neutral"
    small = Counter(c.content for c in curation_cases(16, seed=0))
    assert set(small) == {"clean", *DEFECTS, *DUPLICATES} and small["clean"] >= 8
