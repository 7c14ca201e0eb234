"""Content signals (`services/media/signals.py`): per frame, still spans from packet sizes,
per clip; the still-span threshold checked on what x264 and x265 write with their defaults."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest
from numpy.typing import NDArray

from schemas.events import StreamSignals
from services.media.av_io import DeviceVideo, decode_keyframes, encode_device_file
from services.media.signals import (
    SignalSampler,
    clip_quality,
    frame_signal,
    gyro_rms,
    still_spans,
    stream_signals,
)

RNG = np.random.default_rng(7)


def textured(seed: int = 0, size: tuple[int, int] = (180, 320)) -> NDArray[np.uint8]:
    rng = np.random.default_rng(seed)
    base = cv2.resize(
        rng.integers(0, 255, (size[0] // 8, size[1] // 8), dtype=np.uint8), size[::-1]
    )
    edges = (rng.random(size) > 0.97).astype(np.uint8) * 120
    return u8(base.astype(np.int16) + edges)


def u8(values: NDArray[np.generic]) -> NDArray[np.uint8]:
    return np.asarray(np.clip(values, 0, 255), dtype=np.uint8)


def hamming(a: str, b: str) -> int:
    return bin(int(a, 16) ^ int(b, 16)).count("1")


def test_frame_signals_separate_blur_exposure_and_content() -> None:
    clean = textured(1)
    blurred = u8(cv2.GaussianBlur(clean, (0, 0), 6))
    bright = np.clip(clean.astype(np.int16) * 3, 0, 255).astype(np.uint8)
    dark = (clean // 12).astype(np.uint8)
    s_clean, s_blur = frame_signal(0, clean), frame_signal(0, blurred)
    assert s_blur.sharpness < s_clean.sharpness / 20
    assert frame_signal(0, bright).highlights > 0.3 > s_clean.highlights
    assert frame_signal(0, dark).mean_luma < 25 and frame_signal(0, dark).shadows > 0.1
    # a perceptual hash: the same picture re-encoded (noise, another size) stays close, another
    # picture does not
    noisy = np.clip(clean + RNG.normal(0, 4, clean.shape), 0, 255).astype(np.uint8)
    smaller = u8(cv2.resize(clean, (160, 90)))
    other = frame_signal(0, textured(2)).phash
    assert hamming(s_clean.phash, frame_signal(0, noisy).phash) <= 6
    assert hamming(s_clean.phash, frame_signal(0, smaller).phash) <= 6
    assert hamming(s_clean.phash, other) > 16


def test_sampler_keeps_at_most_one_frame_per_interval() -> None:
    sampler = SignalSampler(1.0)
    for i in range(30):
        sampler.add(i / 10, textured(i))
    assert [f.t_s for f in sampler.frames] == [0.0, 1.0, 2.0]


def test_still_spans_are_runs_of_near_empty_inter_frames() -> None:
    t = np.arange(300) / 30.0
    sizes = np.full(300, 20_000, dtype=np.int64)
    sizes[90:210] = 40  # 4 s of all-skip frames ...
    sizes[[93, 97]] = 2300  # ... in which the encoder still refines two frames at the start
    sizes[250:260] = 40  # a third of a second: a pause, not a freeze
    key = np.zeros(300, dtype=bool)
    key[[0, 150]] = True  # a keyframe (a GOP boundary) inside the freeze
    ((start, end),) = still_spans(t, sizes, key, 1280 * 720, 0.004)
    assert start == pytest.approx(89 / 30) and end == pytest.approx(210 / 30)
    # slow motion: small B frames between larger P frames is not a freeze
    rhythm = np.where(np.arange(300) % 3 == 0, 20_000, 300).astype(np.int64)
    assert still_spans(t, rhythm, key, 1280 * 720, 0.004) == []
    assert still_spans(t, np.full(300, 20_000, dtype=np.int64), key, 1280 * 720, 0.004) == []


def _stream(
    t: list[float], sharp: list[float], luma: list[float], std: list[float]
) -> StreamSignals:
    n = len(t)
    return StreamSignals(
        camera="main",
        stream_index=0,
        t_s=t,
        sharpness=sharp,
        mean_luma=luma,
        std_luma=std,
        highlights=[0.0] * n,
        shadows=[0.0] * n,
        phash=["0" * 16] * n,
        still_spans_s=[(4.0, 8.0)],
    )


def test_clip_quality_summarises_the_window_and_takes_the_worst_stream() -> None:
    main = _stream([0, 2, 4, 6, 8], [300, 320, 310, 5, 6], [120] * 5, [40] * 5)
    covered = _stream([0, 2, 4, 6, 8], [300] * 5, [120, 120, 10, 10, 10], [40, 40, 2, 2, 2])
    first = clip_quality([main, covered], 0.0, 4.0, None, 24.0, 6.0)
    assert first.sharpness == 300 and first.blocked_fraction == 0.0
    assert first.frozen_fraction == 0.0 and first.motion is None
    second = clip_quality([main, covered], 4.0, 9.0, None, 24.0, 6.0)
    assert second.sharpness == 6  # the median of the main stream's 310, 5, 6
    assert second.blocked_fraction == 1.0 and second.frozen_fraction == pytest.approx(0.8)


def test_gyro_rms_of_a_device_at_rest_and_in_hand() -> None:
    t = np.arange(400) / 200.0
    rest = np.column_stack([t, np.zeros(400), np.zeros(400), np.full(400, 9.81)] + [
        RNG.normal(0, 0.002, 400) for _ in range(3)
    ])  # fmt: skip
    hand = rest.copy()
    hand[:, 4:] = RNG.normal(0, 0.6, (400, 3))
    assert (gyro_rms(rest) or 1) < 0.01 < 0.5 < (gyro_rms(hand) or 0)
    assert gyro_rms(rest[:, 1:]) == pytest.approx(gyro_rms(rest))  # frame-synced (N, 6)
    assert gyro_rms(None) is None and gyro_rms(np.zeros((0, 7))) is None


@pytest.mark.parametrize("encoder", ["libx264", "libx265"])
def test_a_frozen_segment_written_by_an_encoder_with_defaults_is_a_still_span(
    tmp_path: Path, encoder: str
) -> None:
    """8 s at 30 fps, moving texture except 3-6 s where one frame repeats: the encoder's
    default settings code the repeats as near-empty inter frames."""
    rng = np.random.default_rng(3)
    base = rng.integers(0, 255, (90, 160, 3), dtype=np.uint8)

    def frames() -> list[NDArray[np.uint8]]:
        out = []
        for i in range(240):
            k = 90 if 90 <= i < 180 else i
            shifted = np.roll(base, k * 2, axis=1)
            out.append(u8(cv2.resize(shifted, (640, 360), interpolation=cv2.INTER_LINEAR)))
        return out

    path = tmp_path / "frozen.mp4"
    options = {"x265-params": "log-level=error"} if encoder == "libx265" else {}
    video = DeviceVideo(
        encoder, frames(), [i * 512 for i in range(240)], Fraction(1, 15360), 30, 640, 360,
        options=options,
    )  # fmt: skip
    encode_device_file(path, [video], "mp4")
    sampler = SignalSampler(1.0)
    check = decode_keyframes(path, 0, sampler=sampler, still_bits_per_pixel=0.004)
    assert check.failed == 0 and sampler.frames
    (span,) = check.still_spans_s
    assert span[0] == pytest.approx(3.0, abs=0.1) and span[1] == pytest.approx(6.0, abs=0.1)
    signals = stream_signals("main", 0, sampler.frames, check.still_spans_s)
    quality = clip_quality([signals], 2.0, 8.0, None, 24.0, 6.0)
    assert quality.frozen_fraction == pytest.approx(0.5, abs=0.03)
