"""The training read path: manifest rows to clips through a node-local cache (docs/reader.md).

Public API: `open_reader`, `ClipLoader`, `Clip`; the pure order functions `epoch_order`,
`partition`, `reader_part`, `resume_position`; `ClipDataset` (PyTorch, optional extra) lives in
`services.reader.torch_dataset`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.reader.clips import Clip, read_clip
    from services.reader.loader import ClipLoader, open_reader
    from services.reader.order import epoch_order, partition, reader_part, resume_position

# Resolved on first use: importing the package (as `egoline --help` does for
# services.reader.cli) would otherwise load numpy, pyarrow and the object store client, ~0.5 s.
_HOMES = {
    "Clip": "services.reader.clips",
    "read_clip": "services.reader.clips",
    "ClipLoader": "services.reader.loader",
    "open_reader": "services.reader.loader",
    "epoch_order": "services.reader.order",
    "partition": "services.reader.order",
    "reader_part": "services.reader.order",
    "resume_position": "services.reader.order",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home), name)


__all__ = [
    "Clip",
    "ClipLoader",
    "epoch_order",
    "open_reader",
    "partition",
    "read_clip",
    "reader_part",
    "resume_position",
]
