"""A PyTorch `IterableDataset` over a manifest (optional extra: `pip install 'egoline[torch]'`).

Each dataloader worker of each rank reads its own share of the epoch (`reader_part`): no clip is
read twice, none is skipped. Call `set_epoch(n)` before each epoch (as with
`DistributedSampler`); to resume, pass `start`, the global position every reader had reached
(`resume_position`). The reader (object-store client, cache) is built inside each worker, so
the dataset pickles as plain settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from services.common.settings import Settings, get_settings
from services.reader.loader import ClipLoader, open_reader
from services.reader.order import reader_part


class ClipDataset(IterableDataset[dict[str, Any]]):
    """Yields per clip `{"key", "frames" (uint8, (T, H, W, 3)) or "mp4" (bytes),
    "streams" ({label: member bytes} for every video stream: depth, other cameras...),
    "imu" (float64, (M, 7) [t from clip start s, accel m/s^2, gyro rad/s], or None), "meta"}`."""

    def __init__(
        self,
        manifest: Path | str,
        *,
        seed: int = 0,
        decode: bool = True,
        rank: int = 0,
        world_size: int = 1,
        start: int = 0,
        settings: Settings | None = None,
    ) -> None:
        super().__init__()
        reader_part(rank, world_size, 0, 1)  # validate early, in the parent process
        self.manifest = manifest
        self.seed = seed
        self.decode = decode
        self.rank = rank
        self.world_size = world_size
        self.start = start
        self.epoch = 0
        self.settings = settings or get_settings()
        self._reader: ClipLoader | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        part, parts = reader_part(self.rank, self.world_size, worker, num_workers)
        if self._reader is None:
            self._reader = open_reader(
                self.manifest, self.settings, seed=self.seed, decode=self.decode
            )
        for clip in self._reader.clips(self.epoch, start=self.start, part=part, parts=parts):
            sample: dict[str, Any] = {"key": str(clip.row["clip_key"]), "meta": clip.meta}
            if clip.frames is not None:
                sample["frames"] = torch.from_numpy(clip.frames)
            else:
                sample["mp4"] = clip.mp4
            sample["streams"] = clip.streams
            sample["imu"] = None if clip.imu is None else torch.from_numpy(clip.imu)
            yield sample

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None}  # each worker opens its own reader
