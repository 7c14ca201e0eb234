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

import bisect
from collections.abc import Iterator

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


def uniform_keys(seed: int, epoch: int, stream: int, n: int, first: int = 0) -> NDArray[np.float64]:
    """`n` deterministic uniforms in [0, 1) for (seed, epoch, stream): numbers `first` to
    `first + n - 1` of that stream (any slice of the stream is computed on its own)."""
    if seed < 0 or epoch < 0 or first < 0:
        raise ValueError("seed, epoch and first must be >= 0")
    head = np.array([seed & _MASK64, epoch & _MASK64, stream & _MASK64], dtype=np.uint64)
    base = np.uint64(0)
    for value in head:
        base = _splitmix64(np.array([base ^ value], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        counters = base + np.arange(first, first + n, dtype=np.uint64) * _GOLDEN
    bits = _splitmix64(counters) >> np.uint64(11)  # 53 random bits
    return bits.astype(np.float64) / float(1 << 53)


def _runs(labels: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Start index and length of each run of equal consecutive labels. A manifest lists a
    shard's clips together, so there are about as many runs as shards, far fewer than rows:
    the functions below sort runs, not rows (10M rows: ~0.1 s instead of several seconds)."""
    n = len(labels)
    change = np.empty(n, dtype=bool)
    change[:1] = True
    np.not_equal(labels[1:], labels[:-1], out=change[1:])
    starts = np.flatnonzero(change).astype(np.int64)
    return starts, np.diff(np.append(starts, n))


def shard_ids(shard_keys: NDArray[np.int64] | list[int]) -> NDArray[np.int64]:
    """Dense shard ids (0..S-1, in order of first appearance) from any per-clip shard labels."""
    labels = np.asarray(shard_keys, dtype=np.int64)
    n = len(labels)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts, _ = _runs(labels)
    # A label's first appearance is the start of its first run.
    distinct, first_run = np.unique(labels[starts], return_index=True)
    rank = np.empty(len(distinct), dtype=np.int64)
    rank[np.argsort(first_run, kind="stable")] = np.arange(len(distinct), dtype=np.int64)
    low, high = int(distinct[0]), int(distinct[-1])
    if high - low <= 4 * n:  # labels are codes (dictionary indices): one lookup table
        table = np.zeros(high - low + 1, dtype=np.int64)
        table[distinct - low] = rank
        return table[labels - low]
    return rank[np.searchsorted(distinct, labels)]


def _shard_ranks(n_shards: int, seed: int, epoch: int) -> NDArray[np.int64]:
    rank = np.empty(n_shards, dtype=np.int64)
    rank[np.argsort(uniform_keys(seed, epoch, 0, n_shards), kind="stable")] = np.arange(
        n_shards, dtype=np.int64
    )
    return rank


class _LaidOut:
    """Rows by (shard rank, row), any slice on its own: the runs of equal shards sorted stably by
    rank, each run's rows in order (the permutation a lexsort of every row gives, in
    O(runs log runs) and without materialising it)."""

    def __init__(self, shards: NDArray[np.int64], seed: int, epoch: int) -> None:
        starts, lengths = _runs(shards)
        rank = _shard_ranks(int(shards.max()) + 1, seed, epoch)
        by_rank = np.argsort(rank[shards[starts]], kind="stable")
        lengths = lengths[by_rank]
        self.out_start = np.cumsum(lengths) - lengths  # where each sorted run lands
        self.shift = starts[by_rank] - self.out_start  # row = position + shift of its run
        self.n = len(shards)

    def slice(self, lo: int, hi: int) -> NDArray[np.int64]:
        positions = np.arange(lo, hi, dtype=np.int64)
        run = np.searchsorted(self.out_start, positions, side="right") - 1
        return positions + self.shift[run]


def epoch_order_blocks(
    shard_of_clip: NDArray[np.int64], seed: int, epoch: int, buffer: int, block: int = 1 << 16
) -> Iterator[NDArray[np.int64]]:
    """`epoch_order` in consecutive pieces, each computed only when asked for: concatenated,
    exactly `epoch_order(...)`. The first clips of an epoch are known after one piece (~64k
    positions), not after the whole order (10M rows: ~3 s and ~0.5 GiB of fresh memory here).

    Piece j holds the clips whose jittered position `p + buffer * u` lies in
    [j * block, (j + 1) * block): since it is within [p, p + buffer], those clips come from laid-out
    positions [j * block - buffer - 1, (j + 1) * block); each piece is sorted on its own with the
    same stable tie rule (position order), so the pieces follow each other as in one sort.
    """
    shards = np.asarray(shard_of_clip, dtype=np.int64)
    n = len(shards)
    if buffer < 0:
        raise ValueError("buffer must be >= 0")
    if block < 1:
        raise ValueError("block must be >= 1")
    if n == 0:
        return
    laid_out = _LaidOut(shards, seed, epoch)
    if buffer <= 1:
        for lo in range(0, n, block):
            yield laid_out.slice(lo, min(n, lo + block))
        return
    for low in range(0, n + buffer + 1, block):
        lo, hi = max(0, low - buffer - 1), min(n, low + block)
        if lo >= hi:
            break
        keys = np.arange(lo, hi, dtype=np.float64) + buffer * uniform_keys(
            seed, epoch, 1, hi - lo, first=lo
        )
        chosen = np.flatnonzero((keys >= low) & (keys < low + block))
        if len(chosen):
            yield laid_out.slice(lo, hi)[chosen[np.argsort(keys[chosen], kind="stable")]]


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
    laid_out = _LaidOut(shards, seed, epoch).slice(0, n)
    if buffer <= 1:
        return laid_out
    jitter = np.arange(n, dtype=np.float64) + buffer * uniform_keys(seed, epoch, 1, n)
    return laid_out[np.argsort(jitter, kind="stable")].astype(np.int64)


class LazyOrder:
    """`partition(epoch_order(...), start, part, parts)` as a sequence computed a piece at a
    time on first use (`epoch_order_blocks`), so a reader starts after one piece; an index far
    ahead computes every piece up to it. Not thread-safe: the caller serialises access."""

    def __init__(
        self,
        shard_of_clip: NDArray[np.int64],
        seed: int,
        epoch: int,
        buffer: int,
        start: int = 0,
        part: int = 0,
        parts: int = 1,
    ) -> None:
        if not 0 <= part < parts:
            raise ValueError(f"bad part {part} of {parts}")
        if start < 0:
            raise ValueError("start must be >= 0")
        self._blocks = epoch_order_blocks(shard_of_clip, seed, epoch, buffer)
        self._pieces: list[NDArray[np.int64]] = []
        self._piece_starts: list[int] = []  # global position of each piece's first clip
        self._computed = 0  # global positions computed so far
        self._first = start + part
        self._parts = parts
        self._length = len(range(self._first, len(shard_of_clip), parts))

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, k: int) -> int:
        if not 0 <= k < self._length:
            raise IndexError(k)
        position = self._first + k * self._parts
        while position >= self._computed:
            piece = next(self._blocks)
            self._pieces.append(piece)
            self._piece_starts.append(self._computed)
            self._computed += len(piece)
        at = bisect.bisect_right(self._piece_starts, position) - 1
        return int(self._pieces[at][position - self._piece_starts[at]])


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
