"""Local file helpers shared by the agent and the stages: hashing and sidecar headers."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

CHUNK = 4 * 1024 * 1024


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def npy_shape(path: Path) -> tuple[int, ...]:
    """Shape of a `.npy` array from its header alone (no pickle, no full read).

    Raises ValueError when the file is not a plain float `.npy` array.
    """
    with path.open("rb") as handle:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
    if dtype.hasobject or dtype.kind != "f":
        raise ValueError(f"IMU must be a float array, got dtype {dtype}")
    return tuple(int(n) for n in shape)
