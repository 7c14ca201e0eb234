"""IMU sidecars at the sensor's own rate: parsing, timing summary, clip slicing, hostile input."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import pickle
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from services.sensors.imu import (
    ImuError,
    ImuSamples,
    load_imu,
    slice_imu,
    summarize_imu,
)

RNG_SEED = 7


def npy_bytes(array: NDArray[Any]) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def readings(rows: int) -> NDArray[np.float64]:
    """(rows, 6) plausible readings: gravity on z, a slow yaw."""
    values = np.zeros((rows, 6), dtype=np.float64)
    values[:, 2] = 9.81
    values[:, 5] = np.linspace(0.0, 0.5, rows)
    return values


def timestamped(t: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.column_stack([t, readings(t.size)])


def npy_with_header(header: dict[str, Any], payload: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + payload


def csv_bytes(header: str, rows: Iterator[str]) -> bytes:
    return ("\n".join([header, *rows]) + "\n").encode()


def assert_small_peak_while(call: Any, limit_bytes: int = 1 << 20) -> None:
    """`call()` raises ImuError and traces under `limit_bytes` (1 MiB) while doing so."""
    tracemalloc.start()
    try:
        with pytest.raises(ImuError):
            call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < limit_bytes, f"allocated {peak} bytes refusing a hostile header"


# --- formats -------------------------------------------------------------------------------


def test_npy_at_200_hz_with_jitter_loads_at_its_own_rate() -> None:
    rng = np.random.default_rng(RNG_SEED)
    t = np.arange(2000) / 200.0 + rng.normal(0.0, 1e-4, 2000)
    samples = load_imu(npy_bytes(timestamped(t)), "ep1.imu.npy")

    summary = summarize_imu(samples, 0.0, 10.0)

    assert samples.source_format == "npy_timestamped"
    assert samples.values.shape == (2000, 6)
    np.testing.assert_array_equal(samples.t, t)
    assert summary.rate_hz == pytest.approx(200.0, rel=0.01)
    assert summary.nominal_rate_hz == 200.0
    # intervals of independent +-0.1 ms noise: std sqrt(2) * 0.1 ms
    assert summary.jitter_s == pytest.approx(np.sqrt(2) * 1e-4, rel=0.1)
    assert summary.gap_count == 0
    assert summary.non_monotonic_count == 0
    assert abs(summary.drift_ppm) < 100


def test_npy_at_1000_hz_snaps_to_nominal_and_reports_clock_drift() -> None:
    # a sensor clock 50 ppm fast: 1000.05 samples per video second
    t = np.arange(20_000) / (1000.0 * (1 + 50e-6))
    samples = load_imu(npy_bytes(timestamped(t)), "ep1.imu.npy")

    summary = summarize_imu(samples, 0.0, 20.0)

    assert summary.nominal_rate_hz == 1000.0
    assert summary.rate_hz == pytest.approx(1000.05, rel=1e-6)
    assert summary.drift_ppm == pytest.approx(50.0, abs=1.0)
    assert summary.jitter_s < 1e-9


def test_csv_with_header_loads_at_its_own_rate() -> None:
    # long column names, columns out of order, an extra column, a comment and a blank line
    header = "# device imu v2\nTimestamp,gyro_x,gyro_y,gyro_z,accel_x,accel_y,accel_z,temp_c\n"
    rows = [f"{i / 100:.6f},0.1,0.2,0.3,1.0,2.0,9.81,36.5" for i in range(500)]
    data = (header + "\n".join(rows[:10]) + "\n\n" + "\n".join(rows[10:]) + "\n").encode()

    samples = load_imu(data, "ep1.imu.csv")
    summary = summarize_imu(samples, 0.0, 5.0)

    assert samples.source_format == "csv"
    assert samples.rows == 500
    np.testing.assert_array_equal(samples.values[0], [1.0, 2.0, 9.81, 0.1, 0.2, 0.3])
    assert summary.nominal_rate_hz == 100.0
    assert summary.rate_hz == pytest.approx(100.0, rel=1e-6)
    assert summary.coverage == pytest.approx(4.99 / 5.0)


def test_csv_with_nanosecond_timestamps_converts_to_seconds_on_the_video_clock() -> None:
    # ns since device boot; the video started 5000 s after boot
    boot_ns = 5_000 * 1_000_000_000
    rows = (f"{boot_ns + i * 2_500_000},0,0,9.81,0,0,0.01" for i in range(400))
    data = csv_bytes("timestamp_ns,ax,ay,az,gx,gy,gz", rows)

    samples = load_imu(data, "imu.csv", offset_s=-5_000.0)
    summary = summarize_imu(samples, 0.0, 1.0)

    assert samples.t[0] == 0.0
    assert samples.t[-1] == pytest.approx(399 * 0.0025, abs=1e-9)
    assert summary.nominal_rate_hz == 400.0


def test_ns_column_with_fractional_values_is_refused_with_line_and_column() -> None:
    data = csv_bytes("t_ns,ax,ay,az,gx,gy,gz", iter(["0,0,0,0,0,0,0", "1.5,0,0,0,0,0,0"]))

    with pytest.raises(ImuError, match=r"imu.csv: CSV line 3, column 't_ns': '1.5'"):
        load_imu(data, "imu.csv")


def test_frame_synced_npy_takes_the_video_vfr_frame_times() -> None:
    # 30 fps for 10 frames, then 15 fps for 10 frames
    frame_times = np.concatenate([np.arange(10) / 30.0, 10 / 30.0 + np.arange(10) / 15.0])
    samples = load_imu(npy_bytes(readings(20)), "legacy.npy", frame_times_s=frame_times)

    summary = summarize_imu(samples, 0.0, float(frame_times[-1] + 1 / 15.0))

    assert samples.source_format == "npy_frame_synced"
    np.testing.assert_array_equal(samples.t, frame_times)
    assert summary.rows == 20
    assert summary.max_gap_s == pytest.approx(1 / 15.0)


def test_frame_synced_npy_without_frame_times_is_timestamped_from_fps() -> None:
    samples = load_imu(npy_bytes(readings(90)), "legacy.npy", fps=30.0)

    np.testing.assert_allclose(samples.t, np.arange(90) / 30.0)


def test_frame_synced_npy_with_neither_frame_times_nor_fps_is_refused() -> None:
    with pytest.raises(
        ImuError, match=r"legacy\.npy: frame-synced IMU .* needs frame_times_s or fps"
    ):
        load_imu(npy_bytes(readings(10)), "legacy.npy")


def test_frame_synced_npy_with_more_rows_than_frames_is_refused() -> None:
    with pytest.raises(ImuError, match="11 rows but the video has only 10 frame times"):
        load_imu(npy_bytes(readings(11)), "legacy.npy", frame_times_s=np.arange(10) / 30.0)


def test_format_is_detected_from_content_not_the_name() -> None:
    data = npy_bytes(timestamped(np.arange(10) / 100.0))

    samples = load_imu(data, "imu-sidecar.bin")

    assert samples.source_format == "npy_timestamped"


def test_big_endian_fortran_order_int_npy_is_read_as_float64() -> None:
    array = np.asfortranarray(np.arange(70).reshape(10, 7).astype(">i4"))

    samples = load_imu(npy_bytes(array), "imu.npy")

    np.testing.assert_array_equal(samples.t, np.arange(10) * 7)
    assert samples.values.dtype == np.float64
    assert samples.values.flags.c_contiguous


def test_offset_moves_device_timestamps_onto_the_video_clock() -> None:
    samples = load_imu(npy_bytes(timestamped(np.arange(5) / 100.0)), "imu.npy", offset_s=2.0)

    np.testing.assert_allclose(samples.t, 2.0 + np.arange(5) / 100.0)


def test_loaded_samples_are_read_only() -> None:
    samples = load_imu(npy_bytes(timestamped(np.arange(5) / 100.0)), "imu.npy")

    with pytest.raises(ValueError, match="read-only"):
        samples.t[0] = 1.0


# --- summary -------------------------------------------------------------------------------


def test_non_monotonic_timestamps_are_counted() -> None:
    t = np.arange(100) / 100.0
    t[50] = t[48]  # steps back once, then forward: one interval <= 0
    t[80] = t[79]  # a repeated timestamp: interval == 0
    samples = load_imu(npy_bytes(timestamped(t)), "imu.npy")

    summary = summarize_imu(samples, 0.0, 1.0)

    assert summary.non_monotonic_count == 2
    assert summary.nominal_rate_hz == 100.0


def test_dropped_samples_count_as_one_gap_not_as_drift() -> None:
    t = np.delete(np.arange(2000) / 200.0, np.arange(1000, 1010))
    samples = load_imu(npy_bytes(timestamped(t)), "imu.npy")

    summary = summarize_imu(samples, 0.0, 10.0)

    assert summary.gap_count == 1
    assert summary.max_gap_s == pytest.approx(11 / 200.0)
    assert summary.rate_hz == pytest.approx(200.0)
    assert summary.drift_ppm == pytest.approx(0.0, abs=1e-3)


def test_short_imu_covers_less_than_the_video() -> None:
    t = 2.0 + np.arange(601) / 100.0  # 2 s .. 8 s inside a 0 .. 10 s video
    samples = load_imu(npy_bytes(timestamped(t)), "imu.npy")

    summary = summarize_imu(samples, 0.0, 10.0)

    assert summary.coverage == pytest.approx(0.6)
    assert summary.start_skew_s == pytest.approx(2.0)
    assert summary.end_skew_s == pytest.approx(-2.0)
    assert summary.samples_before_video == 0
    assert summary.samples_after_video == 0


def test_imu_overhanging_the_video_counts_samples_outside_it() -> None:
    t = -1.0 + np.arange(1300) / 100.0  # -1 s .. 11.99 s around a 0 .. 10 s video
    samples = load_imu(npy_bytes(timestamped(t)), "imu.npy")

    summary = summarize_imu(samples, 0.0, 10.0)

    assert summary.coverage == 1.0
    assert summary.samples_before_video == 100
    assert summary.samples_after_video == 200


def test_summary_is_plain_json() -> None:
    samples = load_imu(npy_bytes(timestamped(np.arange(10) / 50.0)), "imu.npy")

    encoded = json.dumps(dataclasses.asdict(summarize_imu(samples, 0.0, 0.2)), allow_nan=False)

    assert json.loads(encoded)["nominal_rate_hz"] == 50.0
    assert json.loads(encoded)["source_format"] == "npy_timestamped"


def test_single_sample_summarises_with_zero_interval_statistics() -> None:
    samples = load_imu(npy_bytes(timestamped(np.array([0.5]))), "imu.npy")

    summary = summarize_imu(samples, 0.0, 1.0)

    assert (summary.rate_hz, summary.jitter_s, summary.gap_count, summary.coverage) == (0, 0, 0, 0)


def test_summary_of_an_empty_video_span_is_refused() -> None:
    samples = load_imu(npy_bytes(timestamped(np.arange(3) / 100.0)), "imu.npy")

    with pytest.raises(ValueError, match="positive length"):
        summarize_imu(samples, 1.0, 1.0)


# --- slicing -------------------------------------------------------------------------------


def test_slice_rebases_to_the_clip_start_and_takes_the_ends_only_when_asked() -> None:
    t = np.array([-0.5, 0.0, 0.99, 1.0, 1.5, 2.0, 2.5])
    samples = ImuSamples(t=t, values=readings(t.size), source_format="npy_timestamped")

    middle = slice_imu(samples, 1.0, 2.0, include_before=False, include_after=False)
    first = slice_imu(samples, 0.0, 1.0, include_before=True, include_after=False)
    last = slice_imu(samples, 2.0, 3.0, include_before=False, include_after=True)

    np.testing.assert_array_equal(middle[:, 0], [0.0, 0.5])
    np.testing.assert_array_equal(first[:, 0], [-0.5, 0.0, 0.99])
    np.testing.assert_array_equal(last[:, 0], [0.0, 0.5])
    assert middle.shape == (2, 7)
    np.testing.assert_array_equal(middle[:, 1:], samples.values[3:5])


def ids_of(times: list[float], cuts: list[float]) -> tuple[list[int], ImuSamples]:
    """Row ids, clip by clip, of samples at `times` cut at `cuts` (ends included)."""
    t = np.array(times, dtype=np.float64)
    values = np.zeros((t.size, 6), dtype=np.float64)
    values[:, 0] = np.arange(t.size)  # each row carries its own index
    samples = ImuSamples(t=t, values=values, source_format="npy_timestamped")
    ids: list[int] = []
    clips = list(itertools.pairwise(cuts))
    for k, (start, end) in enumerate(clips):
        clip = slice_imu(
            samples, start, end, include_before=k == 0, include_after=k == len(clips) - 1
        )
        rows = clip[:, 1].astype(np.int64)
        np.testing.assert_array_equal(clip[:, 0], t[rows] - start)
        ids.extend(rows.tolist())
    return ids, samples


# timestamps on a quarter-second grid, so cut points land exactly on samples
grid_times = st.integers(-8, 48).map(lambda i: i / 4)
any_times = st.floats(-2.0, 12.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    times=st.lists(st.one_of(grid_times, any_times), max_size=60),
    monotonic=st.booleans(),
    data=st.data(),
)
def test_slicing_at_any_cut_points_loses_and_duplicates_no_sample(
    times: list[float], monotonic: bool, data: st.DataObject
) -> None:
    if monotonic:
        times = sorted(times)
    cut_point = st.one_of(grid_times, any_times, *([st.sampled_from(times)] if times else []))
    cuts = sorted(data.draw(st.lists(cut_point, min_size=2, max_size=8), label="cuts"))

    ids, _ = ids_of(times, cuts)

    if monotonic:
        assert ids == list(range(len(times)))  # every sample once, in order
    else:
        assert sorted(ids) == list(range(len(times)))  # every sample once


def test_slice_with_start_after_end_is_refused() -> None:
    samples = ImuSamples(t=np.zeros(1), values=np.zeros((1, 6)), source_format="csv")

    with pytest.raises(ValueError, match="must not be after"):
        slice_imu(samples, 2.0, 1.0, include_before=False, include_after=False)


# --- hostile input -------------------------------------------------------------------------


def test_pickled_object_array_is_refused_without_unpickling() -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)

    with pytest.raises(ImuError, match=r"evil\.npy: \.npy holds Python objects"):
        load_imu(buffer.getvalue(), "evil.npy")


def test_three_dimensional_array_is_refused() -> None:
    with pytest.raises(ImuError, match=r"imu.npy: .npy has shape \(2, 3, 7\), expected 2-D"):
        load_imu(npy_bytes(np.zeros((2, 3, 7))), "imu.npy")


def test_absurd_row_count_in_the_header_is_refused_before_allocating() -> None:
    data = npy_with_header({"descr": "<f8", "fortran_order": False, "shape": (10**12, 7)})

    assert_small_peak_while(lambda: load_imu(data, "huge.npy"))
    with pytest.raises(ImuError, match="claims 1000000000000 rows, over the 50000000-row limit"):
        load_imu(data, "huge.npy")


def test_header_claiming_more_data_than_the_file_holds_is_refused_before_allocating() -> None:
    # under the row limit (2.7 GB claimed), but only 56 bytes present
    header = {"descr": "<f8", "fortran_order": False, "shape": (49_000_000, 7)}
    data = npy_with_header(header, b"\0" * 56)

    assert_small_peak_while(lambda: load_imu(data, "lying.npy"))
    with pytest.raises(ImuError, match=r"needs 2744000000 data bytes .* file has 56"):
        load_imu(data, "lying.npy")


def test_row_limit_is_the_callers_to_set() -> None:
    data = npy_bytes(timestamped(np.arange(11) / 100.0))
    rows = (f"{i / 100},0,0,0,0,0,0" for i in range(11))

    with pytest.raises(ImuError, match="over the 10-row limit"):
        load_imu(data, "imu.npy", max_rows=10)
    with pytest.raises(ImuError, match="over the 10-row limit"):
        load_imu(csv_bytes("t,ax,ay,az,gx,gy,gz", rows), "imu.csv", max_rows=10)


def test_file_over_the_byte_limit_is_refused_unread() -> None:
    with pytest.raises(ImuError, match="over the 100-byte limit"):
        load_imu(b"\x93NUMPY" + b"\0" * 200, "imu.npy", max_bytes=100)


@pytest.mark.parametrize(
    ("array", "reason"),
    [
        (np.zeros((4, 5)), "has 5 columns, expected 6"),
        (np.zeros((4, 7), dtype=np.bool_), "dtype bool refused"),
        (np.zeros((4, 7), dtype=np.complex128), "dtype complex128 refused"),
        (np.zeros((0, 7)), "no samples"),
        (np.zeros(4, dtype=[("t", "<f8"), ("ax", "<f8")]), "refused; IMU must be a float or int"),
    ],
)
def test_npy_of_the_wrong_kind_is_refused(array: NDArray[Any], reason: str) -> None:
    with pytest.raises(ImuError, match=reason):
        load_imu(npy_bytes(array), "imu.npy")


def test_truncated_npy_is_refused() -> None:
    data = npy_bytes(timestamped(np.arange(10) / 100.0))

    with pytest.raises(ImuError, match="needs 560 data bytes"):
        load_imu(data[:-8], "imu.npy")


def test_npy_named_file_without_the_magic_is_refused() -> None:
    with pytest.raises(ImuError, match=r"imu\.npy: named \.npy but does not start with the \.npy"):
        load_imu(b"t,ax,ay,az,gx,gy,gz\n0,0,0,0,0,0,0\n", "imu.npy")


def test_npy_with_a_mangled_header_is_refused() -> None:
    with pytest.raises(ImuError, match=r"unreadable \.npy header"):
        load_imu(b"\x93NUMPY\x01\x00\x10\x00{'descr': <f8'}  \n", "imu.npy")


def test_csv_with_text_cells_is_refused_naming_line_and_column() -> None:
    rows = iter(["0.00,0,0,9.81,0,0,0", "0.01,0,n/a,9.81,0,0,0"])

    with pytest.raises(ImuError, match=r"imu.csv: CSV line 3, column 'ay': 'n/a' is not a number"):
        load_imu(csv_bytes("t,ax,ay,az,gx,gy,gz", rows), "imu.csv")


def test_csv_row_short_of_cells_is_refused() -> None:
    rows = iter(["0.00,0,0,9.81,0,0,0", "0.01,0,0"])

    with pytest.raises(ImuError, match="CSV line 3 has 3 cells, the header names 7"):
        load_imu(csv_bytes("t,ax,ay,az,gx,gy,gz", rows), "imu.csv")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0,0,0,9.81,0,0,0\n", "is numeric; the first line must name the columns"),
        ("t,ax,ay,az,gx,gy\n0,0,0,0,0,0\n", r"needs exactly one of \('gz', 'gyro_z'\)"),
        ("ax,ay,az,gx,gy,gz\n0,0,0,0,0,0\n", "needs exactly one time column"),
        ("t,t_ns,ax,ay,az,gx,gy,gz\n0,0,0,0,0,0,0,0\n", "found 2"),
        ("t,ax,ax,ay,az,gx,gy,gz\n0,0,0,0,0,0,0,0\n", r"repeats column names \['ax'\]"),
        ("t,ax,ay,az,gx,gy,gz\n", "header but no samples"),
        ("# only a comment\n\n", "no header line"),
        ("t,ax,ay,az,gx,gy,gz\n0,0,0,nan,0,0,0\n", r"non-finite reading .* at sample 0"),
        ("t,ax,ay,az,gx,gy,gz\n0,0,0,0,0,0,0\ninf,0,0,0,0,0,0\n", "non-finite timestamp inf"),
    ],
)
def test_malformed_csv_is_refused(text: str, reason: str) -> None:
    with pytest.raises(ImuError, match=reason):
        load_imu(text.encode(), "imu.csv")


def test_empty_file_is_refused() -> None:
    with pytest.raises(ImuError, match=r"imu\.csv: empty IMU file"):
        load_imu(b"", "imu.csv")


@pytest.mark.parametrize(
    "data",
    [pickle.dumps({"t": [0.0]}), b"\xff\xd8\xff\xe0 a jpeg", b"t,ax\x00,ay,az,gx,gy,gz\n"],
)
def test_binary_that_is_neither_npy_nor_text_is_refused(data: bytes) -> None:
    with pytest.raises(ImuError, match=r"neither \.npy"):
        load_imu(data, "imu.bin")


def test_invalid_arguments_are_value_errors() -> None:
    data = npy_bytes(readings(3))

    with pytest.raises(ValueError, match="fps must be finite and positive"):
        load_imu(data, "legacy.npy", fps=0.0)
    with pytest.raises(ValueError, match="offset_s must be finite"):
        load_imu(data, "legacy.npy", fps=30.0, offset_s=float("nan"))
