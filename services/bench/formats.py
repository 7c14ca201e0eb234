"""`egoline bench formats`: every format a device writes, through the real stack, counted.

Each case is an episode folder as a device writes it (services/synth/realistic.py: encoder
defaults, open GOP, VFR, 10-bit, audio, RGB-D MKV, several cameras, fragmented and cut-short
files, IMU at its own rate) or a hostile one (services/synth/writer.py defects). The agent uploads
them, the decode/validate/shard/metadata services run as their own processes, and then, from
outside the system under test:
- `frames_in`: a full decode of every video stream of every raw file (what a device recorded);
- `frames_out`: a full decode of every clip member read back from its shard by byte range,
  counting the frames inside the clip's window (pre-roll and carried reference frames are not
  the window's);
- streams, audio streams and IMU samples in and out the same way.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select

from services.agent.recordings import COMPLETION_MARKER, describe
from services.agent.runner import make_agent
from services.common.objectstore import ObjectStore, object_store
from services.common.settings import Settings
from services.demo.run import wait_until_cataloged
from services.media.av_io import (
    decode_stream_times,
    frame_times_s,
    probe_container,
    stream_layout,
)
from services.media.model import ProbeError
from services.metadata.warehouse import clips, dead_letters, episodes, make_engine, verdicts
from services.reader.clips import read_clip
from services.sensors.imu import ImuError, load_imu
from services.stack.fleet import Fleet
from services.synth.writer import Defect, plan_episodes, write_episode

HOSTILE_DEFECTS = (
    Defect.TRUNCATED,  # a plain MP4 cut before its moov: nothing can be located
    Defect.CORRUPT_PACKETS,
    Defect.NON_MONOTONIC,
    Defect.IMU_MISMATCH,
    Defect.NOT_VIDEO,
)
ACCEPTED = ("accept", "accept_with_warnings")


@dataclass
class RawCounts:
    """What a device recorded: frames per (camera, stream index), audio streams per camera,
    IMU samples."""

    frames: dict[tuple[str, int], int] = field(default_factory=dict)
    audio: dict[str, int] = field(default_factory=dict)
    imu_samples: int = 0


@dataclass
class ClipCounts:
    frames: dict[tuple[str, int], int] = field(default_factory=dict)
    audio: dict[str, int] = field(default_factory=dict)
    imu_samples: int = 0
    clips: int = 0
    unreadable: int = 0


def _joined(directory: Path, name: str, scratch: Path) -> Path:
    """The file `name` of an episode folder, its chunks joined if it was written in pieces."""
    single = directory / name
    if single.is_file():
        return single
    out = scratch / name
    with out.open("wb") as sink:
        for piece in sorted(directory.glob(f"{name}.*")):
            with piece.open("rb") as source:
                shutil.copyfileobj(source, sink)
    return out


def raw_counts(directory: Path) -> RawCounts:
    """Full decode of every raw video stream (frames that decode; a cut-short file gives what
    it holds) and the IMU rows, read straight from the device's folder."""
    meta = json.loads((directory / COMPLETION_MARKER).read_text())
    videos = meta.get("videos") or {"main": meta["video"]}
    main_file = meta.get("video")
    counts = RawCounts()
    local = describe(directory)
    names = {local.ref.camera: str(main_file or next(iter(videos.values())))}
    for camera, spec in videos.items():
        file = spec["file"] if isinstance(spec, dict) else spec
        if camera not in names and file != names[local.ref.camera]:
            names[camera] = str(file)
    with tempfile.TemporaryDirectory(prefix="egoline-formats-") as tmp:
        main_probe = None
        for camera, file in names.items():
            path = _joined(directory, file, Path(tmp))
            try:
                layout = stream_layout(path)
            except ProbeError:  # not a container at all: nothing recorded that can be decoded
                continue
            for index, kind, _codec in layout:
                if kind == "video":
                    counts.frames[(camera, index)] = len(decode_stream_times(path, index).times_s)
            counts.audio[camera] = sum(1 for _, kind, _ in layout if kind == "audio")
            if camera == local.ref.camera:
                try:
                    main_probe = probe_container(path)
                except ProbeError:
                    main_probe = None
        if meta.get("imu") and main_probe is not None:
            imu_path = _joined(directory, str(meta["imu"]), Path(tmp))
            primary = main_probe.streams[0]
            try:
                counts.imu_samples = len(
                    load_imu(
                        imu_path.read_bytes(),
                        imu_path.name,
                        frame_times_s=frame_times_s(primary),
                        fps=primary.fps or None,
                    ).t
                )
            except ImuError:
                counts.imu_samples = 0
    return counts


