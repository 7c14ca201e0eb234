"""Every validation rule rejects with its own reason code; clean input is accepted."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.events import EpisodeDecoded, EpisodeRef, ReasonCode, SourceFile, StreamInfo, Verdict
from services.validate.rules import KeyframeResult, RuleSet, evaluate

SHA = "a" * 64


def decoded(stream: dict[str, Any] | None = None, **fields: Any) -> EpisodeDecoded:
    base_stream = {
        "index": 0,
        "codec": "h264",
        "width": 1280,
        "height": 720,
        "fps": 30.0,
        "duration_s": 60.0,
        "frame_count": 1800,
        "keyframe_count": 60,
    }
    ref = EpisodeRef(
        episode_id="ep1",
        device_id="dev1",
        session_id="s1",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        video=SourceFile(key="raw/dev1/ep1/v.mp4", sha256=SHA, size_bytes=10),
        imu=SourceFile(key="raw/dev1/ep1/i.npy", sha256=SHA, size_bytes=10),
    )
    values: dict[str, Any] = {
        "event_id": "0" * 32,
        "produced_at": datetime(2026, 1, 1, tzinfo=UTC),
        "episode": ref,
        "container_format": "mp4",
        "container_complete": True,
        "duration_s": 60.0,
        "streams": [StreamInfo(**{**base_stream, **(stream or {})})],
        "primary_stream": 0,
        "keyframe_times_s": [float(i) for i in range(60)],
        "observed_sha256": SHA,
        "imu_rows": 1800,
        "imu_cols": 6,
    }
    return EpisodeDecoded(**{**values, **fields})


GOOD_KEYFRAMES = KeyframeResult(decoded=60, failed=0)


def codes(event: EpisodeDecoded, keyframes: KeyframeResult = GOOD_KEYFRAMES) -> set[ReasonCode]:
    _, reasons, _ = evaluate(event, keyframes, RuleSet())
    return {r.code for r in reasons}


def test_clean_episode_is_accepted() -> None:
    verdict, reasons, warnings = evaluate(decoded(), GOOD_KEYFRAMES, RuleSet())
    assert (verdict, reasons, warnings) == (Verdict.ACCEPT, [], [])


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (decoded(observed_sha256="b" * 64), ReasonCode.SHA256_MISMATCH),
        (decoded(container_complete=False), ReasonCode.CONTAINER_INCOMPLETE),
        (decoded({"duration_s": 0.2}), ReasonCode.DURATION_OUT_OF_BOUNDS),
        (decoded({"duration_s": 5 * 3600.0}), ReasonCode.DURATION_OUT_OF_BOUNDS),
        (decoded({"fps": 2.0}), ReasonCode.FPS_OUT_OF_BOUNDS),
        (decoded({"fps": 1000.0}), ReasonCode.FPS_OUT_OF_BOUNDS),
        (decoded({"width": 32, "height": 32}), ReasonCode.RESOLUTION_OUT_OF_BOUNDS),
        (decoded({"width": 100_000, "height": 100_000}), ReasonCode.RESOLUTION_OUT_OF_BOUNDS),
        (decoded({"non_monotonic_count": 3}), ReasonCode.NON_MONOTONIC_TIMESTAMPS),
        (decoded({"max_gap_s": 2.0}), ReasonCode.TIMESTAMP_GAP),
        (decoded({"corrupt_packet_count": 1}), ReasonCode.CORRUPT_PACKETS),
        (decoded(imu_rows=1793), ReasonCode.IMU_ROW_MISMATCH),
        (decoded(imu_cols=3), ReasonCode.IMU_UNREADABLE),
        (decoded(imu_error="not a float array"), ReasonCode.IMU_UNREADABLE),
    ],
)
def test_each_rule_rejects_with_its_code(event: EpisodeDecoded, code: ReasonCode) -> None:
    assert codes(event) == {code}


def test_undecodable_keyframes_are_rejected() -> None:
    broken = KeyframeResult(decoded=58, failed=2, first_error="Invalid data")
    assert codes(decoded(), broken) == {ReasonCode.KEYFRAME_UNDECODABLE}


def test_missing_imu_is_a_warning_unless_required() -> None:
    ref = decoded().episode.model_copy(update={"imu": None})
    event = decoded(episode=ref, imu_rows=None, imu_cols=None)
    verdict, reasons, warnings = evaluate(event, GOOD_KEYFRAMES, RuleSet())
    assert verdict is Verdict.ACCEPT_WITH_WARNINGS and not reasons and len(warnings) == 1
    verdict, reasons, _ = evaluate(event, GOOD_KEYFRAMES, RuleSet(imu_required=True))
    assert verdict is Verdict.REJECT


def test_every_reason_is_reported_not_only_the_first() -> None:
    event = decoded({"fps": 2.0, "non_monotonic_count": 1}, imu_rows=5)
    assert codes(event) == {
        ReasonCode.FPS_OUT_OF_BOUNDS,
        ReasonCode.NON_MONOTONIC_TIMESTAMPS,
        ReasonCode.IMU_ROW_MISMATCH,
    }
