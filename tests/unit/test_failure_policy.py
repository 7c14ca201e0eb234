"""The one failure policy (`stage.classify`) and the worker limits (`limits`, `batch.run_jobs`):
pure classification, then real worker processes under a memory and a time limit."""

from __future__ import annotations

import errno
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import av
import pytest

from schemas.events import ReasonCode
from services.common.batch import run_jobs
from services.common.limits import apply_memory_limit
from services.common.retry import backoff_delay
from services.common.stage import Failure, JobTimeLimit, PermanentError, classify


@pytest.mark.parametrize(
    ("exc", "transient", "code", "disk"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), True, "internal_error", "ENOSPC"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True, "internal_error", "EDQUOT"),
        (OSError(errno.EIO, "Input/output error"), True, "internal_error", "EIO"),
        (OSError(errno.EMFILE, "Too many open files"), True, "internal_error", "EMFILE"),
        (ConnectionResetError(errno.ECONNRESET, "reset"), True, "internal_error", None),
        (TimeoutError("read timed out"), True, "internal_error", None),
        (FileNotFoundError(errno.ENOENT, "gone"), False, "internal_error", None),
        (PermanentError(ReasonCode.NOT_A_VIDEO, "x"), False, "not_a_video", None),
        (MemoryError(), False, "resource_limit", None),
        (JobTimeLimit("too long"), False, "resource_limit", None),
        (ValueError("a bug"), False, "internal_error", None),
    ],
)
def test_classify(exc: Exception, transient: bool, code: str, disk: str | None) -> None:
    failure = classify(exc)
    assert (failure.transient, failure.code.value, failure.disk_errno) == (transient, code, disk)


def test_ffmpeg_reporting_eio_about_its_input_is_not_a_disk_fault() -> None:
    """FFmpeg returns AVERROR(EIO) for some unreadable input: that is the file, not the disk."""
    try:
        av.error.err_check(-errno.EIO)
    except OSError as exc:
        assert classify(exc).transient is False
    else:
        pytest.fail("err_check(-EIO) raised nothing")
    try:
        av.error.err_check(-errno.ENOSPC)  # but a full disk under the muxer is
    except OSError as exc:
        assert classify(exc).disk_errno == "ENOSPC"
    else:
        pytest.fail("err_check(-ENOSPC) raised nothing")


def test_backoff_is_full_jitter_and_capped() -> None:
    for attempt in range(12):
        delays = [backoff_delay(attempt, base_s=0.5, cap_s=30.0) for _ in range(200)]
        assert all(0 <= d <= min(30.0, 0.5 * 2**attempt) for d in delays)
    assert max(backoff_delay(20) for _ in range(200)) > 15  # it does reach the cap's range


def allocate(mb: int) -> int:
    return len(bytearray(mb * 1024 * 1024))


def spin(seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass
    return "done"


def pool(memory_mb: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=apply_memory_limit,
        initargs=(memory_mb,),
    )


def test_a_job_over_the_memory_limit_fails_alone_and_the_worker_goes_on() -> None:
    with pool(1024) as workers:
        results, _, _ = workers.submit(run_jobs, allocate, [64, 2048, 64]).result(60)
    assert results[0] == results[2] == 64 * 1024 * 1024
    assert isinstance(results[1], Failure) and results[1].code is ReasonCode.RESOURCE_LIMIT
    assert not results[1].transient and "MEMORY_LIMIT" in results[1].message


def test_a_job_over_the_time_limit_fails_alone_and_the_next_runs() -> None:
    with pool(0) as workers:
        started = time.monotonic()
        results, _, _ = workers.submit(run_jobs, spin, [30.0, 0.01], 0.5).result(60)
    assert time.monotonic() - started < 10
    assert isinstance(results[0], Failure) and results[0].code is ReasonCode.RESOURCE_LIMIT
    assert "TIME_LIMIT" in results[0].message and results[1] == "done"
