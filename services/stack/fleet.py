"""Run pipeline services as separate processes (`egoline serve <stage>`), and stop them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

STAGES = ("decode", "validate", "shard", "metadata")


@dataclass
class Fleet:
    """Child processes, one per (stage, replica), logging to `log_dir/<stage>-<n>.log`."""

    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, stage: str, replicas: int = 1) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for n in range(replicas):
            name = f"{stage}-{n}"
            log = (self.log_dir / f"{name}.log").open("ab")
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "serve", stage],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )

    def start_all(self, stages: tuple[str, ...] = STAGES) -> None:
        for stage in stages:
            self.start(stage)

    def dead(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM every process (graceful: in-flight work finishes), SIGKILL stragglers."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()


@contextlib.contextmanager
def running_fleet(log_dir: Path, stages: tuple[str, ...] = STAGES) -> Iterator[Fleet]:
    fleet = Fleet(log_dir)
    fleet.start_all(stages)
    try:
        yield fleet
    finally:
        fleet.stop()
