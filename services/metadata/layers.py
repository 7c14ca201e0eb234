"""Layers, the pure part: layer records -> checked rows -> the canonical rows of a version, its
digest, the statement the metadata service runs for an `episodes.annotated` event, and the
resolution of `latest` (no database, no files: services/metadata/layer_ingest.py reads files).

A layer version is immutable. Its identity is its *content*: the rows in canonical order (sorted
on their natural key, whatever order a file or an event listed them in), hashed as JSON lines.
Writing a version that exists is a no-op when the digest is the same and refused otherwise, so
the file path and the topic path store exactly the same rows, and a manifest pinned to a
version reads the same rows for ever.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError
from sqlalchemy import Executable, bindparam, text

from schemas.events import TOPIC_ANNOTATED, EpisodesAnnotated, derive_event_id
from schemas.layers import (
    LATEST,
    CalibrationLayer,
    CalibrationRow,
    LabelRow,
    LabelsLayer,
    LayerKind,
    Row,
)

MAX_PROBLEMS = 20  # a refused file lists at most this many problems (the first ones)

# Each kind's table and its columns as the file path COPYs them and the topic path inserts them.
LAYER_TABLES: dict[LayerKind, str] = {
    LayerKind.CALIBRATION: "layer_calibration",
    LayerKind.LABELS: "layer_labels",
}
# (column, Postgres type) after `version`, in COPY order.
LAYER_COLUMNS: dict[LayerKind, tuple[tuple[str, str], ...]] = {
    LayerKind.CALIBRATION: (
        ("row_no", "int"),
        ("episode_id", "text"),
        ("device_id", "text"),
        ("valid_from", "timestamptz"),
        ("valid_until", "timestamptz"),
        ("camera", "text"),
        ("params", "jsonb"),
    ),
    LayerKind.LABELS: (
        ("row_no", "int"),
        ("episode_id", "text"),
        ("label_type", "text"),
        ("start_s", "float8"),
        ("end_s", "float8"),
        ("text", "text"),
    ),
}
ROW_MODELS: dict[LayerKind, type[Row]] = {
    LayerKind.CALIBRATION: CalibrationRow,
    LayerKind.LABELS: LabelRow,
}


# A layer *file* refuses unknown fields (a misspelt key is an error at its line, not a value
# silently dropped); events ignore them like every event (schemas/events.py).
class CalibrationFileRow(CalibrationRow):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LabelFileRow(LabelRow):
    model_config = ConfigDict(frozen=True, extra="forbid")


_ADAPTERS: dict[LayerKind, TypeAdapter[list[Any]]] = {
    LayerKind.CALIBRATION: TypeAdapter(list[CalibrationFileRow]),
    LayerKind.LABELS: TypeAdapter(list[LabelFileRow]),
}


class LayerRecordError(ValueError):
    """A layer file (or event) that is not a valid layer: each problem with its line (JSON
    Lines: the line number; Parquet: the row number, both from 1)."""

    def __init__(self, name: str, problems: list[tuple[int, str]]) -> None:
        self.name = name
        self.problems = sorted(problems)[:MAX_PROBLEMS]
        self.total = len(problems)
        lines = [f"{name}:{line}: {message}" for line, message in self.problems]
        more = self.total - len(self.problems)
        if more > 0:
            lines.append(f"... and {more} more")
        super().__init__("\n".join(lines))

    @property
    def first_line(self) -> int:
        return self.problems[0][0]


class LayerConflictError(ValueError):
    """The version exists with other content: versions are immutable."""


class LayerVersionError(ValueError):
    """A manifest asked for a layer kind or version that is not there."""


Record = tuple[int, Any]  # (line number from 1, the decoded record)


def parse_json_lines(data: bytes, name: str) -> list[Record]:
    """JSON Lines -> (line number, object) per non-blank line; a line that is not a JSON
    object is a problem at its line."""
    records: list[Record] = []
    problems: list[tuple[int, str]] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            problems.append((number, f"not JSON: {exc}"))
            continue
        if not isinstance(value, dict):
            problems.append((number, f"a row must be a JSON object, not {type(value).__name__}"))
            continue
        records.append((number, value))
    if problems:
        raise LayerRecordError(name, problems)
    return records


def check_rows(kind: LayerKind, records: Sequence[Record], name: str) -> list[tuple[int, Row]]:
    """Schema-check every record against its kind's model, and the version as a whole (no
    two rows for one target, no overlapping device windows); every problem with its line.
    Raises LayerRecordError."""
    problems: list[tuple[int, str]] = []
    if not records:
        problems.append((1, f"no rows: a {kind.value} layer needs at least one"))
    rows: list[Any] = []
    try:
        rows = _ADAPTERS[kind].validate_python([record for _, record in records])
    except ValidationError as exc:
        for error in exc.errors(include_url=False, include_input=False):
            index, *where = error["loc"]
            field = ".".join(str(part) for part in where)
            line = records[int(index)][0]
            problems.append((line, f"{field}: {error['msg']}" if field else error["msg"]))
    if problems:
        raise LayerRecordError(name, problems)
    checked = [(line, row) for (line, _), row in zip(records, rows, strict=True)]
    problems += _whole_version_problems(kind, checked)
    if problems:
        raise LayerRecordError(name, problems)
    return checked


def check_json_lines(kind: LayerKind, data: bytes, name: str) -> list[tuple[int, Row]]:
    """A JSON Lines layer file's rows, checked as `check_rows` checks them. The rows are first
    parsed and validated in one pass of pydantic's JSON parser (the file's lines as one array:
    ~10x faster than a `json.loads` and a validation per line); if anything is wrong, the file
    is read again line by line, which names every problem by its line."""
    numbered = [(n, line) for n, line in enumerate(data.splitlines(), start=1) if line.strip()]
    try:
        rows = _ADAPTERS[kind].validate_json(b"[" + b",".join(line for _, line in numbered) + b"]")
    except ValidationError:
        rows = None
    if rows is None or not rows or len(rows) != len(numbered):  # a line of two values...
        return check_rows(kind, parse_json_lines(data, name), name)
    checked = [(line, row) for (line, _), row in zip(numbered, rows, strict=True)]
    problems = _whole_version_problems(kind, checked)
    if problems:
        raise LayerRecordError(name, problems)
    return checked


def _whole_version_problems(
    kind: LayerKind, rows: Sequence[tuple[int, Row]]
) -> list[tuple[int, str]]:
    problems: list[tuple[int, str]] = []
    seen: dict[object, int] = {}
    for line, row in rows:
        key = row.target() if isinstance(row, CalibrationRow) else row
        if key in seen:
            problems.append((line, f"the same {_target_name(row)} as line {seen[key]}"))
        else:
            seen[key] = line
    if kind is LayerKind.CALIBRATION:
        windows: dict[tuple[str, str], list[tuple[datetime, datetime, int]]] = {}
        for line, row in rows:
            assert isinstance(row, CalibrationRow)
            if row.device_id is not None:
                start = row.valid_from or datetime.min.replace(tzinfo=UTC)
                end = row.valid_until or datetime.max.replace(tzinfo=UTC)
                windows.setdefault((row.device_id, row.camera), []).append((start, end, line))
        for (device, camera), spans in windows.items():
            spans.sort()
            for (_, end, line), (start, _, later) in itertools.pairwise(spans):
                if start < end:
                    problems.append(
                        (later, f"{device}/{camera}: validity window overlaps line {line}")
                    )
    return problems


def check_version(kind: LayerKind, rows: Sequence[Row], name: str) -> None:
    """The whole-version checks of rows already schema-checked (an event's): problems named
    by the row's position from 1. Raises LayerRecordError."""
    problems = _whole_version_problems(kind, list(enumerate(rows, start=1)))
    if problems:
        raise LayerRecordError(name, problems)


def _target_name(row: Row) -> str:
    if isinstance(row, CalibrationRow):
        return "episode, camera" if row.episode_id else "device, camera and valid_from"
    return "label"


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat()


def _sort_key(row: Row) -> tuple[Any, ...]:
    if isinstance(row, CalibrationRow):
        return (row.episode_id or "", row.device_id or "", row.camera, _iso(row.valid_from) or "")
    assert isinstance(row, LabelRow)
    return (row.episode_id, row.start_s, row.end_s, row.label_type.value, row.text)


@dataclass(frozen=True)
class LayerContent:
    """A layer version as stored: its canonical rows (tuples in LAYER_COLUMNS order, params
    as JSON text) and the sha256 of them."""

    kind: LayerKind
    rows: list[tuple[Any, ...]]
    digest: str

    @property
    def episode_ids(self) -> frozenset[str]:
        return frozenset(str(r[1]) for r in self.rows if r[1] is not None)

    def as_dicts(self) -> list[dict[str, Any]]:
        names = [name for name, _ in LAYER_COLUMNS[self.kind]]
        out = [dict(zip(names, row, strict=True)) for row in self.rows]
        if self.kind is LayerKind.CALIBRATION:
            for row in out:
                row["params"] = json.loads(row["params"])
        return out


def _params_json(row: CalibrationRow) -> str:
    """The camera's calibration as the manifest carries it (px, metres), as JSON: formatted
    here rather than by a serializer because a 10^5-row layer formats 10^5 of them (every
    number is finite, and a float's repr is valid JSON). Postgres stores it as jsonb."""
    distortion = ",".join(map(repr, row.distortion))
    extrinsics = ",".join(map(repr, row.extrinsics))
    return (
        f'{{"width":{row.width},"height":{row.height},"fx":{row.fx!r},"fy":{row.fy!r},'
        f'"cx":{row.cx!r},"cy":{row.cy!r},"distortion_model":"{row.distortion_model.value}",'
        f'"distortion":[{distortion}],"extrinsics":[{extrinsics}]}}'
    )


def layer_content(kind: LayerKind, rows: Iterable[Row]) -> LayerContent:
    """The canonical rows of a version: sorted on their natural key, numbered, and hashed.
    The same rows in any order give the same content and digest."""
    ordered = sorted(rows, key=_sort_key)
    out: list[tuple[Any, ...]] = []
    for row_no, row in enumerate(ordered):
        if isinstance(row, CalibrationRow):
            params = _params_json(row)
            out.append(
                (
                    row_no,
                    row.episode_id,
                    row.device_id,
                    _iso(row.valid_from),
                    _iso(row.valid_until),
                    row.camera,
                    params,
                )
            )
        else:
            assert isinstance(row, LabelRow)
            out.append(
                (row_no, row.episode_id, row.label_type.value, row.start_s, row.end_s, row.text)
            )
    # The digest: each row's values (str() of a float is its shortest round-trip form) joined
    # by a unit separator, a line per row.
    digest = hashlib.sha256(kind.value.encode() + b"\n")
    digest.update("".join("\x1f".join(map(str, values)) + "\n" for values in out).encode())
    return LayerContent(kind, out, digest.hexdigest())


# The topic path: one statement per `episodes.annotated` event. The version row is inserted
# unless the same version with the same digest is there (a no-op then, rows included); with
# another digest the insert hits the primary key: an IntegrityError, dead-lettered as
# `layer_conflict` (services/metadata/app.py).
_ANNOTATED_SQL = """
WITH v AS (
    INSERT INTO layer_versions (kind, version, digest, row_count, author, source)
    SELECT :kind, :version, :digest, :row_count, :author, :source
    WHERE NOT EXISTS (
        SELECT 1 FROM layer_versions
        WHERE kind = :kind AND version = :version AND digest = :digest
    )
    RETURNING version
)
INSERT INTO {table} (version, {columns})
SELECT v.version, {selected}
FROM v CROSS JOIN jsonb_to_recordset(CAST(:rows AS jsonb)) AS r({typed})
"""
LAYER_VERSIONS_KEY = "layer_versions_pkey"


def annotated_statement(
    kind: LayerKind, version: str, author: str, source: str, content: LayerContent
) -> Executable:
    columns = LAYER_COLUMNS[kind]
    sql = _ANNOTATED_SQL.format(
        table=LAYER_TABLES[kind],
        columns=", ".join(name for name, _ in columns),
        selected=", ".join(f"r.{name}" for name, _ in columns),
        typed=", ".join(f"{name} {kind_}" for name, kind_ in columns),
    )
    return text(sql).bindparams(
        bindparam("kind", value=kind.value),
        bindparam("version", value=version),
        bindparam("digest", value=content.digest),
        bindparam("row_count", value=len(content.rows)),
        bindparam("author", value=author),
        bindparam("source", value=source),
        bindparam("rows", value=json.dumps(content.as_dicts())),
    )


def annotated_event(
    kind: LayerKind, version: str, author: str, source: str, rows: Sequence[Row]
) -> EpisodesAnnotated:
    """The `episodes.annotated` event of a whole version: rows in canonical order, an event id
    derived from the content (publishing it again is a redelivery, not a new event)."""
    ordered = sorted(rows, key=_sort_key)
    digest = layer_content(kind, ordered).digest
    layer: CalibrationLayer | LabelsLayer
    if kind is LayerKind.CALIBRATION:
        layer = CalibrationLayer(rows=[r for r in ordered if isinstance(r, CalibrationRow)])
    else:
        layer = LabelsLayer(rows=[r for r in ordered if isinstance(r, LabelRow)])
    return EpisodesAnnotated(
        event_id=derive_event_id(TOPIC_ANNOTATED, kind.value, version, digest),
        produced_at=datetime.now(UTC),
        version=version,
        author=author,
        source=source,
        layer=layer,
    )


def resolve_versions(
    requested: Mapping[str, str], known: Mapping[str, Sequence[str]]
) -> dict[str, str]:
    """Each requested layer (kind -> version or `latest`) as a concrete version. `known` lists
    each kind's stored versions in ingest order (the last is `latest`). Raises LayerVersionError for
    an unknown kind, an unknown version, or `latest` of a kind with no version."""
    resolved: dict[str, str] = {}
    for kind, version in sorted(requested.items()):
        if kind not in {k.value for k in LayerKind}:
            raise LayerVersionError(
                f"no layer kind {kind!r} (kinds: {', '.join(k.value for k in LayerKind)})"
            )
        versions = known.get(kind, ())
        if version == LATEST:
            if not versions:
                raise LayerVersionError(f"--layer {kind}=latest: no {kind} version ingested yet")
            resolved[kind] = versions[-1]
        elif version in versions:
            resolved[kind] = version
        else:
            raise LayerVersionError(f"--layer {kind}={version}: no such version")
    return resolved


def parse_layer_option(values: Iterable[str]) -> dict[str, str]:
    """`calibration=v3` options -> {kind: version}; `kind` alone means `kind=latest`."""
    out: dict[str, str] = {}
    for value in values:
        kind, _, version = value.partition("=")
        kind, version = kind.strip(), version.strip() or LATEST
        if kind in out:
            raise ValueError(f"--layer {kind} given twice")
        out[kind] = version
    return out
