"""The deployment files, checked offline by real tools: Docker Compose v5's `config` (no
daemon), hadolint on the Dockerfile, the Kubernetes OpenAPI schemas (kubernetes-validate) and
a vendored KEDA ScaledObject schema; plus the invariants no schema knows: every variable a
service reads is set, credentials come from the environment, replicas fit the partitions."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from schemas.events import METADATA_TOPICS, TOPIC_DECODED, TOPIC_UPLOADED, TOPIC_VALIDATED
from services.lag.monitor import PIPELINE_GROUPS
from tests.deploy_files import (
    CLEAN_ENV,
    COMPOSE_FILE,
    CREDENTIALS,
    K8S_DIR,
    KEDA_SCHEMA,
    ROOT,
    SERVICES,
    compose_command,
    compose_config,
    env_example,
    k8s_documents,
    needed_settings,
    settings_env_names,
    venv_tool,
)

KUBERNETES_VERSION = "1.33.0"
STAGES = ("decode", "validate", "shard", "metadata")


# --- compose -------------------------------------------------------------------------------
def test_compose_config_accepts_the_file_with_every_service_and_the_monitoring_profile() -> None:
    services = compose_config()["services"]
    assert set(services) == {
        "kafka", "minio", "postgres", "minio-init", "init", *SERVICES, "prometheus", "grafana"
    }  # fmt: skip
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
    always = [n for n in services if n not in ("prometheus", "grafana")]
    assert not any(services[n].get("profiles") for n in always)


def test_every_long_running_service_has_healthcheck_restart_limits_and_ordered_start() -> None:
    services = compose_config()["services"]
    for name, svc in services.items():
        if name in ("init", "minio-init"):
            assert svc["restart"] == "no", name
            continue
        assert svc["healthcheck"]["test"], name
        assert svc["restart"] == "unless-stopped", name
        limits = svc["deploy"]["resources"]["limits"]
        assert float(limits["cpus"]) > 0 and int(limits["memory"]) > 0, name
    for name in SERVICES:
        assert services[name]["depends_on"]["init"]["condition"] == (
            "service_completed_successfully"
        )
        assert services[name]["command"][:2] == ["serve", name]
    init = services["init"]["depends_on"]
    assert {k: v["condition"] for k, v in init.items()} == {
        "kafka": "service_healthy",
        "postgres": "service_healthy",
        "minio-init": "service_completed_successfully",
    }
    assert services["minio-init"]["depends_on"]["minio"]["condition"] == "service_healthy"


def test_the_stage_healthchecks_probe_the_port_prometheus_scrapes() -> None:
    services = compose_config()["services"]
    prometheus = (ROOT / "infra" / "prometheus" / "prometheus.yml").read_text()
    for name in SERVICES:
        env = services[name]["environment"]
        port = env["EGOLINE_METRICS_PORT"]
        assert env["EGOLINE_METRICS_HOST"] == "0.0.0.0"  # noqa: S104 (in a container)
        assert f"{name}:{port}" in prometheus
        assert f"127.0.0.1:{port}/healthz" in " ".join(services[name]["healthcheck"]["test"])


def test_compose_refuses_to_run_without_the_secrets() -> None:
    """The same validator fails the file when .env is missing: the secrets have no defaults."""
    result = subprocess.run(
        compose_command("config", "-q", env_file=None),
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    for secret in ("POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD", "EGOLINE_S3_SECRET_KEY"):
        assert secret in result.stderr


def test_secrets_only_come_from_the_environment() -> None:
    raw = COMPOSE_FILE.read_text()
    placeholders = env_example()
    for key, value in placeholders.items():
        if re.search("PASSWORD|SECRET", key):
            assert value.startswith("change-me"), f"{key} must hold a placeholder"
            assert value not in raw, f"{key}'s value is written into the compose file"
            assert re.search(r"\$\{" + key + r":\?", raw), f"{key} must be required, no default"
    # every variable the file interpolates is documented in the one .env.example
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", raw))
    assert used <= set(placeholders), used - set(placeholders)
    gitignore = ROOT / ".gitignore"
    assert gitignore.exists() and "compose/.env" in gitignore.read_text().split()


def test_every_variable_a_service_reads_is_set_and_no_more_credentials() -> None:
    """Per service: every endpoint and credential its code reads (imports followed from
    services/<stage>/app.py) is set; no EGOLINE_* name is a typo; no credential it doesn't need."""
    names = settings_env_names()
    services = compose_config()["services"]
    for name in SERVICES:
        env = services[name]["environment"]
        egoline = {k for k in env if k.startswith("EGOLINE_")}
        assert egoline <= set(names), f"{name}: not a setting: {egoline - set(names)}"
        given = {names[k] for k in egoline if env[k]}
        needed = needed_settings(name)
        assert needed, name
        assert needed <= given, f"{name} misses {sorted(needed - given)}"
        assert given & CREDENTIALS == needed & CREDENTIALS, f"{name}: least privilege"
        assert "EGOLINE_STACK_DIR" not in env  # no endpoints-file fallback in a container
    init = services["init"]["environment"]
    assert {names[k] for k in init if k in names} >= {
        "kafka.bootstrap", "database_url", "s3.endpoint", "s3.access_key", "s3.secret_key",
        "topic_partitions",
    }  # fmt: skip


