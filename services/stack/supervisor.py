"""Supervise the pipeline's services as child processes: start each, restart a crashed one
with backoff, stop all gracefully (`egoline up`).

The decisions (when to restart, how long to wait, when a service counts as stable again) are
`RestartPolicy` and `ServiceRecord`, pure and unit-tested; `Supervisor` applies them to real
processes started by `services.stack.fleet.Fleet` (one log per service under the stack dir).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from services.common.retry import backoff_delay
from services.stack.fleet import Fleet, ready

#: What `egoline up` runs: the four stages and the lag service (which serves the web page).
UP_SERVICES = ("decode", "validate", "shard", "metadata", "lag")


class ServiceState(StrEnum):
    STARTING = "starting"  # spawned, /readyz not yet 200
    RUNNING = "running"  # /readyz answered 200 since the last start
    BACKOFF = "backoff"  # exited on its own; restarts at `next_start`
    STOPPED = "stopped"  # stopped by the supervisor


@dataclass(frozen=True)
class RestartPolicy:
    """Exponential backoff with full jitter (`services.common.retry.backoff_delay`), counted
    over consecutive crashes; a service that ran `stable_after_s` before it crashed starts
    counting again from the first delay (a crash an hour later is not a crash loop)."""

    base_s: float = 0.5
    cap_s: float = 30.0
    stable_after_s: float = 30.0

    def consecutive(self, previous: int, ran_s: float) -> int:
        """The crash count after a crash that followed `ran_s` seconds of running."""
        return 1 if ran_s >= self.stable_after_s else previous + 1

    def delay_s(self, consecutive_crashes: int) -> float:
        return backoff_delay(consecutive_crashes - 1, self.base_s, self.cap_s)


@dataclass
class ServiceRecord:
    """What the supervisor knows of one service; written to `up.json` for `status` and `down`."""

    name: str
    port: int
    log: str
    pid: int | None = None
    state: ServiceState = ServiceState.STARTING
    started_at: float = 0.0
    restarts: int = 0
    consecutive_crashes: int = 0
    last_exit: int | None = None
    next_start: float | None = None

    def crashed(self, exit_code: int, now: float, policy: RestartPolicy) -> None:
        """The process exited without being asked to: schedule its restart."""
        self.consecutive_crashes = policy.consecutive(
            self.consecutive_crashes, now - self.started_at
        )
        self.last_exit = exit_code
        self.pid = None
        self.state = ServiceState.BACKOFF
        self.next_start = now + policy.delay_s(self.consecutive_crashes)

    def due(self, now: float) -> bool:
        return (
            self.state is ServiceState.BACKOFF
            and self.next_start is not None
            and now >= self.next_start
        )

    def spawned(self, pid: int, now: float, restart: bool) -> None:
        self.pid = pid
        self.state = ServiceState.STARTING
        self.started_at = now
        self.next_start = None
        if restart:
            self.restarts += 1


@dataclass
class UpState:
    """`<stack dir>/up.json`: the supervisor and its services, rewritten on every change."""

    supervisor_pid: int
    started_at: float
    url: str
    log_dir: str
    #: the embedded services this `up` started (and so stops): kafka, postgres, s3
    stack_started: list[str] = field(default_factory=list)
    services: dict[str, ServiceRecord] = field(default_factory=dict)
    stopping: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> UpState:
        services = {
            name: ServiceRecord(**{**rec, "state": ServiceState(rec["state"])})
            for name, rec in raw.get("services", {}).items()
        }
        return cls(**{**raw, "services": services})


def up_state_path(stack_dir: Path) -> Path:
    return stack_dir / "up.json"


def read_up_state(stack_dir: Path) -> UpState | None:
    path = up_state_path(stack_dir)
    if not path.exists():
        return None
    return UpState.from_json(json.loads(path.read_text()))


def write_up_state(stack_dir: Path, state: UpState) -> None:
    path = up_state_path(stack_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2))
    tmp.replace(path)


class Supervisor:
    """Runs `UP_SERVICES` through a `Fleet` and keeps them running until `stop`."""

    def __init__(
        self,
        stack_dir: Path,
        ports: dict[str, int],
        state: UpState,
        env: dict[str, str] | None = None,
        policy: RestartPolicy | None = None,
        log: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.stack_dir = stack_dir
        self.fleet = Fleet(Path(state.log_dir), env=env or {})
        self.ports = ports
        self.state = state
        self.policy = policy or RestartPolicy()
        self.log = log

    @staticmethod
    def process_name(service: str) -> str:
        return f"{service}-0"

    def start(self) -> None:
        for service in UP_SERVICES:
            name = self.process_name(service)
            self.state.services[service] = ServiceRecord(
                name=service, port=self.ports[service], log=str(self.fleet.log_dir / f"{name}.log")
            )
            self._spawn(service, restart=False)
        self._save()

    def _spawn(self, service: str, restart: bool) -> None:
        name = self.process_name(service)
        self.fleet.spawn(name, port=self.ports[service])
        self.state.services[service].spawned(self.fleet.procs[name].pid, time.time(), restart)

    def tick(self) -> bool:
        """One look at every service: note crashes, restart what is due, mark what became
        ready. Returns whether anything changed (the state file is rewritten then)."""
        now = time.time()
        changed = False
        for service, rec in self.state.services.items():
            proc = self.fleet.procs.get(self.process_name(service))
            if rec.state in (ServiceState.STARTING, ServiceState.RUNNING) and proc is not None:
                code = proc.poll()
                if code is not None:
                    # Its session's other processes (pool workers) outlive a killed leader
                    # and would never exit: stop them before a new one starts.
                    reap_group(proc.pid)
                    rec.crashed(code, now, self.policy)
                    wait_s = (rec.next_start or now) - now
                    self.log(f"{service} exited ({code}); restart in {wait_s:.1f}s, see {rec.log}")
                    changed = True
                elif rec.state is ServiceState.STARTING and ready(rec.port):
                    rec.state = ServiceState.RUNNING
                    self.log(f"{service} ready (pid {rec.pid}, port {rec.port})")
                    changed = True
            if rec.due(now):
                self._spawn(service, restart=True)
                changed = True
        if changed:
            self._save()
        return changed

    def all_running(self) -> bool:
        return all(r.state is ServiceState.RUNNING for r in self.state.services.values())

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every service (each finishes its batch and stops its workers), SIGKILL the
        process group of any that outlives `timeout_s`."""
        self.state.stopping = True
        self._save()
        self.fleet.stop(timeout_s)
        for rec in self.state.services.values():
            rec.state, rec.pid, rec.next_start = ServiceState.STOPPED, None, None
        self._save()

    def _save(self) -> None:
        write_up_state(self.stack_dir, self.state)


def reap_group(pgid: int) -> None:
    """SIGKILL whatever is left in the process group of a service that exited."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def pid_group_alive(pgid: int) -> bool:
    """Whether any process is left in the process group `pgid` (a service and its workers)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
