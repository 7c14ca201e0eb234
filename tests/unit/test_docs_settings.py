"""Docs that cannot drift: every `EGOLINE_*` setting README.md and docs/ name exists, and every
default they state is the code's (`services/common/settings.py`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import SecretStr

from services.common.settings import env_fields

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# EGOLINE_* names in the docs that are not settings of the services: compose's variables.
NOT_SETTINGS = {"EGOLINE_IMAGE"}
NAME = re.compile(r"EGOLINE_[A-Z0-9_]*[A-Z0-9*]")
TABLE_ROW = re.compile(r"^\| `(EGOLINE_[A-Z0-9_]+)` \| ([^|]+) \|", re.MULTILINE)
PROSE_DEFAULT = re.compile(
    r"`(EGOLINE_[A-Z0-9_]+)`[^`;.]{0,20}?,? default ([0-9][0-9.]*|true|false)"
)
PROSE_ASSIGNED = re.compile(r"`(EGOLINE_[A-Z0-9_]+)=([a-z0-9.|-]+)`")


def names_in(text: str) -> set[str]:
    return set(NAME.findall(text))


def matches(stated: str, default: object) -> bool:
    """Does the docs' `stated` default say the code's `default`?"""
    stated = stated.strip()
    if default is None or isinstance(default, SecretStr):
        # Unset (or a credential): the docs say what happens instead ("embedded moto"); only a
        # stated number or boolean would be a claim about a value, and a wrong one.
        return re.fullmatch(r"[0-9.]+|true|false", stated) is None
    if isinstance(default, frozenset):
        # a set of names (`EGOLINE_CURATION_REJECT`): "empty", or the names comma-separated
        if stated == "empty":
            return not default
        return {v.strip(" `") for v in stated.split(",")} == {str(v) for v in default}
    if isinstance(default, bool):
        return stated == str(default).lower()
    if isinstance(default, int | float):
        try:
            return float(stated) == float(default)
        except ValueError:
            return False
    if default == "":
        return stated == "empty"
    return stated == str(default)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_setting_named_in_the_docs_exists(doc: Path) -> None:
    known = set(env_fields())
    missing = []
    for name in names_in(doc.read_text()) - NOT_SETTINGS:
        if name.endswith("*"):
            if not any(k.startswith(name.rstrip("*")) for k in known):
                missing.append(name)
        elif name not in known:
            missing.append(name)
    assert not missing, f"{doc.name} names settings that do not exist: {sorted(missing)}"


def test_every_default_the_docs_state_is_the_codes() -> None:
    fields = env_fields()
    wrong = []
    stated_in_readme = 0
    for doc in DOCS:
        text = doc.read_text()
        rows = TABLE_ROW.findall(text)
        stated_in_readme += len(rows) if doc.name == "README.md" else 0
        for name, stated in [*rows, *PROSE_DEFAULT.findall(text)]:
            default = fields[name][1].default
            if not matches(stated, default):
                wrong.append(f"{doc.name}: {name} default {stated.strip()!r}, code {default!r}")
    assert not wrong, "\n".join(wrong)
    assert stated_in_readme >= 50  # the README's settings table is where the defaults live


def test_every_setting_is_in_the_readme_table() -> None:
    rows = {name for name, _ in TABLE_ROW.findall((ROOT / "README.md").read_text())}
    assert set(env_fields()) - {"DATABASE_URL"} <= rows


def test_values_the_docs_assign_are_allowed() -> None:
    """`EGOLINE_X=a|b` in the docs: each value must pass the setting's own validation."""
    from pydantic import TypeAdapter

    for doc in DOCS:
        for name, values in PROSE_ASSIGNED.findall(doc.read_text()):
            annotation = env_fields()[name][1].annotation
            assert annotation is not None, name
            for value in values.split("|"):
                TypeAdapter(annotation).validate_python(value)