def test_the_minio_init_applies_the_agents_scoped_policy_from_the_docs() -> None:
    doc = (ROOT / "docs" / "agent.md").read_text()
    block = re.search(r"```json\n(.*?)```", doc, re.S)
    assert block, "docs/agent.md lost its policy"
    documented = json.loads(block[1])
    shipped = json.loads((ROOT / "compose" / "minio" / "agent-policy.json").read_text())
    (doc_stmt,) = documented["Statement"]
    (stmt,) = shipped["Statement"]
    assert stmt["Effect"] == doc_stmt["Effect"] == "Allow"
    assert sorted(stmt["Action"]) == sorted(doc_stmt["Action"])
    # the documented per-device resource, generalised to the device's own user name
    general = [r.replace("BUCKET", "egoline") for r in stmt["Resource"]]
    assert [r.replace("${aws:username}", "dev042") for r in general] == doc_stmt["Resource"]
    script = (ROOT / "compose" / "minio" / "init.sh").read_text()
    assert "for name in pipeline agent" in script and "/init/$name-policy.json" in script
    assert 'attach egoline-agent "$AGENT_DEVICE_ID"' in script


# --- Dockerfile ----------------------------------------------------------------------------
def hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [venv_tool("hadolint"), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_dockerfile_passes_hadolint_and_a_bad_one_does_not(tmp_path: Path) -> None:
    result = hadolint(ROOT / "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install egoline\nUSER root\n")
    failed = hadolint(bad)
    assert failed.returncode != 0 and "DL3007" in failed.stdout


def test_the_image_is_multi_stage_pinned_non_root_and_built_from_the_lock() -> None:
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base[1])
    stages = re.findall(r"^FROM (\S+) AS (\w+)$", text, re.M)
    assert [s for _, s in stages] == ["build", "runtime"]
    runtime = text.split("AS runtime", 1)[1]
    assert re.search(r"^USER 10001:10001$", runtime, re.M)
    assert "-c requirements.lock ." in text
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") :][:1] == ["*"]  # deny by default: no .venv, .stack, .env


# --- Kubernetes ----------------------------------------------------------------------------
def keda_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(KEDA_SCHEMA.read_text()))


def test_every_manifest_validates_against_its_schema() -> None:
    kinds: list[str] = []
    for path, doc in k8s_documents():
        kinds.append(doc["kind"])
        if doc["kind"] == "ScaledObject":
            keda_validator().validate(doc)
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert doc["metadata"].get("namespace", "egoline") == "egoline", path
    assert sorted(set(kinds)) == [
        "ConfigMap", "Deployment", "Job", "Namespace", "ScaledObject", "Service"
    ]  # fmt: skip


def test_the_validators_reject_a_broken_manifest() -> None:
    deployment = by_kind("Deployment")["egoline-decode"]
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    scaled = by_kind("ScaledObject")["egoline-decode"]
    no_group = json.loads(json.dumps(scaled))
    del no_group["spec"]["triggers"][0]["metadata"]["consumerGroup"]
    assert not keda_validator().is_valid(no_group)
    numeric = json.loads(json.dumps(scaled))
    numeric["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 20
    assert not keda_validator().is_valid(numeric)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    manifests = [p.name for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml"]
    assert sorted(kustomization["resources"]) == sorted(manifests)


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in k8s_documents() if d["kind"] == kind}


def test_each_stage_scales_on_its_own_group_and_topics_within_its_partitions() -> None:
    config = by_kind("ConfigMap")["egoline-config"]["data"]
    partitions = int(config["EGOLINE_TOPIC_PARTITIONS"])
    deployments = by_kind("Deployment")
    consumes = {
        "decode": {TOPIC_UPLOADED},
        "validate": {TOPIC_DECODED},
        "shard": {TOPIC_VALIDATED},
        "metadata": set(METADATA_TOPICS),
    }
    scaled = by_kind("ScaledObject")
    assert set(scaled) == {f"egoline-{s}" for s in STAGES}  # the lag service stays at one
    for stage in STAGES:
        spec = scaled[f"egoline-{stage}"]["spec"]
        assert spec["scaleTargetRef"]["name"] in deployments
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= partitions, stage
        triggers = [t["metadata"] for t in spec["triggers"]]
        assert all(t["consumerGroup"] == f"egoline-{stage}" for t in triggers)
        assert f"egoline-{stage}" in PIPELINE_GROUPS
        assert {t["topic"] for t in triggers} == consumes[stage], stage
        assert all(t["bootstrapServers"] == config["EGOLINE_KAFKA_BOOTSTRAP"] for t in triggers)
        assert all(t["allowIdleConsumers"] == "false" for t in triggers)


def test_every_kubernetes_service_gets_what_it_reads_with_credentials_from_the_secret() -> None:
    names = settings_env_names()
    config = by_kind("ConfigMap")["egoline-config"]["data"]
    assert not set(config) & {k for k, f in names.items() if f in CREDENTIALS}
    for service in SERVICES:
        pod = by_kind("Deployment")[f"egoline-{service}"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["args"] == ["serve", service]
        env = {e["name"]: e for e in container.get("env", [])}
        assert set(env) <= set(names) and set(config) <= set(names)
        given = {names[k] for k in [*env, *config]}
        assert needed_settings(service) <= given, service
        for name, entry in env.items():
            if names[name] in CREDENTIALS:
                assert entry["valueFrom"]["secretKeyRef"]["name"] == "egoline-credentials"
        assert {names[k] for k in env} & CREDENTIALS == needed_settings(service) & CREDENTIALS
        port = int(env["EGOLINE_METRICS_PORT"]["value"])
        assert container["ports"][0]["containerPort"] == port
        assert pod["securityContext"]["runAsNonRoot"] is True
