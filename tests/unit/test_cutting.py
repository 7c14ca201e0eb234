"""Clip cutting over packet indexes (pure) and on real encoder-default media."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from schemas.events import StreamInfo
from services.media.av_io import decode_stream_times, probe_container, remux_clips
from services.media.cutting import clean_cuts, entry_points, leading_pictures, plan_runs
from services.media.members import member_labels
from services.shard.core import build_tar, member_offsets
from services.synth.realistic import realistic_cases, write_case

# Open GOP in decode order: I0 P4 B2 B1 B3 | CRA8 B6 B5 B7 (leading pictures of 8) P12 B10 B9 B11
PTS = np.array([0, 4, 2, 1, 3, 8, 6, 5, 7, 12, 10, 9, 11], dtype=np.int64)
KEY = np.zeros(len(PTS), dtype=bool)
KEY[[0, 5]] = True


def test_a_cra_with_leading_pictures_is_an_entry_point_but_not_a_clean_cut() -> None:
    assert entry_points(PTS, KEY).tolist() == [0, 5]
    assert clean_cuts(PTS, KEY).tolist() == [0]
    assert leading_pictures(PTS, 5, None) == [6, 7, 8]


def test_windows_at_a_cra_show_every_frame_once_and_carry_what_the_leading_frames_need() -> None:
    runs = plan_runs(PTS, KEY, [(0, 8), (8, 13)])
    first, second = runs
    assert first is not None and second is not None
    # the first clip runs through B7: it holds the CRA (a reference, shown after its window)
    assert (first.first, first.last) == (0, 8) and 5 in first
    # the second starts at the CRA and leaves out its leading pictures (they are the first's)
    assert second.first == 5 and not any(i in second for i in (6, 7, 8))
    shown = [
        int(PTS[i])
        for run, (a, b) in zip(runs, [(0, 8), (8, 13)], strict=True)
        for i in range(run.first, run.last + 1)  # type: ignore[union-attr]
        if i in run and a <= PTS[i] < b  # type: ignore[operator]
    ]
    assert sorted(shown) == list(range(13))


def test_a_window_starting_between_keyframes_gets_pre_roll_from_the_keyframe_before() -> None:
    (run,) = plan_runs(PTS, KEY, [(10, 13)])
    assert run is not None and run.first == 5  # decodes from the CRA; frames < 10 are pre-roll


def test_a_stream_without_frames_in_a_window_has_no_run() -> None:
    assert plan_runs(PTS, KEY, [(100, 200)]) == [None]


def test_member_offsets_are_where_tar_puts_each_members_data() -> None:
    members = [("a.mp4", b"x" * 1000), ("a.depth.mp4", b"y" * 513), ("a.json", b"{}")]
    from services.shard.core import Member

    data, spans = build_tar([Member(n, d) for n, d in members])
    relative = member_offsets([len(d) for _, d in members])
    assert [s.offset - spans[0].offset for s in spans] == relative
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert [m.name for m in tar.getmembers()] == [n for n, _ in members]


def stream(index: int, title: str | None = None) -> StreamInfo:
    return StreamInfo(
        index=index,
        codec="h264",
        width=64,
        height=64,
        fps=30,
        duration_s=1,
        frame_count=30,
        keyframe_count=1,
        title=title,
    )


class Source:
    def __init__(self, camera: str, streams: list[StreamInfo]) -> None:
        self.camera, self.streams = camera, streams


def test_member_labels_are_unique_and_dot_free() -> None:
    labels = member_labels(
        [
            Source("main", [stream(0, "rgb"), stream(1, "Depth Map"), stream(2)]),
            Source("wrist", [stream(0), stream(1, "ir")]),
        ]
    )
    assert labels == {
        ("main", 0): "main",
        ("main", 1): "depth-map",
        ("main", 2): "s2",
        ("wrist", 0): "wrist",
        ("wrist", 1): "wrist-ir",
    }
    assert all("." not in v for v in labels.values())


@pytest.fixture(scope="module")
def open_gop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    case = next(c for c in realistic_cases() if c.name == "h265_default_open_gop_mp4")
    return write_case(case, tmp_path_factory.mktemp("realistic")) / "video.mp4"


def test_x265_defaults_make_open_gop_keyframes_with_leading_pictures(open_gop: Path) -> None:
    primary = probe_container(open_gop).streams[0]
    assert primary.codec == "hevc"
    assert len(primary.entry_times_s) > len(primary.clean_cut_times_s)  # a CRA with RASL frames


def test_cutting_open_gop_hevc_at_its_cra_keyframes_loses_no_frame(open_gop: Path) -> None:
    primary = probe_container(open_gop).streams[0]
    cuts = [*primary.entry_times_s, primary.duration_s]
    clips = remux_clips(open_gop, primary.index, cuts)
    shown = 0
    for i, (data, _packets) in enumerate(clips):
        window = cuts[i + 1] - cuts[i]
        last = i == len(clips) - 1
        times = decode_stream_times(data, 0).times_s
        shown += sum(1 for t in times if t >= -1e-6 and (last or t < window - 1e-6))
    assert shown == len(decode_stream_times(open_gop, primary.index).times_s) == 600
