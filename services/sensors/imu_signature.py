"""The IMU signature of an episode (pure): a short motion descriptor, its landmark hashes, and the
rule that says two traces are the same recording.

A duplicate copy of a recording (re-encoded, resized, cropped, trimmed) keeps what the device
felt: the IMU samples are the same numbers, at most trimmed and rebased to the copy's first
frame. So the IMU finds copies the picture hash misses (a picture re-encoded or cropped until
its pHash drifts, or mostly uniform frames) and confirms the ones it finds. Design
(docs/curation.md, "The IMU signature"):

- **Descriptor**: the gyro magnitude |w| (rad/s; rotation-invariant, no gravity in it) on a
  `DESCRIPTOR_HZ` (10 Hz) grid, smoothed by a Gaussian of `SMOOTH_S` (0.15 s): fine bins of
  `FINE_HZ` averaged from the samples at any rate (20 Hz frame-synced to 1 kHz), then the
  Gaussian, then every 10th. The grid's phase is the trace's own; smoothing keeps the values
  nearly the same whatever the phase (a trimmed copy's grid is shifted by up to half a step).
- **Uninformative**: a device at rest (on a table: gyro noise ~0.002 rad/s) has no peak of
  |w| with a prominence of `PEAK_PROMINENCE` (0.05 rad/s), so it has no landmarks; an episode
  with fewer than `MIN_PEAKS` peaks or `MIN_LANDMARKS` landmarks is `informative=False`
  (stored without landmarks) and matches nothing, exactly as uniform frames carry no pHash.
- **Landmarks** (the index keys; as audio fingerprints pair spectral peaks): each peak with
  two of the next three, hashed from the two time gaps (0.1 s steps) and the three peak
  heights (eighth-of-an-octave steps of |w|): 35 bits, nothing of the trace's start in them,
  so a trimmed copy keeps every landmark after its cut. Each landmark carries its anchor's
  time. Fine steps make a landmark rare (an index probe reads few rows) at the price of some
  landmarks a noisy copy loses; a copy keeps most of its tens, one is enough to be checked.
- **Alignment**: landmarks two traces share vote for the lag between their clocks (their
  anchor time minus ours); the median lag of the votes, counted within `LAG_TOLERANCE_S`.
- **The check**: Pearson correlation of the two descriptors over their overlap at that lag
  (and one grid step either side): a copy correlates ~1, unrelated motion far lower. The rule
  (`ImuRule`): `min_votes` (2) landmarks at the lag, or one when either trace has fewer than
  `FEW_LANDMARKS` (8: a short or sparse copy may keep only one), then correlation >=
  `min_correlation` over an overlap of at least `min_overlap_s` that covers at least
  `min_cover` of the shorter trace. Two votes keep chance candidates (a landmark shared by
  accident) few as the corpus grows: each costs a correlation.

`services/metadata/imu_duplicates.py` runs the same alignment and check in SQL over the
landmark index; these functions are its reference (tests compare them on crafted traces).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from services.sensors.imu import ImuSamples

SIGNATURE_VERSION: Final = 1
DESCRIPTOR_HZ: Final = 10.0  # descriptor samples per second
FINE_HZ: Final = 100.0  # bins the samples are first averaged into
SMOOTH_S: Final = 0.15  # Gaussian sigma (seconds)
MAX_DESCRIPTOR_S: Final = 3600.0  # the first hour of a longer episode (36k values, ~250 KB JSON)
PEAK_HALF_WINDOW: Final = 3  # a peak is the maximum within +-0.3 s
PROMINENCE_WINDOW: Final = 10  # ... and rises above the lowest point within 1 s either side
PEAK_PROMINENCE: Final = 0.05  # ... by this much (rad/s): 25x a resting gyro's noise
MIN_PEAKS: Final = 4  # fewer: uninformative (a resting or featureless trace)
MIN_LANDMARKS: Final = 3  # fewer: too little to find a trimmed or noisy copy by
FEW_LANDMARKS: Final = 8  # a pair where either has fewer needs one vote, not `min_votes`
FAN_OUT: Final = 3  # an anchor peak pairs with two of its next three peaks
MAX_LANDMARK_SPAN_S: Final = 8.0  # ... all within this many seconds of it
GAP_STEP_S: Final = 0.1  # time gaps quantised to this (seconds)
GAP_LEVELS: Final = 128  # 7 bits: gaps up to 12.8 s
HEIGHT_FLOOR: Final = 0.02  # rad/s: the lowest height level
HEIGHT_STEPS_PER_OCTAVE: Final = 8.0
HEIGHT_LEVELS: Final = 128  # 7 bits: 0.02 rad/s x 2^(127/8), ~1200 rad/s
LEVEL_BITS: Final = 7
LAG_TOLERANCE_S: Final = 0.3  # votes within this of the median lag count
DECIMALS: Final = 4  # descriptor values rounded to 0.1 mrad/s in the event


@dataclass(frozen=True)
class ImuDescriptor:
    """An IMU trace's signature. `values`: the smoothed gyro magnitude (rad/s) at `rate_hz`,
    value i at `start_s + i / rate_hz` on the episode's video clock (seconds). `landmarks` and
    `landmark_t_s` (anchor times, seconds, same clock) are parallel; both empty when the trace
    is not `informative` (too few peaks: at rest, or featureless)."""

    rate_hz: float
    start_s: float
    values: tuple[float, ...]
    peaks: int
    landmarks: tuple[int, ...]
    landmark_t_s: tuple[float, ...]

    @property
    def informative(self) -> bool:
        return self.peaks >= MIN_PEAKS and len(self.landmarks) >= MIN_LANDMARKS

    @property
    def span_s(self) -> float:
        """Seconds the descriptor covers."""
        return len(self.values) / self.rate_hz


@dataclass(frozen=True)
class ImuRule:
    """When two informative traces are the same recording (defaults: `CurationSettings`)."""

    min_votes: int = 2
    min_correlation: float = 0.95
    min_overlap_s: float = 5.0
    min_cover: float = 0.8


@dataclass(frozen=True)
class ImuMatch:
    """The evidence for a pair: landmark votes, the lag (their clock minus ours, seconds),
    the correlation over the overlap and the overlap's length (seconds)."""

    votes: int
    lag_s: float
    correlation: float
    overlap_s: float


