"""The corpus view on the real stack: episodes uploaded by the device agent through the fleet
(two recordings made as devices make them, a rejected one and an exact copy of a recording
under another id) show up in the lag service's /corpus/*.json with the counts, hours, reasons
and duplicate put in; the freshness percentiles equal a recomputation from the warehouse's
timestamps; and the /corpus page in headless Chromium shows those values."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from playwright.sync_api import Browser

from services.common.settings import Settings
from services.stack.corpus import corpus_reader
from services.stack.fleet import Fleet
from services.synth.realistic import OFFSET_STRIDE, realistic_cases, write_case
from services.synth.writer import Defect
from tests.fixtures.http import http_get
from tests.fixtures.lag import LagServiceProcess, running_lag_service
from tests.fixtures.media import EpisodeFactory
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected

PANELS = ("summary", "rejects", "duplicates", "freshness")


@dataclass
class Corpus:
    """What this module put in, the panels read before it, and the lag service serving them."""

    device: str
    started: dict[str, datetime]  # episode id -> started_at
    seconds: dict[str, float]  # episode id -> seconds of video (frames / fps)
    rejected: str
    original: str
    copy: str
    published_at: float  # wall clock when the agent had published every episode
    sharded_at: float  # wall clock when every episode had its final state
    before: dict[str, dict[str, Any]]
    service: LagServiceProcess

    def panel(self, name: str) -> dict[str, Any]:
        code, body = http_get(self.service.port, f"/corpus/{name}.json", timeout_s=30)
        assert code == 200, body
        payload = dict(json.loads(body))
        assert payload["error"] is None, payload["error"]
        return payload


def rewrite(folder: Path, **fields: Any) -> dict[str, Any]:
    meta = json.loads((folder / "episode.json").read_text())
    meta.update(fields)
    (folder / "episode.json").write_text(json.dumps(meta))
    return dict(meta)


@pytest.fixture(scope="module")
def corpus(
    stack: Settings,
    fleet: Fleet,
    episode_factory: EpisodeFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Corpus]:
    reader = corpus_reader(stack, ttl_s=0)
    before = {name: reader.panel(name) for name in PANELS}
    reader.close()
    assert all(p["error"] is None for p in before.values()), before

    seed = 7000 + int(time.time()) % 2000
    device = f"corpusdev{seed}"
    # recorded three hours ago, a minute apart: the first one rejected (corrupt keyframes), then
    # two recordings as devices make them (x264 defaults with B-frames and a 200 Hz IMU; a head +
    # wrist rig whose wrist camera starts late)
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    (broken,) = episode_factory(1, seed=seed, defects=(Defect.CORRUPT_PACKETS,))
    cases = {c.name: c for c in realistic_cases()}
    recorded = tmp_path_factory.mktemp("recorded")
    fps = {broken.name: float(json.loads((broken / "episode.json").read_text())["fps"])}
    dirs = [broken]
    for k, name in enumerate(("h264_default_mp4", "multicam_mp4")):
        # each its own picture (cases written with one seed share their content: duplicates)
        case = replace(cases[name], seed_offset=(k + 1) * OFFSET_STRIDE)
        dirs.append(write_case(case, recorded, seed))
        fps[dirs[-1].name] = float(case.fps)
    started, seconds = {}, {}
    for i, folder in enumerate(dirs):
        at = base + timedelta(minutes=i)
        meta = rewrite(folder, device_id=device, started_at=at.isoformat())
        frames = meta["frames"] if "frames" in meta else meta["synthetic"]["frames"]
        started[meta["episode_id"]] = at
        seconds[meta["episode_id"]] = frames / fps[folder.name]
    # the same bytes again under another id, recorded later: an exact duplicate of dirs[1]
    original = dirs[1].name
    copy_dir = tmp_path_factory.mktemp("copy") / f"{original}-copy"
    shutil.copytree(dirs[1], copy_dir)
    copy_at = base + timedelta(minutes=10)
    rewrite(copy_dir, episode_id=copy_dir.name, started_at=copy_at.isoformat())
    started[copy_dir.name], seconds[copy_dir.name] = copy_at, seconds[original]

    agent = device_agent(stack, tmp_path_factory.mktemp("agent"))
    assert agent.run_once([*dirs, copy_dir], 60).get("published") == 4
    published_at = time.time()
    expected = {e: "sharded" for e in started} | {dirs[0].name: "rejected"}
    wait_for(
        lambda: episode_states(stack, list(expected)) == expected, 240, "every episode's state"
    )
    sharded_at = time.time()
    with running_lag_service(tmp_path_factory.mktemp("lag")) as service:
        yield Corpus(
            device=device,
            started=started,
            seconds=seconds,
            rejected=dirs[0].name,
            original=original,
            copy=copy_dir.name,
            published_at=published_at,
            sharded_at=sharded_at,
            before=before,
            service=service,
        )


def by(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {str(r[key]): r for r in rows}


def test_summary_counts_the_episodes_and_hours_put_in(corpus: Corpus) -> None:
    summary = corpus.panel("summary")
    hours = sum(corpus.seconds.values()) / 3600
    mine = by(summary["by_device"], "device")[corpus.device]
    assert mine["episodes"] == 4
    assert mine["hours"] == pytest.approx(hours, abs=0.5 / 3600)

    old = corpus.before["summary"]
    assert summary["episodes"] - old["episodes"] == 4
    assert summary["devices"] - old["devices"] == 1
    assert summary["hours"] - old["hours"] == pytest.approx(hours, abs=0.5 / 3600)

    # by day of recording (UTC): the difference is exactly this module's episodes
    days = Counter(at.strftime("%Y-%m-%d") for at in corpus.started.values())
    now_days, old_days = by(summary["by_day"], "day"), by(old["by_day"], "day")
    for day, n in days.items():
        assert now_days[day]["episodes"] - old_days.get(day, {"episodes": 0})["episodes"] == n

    # by verdict: one reject, three accepted (with or without warnings)
    now_v, old_v = by(summary["by_verdict"], "verdict"), by(old["by_verdict"], "verdict")

    def grew(verdict: str) -> int:
        return int(
            now_v.get(verdict, {"episodes": 0})["episodes"]
            - old_v.get(verdict, {"episodes": 0})["episodes"]
        )

    assert grew("reject") == 1
    assert grew("accept") + grew("accept_with_warnings") == 3
    assert summary["by_status"]["sharded"] - old["by_status"]["sharded"] == 3
    assert summary["by_status"]["rejected"] - old["by_status"]["rejected"] == 1


def test_rejects_name_the_reason_and_show_the_latest_example(corpus: Corpus) -> None:
    rejects = corpus.panel("rejects")
    old = corpus.before["rejects"]["by_reason"]
    code = "keyframe_undecodable"
    assert rejects["by_reason"][code] - old.get(code, 0) == 1
    latest = rejects["latest"][0]  # the latest episode rejected is this module's
    assert latest["episode_id"] == corpus.rejected
    assert latest["device_id"] == corpus.device
    assert datetime.fromisoformat(latest["started_at"]) == corpus.started[corpus.rejected]
    assert code in {r["code"] for r in latest["reasons"]}
    assert all(r["detail"] for r in latest["reasons"])
    rejected_at = datetime.fromisoformat(latest["rejected_at"]).timestamp()
    assert corpus.published_at - 5 <= rejected_at <= corpus.sharded_at + 5


def test_duplicates_show_the_copy_and_its_original(corpus: Corpus) -> None:
    duplicates = corpus.panel("duplicates")
    assert duplicates["by_kind"]["exact"] - corpus.before["duplicates"]["by_kind"]["exact"] == 1
    latest = by(duplicates["latest"], "episode_id")
    assert corpus.copy in latest, duplicates["latest"]
    copy = latest[corpus.copy]
    assert (copy["duplicate_of"], copy["kind"], copy["device_id"]) == (
        corpus.original,
        "exact",
        corpus.device,
    )
    # the earlier recording stays canonical (it may be a near duplicate of another test's)
    assert latest.get(corpus.original, {}).get("duplicate_of") != corpus.copy
    # and the other recording, a picture of its own, is nobody's duplicate
    other = next(
        e for e in corpus.started if e not in {corpus.rejected, corpus.original, corpus.copy}
    )
    assert other not in latest, latest[other]


def sharded_times(settings: Settings) -> list[tuple[str, datetime, datetime, datetime | None]]:
    """(episode, started_at, sharded at, uploaded at) of every sharded episode, raw."""
    with psycopg.connect(settings.database_libpq_url) as conn:
        rows = conn.execute(
            "SELECT e.episode_id, e.started_at, e.updated_at, p.processed_at FROM episodes e "
            "LEFT JOIN episode_refs r ON r.episode_id = e.episode_id "
            "LEFT JOIN processed_events p ON p.event_id = r.event_id "
            "WHERE e.status = 'sharded'"
        ).fetchall()
    return [(str(a), b, c, d) for a, b, c, d in rows]


def test_freshness_percentiles_equal_a_recomputation_from_the_warehouse(
    stack: Settings, corpus: Corpus
) -> None:
    fresh = corpus.panel("freshness")
    now = fresh["generated_at"]
    times = sharded_times(stack)
    # this module's episodes: sharded after they were published, hours after their start
    mine = {e: (s, sh, up) for e, s, sh, up in times if e in corpus.started}
    assert len(mine) == 3
    pipeline_s = corpus.sharded_at - corpus.published_at + 1
    for started, sharded, uploaded in mine.values():
        assert uploaded is not None
        assert 0 <= (sharded - uploaded).total_seconds() <= pipeline_s
        assert (sharded - started).total_seconds() >= 3 * 3600 - 10 * 60
    for name, window_s in (("hour", 3600), ("day", 86400)):
        inside = [t for t in times if now - t[2].timestamp() <= window_s]
        window = fresh["windows"][name]
        assert window["episodes"] == len(inside) >= 3
        from_start = [(sh - s).total_seconds() for _, s, sh, _ in inside]
        from_upload = [(sh - up).total_seconds() for _, _, sh, up in inside if up is not None]
        for key, values in (("from_started_at", from_start), ("from_upload", from_upload)):
            assert window[key]["episodes"] == len(values)
            for q in (50, 99):
                expected = float(np.percentile(values, q))
                assert window[key][f"p{q}_s"] == pytest.approx(expected, abs=0.01), (name, key, q)


def test_corpus_page_shows_the_panels_values(
    corpus: Corpus, chromium: Browser, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    summary, fresh = corpus.panel("summary"), corpus.panel("freshness")
    page = chromium.new_page(viewport={"width": 1200, "height": 900})
    page.goto(corpus.service.url, timeout=30_000)
    page.click("#corpus-link")  # the lag page links to the corpus view
    page.wait_for_url("**/corpus", timeout=30_000)
    assert page.title() == "egoline corpus"
    page.wait_for_function("Number(document.body.dataset.polls) >= 1", timeout=60_000)
    for panel in PANELS:
        assert page.locator(f"#{panel} .error").inner_text() == ""

    assert page.locator("#total-episodes").inner_text() == str(summary["episodes"])
    row = page.locator(f'#by-device tr[data-device="{corpus.device}"] td')
    assert row.nth(1).inner_text() == "4"
    hours = sum(corpus.seconds.values()) / 3600
    assert float(row.nth(2).inner_text()) == pytest.approx(hours, abs=0.001)
    day = corpus.started[corpus.copy].strftime("%Y-%m-%d")
    assert page.locator(f'#day-chart rect[data-day="{day}"]').count() == 1

    reject = page.locator("#reject-latest tbody tr").first
    assert reject.get_attribute("data-episode") == corpus.rejected
    assert "keyframe_undecodable" in reject.locator("td").nth(3).inner_text()

    copy = page.locator(f'#dup-latest tr[data-episode="{corpus.copy}"] td')
    assert [copy.nth(i).inner_text() for i in (1, 2)] == [corpus.original, "exact"]

    for name in ("hour", "day"):
        shown = page.locator(f'#fresh-table tr[data-window="{name}"]')
        window = fresh["windows"][name]
        assert shown.locator("td").nth(1).inner_text() == str(window["episodes"])
        assert float(shown.get_attribute("data-start-p50") or "nan") == pytest.approx(
            window["from_started_at"]["p50_s"]
        )
        assert float(shown.get_attribute("data-upload-p99") or "nan") == pytest.approx(
            window["from_upload"]["p99_s"]
        )

    shot = request.config.getoption("--corpus-page-png") or str(tmp_path / "corpus-page.png")
    page.screenshot(path=shot, full_page=True)
    page.close()
