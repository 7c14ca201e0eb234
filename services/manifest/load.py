"""Load a manifest zero-copy through a memory map, and read its rows.

A manifest row does not store its clip key (the WebDataset key of the clip's members): it is
`<episode_id>_<clip_index, 5 digits>`, derived here, which keeps the file free of one unique
string per clip.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc


def load_manifest(path: Path | str) -> pa.Table:
    """The manifest as an Arrow table whose buffers point into the memory-mapped file."""
    source = pa.memory_map(str(path), "r")
    return ipc.open_file(source).read_all()


def manifest_metadata(table: pa.Table) -> dict[str, Any]:
    """The format version, the filter, the SQL and the layer versions the manifest was built
    with."""
    raw = table.schema.metadata or {}
    out: dict[str, Any] = {}
    if b"egoline.manifest.version" in raw:
        out["version"] = int(raw[b"egoline.manifest.version"])
    if b"egoline.manifest.filter" in raw:
        out["filter"] = json.loads(raw[b"egoline.manifest.filter"])
    if b"egoline.manifest.query" in raw:
        out["query"] = raw[b"egoline.manifest.query"].decode()
    out["layers"] = layer_versions(raw)  # format version 5; {} before
    return out


# Where a manifest names the layer versions it pins, a JSON object {kind: resolved version}:
# `egoline.manifest.layers` (format version 5, written by the layers build), or
# `egoline.layers` (the key first agreed between the two halves of issue 19); read in that order.
LAYERS_KEYS = (b"egoline.manifest.layers", b"egoline.layers")


def layer_versions(metadata: dict[bytes, bytes] | None) -> dict[str, str]:
    """The layer versions a manifest pins (`LAYERS_KEYS`); {} when absent. Raises ValueError
    when the value is not a JSON object."""
    found = [(metadata or {}).get(key) for key in LAYERS_KEYS]
    raw = next((value for value in found if value is not None), None)
    if raw is None:
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"the layer versions are not a JSON object: {raw[:80]!r}")
    return {str(kind): str(version) for kind, version in sorted(value.items())}


def clip_key(episode_id: str, clip_index: int) -> str:
    """The WebDataset key of a clip: the prefix of its members' names in the shard."""
    return f"{episode_id}_{clip_index:05d}"


def with_clip_key(row: dict[str, Any]) -> dict[str, Any]:
    if "clip_key" not in row:
        row["clip_key"] = clip_key(str(row["episode_id"]), int(row["clip_index"]))
    return row


def clip_labels(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The labelled spans of a manifest row's episode (its `labels` column, format 5) that
    overlap the clip's span [clip_start_s, clip_start_s + clip_duration_s), both on the
    episode clock, in time order; a zero-length span counts at its instant. Empty when the
    manifest pinned no labels or the episode has none."""
    spans = json.loads(row["labels"]) if row.get("labels") else []
    start = float(row["clip_start_s"])
    end = start + float(row["clip_duration_s"])
    return [
        s for s in spans if s["start_s"] < end and (s["end_s"] > start or s["start_s"] >= start)
    ]


def manifest_rows(
    table: pa.Table, start: int = 0, count: int | None = None
) -> list[dict[str, Any]]:
    """Rows `start`..`start + count` as dicts, each with its `clip_key`."""
    part = table.slice(start, count) if count is not None else table.slice(start)
    return [with_clip_key(row) for row in part.to_pylist()]


def manifest_row(table: pa.Table, index: int) -> dict[str, Any]:
    return manifest_rows(table, index, 1)[0]
