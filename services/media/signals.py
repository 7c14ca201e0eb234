"""Content signals of video frames and clips (curation), as pure functions of arrays.

Computed on the frames validate decodes anyway (each stream's keyframes, at most one per
`sample_s`), converted by the decoder's scaler to 8-bit luma 320 px wide, and on the packet
sizes the demuxer reads anyway; so curation adds no decoding pass. OpenCV does the filtering
(`cv2.Laplacian`) and the perceptual hash (`cv2.img_hash.pHash`, the DCT hash of the
contrib module): well-kept, vectorised C++, ~0.5 ms a frame here (docs/curation.md).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np
from numpy.typing import NDArray

from schemas.events import ClipQuality, EpisodeSignals, StreamSignals

# Luma of a clipped highlight / crushed shadow (8-bit, full range after the scaler).
HIGHLIGHT_LUMA = 250
SHADOW_LUMA = 5
# Frames this uniform carry no content to hash: a black (covered) frame hashes like any other
# black frame, so such hashes are kept out of duplicate matching.
UNIFORM_STD = 2.0
# A run of still inter frames shorter than this is a pause in motion, not a frozen picture.
MIN_STILL_S = 1.0
MAX_STILL_GAP_S = 0.25
# Headers an encoder writes for every frame whatever the picture (NAL, slice and frame
# headers: 26-60 bytes measured on x264/x265 defaults); only what lies beyond is picture data.
FRAME_HEADER_BYTES = 64
MIN_STILL_DENSITY = 0.8
SIGNAL_WIDTH = 320


@dataclass(frozen=True)
class FrameSignal:
    """The signals of one sampled frame. Luma values on the 8-bit scale."""

    t_s: float
    sharpness: float  # variance of the Laplacian of the luma
    mean_luma: float
    std_luma: float
    highlights: float  # fraction of pixels >= HIGHLIGHT_LUMA
    shadows: float  # fraction of pixels <= SHADOW_LUMA
    phash: str  # 64-bit DCT perceptual hash, 16 hex digits


def frame_signal(t_s: float, luma: NDArray[np.uint8]) -> FrameSignal:
    """Signals of one frame's 8-bit luma plane (any size; SIGNAL_WIDTH wide as sampled)."""
    values = luma.astype(np.float32)
    laplacian = cv2.Laplacian(luma, cv2.CV_32F)
    digest = cv2.img_hash.pHash(luma)
    size = float(luma.size)
    return FrameSignal(
        t_s=t_s,
        sharpness=float(laplacian.var()),
        mean_luma=float(values.mean()),
        std_luma=float(values.std()),
        highlights=float(np.count_nonzero(luma >= HIGHLIGHT_LUMA)) / size,
        shadows=float(np.count_nonzero(luma <= SHADOW_LUMA)) / size,
        phash=bytes(digest.reshape(-1)).hex(),
    )


@dataclass
class SignalSampler:
    """Collects the signals of a stream's decoded frames, at most one per `sample_s` (frames
    arrive in presentation order from a keyframe pass)."""

    sample_s: float
    frames: list[FrameSignal] = field(default_factory=list)

    def wants(self, t_s: float) -> bool:
        return not self.frames or t_s - self.frames[-1].t_s >= self.sample_s

    def add(self, t_s: float, luma: NDArray[np.uint8]) -> None:
        if self.wants(t_s):
            self.frames.append(frame_signal(t_s, luma))

    def insert(self, t_s: float, luma: NDArray[np.uint8]) -> None:
        """A frame sampled on purpose (inside a still span), kept in time order."""
        if any(abs(f.t_s - t_s) < 1e-6 for f in self.frames):
            return
        bisect.insort(self.frames, frame_signal(t_s, luma), key=lambda f: f.t_s)


def still_spans(
    pts_s: NDArray[np.float64],
    sizes: NDArray[np.int64],
    keyframe: NDArray[np.bool_],
    pixels: int,
    bits_per_pixel: float,
    min_span_s: float = MIN_STILL_S,
    max_gap_s: float = MAX_STILL_GAP_S,
    min_density: float = MIN_STILL_DENSITY,
) -> list[tuple[float, float]]:
    """[start, end) spans (seconds, the packets' clock) of a frozen picture, read from packet
    sizes without decoding: an encoder spends almost nothing on an inter frame identical to its
    reference. Still frames (inter frames whose picture data, beyond FRAME_HEADER_BYTES, is
    under `bits_per_pixel`) are grouped into runs allowing
    gaps of up to `max_gap_s` (an encoder still refines a few frames just after the picture
    stops: measured on x264/x265 defaults, docs/curation.md); a run counts when it lasts
    `min_span_s` and at least `min_density` of its frames are still, which keeps the
    small-B-frame / larger-P-frame rhythm of slow real motion out."""
    if len(pts_s) == 0 or pixels <= 0:
        return []
    order = np.argsort(pts_s, kind="stable")
    t = pts_s[order]
    bpp = np.maximum(sizes[order].astype(np.float64) - FRAME_HEADER_BYTES, 0.0) * 8.0 / pixels
    still = np.flatnonzero(~keyframe[order] & (bpp < bits_per_pixel)).tolist()
    if not still:
        return []
    step = float(np.median(np.diff(t))) if len(t) > 1 else 0.0
    runs: list[list[int]] = [[still[0]]]
    for i in still[1:]:
        if t[i] - t[runs[-1][-1]] <= max_gap_s + step / 2:
            runs[-1].append(i)
        else:
            runs.append([i])
    spans = []
    for run in runs:
        first, last = run[0], run[-1]
        # the picture froze on the frame before the first still one
        start = float(t[first - 1] if first > 0 else t[first])
        end = float(t[last + 1] if last + 1 < len(t) else t[last] + step)
        density = len(run) / (last - first + 1)
        if end - start >= min_span_s and density >= min_density:
            spans.append((start, end))
    return spans