def describe_imu(samples: ImuSamples, start_s: float, end_s: float) -> ImuDescriptor:
    """The signature of the samples within [start_s, end_s] (seconds, the video's span; the
    first `MAX_DESCRIPTOR_S` of it). Samples out of time order are sorted; non-finite rows were
    refused by `load_imu`. Raises ValueError for an empty or reversed span."""
    if not (math.isfinite(start_s) and math.isfinite(end_s) and end_s > start_s):
        raise ValueError(f"IMU span [{start_s}, {end_s}] must have positive length")
    t = np.asarray(samples.t, dtype=np.float64)
    keep = (t >= start_s) & (t <= min(end_s, start_s + MAX_DESCRIPTOR_S))
    order = np.argsort(t[keep], kind="stable")
    return describe_gyro(t[keep][order], np.asarray(samples.values)[keep][order, 3:6])


def describe_gyro(t: NDArray[np.float64], gyro: NDArray[np.float64]) -> ImuDescriptor:
    """The signature of gyro rates (N, 3) rad/s at sorted times t (N,) seconds."""
    if t.size < 2 or t[-1] - t[0] < 2.0 / DESCRIPTOR_HZ:
        return ImuDescriptor(DESCRIPTOR_HZ, float(t[0]) if t.size else 0.0, (), 0, (), ())
    magnitude = np.sqrt(np.sum(gyro.astype(np.float64) ** 2, axis=1))
    # The grid starts at the first descriptor step on or after the first sample.
    start = math.ceil(float(t[0]) * DESCRIPTOR_HZ - 1e-9) / DESCRIPTOR_HZ
    fine = _fine_bins(t, magnitude, start)
    smooth = _gaussian(fine, SMOOTH_S * FINE_HZ)
    step = round(FINE_HZ / DESCRIPTOR_HZ)
    values = np.round(smooth[::step], DECIMALS)
    peak_t, peak_h = find_peaks(values)
    landmarks, anchors = landmark_hashes(peak_t, peak_h)
    informative = len(peak_t) >= MIN_PEAKS and len(landmarks) >= MIN_LANDMARKS
    return ImuDescriptor(
        rate_hz=DESCRIPTOR_HZ,
        start_s=round(start, 6),
        values=tuple(float(v) for v in values),
        peaks=len(peak_t),
        landmarks=tuple(landmarks) if informative else (),
        landmark_t_s=tuple(round(start + a, 4) for a in anchors) if informative else (),
    )


