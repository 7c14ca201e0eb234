"""The agent's pure parts: part ranges, ETags, the bandwidth cap, and what it refuses to upload."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.agent.journal import AckedPart, Journal
from services.agent.multipart import part_ranges
from services.agent.ratelimit import TokenBucket
from services.agent.recordings import AgentInputError, describe, find_ready, raw_key


def test_part_ranges_cover_the_file_exactly() -> None:
    assert part_ranges(25, 10) == [(1, 0, 10), (2, 10, 10), (3, 20, 5)]
    assert part_ranges(10, 10) == [(1, 0, 10)]


def test_token_bucket_holds_the_average_rate() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    bucket = TokenBucket(rate=100.0, burst=100.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        bucket.acquire(100)
    # 1000 bytes at 100 B/s with a 100-byte burst: 9 seconds of waiting
    assert sum(slept) == pytest.approx(9.0)


def test_raw_key_layout() -> None:
    key = raw_key("dev1", datetime(2026, 3, 4, 23, 0, tzinfo=UTC), "ep1", "ab" * 32, "mp4")
    assert key == f"raw/dev1/2026/03/04/ep1/{'ab' * 32}.mp4"


def _episode(tmp_path: Path, **meta_overrides: object) -> Path:
    folder = tmp_path / "ep1"
    folder.mkdir()
    (folder / "video.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom" + b"x" * 100)
    meta = {
        "episode_id": "ep1",
        "device_id": "dev1",
        "session_id": "s1",
        "started_at": "2026-01-01T00:00:00+00:00",
        "video": "video.mp4",
        **meta_overrides,
    }
    (folder / "episode.json").write_text(json.dumps(meta))
    return folder


def test_describe_hashes_and_keys_a_good_episode(tmp_path: Path) -> None:
    episode = describe(_episode(tmp_path))
    data = (tmp_path / "ep1" / "video.mp4").read_bytes()
    assert episode.ref.video.sha256 == hashlib.sha256(data).hexdigest()
    assert episode.ref.video.key.endswith(f"/ep1/{episode.ref.video.sha256}.mp4")


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"episode_id": "../../etc"}, "invalid ids"),
        ({"episode_id": "ep.1"}, "invalid ids"),
        ({"device_id": "dev/1"}, "invalid ids"),
        ({"video": "../other/video.mp4"}, "not a plain name"),
        ({"video": "missing.mp4"}, "missing"),
        ({"started_at": "yesterday"}, "unreadable"),
    ],
)
def test_bad_episodes_are_refused_with_a_reason(
    tmp_path: Path, overrides: dict[str, object], why: str
) -> None:
    with pytest.raises(AgentInputError, match=why):
        describe(_episode(tmp_path, **overrides))


def test_zero_byte_video_is_refused(tmp_path: Path) -> None:
    folder = _episode(tmp_path)
    (folder / "video.mp4").write_bytes(b"")
    with pytest.raises(AgentInputError, match="empty"):
        describe(folder)


def test_chunks_are_grouped_into_one_object(tmp_path: Path) -> None:
    folder = _episode(tmp_path)
    whole = (folder / "video.mp4").read_bytes()
    (folder / "video.mp4").unlink()
    for i in range(3):
        (folder / f"video.mp4.{i:03d}").write_bytes(whole[i * 40 : (i + 1) * 40])
    episode = describe(folder)
    assert episode.video.size_bytes == len(whole)
    assert episode.ref.video.sha256 == hashlib.sha256(whole).hexdigest()
    assert episode.video.read_at(30, 20) == whole[30:50]  # across a chunk boundary


def test_stable_mode_waits_for_quiet_files(tmp_path: Path) -> None:
    folder = _episode(tmp_path)
    mtime = (folder / "video.mp4").stat().st_mtime
    assert find_ready(tmp_path, "stable", stable_s=5, now=mtime + 1) == []
    assert find_ready(tmp_path, "stable", stable_s=5, now=mtime + 6) == [folder]
    assert find_ready(tmp_path, "marker", stable_s=5, now=mtime) == [folder]


def test_journal_keeps_an_event_once(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    journal.add_episode("q1", tmp_path)
    journal.store_event("q1", '{"first": 1}')
    journal.store_event("q1", '{"second": 2}')
    row = journal.episode("q1")
    assert row is not None and row.event_json == '{"first": 1}' and row.state == "uploaded"
    assert not journal.add_episode("q1", tmp_path)


def test_parts_resent_counts_a_byte_range_sent_again_under_a_new_upload_id(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    first = [AckedPart(n, (n - 1) * 10, 10, f"e{n}", ("s1", float(n))) for n in (1, 2)]
    journal.ack_parts("raw/k", "upload-a", first)
    assert journal.parts_resent() == 0
    # resumed under a new upload id: part 2 sent again, part 3 is new
    again = [AckedPart(n, (n - 1) * 10, 10, f"e{n}", ("s2", 10.0 + n)) for n in (2, 3)]
    journal.ack_parts("raw/k", "upload-b", again)
    # a part recognised on resume is not a send; another file's same range is not a re-send
    journal.ack_parts("raw/k", "upload-b", [AckedPart(1, 0, 10, "e1", None)])
    journal.ack_parts("raw/other", "upload-c", [AckedPart(1, 0, 10, "e1", ("s2", 20.0))])
    assert journal.parts_resent() == 1
    # a range cut differently still overlaps what was sent
    journal.ack_parts("raw/k", "upload-d", [AckedPart(1, 5, 10, "x", ("s3", 30.0))])
    assert journal.parts_resent() == 2
