"""The IMU signature (services/sensors/imu_signature.py): a trimmed, rebased or noisy copy of a
hand-held trace is the same recording, an independent trace is not, and a resting trace says
"uninformative"; and the decoded event carries it."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from schemas.events import EpisodeDecoded, ImuSignature
from services.decode.core import signature_model
from services.sensors.imu import ImuSamples
from services.sensors.imu_signature import (
    DESCRIPTOR_HZ,
    MIN_PEAKS,
    ImuDescriptor,
    ImuRule,
    confirm_match,
    correlation_at,
    describe_gyro,
    describe_imu,
    find_peaks,
    imu_match,
    landmark_hash,
    vote_lag,
)
from services.synth.realistic import imu_samples

RULE = ImuRule()
LENIENT = ImuRule(min_votes=1, min_correlation=-1.0, min_overlap_s=0.0, min_cover=0.0)


def samples(rows: NDArray[np.float64]) -> ImuSamples:
    return ImuSamples(
        np.ascontiguousarray(rows[:, 0]), np.ascontiguousarray(rows[:, 1:]), "npy_timestamped"
    )


def recording(seed: int, duration_s: float = 14.0, rate_hz: float = 200.0) -> NDArray[np.float64]:
    """A hand-held IMU trace as devices write it (synth: sway, head turns, MEMS noise)."""
    return imu_samples(rate_hz, -0.05, duration_s + 0.05, seed)


def trimmed(rows: NDArray[np.float64], trim_s: float) -> NDArray[np.float64]:
    """What `ffmpeg -ss T -c copy` plus a rebased sidecar keep: from T on, t' = t - T."""
    out = rows[rows[:, 0] >= trim_s - 0.05].copy()
    out[:, 0] -= trim_s
    return out


def signature(rows: NDArray[np.float64]) -> ImuDescriptor:
    return describe_imu(samples(rows), 0.0, float(rows[-1, 0]))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    trim_s=st.floats(2.0, 4.0),
    noise=st.floats(0.0, 0.01),
    rate_hz=st.sampled_from([100.0, 200.0, 1000.0]),
)
def test_a_trimmed_rebased_copy_matches_both_ways_at_its_cut_or_not_at_all(
    seed: int, trim_s: float, noise: float, rate_hz: float
) -> None:
    """Given a hand-held trace, when it is trimmed by T s, rebased to the cut (a trimmed copy's
    sidecar: the same samples, another clock and grid phase) and maybe given extra noise, then
    the rule says the same both ways round (the metadata service finds the pair whichever
    episode comes second), and a match is at the lag T with a copy's correlation. How often
    copies match is the next test's: a landmark is an exact hash, and a new grid phase can
    move a peak across a quantisation step (found: seed 511, one of 13 landmarks kept)."""
    original = recording(seed, rate_hz=rate_hz)
    copy = trimmed(original, trim_s)
    copy[:, 1:] += np.random.default_rng(seed).normal(0, noise, copy[:, 1:].shape)
    ours, theirs = signature(copy), signature(original)
    match, back = imu_match(ours, theirs, RULE), imu_match(theirs, ours, RULE)
    assert (match is None) == (back is None)
    if match is not None and back is not None:
        assert abs(match.lag_s - trim_s) < 0.2 and abs(back.lag_s + match.lag_s) < 1e-6
        assert match.correlation >= 0.95 and match.votes == back.votes


def test_trimmed_copies_match_their_original() -> None:
    """Given 300 copies trimmed by 2-4 s and rebased, at 100 Hz to 1 kHz: then at least 99 %
    of the informative ones match their original (measured: 293 of 293)."""
    rng = np.random.default_rng(11)
    found = informative = 0
    for seed in range(300):
        original = recording(seed, rate_hz=float(rng.choice([100.0, 200.0, 1000.0])))
        ours = signature(trimmed(original, float(rng.uniform(2.0, 4.0))))
        if ours.informative:
            informative += 1
            found += imu_match(ours, signature(original), RULE) is not None
    assert informative >= 285
    assert found >= 0.99 * informative, (found, informative)


def test_noisy_trimmed_copies_match_nearly_always() -> None:
    """Given 200 trimmed copies with extra sensor noise (up to the trace's own MEMS noise,
    0.01 rad/s per axis): then at least 97 % of the informative ones match their original (a
    landmark is an exact hash, so noise or a new grid phase that moves a peak across a
    quantisation step loses it; a copy keeps most of its landmarks and needs two, or one
    when it has fewer than `FEW_LANDMARKS`)."""
    rng = np.random.default_rng(5)
    found = informative = 0
    for seed in range(200):
        original = recording(seed, duration_s=14.0)
        copy = trimmed(original, float(rng.uniform(2.0, 4.0)))
        copy[:, 1:] += rng.normal(0, float(rng.uniform(0, 0.01)), copy[:, 1:].shape)
        ours = signature(copy)
        if ours.informative:
            informative += 1
            found += imu_match(ours, signature(original), RULE) is not None
    assert informative >= 190
    assert found >= 0.97 * informative, (found, informative)


