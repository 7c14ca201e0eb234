"""Read order for an epoch (pure): shard-aware deterministic shuffle, resume, partitioning.

An epoch's order is a function of (manifest, seed, epoch) only:

1. the shards are put in a random order;
2. the clips are laid out shard by shard in that order (manifest order within a shard);
3. each clip is moved by a random amount within a window of `buffer` positions (sort by
   `position + buffer * u`, `u` uniform in [0, 1)), the windowed equivalent of WebDataset's
   shuffle buffer: clips of a few neighbouring shards mix, and a reader never has more than about
   `buffer` clips' worth of shards in flight.

The randomness is SplitMix64 over integer counters in NumPy, not a library generator, so the
order is the same on every machine, NumPy and Python version.

The order is then cut for the readers: the `parts = world_size * num_workers` readers take
positions `start + part, start + part + parts, ...` — disjoint, together exactly the positions
from `start` on. Resuming at a global position gives exactly the clips not yet read, provided
every reader had read the same number (`resume_position`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK64 = (1 << 64) - 1


def _splitmix64(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform_keys(seed: int, epoch: int, stream: int, n: int) -> NDArray[np.float64]:
    """`n` deterministic uniforms in [0, 1) for (seed, epoch, stream)."""
    if seed < 0 or epoch < 0:
        raise ValueError("seed and epoch must be >= 0")
    head = np.array([seed & _MASK64, epoch & _MASK64, stream & _MASK64], dtype=np.uint64)
    base = np.uint64(0)
    for value in head:
        base = _splitmix64(np.array([base ^ value], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        counters = base + np.arange(n, dtype=np.uint64) * _GOLDEN
    bits = _splitmix64(counters) >> np.uint64(11)  # 53 random bits
    return bits.astype(np.float64) / float(1 << 53)


def shard_ids(shard_keys: NDArray[np.int64] | list[int]) -> NDArray[np.int64]:
    """Dense shard ids (0..S-1, in order of first appearance) from any per-clip shard labels."""
    labels = np.asarray(shard_keys, dtype=np.int64)
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first), dtype=np.int64)
    return rank[inverse.reshape(-1)]


def epoch_order(
    shard_of_clip: NDArray[np.int64], seed: int, epoch: int, buffer: int
) -> NDArray[np.int64]:
    """The clips (row indexes into the manifest) in read order for one epoch.

    `shard_of_clip[i]` is a dense shard id (0..S-1, see `shard_ids`) of row i. `buffer` <= 1 keeps
    each shard's clips together in manifest order. Same arguments, same order.
    """
    shards = np.asarray(shard_of_clip, dtype=np.int64)
    n = len(shards)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if buffer < 0:
        raise ValueError("buffer must be >= 0")
    n_shards = int(shards.max()) + 1
    shard_rank = np.empty(n_shards, dtype=np.int64)
    shard_rank[np.argsort(uniform_keys(seed, epoch, 0, n_shards), kind="stable")] = np.arange(
        n_shards, dtype=np.int64
    )
    rows = np.arange(n, dtype=np.int64)
    laid_out = np.lexsort((rows, shard_rank[shards]))
    if buffer <= 1:
        return laid_out.astype(np.int64)
    jitter = np.arange(n, dtype=np.float64) + buffer * uniform_keys(seed, epoch, 1, n)
    return laid_out[np.argsort(jitter, kind="stable")].astype(np.int64)


def reader_part(rank: int, world_size: int, worker: int, num_workers: int) -> tuple[int, int]:
    """(part, parts) of one dataloader worker of one rank: rank-major, worker-minor."""
    if not (0 <= rank < world_size and 0 <= worker < num_workers):
        raise ValueError(f"bad reader rank={rank}/{world_size} worker={worker}/{num_workers}")
    return rank * num_workers + worker, world_size * num_workers


def partition(order: NDArray[np.int64], start: int, part: int, parts: int) -> NDArray[np.int64]:
    """The clips reader `part` of `parts` reads, from global position `start` of `order` on."""
    if not 0 <= part < parts:
        raise ValueError(f"bad part {part} of {parts}")
    if start < 0:
        raise ValueError("start must be >= 0")
    return order[start + part :: parts]


def resume_position(start: int, read_per_part: int, parts: int) -> int:
    """The global position to resume from after every one of `parts` readers, started at
    `start`, has read `read_per_part` clips."""
    if read_per_part < 0 or parts <= 0:
        raise ValueError("read_per_part must be >= 0 and parts > 0")
    return start + read_per_part * parts
