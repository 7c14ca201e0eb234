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

from services.stack.launcher import free_port

STAGES = ("decode", "validate", "shard", "metadata")


@dataclass
class Fleet:
    """Child processes, one per (stage, replica), logging to `log_dir/<stage>-<n>.log`."""

    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)

    def start(self, stage: str, replicas: int = 1) -> None:
        for n in range(replicas):
            self.spawn(f"{stage}-{n}")

    def spawn(self, name: str, port: int | None = None) -> None:
        """Start (or start again) the process `<stage>-<n>`, appending to its log; its
        /metrics, /healthz and /readyz on `port` (default: a free one)."""
        stage = name.rsplit("-", 1)[0]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{name}.log").open("ab") as log:
            self.metrics_ports[name] = port or free_port()
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "serve", stage],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={
                    **os.environ,
                    # processes of one fleet share a node: share raw objects on local disk too
                    "EGOLINE_RAW_CACHE_DIR": os.environ.get(
                        "EGOLINE_RAW_CACHE_DIR", str(self.log_dir.parent / "raw-cache")
                    ),
                    **self.env,
                    "EGOLINE_METRICS_PORT": str(self.metrics_ports[name]),
                },
                start_new_session=True,
            )

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL, timeout_s: float = 60.0) -> int:
        """Signal the process `name` and wait (up to `timeout_s`) for it to exit; returns its
        exit code. SIGKILL goes to its whole process group (its workers die with it, as in a
        crash of the machine's container); other signals go to the service process alone,
        which handles them (SIGTERM: graceful stop)."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            if sig is signal.SIGKILL:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        return proc.wait(timeout_s)

    def start_all(self, stages: tuple[str, ...] = STAGES) -> None:
        for stage in stages:
            self.start(stage)

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Block until every process answers 200 on /readyz (its consumer finished joining its
        group and holds partitions). Stopping a member mid-join can wedge a group on the
        embedded broker (docs/stack.md), and a service is not ready before it has joined."""
        deadline = time.monotonic() + timeout_s
        waiting = set(self.procs)
        while waiting:
            for name in sorted(waiting):
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"{name} exited; see {self.log_dir / (name + '.log')}")
                if ready(self.metrics_ports[name]):
                    waiting.discard(name)
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {timeout_s}s: {sorted(waiting)}")
            time.sleep(0.3)

    def dead(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM every service (graceful: it finishes its batch and stops its own workers),
        then SIGKILL the process group of any straggler."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            # a worker that outlived its service (its group is the service's pid) goes too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()


@contextlib.contextmanager
def running_fleet(log_dir: Path, stages: tuple[str, ...] = STAGES) -> Iterator[Fleet]:
    fleet = Fleet(log_dir)
    fleet.start_all(stages)
    try:
        fleet.wait_ready()
        yield fleet
    finally:
        fleet.stop()


def ready(port: int) -> bool:
    """Whether the service on `port` answers 200 on /readyz."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:  # refused, or HTTPError 503 (a subclass): not ready
        return False
