"""Curation's opt-in reject mode on the real stack: a validate process with
`EGOLINE_CURATION_REJECT=covered,frozen` rejects a covered-lens and a frozen recording (made the
way devices make them, uploaded by the device agent) with `content_covered` / `content_frozen`,
stores their signals all the same, and passes a clean recording and a device at rest (`static`,
not listed: flagged only). With the setting empty (the session fleet's validate), the same two
episodes re-derived by a backfill under a new pipeline version are accepted and sharded, their
clips flagged by their values: the reject mode is a pipeline-version decision."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from services.cli import app
from services.common.settings import Settings
from services.stack.fleet import Fleet
from services.synth.realistic import RealisticCase, write_case
from tests.fixtures.polling import wait_for
from tests.fixtures.stack import device_agent, episode_states

pytestmark = pytest.mark.connected

CASES = [
    RealisticCase("rej_clean", duration_s=12.0, seed_offset=1),
    RealisticCase("rej_covered", content="covered", duration_s=12.0, seed_offset=2),
    RealisticCase("rej_frozen", content="frozen", duration_s=12.0, seed_offset=3),
    RealisticCase("rej_static", content="static", duration_s=12.0, seed_offset=4),
]


def verdicts(settings: Settings, ids: list[str], version: str) -> dict[str, tuple[str, list[str]]]:
    """episode -> (verdict, reason codes) under `version`."""
    with psycopg.connect(settings.database_libpq_url) as conn:
        rows = conn.execute(
            "SELECT episode_id, verdict, reasons FROM verdicts "
            "WHERE episode_id = ANY(%s) AND pipeline_version = %s",
            (ids, version),
        ).fetchall()
    return {str(e): (str(v), [str(r["code"]) for r in reasons]) for e, v, reasons in rows}


def stored_signals(settings: Settings, ids: list[str], version: str) -> dict[str, int]:
    """episode -> sampled frames stored in `episode_quality` under `version`."""
    with psycopg.connect(settings.database_libpq_url) as conn:
        rows = conn.execute(
            "SELECT episode_id, frames FROM episode_quality "
            "WHERE episode_id = ANY(%s) AND pipeline_version = %s",
            (ids, version),
        ).fetchall()
    return {str(e): int(n) for e, n in rows}


def worst_clips(settings: Settings, ids: list[str], version: str) -> dict[str, tuple[Any, ...]]:
    """episode -> (clips, most covered, most frozen) under `version`."""
    with psycopg.connect(settings.database_libpq_url) as conn:
        rows = conn.execute(
            "SELECT episode_id, count(*), max(blocked_fraction), max(frozen_fraction) FROM clips "
            "WHERE episode_id = ANY(%s) AND pipeline_version = %s GROUP BY episode_id",
            (ids, version),
        ).fetchall()
    return {str(e): tuple(rest) for e, *rest in rows}


def test_reject_mode_rejects_listed_classes_and_flag_only_accepts_the_same_episodes(
    stack: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    seed = int(time.time()) % 9000 + 1000
    dirs, ids = [], {}
    for case in CASES:
        folder = write_case(case, tmp_path / "episodes", seed=seed)
        meta = json.loads((folder / "episode.json").read_text())
        meta["device_id"] = f"rejdev{seed}"
        (folder / "episode.json").write_text(json.dumps(meta))
        dirs.append(folder)
        ids[case.name] = str(meta["episode_id"])
    every = sorted(ids.values())
    rejected = [ids["rej_covered"], ids["rej_frozen"]]
    version = stack.pipeline_version

    # This test's validate is the group's only member, with reject mode on.
    fleet.kill("validate-0", timeout_s=60)
    own = Fleet(
        tmp_path / "logs",
        env={
            "EGOLINE_START_JITTER_S": "0",
            "EGOLINE_BATCH_WAIT_S": "0.5",
            "EGOLINE_CURATION_REJECT": "covered,frozen",
        },
    )
    try:
        own.start("validate")
        own.wait_ready()
        agent = device_agent(stack, tmp_path / "agent")
        assert agent.run_once(dirs, 60).get("published") == len(dirs)
        expected = {
            ids["rej_clean"]: "sharded",
            ids["rej_static"]: "sharded",  # a device at rest: not listed, flagged only
            ids["rej_covered"]: "rejected",
            ids["rej_frozen"]: "rejected",
        }
        wait_for(lambda: episode_states(stack, every) == expected, 300, "reject-mode verdicts")
    finally:
        own.stop()
        fleet.spawn("validate-0")
        fleet.wait_ready()

    got = verdicts(stack, every, version)
    assert got[ids["rej_covered"]] == ("reject", ["content_covered"])
    assert got[ids["rej_frozen"]] == ("reject", ["content_frozen"])
    for name in ("rej_clean", "rej_static"):
        verdict, codes = got[ids[name]]
        assert verdict != "reject" and not [c for c in codes if c.startswith("content_")], got
    # the signals of the rejected episodes are stored all the same: the warehouse shows why
    frames = stored_signals(stack, every, version)
    assert set(frames) == set(every) and all(n > 0 for n in frames.values()), frames
    assert set(worst_clips(stack, every, version)) == {ids["rej_clean"], ids["rej_static"]}

    # Flag only (the setting empty): the same episodes under a new pipeline version.
    new = f"flag-{seed}"
    runner = CliRunner()
    args = ["backfill", "--pipeline-version", new]
    for episode_id in rejected:
        args += ["--episode", episode_id]
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout.strip().splitlines()[-1])["episodes"] == len(rejected)
    wait_for(
        lambda: set(verdicts(stack, rejected, new)) == set(rejected), 300, "flag-only verdicts"
    )
    again = verdicts(stack, rejected, new)
    assert all(v != "reject" and not r for v, r in again.values()), again
    wait_for(
        lambda: set(worst_clips(stack, rejected, new)) == set(rejected),
        300,
        "the backfilled episodes' clips",
    )
    clips = worst_clips(stack, rejected, new)
    _, covered_most, _ = clips[ids["rej_covered"]]
    _, _, frozen_most = clips[ids["rej_frozen"]]
    assert covered_most >= stack.curation.min_blocked_fraction  # flagged by its values
    assert frozen_most > stack.curation.max_frozen_fraction
