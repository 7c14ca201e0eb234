"""`egoline up`'s live terminal view: a pure rendering of the `egoline status` document."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

STATE_STYLE = {"running": "green", "starting": "yellow", "backoff": "red", "stopped": "dim"}
LAG_STYLE = {"OK": "green", "WARN": "yellow", "UNKNOWN": "dim"}


def _services(doc: dict[str, Any]) -> Table:
    table = Table(title="services", title_justify="left", expand=False)
    for col in ("service", "state", "pid", "restarts", "last exit"):
        table.add_column(col)
    for name, svc in doc.get("services", {}).items():
        state = str(svc["state"])
        table.add_row(
            name,
            Text(state, style=STATE_STYLE.get(state, "")),
            str(svc["pid"] or "-"),
            str(svc["restarts"]),
            "-" if svc["last_exit"] is None else str(svc["last_exit"]),
        )
    return table


def _episodes(doc: dict[str, Any]) -> RenderableType:
    if "warehouse_error" in doc:
        return Text(f"warehouse: {doc['warehouse_error']}", style="red")
    table = Table(title="episodes", title_justify="left")
    counts = {k: v for k, v in doc.get("episodes", {}).items() if v}
    for state in counts or {"(none yet)": 0}:
        table.add_column(state, justify="right")
    table.add_row(*(f"{n:,}" for n in counts.values()) if counts else ("",))
    return table


def _throughput(doc: dict[str, Any]) -> Text:
    tp = doc.get("throughput")
    if not tp:
        return Text("")
    return Text(
        f"sharded in the last {tp['window_s']} s: {tp['episodes_per_min']:.0f} episodes/min, "
        f"{tp['video_hours_per_hour']:.2f} h of video per hour"
    )


def _rejects(doc: dict[str, Any]) -> RenderableType:
    rejects = doc.get("rejects") or {}
    if not rejects:
        return Text("rejects: none", style="dim")
    table = Table(title="rejects by reason", title_justify="left")
    table.add_column("reason")
    table.add_column("episodes", justify="right")
    for reason, n in rejects.items():
        table.add_row(reason, f"{n:,}")
    return table


def _lag(doc: dict[str, Any]) -> RenderableType:
    lag = doc.get("lag") or {}
    if "error" in lag:
        return Text(f"lag: {lag['error']}", style="yellow")
    table = Table(title="consumer lag", title_justify="left")
    for col in ("group", "lag", "seconds behind", "status"):
        table.add_column(col)
    for group, entry in lag.items():
        status = str(entry.get("status"))
        seconds = entry.get("lag_seconds")
        table.add_row(
            group,
            str(entry.get("lag")),
            "-" if seconds is None else f"{seconds:.1f}",
            Text(status, style=LAG_STYLE.get(status, "red")),
        )
    return table


def render(doc: dict[str, Any]) -> RenderableType:
    url = doc.get("url")
    pages = f"{url} (corpus: {url}corpus)" if url else "-"
    head = Text.assemble(
        ("egoline up", "bold"),
        f"  page {pages}  uptime {doc.get('uptime_s', 0):.0f}s  ",
        ("Ctrl-C stops everything", "dim"),
    )
    return Group(head, _services(doc), _episodes(doc), _throughput(doc), _rejects(doc), _lag(doc))
