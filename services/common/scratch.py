"""Scratch directories of worker jobs, named by the worker's pid: a job's `with` block removes
its own, and a worker killed mid-job (SIGKILL, the OOM killer) leaves one behind that the next
worker started on the node sweeps (`sweep_dead`), so crashes cannot slowly fill the disk."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("egoline.scratch")
PREFIX = "egoline-job-"


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie child still answers kill(0); check its state.
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        if status == "Z":
            return False
    return True


def job_scratch(kind: str, base: Path | None = None) -> tempfile.TemporaryDirectory[str]:
    """A temporary directory for one job of this process (`egoline-job-<pid>-<kind>-...`)."""
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-{kind}-", dir=base)


def owned_name(label: str) -> str:
    """A directory name this process owns for `sweep_dead`: `egoline-job-<pid>-<label>`."""
    return f"{PREFIX}{os.getpid()}-{label}"


def owner_pid(name: str) -> int | None:
    if not name.startswith(PREFIX):
        return None
    head = name[len(PREFIX) :].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def sweep_dead(base: Path | None = None) -> int:
    """Remove the job scratch directories under `base` (default: the temp dir) whose process
    is gone; returns how many."""
    root = base or Path(tempfile.gettempdir())
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in root.iterdir():
            pid = owner_pid(entry.name)
            if pid is not None and entry.is_dir() and not pid_alive(pid):
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
    if removed:
        log.warning("removed %d scratch directories of dead workers under %s", removed, root)
    return removed