def stream_signals(
    camera: str, stream_index: int, frames: Sequence[FrameSignal], spans: list[tuple[float, float]]
) -> StreamSignals:
    """The event form: columns, rounded (the event stays small: ~40 bytes a frame)."""
    return StreamSignals(
        camera=camera,
        stream_index=stream_index,
        t_s=[round(f.t_s, 3) for f in frames],
        sharpness=[round(f.sharpness, 1) for f in frames],
        mean_luma=[round(f.mean_luma, 1) for f in frames],
        std_luma=[round(f.std_luma, 1) for f in frames],
        highlights=[round(f.highlights, 4) for f in frames],
        shadows=[round(f.shadows, 4) for f in frames],
        phash=[f.phash for f in frames],
        still_spans_s=[(round(a, 3), round(b, 3)) for a, b in spans],
    )


def signals_on_clock(
    signals: EpisodeSignals, starts_s: dict[tuple[str, int], float]
) -> list[StreamSignals]:
    """The validate stage's per-stream signals moved onto the episode clock (each stream's
    times are from its own first pts; `starts_s` puts each (camera, stream index)'s first frame
    on the episode clock, `cutting.EpisodeClock.starts_s`), so a clip window selects them
    directly. Streams not in `starts_s` are left out."""
    out = []
    for sig in signals.streams:
        shift = starts_s.get((sig.camera, sig.stream_index))
        if shift is None:
            continue
        out.append(
            sig.model_copy(
                update={
                    "t_s": [t + shift for t in sig.t_s],
                    "still_spans_s": [(a + shift, b + shift) for a, b in sig.still_spans_s],
                }
            )
        )
    return out


def _blocked_share(
    s: StreamSignals, start_s: float, end_s: float, dark_luma: float, flat_std: float
) -> float:
    """Share of [start_s, end_s) the lens was covered: each moment shows what the latest sample
    before it shows (the first one, before any), except inside a still span, which shows its
    sampled frame (one picture throughout). On a 0.1 s grid."""
    dark = [m < dark_luma and d < flat_std for m, d in zip(s.mean_luma, s.std_luma, strict=True)]
    spans = [
        (a, b, j)
        for a, b in s.still_spans_s
        for j in [next((j for j, t in enumerate(s.t_s) if a <= t < b), None)]
        if j is not None
    ]
    steps = max(1, round((end_s - start_s) / 0.1))
    covered = 0
    for k in range(steps):
        tau = start_s + (k + 0.5) * (end_s - start_s) / steps
        inside = next((j for a, b, j in spans if a <= tau < b), None)
        if inside is None:
            inside = max(0, bisect.bisect_right(s.t_s, tau) - 1)
        covered += dark[inside]
    return covered / steps


def _from_mid_grey(luma: float) -> float:
    return abs(luma - 127.5)


def _overlap(spans: Sequence[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


def gyro_rms(imu: NDArray[np.float64] | None) -> float | None:
    """RMS of the gyro magnitude (rad/s) of an IMU slice `(N, 7)` `[t, accel xyz, gyro xyz]`
    or frame-synced `(N, 6)` `[accel xyz, gyro xyz]`; None without samples."""
    if imu is None or imu.ndim != 2 or len(imu) == 0 or imu.shape[1] not in (6, 7):
        return None
    gyro = imu[:, -3:].astype(np.float64)
    finite = gyro[np.isfinite(gyro).all(axis=1)]
    if len(finite) == 0:
        return None
    return float(np.sqrt(np.mean(np.sum(finite * finite, axis=1))))


def clip_quality(
    streams: Sequence[StreamSignals],
    start_s: float,
    end_s: float,
    imu: NDArray[np.float64] | None,
    dark_luma: float,
    flat_std: float,
) -> ClipQuality:
    """A clip's signals over [start_s, end_s) (each stream's own clock): per stream the median
    sharpness, mean exposure, the frozen share of the span and the share of dark-and-flat
    frames; over streams the worst of each. Without a sampled frame in the span, the nearest
    earlier sample stands for it (a clip starts on a keyframe, which was sampled)."""
    sharp: list[float] = []
    luma: list[float] = []
    high: list[float] = []
    low: list[float] = []
    frozen = 0.0
    blocked = 0.0
    span = max(end_s - start_s, 1e-9)
    for s in streams:
        if not s.t_s:
            continue
        lo = bisect.bisect_left(s.t_s, start_s - 1e-6)
        hi = bisect.bisect_left(s.t_s, end_s - 1e-6)
        picked = list(range(lo, hi)) or [max(0, min(lo, len(s.t_s)) - 1)]
        sharp.append(statistics.median(s.sharpness[i] for i in picked))
        luma.append(statistics.fmean(s.mean_luma[i] for i in picked))
        high.append(statistics.fmean(s.highlights[i] for i in picked))
        low.append(statistics.fmean(s.shadows[i] for i in picked))
        blocked = max(blocked, _blocked_share(s, start_s, end_s, dark_luma, flat_std))
        frozen = max(frozen, min(1.0, _overlap(s.still_spans_s, start_s, end_s) / span))
    # the stream furthest from mid-grey is the worst exposed
    worst_luma: float | None = max(luma, key=_from_mid_grey) if luma else None
    return ClipQuality(
        sharpness=round(min(sharp), 1) if sharp else None,
        mean_luma=None if worst_luma is None else round(worst_luma, 1),
        highlights=round(max(high), 4) if high else None,
        shadows=round(max(low), 4) if low else None,
        frozen_fraction=round(frozen, 4),
        blocked_fraction=round(blocked, 4),
        motion=None if (rms := gyro_rms(imu)) is None else round(rms, 4),
    )
