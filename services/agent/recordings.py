"""Finding finished recordings on the device and describing them (ids checked, files hashed).

An episode is a folder holding `episode.json` (episode, device and session ids, start time, the
video file name, optionally the IMU file name and a list of tags). A folder is ready when:
- `marker` mode: `episode.json` exists (the recorder writes it last, atomically), or
- `stable` mode: `episode.json` exists and no file in the folder changed size or mtime for
  `stable_s` seconds (for recorders that write the metadata first).

Chunked recordings: a recorder that splits one file into byte-contiguous pieces
(`video.mkv.000`, `video.mkv.001`, ...) names `video.mkv` in `episode.json`; the pieces are
grouped, in order, into that one raw object.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from schemas.events import CameraFile, EpisodeRef, SourceFile

COMPLETION_MARKER = "episode.json"
CHUNK_SUFFIX = re.compile(r"^\.\d{3,6}$")
READ_CHUNK = 8 * 1024 * 1024


class AgentInputError(ValueError):
    """An episode the agent refuses: it is marked failed with this reason, nothing published."""


@dataclass(frozen=True)
class LocalFile:
    """One logical file: a single path or its ordered chunks, read as one byte stream."""

    paths: tuple[Path, ...]
    size_bytes: int
    sha256: str
    fingerprint: tuple[tuple[int, int], ...]  # (size, mtime_ns) of each path when hashed

    def changed(self) -> bool:
        """True if any piece changed size or mtime since it was hashed."""
        return _fingerprint(self.paths) != self.fingerprint

    def read_at(self, offset: int, length: int) -> bytes:
        """`length` bytes from logical `offset` (across chunk boundaries); fewer at the end."""
        if len(self.paths) == 1:  # the common case: one read, no copy into a join buffer
            with self.paths[0].open("rb", buffering=0) as handle:
                return os.pread(handle.fileno(), length, offset)
        out = bytearray()
        position = 0
        for path in self.paths:
            size = path.stat().st_size
            if offset < position + size and len(out) < length:
                start = max(0, offset - position)
                with path.open("rb") as handle:
                    handle.seek(start)
                    out += handle.read(min(size - start, length - len(out)))
            position += size
        return bytes(out)


@dataclass(frozen=True)
class LocalEpisode:
    directory: Path
    ref: EpisodeRef
    video: LocalFile
    imu: LocalFile | None
    cameras: dict[str, LocalFile] = field(default_factory=dict)

    def files(self) -> list[tuple[SourceFile, LocalFile]]:
        pairs: list[tuple[SourceFile, LocalFile]] = [(self.ref.video, self.video)]
        for name, local in sorted(self.cameras.items()):
            pairs.append((self.ref.cameras[name].file, local))
        if self.ref.imu is not None and self.imu is not None:
            pairs.append((self.ref.imu, self.imu))
        return pairs


def raw_key(device_id: str, started_at: datetime, episode_id: str, sha256: str, ext: str) -> str:
    """`raw/<device>/<yyyy>/<mm>/<dd>/<episode>/<sha256>.<ext>`: never overwritten."""
    day = started_at.astimezone(UTC)
    return f"raw/{device_id}/{day:%Y/%m/%d}/{episode_id}/{sha256}.{ext}"


def _fingerprint(paths: tuple[Path, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for path in paths:
        st = path.stat()
        out.append((st.st_size, st.st_mtime_ns))
    return tuple(out)


def find_ready(root: Path, mode: str, stable_s: float, now: float) -> list[Path]:
    """Episode folders under `root` (or `root` itself) that are ready to upload."""
    candidates = (
        [root]
        if (root / COMPLETION_MARKER).exists()
        else sorted(p.parent for p in root.glob(f"*/{COMPLETION_MARKER}"))
    )
    if mode == "marker":
        return candidates
    ready = []
    for folder in candidates:
        newest = max((p.stat().st_mtime for p in folder.iterdir() if p.is_file()), default=now)
        if now - newest >= stable_s:
            ready.append(folder)
    return ready


def _pieces(directory: Path, name: str) -> tuple[Path, ...]:
    """The file `name` in `directory`, or its ordered chunks `name.000`, `name.001`, ..."""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise AgentInputError(f"{directory}: file name {name!r} is not a plain name in the folder")
    single = directory / name
    if single.is_file():
        return (single,)
    chunks = sorted(
        p for p in directory.glob(f"{name}.*") if CHUNK_SUFFIX.match(p.name[len(name) :])
    )
    if not chunks:
        raise AgentInputError(f"{directory}: {name} is missing")
    return tuple(chunks)


def hash_file(paths: tuple[Path, ...]) -> LocalFile:
    """Read the pieces once, in order, computing size and sha256."""
    before = _fingerprint(paths)
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(READ_CHUNK)  # one buffer reused: no allocation per chunk
    view = memoryview(buffer)
    try:
        for path in paths:
            with path.open("rb", buffering=0) as handle:
                while n := handle.readinto(buffer):
                    digest.update(view[:n])
                    size += n
    except OSError as exc:
        raise AgentInputError(f"cannot read {paths[0].name}: {exc}") from exc
    if size == 0:
        raise AgentInputError(f"{paths[0].name} is empty (zero bytes)")
    if _fingerprint(paths) != before:
        raise AgentInputError(f"{paths[0].name} changed while being read")
    return LocalFile(paths, size, digest.hexdigest(), before)


def _extension(name: str, directory: Path) -> str:
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else "bin"
    if not re.fullmatch(r"[a-z0-9]{1,8}", ext):
        raise AgentInputError(f"{directory}: odd file extension {ext!r}")
    return ext


def _camera_entries(meta: dict[str, object], directory: Path) -> list[tuple[str, str, float]]:
    """(camera, file name, offset_s) of every camera, main first. `videos` maps a camera name
    to a file name or to `{"file": name, "offset_s": seconds}`; without it, `video` is the one
    camera `main`. With both, `video` names the main camera's file."""
    videos = meta.get("videos")
    if videos is None:
        return [("main", str(meta["video"]), 0.0)]
    if not isinstance(videos, dict) or not videos:
        raise TypeError("videos must be a non-empty object of camera name -> file")
    entries = []
    for name, spec in videos.items():
        if isinstance(spec, dict):
            entries.append((str(name), str(spec["file"]), float(spec.get("offset_s", 0.0))))
        else:
            entries.append((str(name), str(spec), 0.0))
    main_file = meta.get("video")
    entries.sort(key=lambda e: (e[1] != main_file, list(videos).index(e[0])))
    return entries


