"""Read the deployment files the way their tools do: compose through Docker Compose's own
`config`, Kubernetes YAML documents, and what each service's code needs from the environment."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from services.common.settings import env_fields

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
ENV_EXAMPLE = COMPOSE_DIR / ".env.example"
K8S_DIR = ROOT / "infra" / "k8s"
KEDA_SCHEMA = K8S_DIR / "schemas" / "keda-scaledobject-v1alpha1.json"
# The egoline services and the command each runs (compose service name = stage name).
SERVICES = ("decode", "validate", "shard", "metadata", "lag")

# What a service talks to -> the settings it must be given (the endpoint and its credentials).
KAFKA = frozenset({"kafka.bootstrap"})
S3 = frozenset({"s3.endpoint", "s3.access_key", "s3.secret_key", "s3.bucket"})
POSTGRES = frozenset({"database_url"})
CREDENTIALS = frozenset({"s3.access_key", "s3.secret_key", "database_url", "kafka.sasl_password"})


def venv_tool(name: str) -> str:
    """A console script installed next to this interpreter (the dev extra's validators)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise AssertionError(f"{name} is not installed: run `make venv` (it is in the dev extra)")
    return str(path)


def compose_command(*args: str, env_file: Path | None = ENV_EXAMPLE) -> list[str]:
    argv = [venv_tool("docker-compose"), "-f", str(COMPOSE_FILE)]
    if env_file is not None:
        argv += ["--env-file", str(env_file)]
    return [*argv, *args]


# No daemon: `config` must not need one, so point the client nowhere.
CLEAN_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "DOCKER_HOST": "unix:///nonexistent.sock"}


@cache
def compose_config() -> dict[str, Any]:
    """The compose file as Docker Compose resolves it (interpolated, anchors merged), with
    the monitoring profile on, from the .env.example placeholders."""
    result = subprocess.run(
        compose_command("--profile", "monitoring", "config", "--format", "json"),
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


def env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def settings_env_names() -> dict[str, str]:
    """Every environment variable Settings reads -> its field's dotted path."""
    return {env: path for env, (path, _) in env_fields().items()}


def module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def reachable_modules(start: str) -> dict[str, str]:
    """egoline modules `start` imports, transitively (imports inside functions too): name ->
    source. An over-approximation of what the service can run, which is the safe side."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        name = todo.pop()
        path = module_file(name)
        if name in seen or path is None:
            continue
        source = path.read_text()
        seen[name] = source
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo.append(node.module)
                todo += [f"{node.module}.{a.name}" for a in node.names]
    return {n: s for n, s in seen.items() if n.split(".")[0] in ("services", "schemas")}


def needed_settings(service: str) -> frozenset[str]:
    """The endpoints and credentials the code of `egoline serve <service>` reads."""
    modules = reachable_modules(f"services.{service}.app")
    needs: set[str] = set()
    if "services.common.kafka" in modules or "services.common.stage" in modules:
        needs |= KAFKA
    if "services.common.objectstore" in modules:
        needs |= S3
    database = re.compile(r"\bdatabase_(url|sqlalchemy_url|libpq_url)\b")
    readers = {n: src for n, src in modules.items() if n != "services.common.settings"}
    if any(database.search(src) for src in readers.values()):
        needs |= POSTGRES
    return frozenset(needs)


def k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    docs: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs
