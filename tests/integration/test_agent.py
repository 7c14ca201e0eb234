"""The upload agent on the real stack: kill -9 mid-upload, a paused broker, an unreachable S3."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

from schemas.events import TOPIC_UPLOADED
from services.agent.journal import Journal
from services.agent.multipart import multipart_etag, part_ranges
from services.agent.runner import make_agent
from services.bench.upload import kill_and_resume
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.stack.launcher import Stack
from tests.fixtures.kafka_read import read_topic
from tests.fixtures.polling import wait_for
from tests.fixtures.proxy import FaultProxy

pytestmark = pytest.mark.connected
MB = 1024 * 1024


def make_episode(root: Path, size_mb: int) -> tuple[Path, str]:
    """A recording folder with `size_mb` of video bytes; returns (folder, episode id)."""
    episode_id = f"agent-{uuid.uuid4().hex[:10]}"
    folder = root / episode_id
    folder.mkdir(parents=True)
    (folder / "video.mp4").write_bytes(os.urandom(size_mb * MB))
    meta = {
        "episode_id": episode_id,
        "device_id": "dev-agent",
        "session_id": f"s-{episode_id}",
        "started_at": "2026-06-01T12:00:00+00:00",
        "video": "video.mp4",
    }
    (folder / "episode.json").write_text(json.dumps(meta))
    return folder, episode_id


def events_for(settings: Settings, episode_id: str) -> list[str]:
    return [
        json.loads(m.value() or b"{}")["event_id"]
        for m in read_topic(settings, TOPIC_UPLOADED)
        if m.key() == episode_id.encode()
    ]


def test_kill_9_mid_upload_resumes_without_resending_parts(stack: Settings, tmp_path: Path) -> None:
    folder, episode_id = make_episode(tmp_path / "rec", size_mb=40)
    state = tmp_path / "agent"
    acked, stdout = kill_and_resume(
        folder, state, bandwidth_mb_s=6, extra_env={"EGOLINE_AGENT_UPLOAD_CONCURRENCY": "2"}
    )
    assert 3 <= acked < 8, "the kill must land mid-upload (8 parts in all)"
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["parts_resent"] == 0

    journal = Journal(state / "journal.sqlite")
    assert journal.parts_resent() == 0
    assert journal.counts() == {"published": 1}
    local = (folder / "video.mp4").read_bytes()
    key = journal.episodes()[0].event_json
    assert key is not None
    raw_key = json.loads(key)["episode"]["video"]["key"]
    stored = object_store(stack).get_bytes(raw_key)
    assert hashlib.sha256(stored).digest() == hashlib.sha256(local).digest()
    assert len(events_for(stack, episode_id)) == 1


def test_resume_after_the_journal_lost_the_upload_id_adopts_the_upload_in_progress(
    stack: Settings, tmp_path: Path
) -> None:
    """Given an agent killed mid-upload whose journal then lost the multipart upload id, when
    it resumes, then it continues the store's upload in progress: no byte range goes twice."""
    folder, _ = make_episode(tmp_path / "rec", size_mb=40)
    state = tmp_path / "agent"

    def forget_upload_id(journal_path: Path) -> None:
        with contextlib.closing(sqlite3.connect(journal_path)) as db, db:
            assert db.execute("UPDATE uploads SET upload_id = NULL").rowcount == 1

    acked, stdout = kill_and_resume(
        folder,
        state,
        bandwidth_mb_s=6,
        extra_env={"EGOLINE_AGENT_UPLOAD_CONCURRENCY": "2"},
        after_kill=forget_upload_id,
    )
    assert 3 <= acked < 8, "the kill must land mid-upload (8 parts in all)"
    assert json.loads(stdout.strip().splitlines()[-1])["parts_resent"] == 0

    journal = Journal(state / "journal.sqlite")
    assert journal.parts_resent() == 0
    assert journal.counts() == {"published": 1}
    event = journal.episodes()[0].event_json
    assert event is not None
    raw_key = json.loads(event)["episode"]["video"]["key"]
    store = object_store(stack)
    local = (folder / "video.mp4").read_bytes()
    assert hashlib.sha256(store.get_bytes(raw_key)).digest() == hashlib.sha256(local).digest()
    assert store.list_uploads(raw_key) == []  # the adopted upload is the one completed
    # the agent checks the completed object by this ETag instead of a HEAD: it must be the
    # store's (else every upload pays the fallback HEAD)
    part_md5s = {
        n: hashlib.md5(local[o : o + ln]).hexdigest()  # noqa: S324 - S3's part ETag
        for n, o, ln in part_ranges(len(local), 5 * MB)
    }
    info = store.stat(raw_key)
    assert info is not None and info.etag.strip('"') == multipart_etag(part_md5s)


