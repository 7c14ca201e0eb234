"""IMU sidecars at the sensor's own rate: parse bytes, summarise against the video, slice per clip.

Pure core: bytes in, numpy arrays and plain frozen dataclasses out; no file or network I/O.

Units everywhere: time in seconds on the video's clock (the clock of the frame presentation
times), acceleration in m/s^2, angular rate in rad/s. A sample row is `[ax, ay, az, gx, gy, gz]`.

Accepted layouts, told apart by content (the `.npy` magic), the name only sharpening errors:

- `.npy` `(N, 7)` `[t, ax, ay, az, gx, gy, gz]` (`npy_timestamped`);
- `.npy` `(frames, 6)`, one row per video frame, the legacy layout (`npy_frame_synced`): its
  timestamps are the caller's frame presentation times, or `i / fps`;
- CSV with a header line naming the columns (`csv`): a time column in seconds (`t`, `timestamp`,
  `time`, `t_s`) or integer nanoseconds (`t_ns`, `timestamp_ns`), and the six axes as
  `ax..gz` or `accel_x..gyro_z`; other columns are ignored.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
from numpy.typing import NDArray

SourceFormat = Literal["npy_timestamped", "npy_frame_synced", "csv"]

# 50M rows is ~14 h at 1 kHz; a header claiming more is refused before anything is allocated.
DEFAULT_MAX_ROWS: Final = 50_000_000
# 50M rows x 7 float64 is 2.6 GiB of .npy; a sidecar larger than this is refused unread.
DEFAULT_MAX_BYTES: Final = 3 << 30
# numpy's own default bound on a .npy header (bytes)
NPY_MAX_HEADER_BYTES: Final = 10_000

# Rates IMUs are configured at (Hz); a measured rate within 2 % of one snaps to it.
COMMON_RATES_HZ: Final = (50.0, 100.0, 200.0, 400.0, 500.0, 800.0, 1000.0)
RATE_SNAP_TOLERANCE: Final = 0.02
# An interval longer than this many median intervals counts as a gap (dropped samples).
GAP_FACTOR: Final = 3.0

VALUE_COLUMNS: Final = 6
NPY_MAGIC: Final = b"\x93NUMPY"
NS_PER_S: Final = 1_000_000_000

TIME_S_NAMES: Final = ("t", "timestamp", "time", "t_s")
TIME_NS_NAMES: Final = ("t_ns", "timestamp_ns")
AXIS_NAMES: Final = (
    ("ax", "accel_x"),
    ("ay", "accel_y"),
    ("az", "accel_z"),
    ("gx", "gyro_x"),
    ("gy", "gyro_y"),
    ("gz", "gyro_z"),
)


class ImuError(ValueError):
    """An IMU sidecar that cannot be read; the message names the file and what is wrong where."""


@dataclass(frozen=True, eq=False)
class ImuSamples:
    """IMU samples on the video's clock.

    `t`: (N,) float64 seconds; `values`: (N, 6) float64 `[ax, ay, az, gx, gy, gz]` in m/s^2 and
    rad/s. Rows are kept in file order; timestamps may be non-monotonic (see `ImuSummary`). Both
    arrays are stored as read-only views. Raises ValueError on mismatched shapes or dtypes.
    """

    t: NDArray[np.float64]
    values: NDArray[np.float64]
    source_format: SourceFormat

    def __post_init__(self) -> None:
        if self.t.dtype != np.float64 or self.values.dtype != np.float64:
            raise ValueError(f"IMU arrays must be float64, got {self.t.dtype}, {self.values.dtype}")
        if self.t.ndim != 1 or self.values.shape != (self.t.size, VALUE_COLUMNS):
            raise ValueError(
                f"IMU t must be (N,) and values (N, {VALUE_COLUMNS}), "
                f"got {self.t.shape} and {self.values.shape}"
            )
        for field in ("t", "values"):
            view = getattr(self, field).view()
            view.flags.writeable = False
            object.__setattr__(self, field, view)

    @property
    def rows(self) -> int:
        """Number of samples."""
        return int(self.t.size)


@dataclass(frozen=True)
class ImuSummary:
    """Timing of an IMU stream against the video span; plain numbers, `dataclasses.asdict`-able.

    Times in seconds on the video's clock, rates in Hz. Interval statistics are 0 when there
    are fewer than two samples.
    """

    rows: int
    source_format: str
    t_first_s: float  # earliest timestamp (the first row when monotonic)
    t_last_s: float  # latest timestamp (the last row when monotonic)
    rate_hz: float  # 1 / median positive interval
    nominal_rate_hz: float  # rate_hz snapped to a COMMON_RATES_HZ entry within 2 %, else rate_hz
    jitter_s: float  # standard deviation of the intervals
    max_gap_s: float  # largest interval
    gap_count: int  # intervals longer than GAP_FACTOR x the median interval
    non_monotonic_count: int  # intervals <= 0 (repeated or backwards timestamps)
    drift_ppm: float  # (mean rate / nominal - 1) * 1e6 over regular intervals; > 0: runs fast
    coverage: float  # fraction of [video_start, video_end] inside [t_first, t_last], 0..1
    start_skew_s: float  # t_first - video_start; > 0: IMU starts late
    end_skew_s: float  # t_last - video_end; < 0: IMU stops early
    samples_before_video: int  # t < video_start
    samples_after_video: int  # t >= video_end


def load_imu(
    data: bytes,
    name: str,
    *,
    frame_times_s: NDArray[np.float64] | None = None,
    fps: float | None = None,
    offset_s: float = 0.0,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ImuSamples:
    """Parse an IMU sidecar's bytes into samples on the video's clock.

    `name` is the sidecar's file name or key, used in error messages (and to say a file named
    `.npy` lacks the magic). `offset_s` (seconds) is added to every timestamp: the sensor clock's
    offset to the video clock. `frame_times_s` ((frames,) seconds, the video's presentation
    times) or else `fps` (> 0) timestamps the legacy frame-synced layout, row `i` at
    `frame_times_s[i]` or `i / fps`; a frame-synced file with more rows than frame times is
    refused rather than given invented times. `.npy` headers are checked (dtype, ndim, columns,
    `max_rows`, exact byte length) before any array is built, and never unpickled.

    Raises ImuError for an unreadable, empty, oversized (`max_bytes`, `max_rows`) or non-finite
    sidecar; ValueError for invalid arguments (non-finite offset, fps <= 0, 2-D frame times).
    """
    if not math.isfinite(offset_s):
        raise ValueError(f"offset_s must be finite, got {offset_s}")
    if not data:
        raise ImuError(f"{name}: empty IMU file (0 bytes)")
    if len(data) > max_bytes:
        raise ImuError(f"{name}: IMU file is {len(data)} bytes, over the {max_bytes}-byte limit")
    fmt: SourceFormat
    if data.startswith(NPY_MAGIC):
        array = _read_npy(data, name, max_rows)
        if array.shape[1] == VALUE_COLUMNS + 1:
            fmt = "npy_timestamped"
            t = np.array(array[:, 0], dtype=np.float64)
            values = np.array(array[:, 1:], dtype=np.float64, order="C")
        else:
            fmt = "npy_frame_synced"
            t = _frame_synced_times(array.shape[0], name, frame_times_s, fps)
            values = np.array(array, dtype=np.float64, order="C")
    elif name.lower().endswith(".npy"):
        raise ImuError(f"{name}: named .npy but does not start with the .npy magic {NPY_MAGIC!r}")
    else:
        fmt = "csv"
        t, values = _read_csv(data, name, max_rows)
    if offset_s:
        t += offset_s
    _require_finite(t, values, name)
    return ImuSamples(t=t, values=values, source_format=fmt)


def summarize_imu(samples: ImuSamples, video_start_s: float, video_end_s: float) -> ImuSummary:
    """Rate, jitter, gaps and alignment of `samples` against the video span (seconds).

    `drift_ppm` compares the mean rate over regular intervals (positive and not a gap) with the
    nominal rate, so dropped samples count as gaps, not drift. Raises ValueError when there are
    no samples or the span is not a finite, positive-length interval.
    """
    span_s = video_end_s - video_start_s
    if not (math.isfinite(span_s) and span_s > 0):
        raise ValueError(f"video span [{video_start_s}, {video_end_s}) must have positive length")
    if samples.rows == 0:
        raise ValueError("cannot summarise an IMU stream with no samples")
    t = samples.t
    t_first, t_last = float(t.min()), float(t.max())
    intervals = np.diff(t)
    positive = intervals[intervals > 0]
    median_s = float(np.median(positive)) if positive.size else 0.0
    rate_hz = 1.0 / median_s if median_s > 0 else 0.0
    nominal_hz = nominal_rate(rate_hz)
    gap_limit_s = GAP_FACTOR * median_s
    regular = positive[positive <= gap_limit_s]
    drift_ppm = 0.0
    if regular.size and nominal_hz > 0:
        drift_ppm = (1.0 / float(regular.mean()) / nominal_hz - 1.0) * 1e6
    overlap_s = max(0.0, min(t_last, video_end_s) - max(t_first, video_start_s))
    return ImuSummary(
        rows=samples.rows,
        source_format=samples.source_format,
        t_first_s=t_first,
        t_last_s=t_last,
        rate_hz=rate_hz,
        nominal_rate_hz=nominal_hz,
        jitter_s=float(intervals.std()) if intervals.size else 0.0,
        max_gap_s=float(intervals.max()) if intervals.size else 0.0,
        gap_count=int(np.count_nonzero(intervals > gap_limit_s)) if median_s > 0 else 0,
        non_monotonic_count=int(np.count_nonzero(intervals <= 0)),
        drift_ppm=drift_ppm,
        coverage=min(1.0, overlap_s / span_s),
        start_skew_s=t_first - video_start_s,
        end_skew_s=t_last - video_end_s,
        samples_before_video=int(np.count_nonzero(t < video_start_s)),
        samples_after_video=int(np.count_nonzero(t >= video_end_s)),
    )


def nominal_rate(rate_hz: float) -> float:
    """`rate_hz` snapped to the nearest COMMON_RATES_HZ entry within 2 %, else unchanged (Hz)."""
    nearest = min(COMMON_RATES_HZ, key=lambda common: abs(common - rate_hz))
    return nearest if abs(rate_hz - nearest) <= RATE_SNAP_TOLERANCE * nearest else rate_hz


def slice_imu(
    samples: ImuSamples,
    start_s: float,
    end_s: float,
    *,
    include_before: bool,
    include_after: bool,
) -> NDArray[np.float64]:
    """The samples of the clip [start_s, end_s) as an (M, 7) array `[t - start_s, ax..gz]`.

    Times in seconds; the first column is rebased to the clip start. `include_before` (the
    episode's first clip) also takes samples with t < start_s (negative rebased times),
    `include_after` (the last clip) those with t >= end_s. Cutting an episode at consecutive
    points with both flags on the ends yields every sample exactly once, in file order within a
    clip. Raises ValueError unless start_s <= end_s.
    """
    if not start_s <= end_s:
        raise ValueError(f"clip start {start_s} s must not be after its end {end_s} s")
    t = samples.t
    keep = np.ones(t.shape, dtype=np.bool_)
    if not include_before:
        keep &= t >= start_s
    if not include_after:
        keep &= t < end_s
    out = np.empty((int(np.count_nonzero(keep)), VALUE_COLUMNS + 1), dtype=np.float64)
    out[:, 0] = t[keep] - start_s
    out[:, 1:] = samples.values[keep]
    return out


def slice_imu_by_windows(
    samples: ImuSamples, windows: Sequence[tuple[float, float]], shift_s: float
) -> list[NDArray[np.float64]]:
    """The IMU cut at consecutive clip windows (seconds on a clock where the IMU's time 0 lies
    at `shift_s`): every sample in exactly one slice (the first also takes what came before the
    video, the last what came after), timestamps rebased to each window's start."""
    last = len(windows) - 1
    return [
        slice_imu(samples, a - shift_s, b - shift_s, include_before=i == 0, include_after=i == last)
        for i, (a, b) in enumerate(windows)
    ]


def _read_npy(data: bytes, name: str, max_rows: int) -> NDArray[Any]:
    """A read-only 2-D view of a `.npy` file's data, its header vetted before any view is made.

    The caller's float64 conversion is the only copy.
    """
    handle = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(
                handle, max_header_size=NPY_MAX_HEADER_BYTES
            )
        elif version in ((2, 0), (3, 0)):
            # 3.0 differs from 2.0 only by a UTF-8 header, which a plain numeric dtype never needs
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(
                handle, max_header_size=NPY_MAX_HEADER_BYTES
            )
        else:
            raise ImuError(f"{name}: unsupported .npy format version {version}")
    except ImuError:
        raise
    except (ValueError, TypeError, SyntaxError, OverflowError) as exc:
        raise ImuError(f"{name}: unreadable .npy header: {exc}") from exc
    if dtype.hasobject:
        raise ImuError(f"{name}: .npy holds Python objects (dtype {dtype}); refusing to unpickle")
    if dtype.names is not None or dtype.subdtype is not None or dtype.kind not in "fiu":
        raise ImuError(f"{name}: .npy dtype {dtype} refused; IMU must be a float or int array")
    if len(shape) != 2:
        raise ImuError(f"{name}: .npy has shape {shape}, expected 2-D (rows, 6) or (rows, 7)")
    rows, cols = (int(n) for n in shape)
    if cols not in (VALUE_COLUMNS, VALUE_COLUMNS + 1):
        raise ImuError(f"{name}: .npy has {cols} columns, expected 6 (frame-synced) or 7 (t + 6)")
    if rows > max_rows:
        raise ImuError(f"{name}: .npy header claims {rows} rows, over the {max_rows}-row limit")
    if rows == 0:
        raise ImuError(f"{name}: .npy has no samples (shape {shape})")
    header_end = handle.tell()
    expected = rows * cols * dtype.itemsize
    if len(data) - header_end != expected:
        raise ImuError(
            f"{name}: .npy header {shape} {dtype} needs {expected} data bytes after byte "
            f"{header_end}, file has {len(data) - header_end}"
        )
    flat = np.frombuffer(data, dtype=dtype, count=rows * cols, offset=header_end)
    return flat.reshape((rows, cols), order="F" if fortran_order else "C")


def _frame_synced_times(
    rows: int, name: str, frame_times_s: NDArray[np.float64] | None, fps: float | None
) -> NDArray[np.float64]:
    """Timestamps (seconds) of frame-synced rows: the frame times, else `i / fps`."""
    if frame_times_s is not None:
        frame_times = np.asarray(frame_times_s, dtype=np.float64)
        if frame_times.ndim != 1:
            raise ValueError(f"frame_times_s must be 1-D, got shape {frame_times.shape}")
        if frame_times.size < rows:
            raise ImuError(
                f"{name}: frame-synced IMU has {rows} rows but the video has only "
                f"{frame_times.size} frame times"
            )
        return frame_times[:rows].copy()
    if fps is not None:
        if not (math.isfinite(fps) and fps > 0):
            raise ValueError(f"fps must be finite and positive, got {fps}")
        return np.arange(rows, dtype=np.float64) / fps
    raise ImuError(f"{name}: frame-synced IMU (rows, 6) needs frame_times_s or fps for timestamps")


def _read_csv(
    data: bytes, name: str, max_rows: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Timestamps (seconds) and (N, 6) values of a headed CSV."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ImuError(f"{name}: neither .npy (no magic) nor UTF-8 CSV text: {exc}") from exc
    if "\x00" in text:
        raise ImuError(f"{name}: neither .npy (no magic) nor CSV text: contains NUL bytes")
    lines = _content_lines(text)
    header = next(lines, None)
    if header is None:
        raise ImuError(f"{name}: CSV has no header line")
    header_line, header_text = header
    names = [cell.strip().strip("\"'").lower() for cell in header_text.split(",")]
    time_col, in_ns, value_cols = _resolve_columns(names, name, header_line)
    if next(lines, None) is None:
        raise ImuError(f"{name}: CSV has a header but no samples")
    # an upper bound on data rows (blank and comment lines count too), known before parsing
    line_count = text.count("\n", 0) + 1 - header_line
    if line_count > max_rows:
        raise ImuError(f"{name}: CSV has up to {line_count} rows, over the {max_rows}-row limit")
    usecols = (time_col, *value_cols)
    fields = [("t", np.int64 if in_ns else np.float64)]
    fields += [(f"v{i}", np.float64) for i in range(VALUE_COLUMNS)]
    try:
        table = np.loadtxt(
            io.StringIO(text),
            delimiter=",",
            skiprows=header_line,
            usecols=usecols,
            dtype=np.dtype(fields),
            comments="#",
            ndmin=1,
        )
    except ValueError as exc:
        raise ImuError(
            f"{name}: {_describe_bad_cell(text, header_line, usecols, names, in_ns) or exc}"
        ) from exc
    if in_ns:
        # whole seconds and the remainder apart, so ns counts beyond 2**53 keep their precision
        ns = table["t"]
        seconds, remainder = np.divmod(ns, NS_PER_S)
        t = seconds.astype(np.float64) + remainder.astype(np.float64) / NS_PER_S
    else:
        t = table["t"].astype(np.float64)
    values = np.stack([table[f"v{i}"] for i in range(VALUE_COLUMNS)], axis=1).astype(np.float64)
    return t, values


def _content_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of the lines that are neither blank nor `#` comments."""
    for number, line in enumerate(io.StringIO(text), start=1):
        content = line.split("#", 1)[0].strip()
        if content:
            yield number, content


def _resolve_columns(
    names: Sequence[str], name: str, header_line: int
) -> tuple[int, bool, tuple[int, ...]]:
    """(time column, whether it is in ns, the six value columns) from the CSV header names."""
    where = f"{name}: CSV header (line {header_line})"
    if all(_is_number(cell) for cell in names):
        raise ImuError(
            f"{where} is numeric; the first line must name the columns, e.g. t,ax,ay,az,gx,gy,gz"
        )
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ImuError(f"{where} repeats column names {duplicated}")
    time_cols = [
        (i, n in TIME_NS_NAMES) for i, n in enumerate(names) if n in (TIME_S_NAMES + TIME_NS_NAMES)
    ]
    if len(time_cols) != 1:
        raise ImuError(
            f"{where} needs exactly one time column of {TIME_S_NAMES} (seconds) or "
            f"{TIME_NS_NAMES} (integer ns), found {len(time_cols)} in {list(names)}"
        )
    value_cols: list[int] = []
    for aliases in AXIS_NAMES:
        found = [i for i, n in enumerate(names) if n in aliases]
        if len(found) != 1:
            raise ImuError(f"{where} needs exactly one of {aliases}, found {len(found)}")
        value_cols.append(found[0])
    time_col, in_ns = time_cols[0]
    return time_col, in_ns, tuple(value_cols)


def _describe_bad_cell(
    text: str, header_line: int, usecols: Sequence[int], names: Sequence[str], in_ns: bool
) -> str | None:
    """Where the first unparseable cell is (line number, column name), for the error message.

    Only run after numpy refused the file, so its speed does not matter.
    """
    for number, content in _content_lines(text):
        if number <= header_line:
            continue
        cells = content.split(",")
        if len(cells) <= max(usecols):
            return f"CSV line {number} has {len(cells)} cells, the header names {len(names)}"
        for index in usecols:
            cell = cells[index].strip()
            if in_ns and index == usecols[0]:
                if not _is_int(cell):
                    return f"CSV line {number}, column {names[index]!r}: {cell!r} is not integer ns"
            elif not _is_number(cell):
                return f"CSV line {number}, column {names[index]!r}: {cell!r} is not a number"
    return None


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _is_int(cell: str) -> bool:
    try:
        int(cell)
    except ValueError:
        return False
    return True


def _require_finite(t: NDArray[np.float64], values: NDArray[np.float64], name: str) -> None:
    """Refuse NaN or infinite timestamps or readings, naming the first bad row (0-based)."""
    bad_t = np.flatnonzero(~np.isfinite(t))
    if bad_t.size:
        raise ImuError(f"{name}: non-finite timestamp {t[bad_t[0]]} at sample {bad_t[0]}")
    bad_rows = np.flatnonzero(~np.isfinite(values).all(axis=1))
    if bad_rows.size:
        row = int(bad_rows[0])
        raise ImuError(f"{name}: non-finite reading {values[row].tolist()} at sample {row}")
