"""The committed JSON Schemas match the models, and the models stay backward compatible."""

from __future__ import annotations

import copy
import json

import pytest

from schemas.compat import (
    BASELINE_DIR,
    SCHEMA_DIR,
    backward_incompatibilities,
    model_schemas,
    render,
    schema_file_name,
)


@pytest.mark.parametrize("name", sorted(model_schemas()))
def test_committed_schema_matches_model(name: str) -> None:
    committed = (SCHEMA_DIR / schema_file_name(name)).read_text()
    assert committed == render(model_schemas()[name]), (
        f"schemas/jsonschema/{schema_file_name(name)} is stale: run `egoline schemas export`"
    )


@pytest.mark.parametrize("name", sorted(model_schemas()))
def test_model_reads_every_event_of_the_previous_version(name: str) -> None:
    baseline = json.loads((BASELINE_DIR / schema_file_name(name)).read_text())
    assert backward_incompatibilities(baseline, model_schemas()[name]) == []


def _uploaded() -> dict[str, object]:
    return copy.deepcopy(model_schemas()["episodes.uploaded"])


def test_new_required_field_is_incompatible() -> None:
    old, new = _uploaded(), _uploaded()
    new["properties"]["camera_serial"] = {"type": "string"}  # type: ignore[index]
    new["required"] = [*new["required"], "camera_serial"]  # type: ignore[misc]
    assert backward_incompatibilities(old, new) == ["<root>.camera_serial: new required field"]


def test_new_optional_field_is_compatible() -> None:
    old, new = _uploaded(), _uploaded()
    new["properties"]["camera_serial"] = {"type": "string", "default": ""}  # type: ignore[index]
    assert backward_incompatibilities(old, new) == []


def test_removed_or_retyped_field_is_incompatible() -> None:
    old, new = _uploaded(), _uploaded()
    del new["$defs"]["SourceFile"]["properties"]["sha256"]  # type: ignore[index]
    new["$defs"]["SourceFile"]["properties"]["size_bytes"] = {"type": "string"}  # type: ignore[index]
    problems = backward_incompatibilities(old, new)
    assert "SourceFile.sha256: field removed" in problems
    assert "SourceFile.size_bytes: type changed" in problems


def test_dropped_enum_value_is_incompatible() -> None:
    old = model_schemas()["dlq"]
    new = copy.deepcopy(old)
    new["$defs"]["ReasonCode"]["enum"].remove("sha256_mismatch")
    assert backward_incompatibilities(old, new) == [
        "ReasonCode: enum values dropped ['sha256_mismatch']"
    ]


def test_committed_asyncapi_document_is_current() -> None:
    from pathlib import Path

    from services.contracts.asyncapi import asyncapi_document

    committed = json.loads((Path(__file__).parents[2] / "docs" / "asyncapi.json").read_text())
    assert committed == asyncapi_document(), "docs/asyncapi.json is stale: `egoline schemas export`"
