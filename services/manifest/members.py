"""Which episodes, and which of their clips, a manifest holds (pure: Arrow and numpy in memory).

A manifest's membership is one row per episode: its id, the split the manifest gave it, its
pipeline version and its clips as a bitmap (bit `i % 8` of byte `i // 8`, least significant
bit first, is set when clip index `i` is in the manifest; an episode of ten clips is two
bytes). The same rows come from a build's query result (`members_of_episodes`, before the
explode) or from a manifest file (`members_of_manifest`, for manifests built before the index,
and for `egoline manifest diff`), sorted by episode id. The warehouse stores them in
`manifest_members` (docs/warehouse.md "Reverse lineage").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

MEMBER_COLUMNS = ("episode_id", "split", "pipeline_version", "clips")

# popcount of every byte value
_BITS_SET = np.array([bin(v).count("1") for v in range(256)], dtype=np.int64)


def clip_bitmaps(
    parent: NDArray[np.integer[Any]], clip_index: NDArray[np.integer[Any]], episodes: int
) -> pa.BinaryArray:
    """Per episode 0..episodes-1 the bitmap of its clips' indexes.

    `parent[k]` is clip k's episode (non-decreasing: an episode's clips are together),
    `clip_index[k]` its index (>= 0, unique within its episode: a repeated index would be
    counted twice). An episode without clips gets an empty bitmap. Raises ValueError on a
    negative index or an unordered `parent`.
    """
    parent = np.asarray(parent)
    clip_index = np.asarray(clip_index)
    if len(parent) != len(clip_index):
        raise ValueError(f"{len(parent)} parents for {len(clip_index)} clip indexes")
    if len(parent) and (np.any(np.diff(parent) < 0) or parent[0] < 0 or parent[-1] >= episodes):
        raise ValueError("clips must be grouped by episode, in episode order")
    if len(clip_index) and int(clip_index.min()) < 0:
        raise ValueError("a clip index is negative")
    counts = np.bincount(parent, minlength=episodes)
    starts = np.zeros(episodes, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    highest = np.full(episodes, -1, dtype=np.int64)
    some = counts > 0
    if len(parent):
        highest[some] = np.maximum.reduceat(clip_index, starts[some])
    sizes = np.where(some, highest // 8 + 1, 0)
    offsets = np.zeros(episodes + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    # Most episodes hold clips 0..count-1 (unique indexes whose highest is count - 1): their
    # bitmap is whole bytes of ones and a last partial byte, written per episode. Only the clips
    # of the others are set bit by bit (one weighted count per byte: distinct bits add up to
    # their OR).
    total = int(offsets[-1])
    dense = some & (highest == counts - 1)
    data = np.repeat(np.where(dense, 0xFF, 0).astype(np.uint8), sizes)
    last = offsets[1:][dense] - 1
    tail = counts[dense] % 8
    data[last] = np.where(tail == 0, 0xFF, (1 << tail) - 1).astype(np.uint8)
    sparse = ~dense[parent] if len(parent) else np.zeros(0, dtype=bool)
    if sparse.any():
        index = clip_index[sparse].astype(np.int64)
        position = offsets[parent[sparse]] + (index >> 3)
        weights = np.left_shift(1, index & 7).astype(np.float64)
        data |= np.bincount(position, weights=weights, minlength=total).astype(np.uint8)
    large = offsets[-1] >= 2**31
    arrow_type = pa.large_binary() if large else pa.binary()
    offset_buffer = pa.py_buffer(offsets if large else offsets.astype(np.int32))
    array = pa.Array.from_buffers(arrow_type, episodes, [None, offset_buffer, pa.py_buffer(data)])
    return array.cast(pa.binary()) if large else array


def bitmap_indexes(bitmap: bytes) -> list[int]:
    """The clip indexes set in a bitmap, ascending."""
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return [int(i) for i in np.flatnonzero(bits)]


def popcounts(bitmaps: pa.Array | pa.ChunkedArray) -> NDArray[np.int64]:
    """Clips per bitmap (vectorised over the whole data buffer)."""
    array = bitmaps.combine_chunks() if isinstance(bitmaps, pa.ChunkedArray) else bitmaps
    if len(array) == 0:
        return np.zeros(0, dtype=np.int64)
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    _, offset_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=offset_type)[
        array.offset : array.offset + len(array) + 1
    ].astype(np.int64)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0)
    per_byte = np.zeros(int(offsets[-1]) + 1, dtype=np.int64)
    np.cumsum(_BITS_SET[data[: offsets[-1]].astype(np.int64)], out=per_byte[1:])
    return per_byte[offsets[1:]] - per_byte[offsets[:-1]]


def members_of_episodes(
    episodes: pa.Table,
    parent: NDArray[np.integer[Any]],
    clip_index: NDArray[np.integer[Any]],
) -> pa.Table:
    """Membership from a build's query result (one row per episode, already in episode-id
    order) and its exploded clips (`Exploder.parent`, `Exploder.clip_indexes()`)."""
    return pa.table(
        {
            "episode_id": episodes.column("episode_id").cast(pa.string()),
            "split": episodes.column("split").cast(pa.string()),
            "pipeline_version": episodes.column("pipeline_version").cast(pa.string()),
            "clips": clip_bitmaps(parent, clip_index, episodes.num_rows),
        }
    )


def members_of_manifest(table: pa.Table) -> pa.Table:
    """Membership from a manifest's rows (any row order), sorted by episode id. Raises
    ValueError if the manifest gives one episode two splits or two pipeline versions."""
    distinct, codes = _codes(table.column("episode_id"))
    by_id = pc.sort_indices(distinct).to_numpy()
    rank = np.empty(len(distinct), dtype=np.int64)
    rank[by_id] = np.arange(len(distinct))
    parent = rank[codes]
    clip_index = table.column("clip_index").to_numpy().astype(np.int64)
    order = np.lexsort((clip_index, parent))
    if len(order) > 1:  # a clip listed twice counts once
        again = (np.diff(parent[order]) == 0) & (np.diff(clip_index[order]) == 0)
        order = order[np.concatenate(([True], ~again))]
    parent, clip_index = parent[order], clip_index[order]
    starts = np.searchsorted(parent, np.arange(len(distinct)))
    out: dict[str, pa.Array] = {"episode_id": distinct.take(pa.array(by_id))}
    for name in ("split", "pipeline_version"):
        values, value_codes = _codes(table.column(name))
        value_codes = value_codes[order]
        first = value_codes[starts] if len(starts) else value_codes[:0]
        if np.any(value_codes != first[parent]):
            raise ValueError(f"an episode of the manifest has clips of two values of {name}")
        out[name] = values.take(pa.array(first))
    out["clips"] = clip_bitmaps(parent, clip_index, len(distinct))
    return pa.table([out[name] for name in MEMBER_COLUMNS], names=list(MEMBER_COLUMNS))


def _codes(column: pa.ChunkedArray) -> tuple[pa.Array, NDArray[np.int64]]:
    """A string (or dictionary) column's distinct values and each row's code into them."""
    if pa.types.is_dictionary(column.type):
        column = column.unify_dictionaries()
        chunks = [c for c in column.chunks if len(c)]
        if chunks:
            codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in chunks])
            values = chunks[0].dictionary.cast(pa.string())
            used = np.unique(codes)  # dictionaries may hold values no row uses
            remap = np.full(len(values), -1, dtype=np.int64)
            remap[used] = np.arange(len(used))
            return values.take(pa.array(used)), remap[codes]
    encoded = pc.dictionary_encode(column.cast(pa.string()).combine_chunks())
    return encoded.dictionary, encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
