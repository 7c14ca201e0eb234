"""The Grafana dashboard and the Prometheus config can't drift from the code: every metric a
panel queries is one a service registers, and every service is scraped."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

import services.common.metrics  # noqa: F401  (registers the stage metrics on REGISTRY)
from services.lag.app import LagMetrics
from services.stack.fleet import STAGES

INFRA = Path(__file__).resolve().parents[2] / "infra"
DASHBOARD = INFRA / "grafana" / "dashboards" / "egoline.json"
PROMETHEUS = INFRA / "prometheus" / "prometheus.yml"

# Series Prometheus itself adds to every scrape.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
    "and", "or", "unless", "inf", "nan",
    # aggregation operators (`sum by (x) (...)`: not followed by a parenthesis once the
    # grouping is dropped)
    "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "limitk", "limit_ratio",
}  # fmt: skip
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}


def series_names(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry exposes, whether or not a labelled child exists yet."""
    names = set()
    for family in registry.collect():
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label names and
    values, durations and numbers left out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery windows
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        following = expr[match.end() :].lstrip()
        if following.startswith("("):  # a function call
            continue
        if match.group() not in PROMQL_WORDS:
            names.add(match.group())
    return names


def queries(dashboard: dict[str, Any]) -> Iterator[str]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            yield from (t["expr"] for t in panel.get("targets", []))
            yield from walk(panel.get("panels", []))

    yield from walk(dashboard["panels"])
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        yield query["query"] if isinstance(query, dict) else str(query)


def test_the_parser_finds_metrics_and_skips_the_rest() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (stage, le) ("
        'rate(egoline_stage_batch_seconds_bucket{stage=~"de.*"}[5m])))'
        ' / on (stage) group_left max without (le) (up{job="x"})'
    )
    assert metric_names(expr) == {"egoline_stage_batch_seconds_bucket", "up"}
    assert metric_names("label_values(egoline_stage_records_total, stage)") == {
        "egoline_stage_records_total",
        "stage",  # a label_values argument: the test below allows label names there
    }


def test_every_dashboard_query_uses_a_metric_the_code_registers() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = series_names(REGISTRY) | series_names(LagMetrics().registry) | PROMETHEUS_SERIES
    used: set[str] = set()
    for query in queries(dashboard):
        names = metric_names(query)
        if query.startswith("label_values("):
            names -= {query.rstrip(")").rsplit(",", 1)[1].strip()}
        assert names, f"no metric in {query!r}"
        unknown = names - known
        assert not unknown, f"{query!r} uses {sorted(unknown)}, which no service registers"
        used |= names
    # the panels the issue asks for
    for metric in (
        "kafka_consumergroup_group_sum_lag",
        "kafka_consumergroup_group_max_lag_seconds",
        "egoline_consumergroup_status",
        "egoline_stage_records_total",
        "egoline_stage_failures_total",
        "egoline_stage_batch_seconds_bucket",
    ):
        assert metric in used, f"no panel shows {metric}"


def test_prometheus_scrapes_the_lag_service_and_every_stage() -> None:
    config = PROMETHEUS.read_text()
    targets = set(re.findall(r'targets:\s*\["([^"]+)"\]', config))
    assert "lag:9308" in targets
    assert {f"{stage}:9400" for stage in STAGES} <= targets
