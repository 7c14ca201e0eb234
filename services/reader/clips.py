"""Read one clip of a manifest row with one ranged GET of its shard."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from services.common.objectstore import ObjectStore


@dataclass(frozen=True)
class Clip:
    mp4: bytes
    imu: NDArray[np.float32] | None
    row: dict[str, Any]


def read_clip(store: ObjectStore, row: dict[str, Any]) -> Clip:
    """Fetch a clip's MP4 (and IMU slice) by byte range from its shard."""
    mp4 = store.get_range(str(row["shard_key"]), int(row["byte_offset"]), int(row["length"]))
    imu = None
    if row.get("imu_offset") is not None and row.get("imu_length"):
        raw = store.get_range(str(row["shard_key"]), int(row["imu_offset"]), int(row["imu_length"]))
        imu = np.load(io.BytesIO(raw), allow_pickle=False)
    return Clip(mp4=mp4, imu=imu, row=row)