def _fine_bins(t: NDArray[np.float64], x: NDArray[np.float64], start: float) -> NDArray[np.float64]:
    """Mean of x per 1/FINE_HZ bin from `start` (bins without a sample: linear in between)."""
    index = np.floor((t - start) * FINE_HZ).astype(np.int64)
    inside = index >= 0
    index, x = index[inside], x[inside]
    count = int(index[-1]) + 1 if index.size else 0
    sums = np.bincount(index, weights=x, minlength=count)
    counts = np.bincount(index, minlength=count)
    filled = counts > 0
    centres = np.arange(count, dtype=np.float64)
    out: NDArray[np.float64] = np.interp(centres, centres[filled], sums[filled] / counts[filled])
    return out


def _gaussian(x: NDArray[np.float64], sigma: float) -> NDArray[np.float64]:
    """x smoothed by a Gaussian of `sigma` bins, renormalised at the edges."""
    radius = int(3 * sigma)
    offsets = np.arange(-radius, radius + 1, dtype=np.float64)
    kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
    num = np.convolve(x, kernel, mode="same")
    den = np.convolve(np.ones_like(x), kernel, mode="same")
    out: NDArray[np.float64] = num / den
    return out


def find_peaks(values: Sequence[float] | NDArray[np.float64]) -> tuple[list[float], list[float]]:
    """Peaks of a descriptor: (times in steps from its start, sub-step by a parabola through
    the peak and its neighbours; heights in rad/s). A peak is the first maximum within
    `PEAK_HALF_WINDOW` steps either side that rises `PEAK_PROMINENCE` above the lowest value
    within `PROMINENCE_WINDOW` steps on both sides."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n < 3:
        return [], []
    w, p = PEAK_HALF_WINDOW, PROMINENCE_WINDOW
    # Windows over the trace padded with -inf (max) / +inf (min): the edges see only the trace.
    high = np.pad(x, w, constant_values=-np.inf)
    around = sliding_window_view(high, 2 * w + 1)  # row i: x[i - w .. i + w]
    first_max = np.argmax(around, axis=1) == w  # the first maximum of its window is i
    low = np.pad(x, p, constant_values=np.inf)
    left = sliding_window_view(low[:-1], p).min(axis=1)[:n]  # x[i - p .. i - 1]
    right = sliding_window_view(low[p + 1 :], p).min(axis=1)[:n]  # x[i + 1 .. i + p]
    prominent = x - np.maximum(left, right) >= PEAK_PROMINENCE
    index = np.flatnonzero(first_max & prominent)
    index = index[(index > 0) & (index < n - 1)]
    a, b, c = x[index - 1], x[index], x[index + 1]
    curvature = a - 2 * b + c
    safe = np.where(curvature < 0, curvature, -1.0)
    shift = np.where(curvature < 0, 0.5 * (a - c) / safe, 0.0)
    heights = b - 0.25 * (a - c) * shift
    return [float(v) for v in index + shift], [float(v) for v in heights]


def height_level(height: float) -> int:
    """A peak height (rad/s) as an eighth-of-an-octave level, 0..HEIGHT_LEVELS-1."""
    if height <= HEIGHT_FLOOR:
        return 0
    level = math.floor(math.log2(height / HEIGHT_FLOOR) * HEIGHT_STEPS_PER_OCTAVE)
    return min(HEIGHT_LEVELS - 1, level)


def gap_level(gap_s: float) -> int:
    """A time gap between peaks (seconds) in `GAP_STEP_S` steps, 0..GAP_LEVELS-1."""
    return min(GAP_LEVELS - 1, int(gap_s / GAP_STEP_S))


def landmark_hash(gap1_s: float, gap2_s: float, h0: float, h1: float, h2: float) -> int:
    """35 bits: two gaps and three height levels, 7 bits each."""
    value = gap_level(gap1_s)
    for part in (gap_level(gap2_s), height_level(h0), height_level(h1), height_level(h2)):
        value = (value << LEVEL_BITS) | part
    return value


def landmark_hashes(
    peak_steps: Sequence[float], heights: Sequence[float]
) -> tuple[list[int], list[float]]:
    """Each peak with two of its next `FAN_OUT` peaks (within `MAX_LANDMARK_SPAN_S`): the
    landmark hashes and their anchor times (seconds from the descriptor's start), unique
    (hash, time) pairs in time order."""
    seen: set[tuple[int, float]] = set()
    out: list[tuple[float, int]] = []
    times = [s / DESCRIPTOR_HZ for s in peak_steps]
    for i, t0 in enumerate(times):
        following = range(i + 1, min(len(times), i + 1 + FAN_OUT))
        for j, k in itertools.combinations(following, 2):
            if times[k] - t0 > MAX_LANDMARK_SPAN_S:
                continue
            gaps = (times[j] - t0, times[k] - times[j])
            h = landmark_hash(*gaps, heights[i], heights[j], heights[k])
            key = (h, round(t0, 4))
            if key not in seen:
                seen.add(key)
                out.append((key[1], h))
    out.sort()
    return [h for _, h in out], [t for t, _ in out]


def vote_lag(ours: ImuDescriptor, theirs: ImuDescriptor) -> tuple[int, float] | None:
    """Landmarks both share vote for the lag (their anchor time minus ours, seconds): the
    median lag of the shared hashes and the votes within `LAG_TOLERANCE_S` of it; None when
    they share none."""
    where: dict[int, list[float]] = {}
    for h, t in zip(theirs.landmarks, theirs.landmark_t_s, strict=True):
        where.setdefault(h, []).append(t)
    lags = sorted(
        t_theirs - t_ours
        for h, t_ours in zip(ours.landmarks, ours.landmark_t_s, strict=True)
        for t_theirs in where.get(h, ())
    )
    if not lags:
        return None
    lag = _median(lags)
    return sum(1 for x in lags if abs(x - lag) <= LAG_TOLERANCE_S), lag


def _median(sorted_values: Sequence[float]) -> float:
    """percentile_cont(0.5), as the SQL takes it."""
    n = len(sorted_values)
    mid = n // 2
    return sorted_values[mid] if n % 2 else (sorted_values[mid - 1] + sorted_values[mid]) / 2


def correlation_at(ours: ImuDescriptor, theirs: ImuDescriptor, shift: int) -> tuple[float, int]:
    """Pearson correlation of our value i with their value i + shift over the overlap, and the
    overlap's length in steps (correlation 0 for fewer than 3 steps or a constant side)."""
    a = np.asarray(ours.values, dtype=np.float64)
    b = np.asarray(theirs.values, dtype=np.float64)
    lo, hi = max(0, -shift), min(a.size, b.size - shift)
    if hi - lo < 3:
        return 0.0, max(0, hi - lo)
    x, y = a[lo:hi], b[lo + shift : hi + shift]
    sx, sy = float(x.std()), float(y.std())
    if sx == 0 or sy == 0:
        return 0.0, hi - lo
    return float(np.mean((x - x.mean()) * (y - y.mean())) / (sx * sy)), hi - lo


def grid_shift(ours: ImuDescriptor, theirs: ImuDescriptor, lag_s: float) -> int:
    """Their descriptor index minus ours for one moment, given the clocks' lag (seconds)."""
    return round((ours.start_s + lag_s - theirs.start_s) * ours.rate_hz)


def imu_match(ours: ImuDescriptor, theirs: ImuDescriptor, rule: ImuRule) -> ImuMatch | None:
    """The pair's evidence if the two traces are the same recording under `rule`, else None.
    Symmetric up to the lag's sign; uninformative traces match nothing."""
    if not (ours.informative and theirs.informative) or ours.rate_hz != theirs.rate_hz:
        return None
    voted = vote_lag(ours, theirs)
    if voted is None:
        return None
    return confirm_match(ours, theirs, voted[0], voted[1], rule)


def votes_needed(ours_landmarks: int, theirs_landmarks: int, rule: ImuRule) -> int:
    """`rule.min_votes`, or 1 when either trace has fewer than `FEW_LANDMARKS` landmarks."""
    return 1 if min(ours_landmarks, theirs_landmarks) < FEW_LANDMARKS else rule.min_votes


def confirm_match(
    ours: ImuDescriptor, theirs: ImuDescriptor, votes: int, lag: float, rule: ImuRule
) -> ImuMatch | None:
    """The check after the landmark vote (`votes` at the lag `lag`, their clock minus ours,
    seconds): the correlation over the overlap there, one grid step either side."""
    needed_votes = votes_needed(len(ours.landmarks), len(theirs.landmarks), rule)
    if votes < needed_votes or ours.rate_hz != theirs.rate_hz:
        return None
    centre = grid_shift(ours, theirs, lag)
    best = max((correlation_at(ours, theirs, centre + d) for d in (-1, 0, 1)), key=lambda r: r[0])
    correlation, steps = best
    overlap_s = steps / ours.rate_hz
    needed = max(rule.min_overlap_s, rule.min_cover * min(ours.span_s, theirs.span_s))
    if correlation < rule.min_correlation or overlap_s < needed:
        return None
    return ImuMatch(votes, float(lag), correlation, overlap_s)
