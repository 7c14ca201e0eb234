"""The embedded stack never wipes a data dir a postmaster still runs on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from services.stack.launcher import Stack, live_postmaster


def _pgdata(tmp_path: Path, pid: int) -> Path:
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    (pgdata / "postmaster.pid").write_text(f"{pid}\n/somewhere\n1733380000\n5432\n")
    (pgdata / "PG_VERSION").write_text("18\n")
    return pgdata


def test_a_live_postmaster_is_found_and_a_dead_one_is_not(tmp_path: Path) -> None:
    assert live_postmaster(tmp_path / "missing") is None
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert live_postmaster(_pgdata(tmp_path, dead.pid)) is None
    (tmp_path / "pgdata" / "postmaster.pid").write_text(f"{os.getpid()}\n")
    assert live_postmaster(tmp_path / "pgdata") == os.getpid()


def test_a_fresh_postgres_refuses_a_data_dir_in_use(tmp_path: Path) -> None:
    pgdata = _pgdata(tmp_path, os.getpid())
    with pytest.raises(RuntimeError, match=f"pid {os.getpid()}"):
        Stack(tmp_path)._start_postgres()
    assert (pgdata / "PG_VERSION").read_text() == "18\n"  # untouched