def test_broker_paused_during_publish_gives_exactly_one_event(
    stack: Settings, tmp_path: Path
) -> None:
    folder, episode_id = make_episode(tmp_path / "rec", size_mb=1)
    agent = make_agent(stack.for_agent(tmp_path / "agent"), object_store(stack))
    agent.enqueue([folder])
    agent.process_due()  # uploaded, event waiting in the outbox
    kafka_pid = Stack(stack.stack_dir).read_state()["kafka"].pid
    assert kafka_pid is not None
    os.kill(kafka_pid, signal.SIGSTOP)
    try:
        publisher = threading.Thread(target=agent.publish, args=(60.0,))
        publisher.start()
        time.sleep(4)
        assert agent.journal.counts() == {"uploaded": 1}  # nothing acknowledged while paused
    finally:
        os.kill(kafka_pid, signal.SIGCONT)
    publisher.join(90)
    assert agent.journal.counts() == {"published": 1}
    assert len(events_for(stack, episode_id)) == 1


def test_upload_completes_once_s3_is_back(
    stack: Settings, tmp_path: Path, fault_proxy: type[FaultProxy]
) -> None:
    folder, episode_id = make_episode(tmp_path / "rec", size_mb=12)
    target = urlparse(stack.require("s3.endpoint"))
    proxy = fault_proxy((str(target.hostname), int(target.port or 80)))
    proxy.set_up(False)
    through_proxy = stack.s3.model_copy(update={"endpoint": f"http://127.0.0.1:{proxy.port}"})
    tuned = stack.agent.model_copy(
        update={"state_dir": tmp_path / "agent", "part_size_mb": 5, "retry_max_s": 60.0}
    )
    settings = stack.for_agent().model_copy(update={"s3": through_proxy, "agent": tuned})
    agent = make_agent(settings, object_store(settings))
    runner = threading.Thread(target=agent.run_once, args=([folder], 30.0))
    runner.start()
    time.sleep(4)
    assert agent.journal.counts().get("published") is None
    proxy.set_up(True)
    runner.join(120)
    assert agent.journal.counts() == {"published": 1}
    assert len(events_for(stack, episode_id)) == 1


def test_watch_uploads_new_recordings_then_archives_them(stack: Settings, tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    state = tmp_path / "agent"
    env = {
        **os.environ,
        "EGOLINE_AGENT_STATE_DIR": str(state),
        "EGOLINE_AGENT_POLL_S": "0.3",
        "EGOLINE_AGENT_AFTER_PUBLISH": "archive",
        "EGOLINE_AGENT_ARCHIVE_DIR": str(tmp_path / "archive"),
    }
    watcher = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "agent", "watch", str(inbox)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        folder, episode_id = make_episode(tmp_path / "staging", size_mb=2)
        (folder / "episode.json").rename(tmp_path / "episode.json")
        folder.rename(inbox / folder.name)  # recording in progress: no marker yet
        time.sleep(1.0)
        assert (
            not (state / "journal.sqlite").exists()
            or Journal(state / "journal.sqlite").counts() == {}
        )
        (tmp_path / "episode.json").rename(inbox / folder.name / "episode.json")
        wait_for(
            lambda: (tmp_path / "archive" / folder.name / "video.mp4").exists(),
            60,
            "the recording uploaded, announced and archived",
        )
    finally:
        watcher.send_signal(signal.SIGTERM)
        out, _ = watcher.communicate(timeout=30)
    assert watcher.returncode == 0
    assert json.loads(out.strip().splitlines()[-1]) == {"archived": 1}
    assert len(events_for(stack, episode_id)) == 1
