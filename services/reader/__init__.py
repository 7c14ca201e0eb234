"""The training read path: manifest rows to clips through a node-local cache (docs/reader.md).

Public API: `open_reader`, `ClipLoader`, `Clip`; the pure order functions `epoch_order`,
`partition`, `reader_part`, `resume_position`; `ClipDataset` (PyTorch, optional extra) lives in
`services.reader.torch_dataset`.
"""

from services.reader.clips import Clip, read_clip
from services.reader.loader import ClipLoader, open_reader
from services.reader.order import epoch_order, partition, reader_part, resume_position

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