def clip_counts(store: ObjectStore, rows: list[dict[str, Any]]) -> ClipCounts:
    """Read every clip back by byte range and decode every member: frames inside each window."""
    out = ClipCounts()
    last_index = max((int(r["clip_index"]) for r in rows), default=-1)
    for row in rows:
        out.clips += 1
        try:
            clip = read_clip(store, row)
        except Exception:
            out.unreadable += 1
            continue
        duration = float(clip.meta.get("duration_s", 0.0))
        last = int(row["clip_index"]) == last_index
        for entry in clip.meta.get("streams", []):
            if entry.get("kind") == "imu":
                continue
            data = clip.streams.get(str(entry["label"]))
            if data is None:
                out.unreadable += 1
                continue
            layout = stream_layout(data)
            video = next(i for i, kind, _ in layout if kind == "video")
            times = decode_stream_times(data, video).times_s
            shown = sum(1 for t in times if t >= -1e-6 and (last or t < duration - 1e-6))
            key = (str(entry["camera"]), int(entry["stream_index"]))
            out.frames[key] = out.frames.get(key, 0) + shown
            audio = sum(1 for _, kind, _ in layout if kind == "audio")
            camera = str(entry["camera"])
            out.audio[camera] = max(out.audio.get(camera, 0), audio)
        if clip.imu is not None:
            out.imu_samples += len(clip.imu)
    return out


@dataclass(frozen=True)
class CaseResult:
    case: str
    episode_id: str
    hostile: bool
    expect: str
    verdict: str
    reasons: list[str]
    warnings: list[str]
    frames_in: dict[str, int]
    frames_out: dict[str, int]
    streams_in: int
    streams_out: int
    audio_in: int
    audio_out: int
    imu_in: int
    imu_out: int
    clips: int
    unreadable: int

    @property
    def accepted(self) -> bool:
        return self.verdict in ACCEPTED

    def line(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "warnings": self.warnings,
            "frames_in": self.frames_in,
            "frames_out": self.frames_out,
            "streams": f"{self.streams_out}/{self.streams_in}",
            "audio": f"{self.audio_out}/{self.audio_in}",
            "imu": f"{self.imu_out}/{self.imu_in}",
            "clips": self.clips,
        }


def _label(key: tuple[str, int]) -> str:
    return f"{key[0]}:{key[1]}"


def judge(
    case: str,
    episode_id: str,
    hostile: bool,
    expect: str,
    verdict: str,
    reasons: list[str],
    warnings: list[str],
    raw: RawCounts,
    out: ClipCounts,
) -> CaseResult:
    """One case's figures (pure)."""
    return CaseResult(
        case=case,
        episode_id=episode_id,
        hostile=hostile,
        expect=expect,
        verdict=verdict,
        reasons=reasons,
        warnings=warnings,
        frames_in={_label(k): v for k, v in sorted(raw.frames.items())},
        frames_out={_label(k): v for k, v in sorted(out.frames.items())},
        streams_in=len(raw.frames),
        streams_out=sum(1 for k, v in out.frames.items() if v > 0 and k in raw.frames),
        audio_in=sum(raw.audio.values()),
        audio_out=sum(min(out.audio.get(c, 0), n) for c, n in raw.audio.items()),
        imu_in=raw.imu_samples,
        imu_out=out.imu_samples,
        clips=out.clips,
        unreadable=out.unreadable,
    )


