"""The PyTorch adapter: a DataLoader with workers reads every clip of an epoch exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.settings import Settings
from tests.fixtures.reader import Corpus

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.connected


def test_a_dataloader_with_two_workers_per_rank_reads_each_clip_once(
    stack: Settings, corpus: Corpus, tmp_path: Path
) -> None:
    from torch.utils.data import DataLoader

    from services.reader.torch_dataset import ClipDataset

    settings = stack.model_copy(update={"reader_cache_dir": tmp_path / "cache"})
    keys: list[str] = []
    for rank in range(2):
        dataset = ClipDataset(
            corpus.manifest, seed=4, decode=True, rank=rank, world_size=2, settings=settings
        )
        dataset.set_epoch(1)
        loader = DataLoader(dataset, batch_size=None, num_workers=2)
        for sample in loader:
            frames = int(sample["meta"]["frame_count"])
            assert tuple(sample["frames"].shape) == (frames, 240, 320, 3)
            assert sample["frames"].dtype == torch.uint8
            assert tuple(sample["imu"].shape) == (frames, 6)
            keys.append(sample["key"])
    assert sorted(keys) == sorted(corpus.digests)
