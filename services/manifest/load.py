"""Load a manifest zero-copy through a memory map."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc


def load_manifest(path: Path) -> pa.Table:
    """The manifest as an Arrow table whose buffers point into the memory-mapped file."""
    source = pa.memory_map(str(path), "r")
    return ipc.open_file(source).read_all()
