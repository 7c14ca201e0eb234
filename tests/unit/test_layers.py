"""Layers without a database: schema checks with line numbers, canonical content and digests,
the topic path's statement, `latest` resolution, the manifest SQL with layer joins and the
layer columns of the explode."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import TextClause
from typer.testing import CliRunner

from schemas.events import TOPIC_ANNOTATED, EpisodesAnnotated
from schemas.layers import CalibrationRow, LabelRow, LayerKind
from services.manifest.explode import explode
from services.manifest.query import ManifestFilter, build_query
from services.metadata.core import statements_for
from services.metadata.layer_ingest import read_layer_file, read_layer_rows
from services.metadata.layers import (
    LayerRecordError,
    LayerVersionError,
    annotated_event,
    check_rows,
    layer_content,
    parse_json_lines,
    parse_layer_option,
    resolve_versions,
)
from tests.unit.test_manifest_explode import clip, episode, episode_rows

IDENTITY = [1.0, 0, 0, 0, 0, 1.0, 0, 0, 0, 0, 1.0, 0, 0, 0, 0, 1.0]


def calibration(episode_id: str = "ep1", camera: str = "main", **extra: Any) -> dict[str, Any]:
    return {
        "episode_id": episode_id,
        "camera": camera,
        "width": 1280,
        "height": 720,
        "fx": 600.5,
        "fy": 601.25,
        "cx": 640.0,
        "cy": 360.0,
        "distortion_model": "opencv",
        "distortion": [0.1, -0.05, 0.001, 0.0, 0.01],
        "extrinsics": IDENTITY,
        **extra,
    }


def label(episode_id: str, text: str, start: float = 0.0, end: float = 5.0) -> dict[str, Any]:
    return {"episode_id": episode_id, "label_type": "instruction", "start_s": start,
            "end_s": end, "text": text}  # fmt: skip


def jsonl(rows: list[Any]) -> bytes:
    return b"\n".join(json.dumps(r).encode() if not isinstance(r, bytes) else r for r in rows)


def problems_of(kind: LayerKind, data: bytes) -> LayerRecordError:
    with pytest.raises(LayerRecordError) as raised:
        check_rows(kind, parse_json_lines(data, "f.jsonl"), "f.jsonl")
    return raised.value


def test_a_bad_row_is_refused_at_its_line_number_with_its_field() -> None:
    rows = [calibration("ep1"), calibration("ep2"), calibration("ep3", fx=-1.0), calibration("ep4")]
    error = problems_of(LayerKind.CALIBRATION, jsonl(rows))
    assert error.first_line == 3
    assert str(error).startswith("f.jsonl:3: fx: Input should be greater than 0")
    assert error.total == 1


def test_every_problem_is_listed_with_its_line_across_kinds_of_mistakes() -> None:
    data = jsonl(
        [
            calibration("ep1"),
            b"{not json",
            calibration("ep3", fy=1.0, colour="red"),  # an unknown (misspelt) field
            [1, 2],
            calibration("ep5", distortion=[0.1, 0.2, 0.3]),  # opencv takes 4, 5, 8, 12 or 14
        ]
    )
    with pytest.raises(LayerRecordError) as raised:
        parse_json_lines(data, "f.jsonl")  # not JSON and not an object: refused while reading
    assert [line for line, _ in raised.value.problems] == [2, 4]
    records = [(n, json.loads(line)) for n, line in enumerate(data.splitlines(), 1)
               if n in (1, 3, 5)]  # fmt: skip
    with pytest.raises(LayerRecordError) as again:
        check_rows(LayerKind.CALIBRATION, records, "f.jsonl")
    assert [line for line, _ in again.value.problems] == [3, 5]
    assert "colour" in str(again.value) and "opencv distortion takes" in str(again.value)


def test_blank_lines_count_in_the_numbering() -> None:
    data = jsonl([label("ep1", "pick"), b"", b"   ", label("ep1", "x", start=3.0, end=1.0)])
    error = problems_of(LayerKind.LABELS, data)
    assert error.problems == [(4, "Value error, end_s must not be before start_s")]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (calibration(device_id="dev1"), "exactly one of episode_id and device_id"),
        ({**calibration(), "episode_id": None}, "exactly one of episode_id and device_id"),
        (calibration(valid_from="2026-01-01T00:00:00Z"), "are for device rows"),
        (calibration(extrinsics=[2.0, *IDENTITY[1:]]), "not orthonormal"),
        (calibration(extrinsics=[*IDENTITY[:15], 2.0]), "last row of the 4x4"),
        (calibration(extrinsics=IDENTITY[:12]), "at least 16"),
        (calibration(distortion_model="fisheye"), "fisheye distortion takes 4"),
        (calibration(camera="Main Camera"), "camera: String should match"),
        ({**calibration(), "episode_id": None, "device_id": "dev1",
          "valid_from": "2026-01-01T00:00:00"}, "valid_from: Input should have timezone"),
    ],
)  # fmt: skip
def test_calibration_rows_are_checked(row: dict[str, Any], message: str) -> None:
    assert message in str(problems_of(LayerKind.CALIBRATION, jsonl([row])))


def test_a_version_may_not_hold_one_target_twice_nor_overlapping_device_windows() -> None:
    device = {**calibration(), "episode_id": None, "device_id": "dev1"}
    rows = [
        calibration("ep1"),
        {**device, "valid_until": "2026-02-01T00:00:00Z"},
        calibration("ep1"),  # the same episode and camera as line 1
        {**device, "valid_from": "2026-01-15T00:00:00+00:00"},  # overlaps line 2's window
        {**device, "camera": "wrist"},  # another camera: fine
    ]
    error = problems_of(LayerKind.CALIBRATION, jsonl(rows))
    assert [line for line, _ in error.problems] == [3, 4]
    assert "as line 1" in error.problems[0][1] and "overlaps line 2" in error.problems[1][1]


def test_the_same_rows_in_any_order_are_the_same_content_and_digest() -> None:
    rows = [LabelRow.model_validate(label(f"ep{i % 7}", f"task {i}", i, i + 2)) for i in range(40)]
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    first, second = layer_content(LayerKind.LABELS, rows), layer_content(LayerKind.LABELS, shuffled)
    assert first == second
    assert [r[0] for r in first.rows] == list(range(40))  # numbered in canonical order
    changed = [*rows[:-1], rows[-1].model_copy(update={"text": "task 39!"})]
    assert layer_content(LayerKind.LABELS, changed).digest != first.digest


def test_calibration_params_carry_the_units_as_documented() -> None:
    (row,) = layer_content(
        LayerKind.CALIBRATION, [CalibrationRow.model_validate(calibration())]
    ).as_dicts()
    assert row["params"] == {
        "width": 1280, "height": 720, "fx": 600.5, "fy": 601.25, "cx": 640.0, "cy": 360.0,
        "distortion_model": "opencv", "distortion": [0.1, -0.05, 0.001, 0.0, 0.01],
        "extrinsics": IDENTITY,
    }  # fmt: skip
    assert row["valid_from"] is None and row["episode_id"] == "ep1"


def test_jsonl_and_parquet_files_of_the_same_rows_give_the_same_content(tmp_path: Path) -> None:
    rows = [calibration(f"ep{i}", camera) for i in range(5) for camera in ("main", "wrist")]
    (tmp_path / "c.jsonl").write_bytes(jsonl(rows))
    pq.write_table(pa.Table.from_pylist(rows[::-1]), tmp_path / "c.parquet")
    from_jsonl = read_layer_file(LayerKind.CALIBRATION, tmp_path / "c.jsonl")
    assert read_layer_file(LayerKind.CALIBRATION, tmp_path / "c.parquet") == from_jsonl
    bad = [*rows[:3], {**rows[3], "fx": 0.0}]
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "bad.parquet")
    with pytest.raises(LayerRecordError) as raised:
        read_layer_rows(LayerKind.CALIBRATION, tmp_path / "bad.parquet")
    assert raised.value.first_line == 4  # Parquet: the row number from 1


def test_an_annotated_event_becomes_one_statement_that_inserts_the_canonical_rows() -> None:
    rows = [LabelRow.model_validate(label("ep2", "b")), LabelRow.model_validate(label("ep1", "a"))]
    event = annotated_event(LayerKind.LABELS, "v1", "ann", "tool", rows)
    assert [r.episode_id for r in event.layer.rows] == ["ep1", "ep2"]  # canonical order
    again = annotated_event(LayerKind.LABELS, "v1", "ann", "tool", rows[::-1])
    assert again.event_id == event.event_id  # derived from the content
    upserts = statements_for(TOPIC_ANNOTATED, event.model_dump_json().encode(), "session", 0.1)
    (statement,) = upserts.statements
    assert isinstance(statement, TextClause)
    compiled = statement.compile()
    assert "INSERT INTO layer_labels" in str(compiled) and "WHERE NOT EXISTS" in str(compiled)
    params = compiled.params
    assert params["digest"] == layer_content(LayerKind.LABELS, rows).digest
    assert json.loads(params["rows"]) == layer_content(LayerKind.LABELS, rows).as_dicts()


def test_an_event_whose_rows_break_a_version_rule_is_malformed() -> None:
    row = LabelRow.model_validate(label("ep1", "same"))
    event = annotated_event(LayerKind.LABELS, "v1", "ann", "tool", [row])
    doubled = EpisodesAnnotated.model_validate(
        {
            **event.model_dump(mode="json"),
            "layer": {"kind": "labels", "rows": [row.model_dump()] * 2},
        }
    )
    with pytest.raises(LayerRecordError, match="the same label as line 1"):
        statements_for(TOPIC_ANNOTATED, doubled.model_dump_json().encode(), "session", 0.1)


def test_latest_resolves_to_the_last_ingested_version_and_unknown_ones_are_refused() -> None:
    known = {"calibration": ["v1", "v3", "v2"], "labels": ["a"]}
    resolved = resolve_versions({"labels": "latest", "calibration": "latest"}, known)
    assert resolved == {"calibration": "v2", "labels": "a"}  # ingest order, not name order
    assert resolve_versions({"calibration": "v3"}, known) == {"calibration": "v3"}
    with pytest.raises(LayerVersionError, match="no such version"):
        resolve_versions({"calibration": "v9"}, known)
    with pytest.raises(LayerVersionError, match="no labels version"):
        resolve_versions({"labels": "latest"}, {})
    with pytest.raises(LayerVersionError, match="no layer kind"):
        resolve_versions({"curation": "latest"}, known)
    assert parse_layer_option(["calibration=v3", "labels"]) == {
        "calibration": "v3",
        "labels": "latest",
    }
    with pytest.raises(ValueError, match="twice"):
        parse_layer_option(["labels=a", "labels=b"])


def test_the_manifest_query_joins_pinned_layers_with_bound_versions() -> None:
    plain, _ = build_query(ManifestFilter())
    assert "layer_" not in plain  # no layer: the query of format 4
    flt = ManifestFilter(layers={"labels": "l2", "calibration": "c3"}, label_contains=["Pick'"])
    assert list(flt.layers) == ["calibration", "labels"]  # one order, whatever was given
    sql, params = build_query(flt)
    assert "LEFT JOIN LATERAL" in sql and "FROM layer_calibration c" in sql
    assert sql.index("calibration.calibration") < sql.index("labels.labels") < sql.index("FROM")
    assert "c3" not in sql and "Pick" not in sql  # values are bound, never SQL text
    assert params.count("c3") == 1 and params.count("l2") == 2 and "Pick'" in params
    assert sql.count("strpos(lower(l.text), lower($") == 1
    sliced, _ = build_query(flt, ("ep5", None))
    assert sliced.count("JOIN LATERAL") == 2  # every slice joins the same layers


def test_a_query_refuses_unresolved_latest_and_a_label_filter_without_labels() -> None:
    with pytest.raises(ValueError, match="resolved before"):
        build_query(ManifestFilter(layers={"labels": "latest"}))
    with pytest.raises(ValueError, match="needs a labels layer"):
        build_query(ManifestFilter(label_contains=["pick"]))
    with pytest.raises(ValueError, match="no layer kind"):
        ManifestFilter(layers={"curation": "v1"})


def test_layer_columns_reach_every_clip_of_their_episode_and_stay_null_without() -> None:
    table = episode_rows(
        [
            episode("ep1", "dev1", ["sA"], [clip(0, 0), clip(1, 0)]),
            episode("ep2", "dev1", ["sA"], [clip(0, 0)]),
            episode("ep3", "dev2", ["sB"], [clip(0, 0)]),
        ]
    )
    cal = '{"main": {"fx": 600.5}}'
    table = table.append_column("calibration", pa.array([cal, cal, None], pa.string()))
    table = table.append_column("labels", pa.array([None, '[{"text": "pick"}]', None]))
    rows = explode(table)
    assert rows.column_names[-2:] == ["calibration", "labels"]
    assert rows.column("calibration").to_pylist() == [cal, cal, cal, None]
    assert rows.column("labels").to_pylist() == [None, None, '[{"text": "pick"}]', None]
    assert len(rows.column("calibration").chunk(0).dictionary) == 2  # one string per value
    assert "calibration" not in explode(episode_rows([episode("e", "d", ["s"], [clip(0, 0)])]))


def test_manifest_build_layer_options_become_the_filter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from services.cli import app
    from services.common.settings import reset_settings_cache

    seen: list[ManifestFilter] = []

    class Stop(Exception):
        pass

    def fake_build(*args: object, **kwargs: object) -> None:
        assert isinstance(args[3], ManifestFilter)
        seen.append(args[3])
        raise Stop

    monkeypatch.setattr("services.manifest.build.build_manifest", fake_build)
    monkeypatch.setattr("services.metadata.warehouse.make_engine", lambda _s: _NoEngine())
    monkeypatch.setattr("services.common.objectstore.object_store", lambda _s: None)
    monkeypatch.setenv("EGOLINE_DATABASE_URL", "postgresql://egoline@127.0.0.1:9/none")
    reset_settings_cache()
    args = ["manifest", "build", "--out", str(tmp_path), "--layer", "calibration=v3"]
    first = CliRunner().invoke(app, [*args, "--label-contains", "pick up"])
    second = CliRunner().invoke(app, [*args, "--layer", "labels=l1"])
    assert isinstance(first.exception, Stop) and isinstance(second.exception, Stop)
    assert seen[0].layers == {"calibration": "v3", "labels": "latest"}
    assert seen[0].label_contains == ["pick up"]
    assert seen[1].layers == {"calibration": "v3", "labels": "l1"}
    reset_settings_cache()


class _NoEngine:
    def dispose(self) -> None:
        pass


def test_device_window_rows_take_aware_timestamps_in_any_zone() -> None:
    row = CalibrationRow.model_validate(
        {**calibration(), "episode_id": None, "device_id": "dev1",
         "valid_from": "2026-01-01T01:00:00+01:00"}
    )  # fmt: skip
    (stored,) = layer_content(LayerKind.CALIBRATION, [row]).rows
    assert stored[3] == datetime(2026, 1, 1, tzinfo=UTC).isoformat()


def test_the_bench_reads_gets_from_the_object_stores_own_request_log(tmp_path: Path) -> None:
    from services.bench.layers import S3RequestLog

    log = tmp_path / "s3.log"
    log.write_text('127.0.0.1 - - [04/Dec/2026 22:36:55] "HEAD /egoline HTTP/1.1" 200 -\n')
    requests = S3RequestLog(log, "egoline")
    requests.begin()  # only what comes after counts
    with log.open("a") as out:
        out.write(
            '127.0.0.1 - - [x] "GET /egoline/raw/dev1/2026/01/01/ep1/ab.mp4 HTTP/1.1" 206 -\n'
            '127.0.0.1 - - [x] "PUT /egoline/manifests/m.arrow?partNumber=1 HTTP/1.1" 200 -\n'
            '127.0.0.1 - - [x] "\x1b[35m\x1b[1mDELETE /egoline/a%2Fb HTTP/1.1\x1b[0m" 204 -\n'
            '127.0.0.1 - - [x] "GET /other-bucket/raw/x HTTP/1.1" 200 -\n'
        )
    requests.end()
    assert requests.requests == [
        ("GET", "raw/dev1/2026/01/01/ep1/ab.mp4"),
        ("PUT", "manifests/m.arrow"),
        ("DELETE", "a/b"),
    ]
    assert requests.gets() == ["raw/dev1/2026/01/01/ep1/ab.mp4"]


def test_a_clips_labels_are_the_spans_of_its_episode_overlapping_it() -> None:
    from services.manifest.load import clip_labels

    spans = [
        {"type": "subtask", "start_s": 0.0, "end_s": 10.0, "text": "reach"},  # ends at the start
        {"type": "subtask", "start_s": 9.5, "end_s": 12.0, "text": "grasp"},
        {"type": "label", "start_s": 15.0, "end_s": 15.0, "text": "contact"},  # an instant
        {"type": "subtask", "start_s": 20.0, "end_s": 25.0, "text": "lift"},  # starts at the end
    ]
    row = {"clip_start_s": 10.0, "clip_duration_s": 10.0, "labels": json.dumps(spans)}
    assert [s["text"] for s in clip_labels(row)] == ["grasp", "contact"]
    assert clip_labels({"clip_start_s": 0.0, "clip_duration_s": 5.0, "labels": None}) == []