def describe(directory: Path) -> LocalEpisode:
    """Read `episode.json`, validate every id, hash the files. Raises AgentInputError."""
    try:
        meta = json.loads((directory / COMPLETION_MARKER).read_text())
        if not isinstance(meta, dict):
            raise TypeError("not a JSON object")
        started = datetime.fromisoformat(str(meta["started_at"]))
        if started.tzinfo is None:
            raise ValueError("started_at needs a time zone")
        cameras = _camera_entries(meta, directory)
        imu_name = meta.get("imu")
        imu_offset = float(meta.get("imu_offset_s", 0.0))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AgentInputError(f"{directory}: unreadable {COMPLETION_MARKER}: {exc}") from exc
    hashed = [(name, hash_file(_pieces(directory, file)), file, off) for name, file, off in cameras]
    imu = hash_file(_pieces(directory, str(imu_name))) if imu_name else None

    def source(local: LocalFile, file_name: str) -> SourceFile:
        ext = _extension(file_name, directory)
        return SourceFile(
            key=raw_key(meta["device_id"], started, meta["episode_id"], local.sha256, ext),
            sha256=local.sha256,
            size_bytes=local.size_bytes,
        )

    main_name, video, video_file, _ = hashed[0]
    try:
        ref = EpisodeRef(
            episode_id=meta["episode_id"],
            device_id=meta["device_id"],
            session_id=meta["session_id"],
            started_at=started,
            tags=meta.get("tags", []),
            video=source(video, video_file),
            camera=main_name,
            cameras={
                name: CameraFile(file=source(local, file), offset_s=offset)
                for name, local, file, offset in hashed[1:]
            },
            imu=None if imu is None else source(imu, str(imu_name)),
            imu_offset_s=imu_offset,
        )
    except (ValidationError, KeyError, TypeError) as exc:
        raise AgentInputError(f"{directory}: invalid ids in {COMPLETION_MARKER}: {exc}") from exc
    return LocalEpisode(
        directory, ref, video, imu, {name: local for name, local, _, _ in hashed[1:]}
    )