def summarize(results: list[CaseResult], keep_audio: bool) -> dict[str, Any]:
    """The JSON line: what was lost, what was wrongly refused, what hostile got in (pure).

    Losses count only for cases egoline accepted (a refused good case is a false reject)."""
    good = [r for r in results if not r.hostile]
    taken = [r for r in good if r.accepted]
    frames_lost = sum(
        max(0, n - r.frames_out.get(k, 0)) for r in taken for k, n in r.frames_in.items()
    )
    frames_duplicated = sum(
        max(0, n - r.frames_in.get(k, 0)) for r in taken for k, n in r.frames_out.items()
    )
    audio_lost = sum(r.audio_in - r.audio_out for r in taken) if keep_audio else 0
    return {
        "cases": len(results),
        "good_cases": len(good),
        "hostile_cases": len(results) - len(good),
        "false_rejects": sum(1 for r in good if not r.accepted),
        "false_reject_cases": [r.case for r in good if not r.accepted],
        "frames_in": sum(sum(r.frames_in.values()) for r in taken),
        "frames_out": sum(sum(r.frames_out.values()) for r in taken),
        "frames_lost": frames_lost,
        "frames_duplicated": frames_duplicated,
        "streams_lost": sum(r.streams_in - r.streams_out for r in taken) + audio_lost,
        "audio_streams_lost": audio_lost,
        "imu_samples_lost": sum(max(0, r.imu_in - r.imu_out) for r in taken),
        "imu_samples_duplicated": sum(max(0, r.imu_out - r.imu_in) for r in taken),
        "unreadable_members": sum(r.unreadable for r in results),
        "hostile_accepted": sum(1 for r in results if r.hostile and (r.accepted or r.clips)),
    }


def _retag(directory: Path, token: str) -> str:
    """Give an episode folder a run-unique id (the warehouse outlives the embedded broker)."""
    marker = directory / COMPLETION_MARKER
    meta = json.loads(marker.read_text())
    meta["episode_id"] = f"{meta['episode_id']}-{token}"[:128]
    marker.write_text(json.dumps(meta, indent=2))
    return str(meta["episode_id"])


def write_cases(work: Path, seed: int, log: Callable[[str], None]) -> list[tuple[str, Path, bool]]:
    """(case name, folder, hostile) for the realistic matrix and the hostile set."""
    from services.synth.realistic import realistic_cases, write_case

    out: list[tuple[str, Path, bool]] = []
    for case in realistic_cases():
        started = time.perf_counter()
        out.append((case.name, write_case(case, work / "realistic", seed=seed), False))
        log(f"wrote {case.name} in {time.perf_counter() - started:.1f}s")
    specs = plan_episodes(len(HOSTILE_DEFECTS), seed=seed, defects=HOSTILE_DEFECTS)
    for spec in specs:
        assert spec.defect is not None
        out.append((f"hostile_{spec.defect.value}", write_episode(spec, work / "hostile"), True))
    return out


def _outcomes(engine: Engine, ids: list[str]) -> dict[str, tuple[str, list[str], list[str]]]:
    """(verdict or status, reason codes, warning codes) of each episode, from the warehouse."""
    out: dict[str, tuple[str, list[str], list[str]]] = {}
    with engine.connect() as conn:
        for eid, status in conn.execute(
            select(episodes.c.episode_id, episodes.c.status).where(episodes.c.episode_id.in_(ids))
        ).all():
            out[str(eid)] = (str(status), [], [])
        for eid, verdict, reasons, warnings in conn.execute(
            select(
                verdicts.c.episode_id, verdicts.c.verdict, verdicts.c.reasons, verdicts.c.warnings
            ).where(verdicts.c.episode_id.in_(ids))
        ).all():
            status = out.get(str(eid), ("", [], []))[0]
            shown = "dead_lettered" if status == "dead_lettered" else str(verdict)
            out[str(eid)] = (
                shown,
                [str(r["code"]) for r in reasons],
                [str(w["code"]) for w in warnings],
            )
        for eid, code in conn.execute(
            select(dead_letters.c.episode_id, dead_letters.c.reason_code).where(
                dead_letters.c.episode_id.in_(ids)
            )
        ).all():
            verdict, reasons, warnings = out.get(str(eid), ("dead_lettered", [], []))
            out[str(eid)] = ("dead_lettered", [*reasons, str(code)], warnings)
    return out


