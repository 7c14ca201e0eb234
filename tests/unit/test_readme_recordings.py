"""The README's "Your own recordings" examples are episode.json files the agent accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from services.agent.recordings import AgentInputError, describe

README = Path(__file__).resolve().parents[2] / "README.md"


def recording_examples() -> list[dict[str, object]]:
    text = README.read_text()
    section = text.split("## Your own recordings", 1)[1].split("\n## ", 1)[0]
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.S)]


def test_readme_shows_a_single_camera_a_multi_camera_rig_and_an_imu_sidecar() -> None:
    examples = recording_examples()
    assert len(examples) == 3
    assert any("videos" in e and len(e["videos"]) > 1 for e in examples)  # type: ignore[arg-type]
    assert any("imu" in e for e in examples)


@pytest.mark.parametrize("index", range(3))
def test_readme_episode_json_is_accepted_by_the_agent(tmp_path: Path, index: int) -> None:
    # given: a recording folder laid out as the README says, with the files it names
    meta = recording_examples()[index]
    folder = tmp_path / "recording"
    folder.mkdir()
    names = {str(meta["video"])}
    for spec in dict(meta.get("videos", {})).values():  # type: ignore[call-overload]
        names.add(spec["file"] if isinstance(spec, dict) else str(spec))
    if "imu" in meta:
        names.add(str(meta["imu"]))
    for name in names:
        (folder / name).write_bytes(name.encode())
    (folder / "episode.json").write_text(json.dumps(meta))
    # when: the agent describes it
    episode = describe(folder)
    # then: every camera and the IMU are raw objects of the episode
    ref = episode.ref
    assert ref.episode_id == meta["episode_id"]
    assert 1 + len(ref.cameras) == max(1, len(dict(meta.get("videos", {}))))  # type: ignore[call-overload]
    assert (ref.imu is not None) == ("imu" in meta)


def test_a_broken_example_would_be_refused(tmp_path: Path) -> None:
    meta = {**recording_examples()[0], "started_at": "2026-06-01T09:30:00"}  # no time zone
    folder = tmp_path / "recording"
    folder.mkdir()
    (folder / str(meta["video"])).write_bytes(b"x")
    (folder / "episode.json").write_text(json.dumps(meta))
    with pytest.raises(AgentInputError, match="time zone"):
        describe(folder)
