"""Job scratch directories are named by their worker's pid and swept once that pid is gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.common.scratch import PREFIX, job_scratch, owner_pid, sweep_dead


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_the_directories_of_dead_processes_are_swept(tmp_path: Path) -> None:
    dead = tmp_path / f"{PREFIX}{dead_pid()}-validate-abc"
    dead.mkdir()
    (dead / "video").write_bytes(b"x" * 1000)
    with job_scratch("decode", tmp_path) as mine:
        unrelated = tmp_path / "egoline-spool-notes"
        unrelated.mkdir()
        assert sweep_dead(tmp_path) == 1
        assert not dead.exists() and Path(mine).exists() and unrelated.exists()
    assert not Path(mine).exists()


def test_owner_pid_reads_only_our_names() -> None:
    assert owner_pid(f"{PREFIX}123-shard-ep1-ab") == 123
    assert owner_pid("egoline-validate-xyz") is None and owner_pid(f"{PREFIX}x-1") is None
