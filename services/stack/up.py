"""`egoline up` / `status` / `down`: the embedded stack (or the configured endpoints) and the
whole fleet (decode, validate, shard, metadata, lag) under one supervisor.

`up` runs the supervisor in the foreground with a live view (Ctrl-C or SIGTERM stops
everything it started), or `--detach`ed in its own session (`down` stops it). Either way the
supervisor writes `<stack dir>/up.json` (`services.stack.supervisor.UpState`), which `status`
and `down` read; each service logs to `<stack dir>/logs/<service>-0.log`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.common.scratch import pid_alive
from services.common.settings import Settings, get_settings, reset_settings_cache
from services.stack.launcher import Stack, free_port
from services.stack.supervisor import (
    UP_SERVICES,
    ServiceState,
    Supervisor,
    UpState,
    pid_group_alive,
    read_up_state,
    up_state_path,
)

TICK_S = 0.5
#: how long `down` waits for the last worker processes of a stopped service to exit
LEFTOVER_GRACE_S = 10.0


class AlreadyUp(RuntimeError):
    pass


def _running_stack(stack: Stack) -> set[str]:
    return {n for n, s in stack.read_state().items() if s.started_by_us and pid_alive(s.pid)}


def check_not_up(stack_dir: Path) -> None:
    state = read_up_state(stack_dir)
    if state is not None and pid_alive(state.supervisor_pid):
        raise AlreadyUp(
            f"egoline is already up (supervisor pid {state.supervisor_pid}, {state.url}); "
            "`egoline down` stops it"
        )


def page_url(settings: Settings) -> str:
    host = "127.0.0.1" if settings.metrics_host in ("0.0.0.0", "") else settings.metrics_host  # noqa: S104
    return f"http://{host}:{settings.page_port}/"


def supervise(
    base: Settings,
    stop: threading.Event,
    on_tick: Callable[[UpState], None] = lambda _s: None,
    keep_stack: bool = False,
    log: Callable[[str], None] = lambda _line: None,
) -> UpState:
    """Bring up the stack and the fleet, keep them running until `stop` is set, then stop
    the fleet and (unless `keep_stack`) the embedded services this call started."""
    from services.stack.provision import stack_up

    stack_dir = base.stack_dir.resolve()
    check_not_up(stack_dir)
    stack = Stack(stack_dir)
    before = _running_stack(stack)
    stack_up(base, log=log)
    reset_settings_cache()
    settings = get_settings()
    started = sorted(_running_stack(stack) - before)
    ports = {s: free_port() for s in UP_SERVICES}
    ports["lag"] = settings.page_port
    state = UpState(
        supervisor_pid=os.getpid(),
        started_at=time.time(),
        url=page_url(settings),
        log_dir=str(stack_dir / "logs"),
        stack_started=started,
    )
    supervisor = Supervisor(stack_dir, ports, state, log=log)
    try:
        supervisor.start()
        log(f"fleet starting: {', '.join(UP_SERVICES)}; page {state.url}")
        while not stop.is_set():
            supervisor.tick()
            on_tick(state)
            stop.wait(TICK_S)
    finally:
        log("stopping the fleet")
        supervisor.stop()
        if started and not keep_stack:
            log(f"stopping the embedded {', '.join(started)}")
            stack.down(only=set(started))
        up_state_path(stack_dir).unlink(missing_ok=True)
    return state


def detach(settings: Settings, timeout_s: float, log: Callable[[str], None]) -> UpState:
    """Start the supervisor in its own session (logging to `<stack dir>/logs/up.log`) and wait
    until every service answers /readyz."""
    stack_dir = settings.stack_dir.resolve()
    check_not_up(stack_dir)
    log_dir = stack_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / "up.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "up", "--no-view"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    shown = ""
    while True:
        code = proc.poll()
        if code is not None:
            tail = (log_dir / "up.log").read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(f"egoline up exited ({code}):\n" + "\n".join(tail))
        state = read_up_state(stack_dir)
        if state is not None and state.supervisor_pid == proc.pid and state.services:
            line = ", ".join(f"{n} {r.state.value}" for n, r in state.services.items())
            if line != shown:
                log(line)
                shown = line
            if all(r.state is ServiceState.RUNNING for r in state.services.values()):
                return state
        if time.monotonic() > deadline:
            os.kill(proc.pid, signal.SIGTERM)
            raise TimeoutError(f"not up after {timeout_s:.0f}s; see {log_dir}")
        time.sleep(TICK_S)


def down(stack_dir: Path, timeout_s: float = 60.0) -> dict[str, Any]:
    """Stop a running `up`: SIGTERM its supervisor (which stops the fleet and the embedded
    services it started) and wait; if the supervisor is gone or does not finish, stop what
    its state file names. Reports what is left (nothing, when it worked)."""
    stack_dir = stack_dir.resolve()
    state = read_up_state(stack_dir)
    if state is None:
        return {"stopped": False, "reason": "not up", "leftover": []}
    graceful = False
    if pid_alive(state.supervisor_pid):
        os.kill(state.supervisor_pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(state.supervisor_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        graceful = not pid_alive(state.supervisor_pid)
    if not graceful:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(state.supervisor_pid, signal.SIGKILL)
        for rec in state.services.values():
            if rec.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(rec.pid, signal.SIGKILL)
        if state.stack_started:
            Stack(stack_dir).down(only=set(state.stack_started))
        up_state_path(stack_dir).unlink(missing_ok=True)
    # a service's pool workers leave a moment after the service itself: give them that moment
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while True:
        leftover = [
            name
            for name, rec in state.services.items()
            if rec.pid is not None and pid_group_alive(rec.pid)
        ]
        if not leftover or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    stack_state = Stack(stack_dir).read_state()
    leftover += [
        n for n in state.stack_started if n in stack_state and pid_alive(stack_state[n].pid)
    ]
    if pid_alive(state.supervisor_pid):
        leftover.append("supervisor")
    return {
        "stopped": True,
        "graceful": graceful,
        "services": list(state.services),
        "stack": state.stack_started,
        "leftover": leftover,
    }


def lag_summary(port: int) -> dict[str, Any]:
    """Per group: total lag, seconds behind and status, from the lag service's /lag.json."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lag.json", timeout=2) as resp:
            doc = json.load(resp)
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    groups = doc.get("groups", {})
    return {
        group: {
            "lag": entry.get("total_lag"),
            "lag_seconds": entry.get("max_lag_seconds"),
            "status": entry.get("status"),
        }
        for group, entry in groups.items()
    }


def status(settings: Settings) -> dict[str, Any]:
    """The `egoline status --json` document: the supervisor's services, the warehouse's
    episodes per state, throughput and rejects by reason, and lag per group."""
    from services.stack.corpus_status import warehouse_status

    stack_dir = settings.stack_dir.resolve()
    state = read_up_state(stack_dir)
    up = state is not None and pid_alive(state.supervisor_pid)
    doc: dict[str, Any] = {"up": up}
    if state is not None:
        doc["url"] = state.url
        doc["supervisor_pid"] = state.supervisor_pid
        doc["uptime_s"] = round(time.time() - state.started_at, 1)
        doc["services"] = {
            name: {
                "state": rec.state.value,
                "pid": rec.pid,
                "alive": pid_alive(rec.pid),
                "restarts": rec.restarts,
                "last_exit": rec.last_exit,
                "log": rec.log,
            }
            for name, rec in state.services.items()
        }
        lag = state.services.get("lag")
        doc["lag"] = lag_summary(lag.port) if up and lag is not None else {}
    doc.update(warehouse_status(settings))
    return doc