def test_copies_are_found_and_independent_recordings_never_match() -> None:
    """Over 40 recordings: every trimmed copy of an informative one matches its original and
    nothing else, and two independent recordings (25 of them, pairwise) never correlate as a
    copy does, at any lag over an overlap the rule would accept (measured: at most ~0.81;
    copies >= ~0.98)."""
    traces = {seed: recording(seed) for seed in range(40)}
    sigs = {seed: signature(rows) for seed, rows in traces.items()}
    informative = [seed for seed, sig in sigs.items() if sig.informative]
    assert len(informative) >= 36  # a hand-held trace is nearly always informative
    found = 0
    for seed in informative:
        copy = signature(trimmed(traces[seed], 2.0 + (seed % 7) * 0.29))
        matches = {other for other, sig in sigs.items() if imu_match(copy, sig, RULE)}
        assert matches <= {seed}
        found += matches == {seed}
    assert found >= 0.9 * len(informative)
    assert not any(vote_lag(a, b) for a, b in itertools.permutations(sigs.values(), 2))
    # No two share a landmark; and were they to, at any lag, the correlation check would turn
    # the pair down: independent recordings never correlate as a copy does.
    worst = 0.0
    for a, b in itertools.combinations(list(sigs.values())[:25], 2):
        least = RULE.min_cover * min(len(a.values), len(b.values))
        for shift in range(-len(a.values), len(b.values)):
            lag = shift / a.rate_hz + b.start_s - a.start_s
            assert confirm_match(a, b, RULE.min_votes, lag, RULE) is None
            r, steps = correlation_at(a, b, shift)
            if steps >= max(least, RULE.min_overlap_s * DESCRIPTOR_HZ):
                worst = max(worst, r)
    assert 0.5 < worst < RULE.min_correlation


@given(seed=st.integers(0, 10_000), duration_s=st.floats(6.0, 60.0))
@settings(max_examples=20, deadline=None)
def test_a_resting_trace_is_uninformative_and_matches_nothing(seed: int, duration_s: float) -> None:
    """Given a device on a table (gyro noise 0.002 rad/s), then its signature has no peaks and
    no landmarks, and it matches neither another resting trace nor a copy of itself."""
    rest = signature(imu_samples(200.0, -0.05, duration_s, seed, at_rest=True))
    other = signature(imu_samples(200.0, -0.05, duration_s, seed + 1, at_rest=True))
    assert not rest.informative and rest.landmarks == () and rest.peaks < MIN_PEAKS
    assert imu_match(rest, other, LENIENT) is None
    assert imu_match(rest, rest, LENIENT) is None


def test_constant_rotation_and_a_few_bumps_are_uninformative_too() -> None:
    """A tripod panning at a steady rate and a device at rest knocked twice have too few peaks
    to tell one recording from another."""
    t = np.arange(0, 30, 0.005)
    steady = np.column_stack([np.full_like(t, 0.3), np.zeros_like(t), np.zeros_like(t)])
    knocks = np.zeros((t.size, 3))
    for centre in (5.0, 17.0):
        knocks[:, 2] += 1.0 * np.exp(-0.5 * ((t - centre) / 0.1) ** 2)
    assert not describe_gyro(t, steady).informative
    assert not describe_gyro(t, knocks).informative


def test_descriptor_is_the_smoothed_gyro_magnitude_at_10_hz() -> None:
    t = np.arange(0, 10, 0.01)
    gyro = np.column_stack([np.full_like(t, 0.3), np.full_like(t, 0.4), np.zeros_like(t)])
    d = describe_gyro(t, gyro)
    assert d.rate_hz == DESCRIPTOR_HZ and d.start_s == 0.0
    assert len(d.values) == 100 and np.allclose(d.values, 0.5)
    assert d.span_s == 10.0


def test_peaks_are_located_between_grid_steps() -> None:
    x = 0.5 * np.exp(-0.5 * ((np.arange(60) - 30.4) / 3.0) ** 2)
    times, heights = find_peaks(x)
    assert len(times) == 1 and abs(times[0] - 30.4) < 0.05 and abs(heights[0] - 0.5) < 0.01


def test_landmark_hashes_carry_no_absolute_time() -> None:
    assert landmark_hash(1.0, 0.5, 0.4, 0.8, 0.3) == landmark_hash(1.0, 0.5, 0.4, 0.8, 0.3)
    assert landmark_hash(1.0, 0.5, 0.4, 0.8, 0.3) != landmark_hash(1.5, 0.5, 0.4, 0.8, 0.3)
    assert landmark_hash(7.9, 7.9, 30, 30, 30) < 1 << 35


def test_correlation_is_over_the_overlap_at_the_shift() -> None:
    rng = np.random.default_rng(1)
    base = rng.normal(0, 1, 200)
    a = ImuDescriptor(10.0, 0.0, tuple(base[30:]), 9, (1,), (0.0,))
    b = ImuDescriptor(10.0, 0.0, tuple(base), 9, (1,), (0.0,))
    r, n = correlation_at(a, b, 30)
    assert abs(r - 1.0) < 1e-12 and n == 170
    assert correlation_at(a, b, 0)[0] < 0.5


def test_the_decoded_event_carries_the_signature() -> None:
    sig = signature_model(signature(recording(3)))
    assert sig.landmarks and len(sig.landmarks) == len(sig.landmark_t_s)
    assert EpisodeDecoded.model_json_schema()["properties"]["imu_signature"]
    again = ImuSignature.model_validate_json(sig.model_dump_json())
    assert again == sig