def _clip_rows(engine: Engine, episode_id: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(clips).where(clips.c.episode_id == episode_id).order_by(clips.c.clip_index)
        ).mappings()
        return [
            {
                "clip_key": r["clip_key"],
                "clip_index": r["clip_index"],
                "shard_key": r["shard_key"],
                "byte_offset": r["mp4_offset"],
                "length": r["mp4_length"],
                "imu_offset": r["imu_offset"],
                "imu_length": r["imu_length"],
                "json_offset": r["json_offset"],
                "json_length": r["json_length"],
            }
            for r in rows
        ]


@dataclass(frozen=True)
class FormatsRun:
    summary: dict[str, Any]
    results: list[CaseResult]
    work_dir: Path


def bench_formats(
    settings: Settings, seed: int, timeout_s: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """`egoline bench formats`: the summary line of `run_formats`."""
    return run_formats(settings, seed, timeout_s, log).summary


def run_formats(
    settings: Settings, seed: int, timeout_s: float, log: Callable[[str], None]
) -> FormatsRun:
    """Write the matrix, run it through a fleet of its own, count from outside."""
    started = time.perf_counter()
    if seed < 0:
        seed = int(time.time()) % 9000 + 1000
    work = settings.stack_dir / "bench-formats" / str(seed)
    shutil.rmtree(work, ignore_errors=True)
    cases = write_cases(work / "cases", seed, log)
    token = f"r{seed}"
    ids = {
        _retag(directory, token): (name, directory, hostile) for name, directory, hostile in cases
    }
    store = object_store(settings)
    engine = make_engine(settings)
    fleet = Fleet(work / "logs", env={"EGOLINE_START_JITTER_S": "0", "EGOLINE_BATCH_WAIT_S": "0.5"})
    fleet.start_all()
    try:
        fleet.wait_ready()
        agent = make_agent(settings.for_agent(work / "agent"), store)
        counts = agent.run_once([directory for _, directory, _ in cases], 60.0)
        log(f"agent: {counts}")
        published = [eid for eid, (_, d, _) in ids.items() if (d / COMPLETION_MARKER).exists()]

        def alive() -> None:
            if dead := fleet.dead():
                raise RuntimeError(f"services exited: {dead}; see {work / 'logs'}")

        wait_until_cataloged(
            engine,
            published,
            timeout_s,
            lambda n: log(f"cataloged {n}/{len(published)}"),
            alive,
        )
    finally:
        fleet.stop()
    outcomes = _outcomes(engine, list(ids))
    results = []
    for eid, (name, directory, hostile) in ids.items():
        verdict, reasons, warnings = outcomes.get(eid, ("not_published", [], []))
        meta = json.loads((directory / COMPLETION_MARKER).read_text())
        expect = str(meta.get("synthetic", {}).get("expect", "reject" if hostile else "accept"))
        raw = raw_counts(directory) if not hostile else RawCounts()
        out = clip_counts(store, _clip_rows(engine, eid))
        result = judge(name, eid, hostile, expect, verdict, reasons, warnings, raw, out)
        log(json.dumps(result.line()))
        results.append(result)
    engine.dispose()
    summary = summarize(results, settings.keep_audio)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    summary["seed"] = seed
    return FormatsRun(summary, results, work)
