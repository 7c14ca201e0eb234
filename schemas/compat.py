"""Backward-compatibility check between two JSON Schemas of one event.

"Backward compatible" means a consumer built on the new schema reads every event written with
the old one: no new required field, no removed or retyped field, no enum value dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.events import EVENT_MODELS

SCHEMA_DIR = Path(__file__).parent / "jsonschema"
BASELINE_DIR = SCHEMA_DIR / "baseline"
_IGNORED_KEYS = {"title", "description", "default", "examples"}

JsonObj = dict[str, Any]


def schema_file_name(name: str) -> str:
    return f"{name}.v1.json"


def model_schemas() -> dict[str, JsonObj]:
    """The JSON Schema of every event model, keyed by topic name (`dlq` for the envelope)."""
    return {name: model.model_json_schema() for name, model in EVENT_MODELS.items()}


def render(schema: JsonObj) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def export(directory: Path = SCHEMA_DIR) -> list[Path]:
    """Write every model's schema into `directory`; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in model_schemas().items():
        path = directory / schema_file_name(name)
        path.write_text(render(schema))
        written.append(path)
    return written


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k not in _IGNORED_KEYS}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _objects(schema: JsonObj) -> dict[str, JsonObj]:
    found = {"<root>": schema}
    found.update(schema.get("$defs", {}))
    return found


def backward_incompatibilities(old: JsonObj, new: JsonObj) -> list[str]:
    """Every way `new` fails to read data valid under `old`; empty when compatible."""
    problems: list[str] = []
    old_objects, new_objects = _objects(old), _objects(new)
    for name, old_obj in old_objects.items():
        new_obj = new_objects.get(name)
        if new_obj is None:
            problems.append(f"{name}: definition removed")
            continue
        if "enum" in old_obj:
            dropped = set(old_obj["enum"]) - set(new_obj.get("enum", []))
            if dropped:
                problems.append(f"{name}: enum values dropped {sorted(dropped)}")
        old_props = old_obj.get("properties", {})
        new_props = new_obj.get("properties", {})
        for field in sorted(set(new_obj.get("required", [])) - set(old_obj.get("required", []))):
            problems.append(f"{name}.{field}: new required field")
        for field, old_type in old_props.items():
            if field not in new_props:
                problems.append(f"{name}.{field}: field removed")
            elif _strip(old_type) != _strip(new_props[field]):
                problems.append(f"{name}.{field}: type changed")
    return problems
