"""`egoline lag`: consumer lag per group and partition, read from the broker, with Burrow's
status; `egoline serve lag` is the long-running form (services/lag/app.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from services.common.output import err, print_json_line
from services.common.settings import get_settings

app = typer.Typer()


@app.command("lag")
def lag(
    group: Annotated[
        list[str] | None, typer.Option(help="more groups besides the pipeline's")
    ] = None,
    samples: Annotated[int, typer.Option(min=1, help="readings to take")] = 3,
    interval_s: Annotated[float, typer.Option(help="seconds between readings")] = 2.0,
    watch: Annotated[bool, typer.Option(help="keep reading and redrawing until Ctrl-C")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="only the JSON line on stdout")] = False,
) -> None:
    """Consumer lag per group and partition, in messages and seconds, with Burrow's status."""
    import time

    from rich.live import Live
    from rich.table import Table

    from services.lag.collector import OffsetReader, StatusReader
    from services.lag.monitor import LagMonitor, LagReport, report_json, watched_groups

    def render(report: LagReport) -> Table:
        table = Table(title="egoline lag")
        for column in ("group", "topic", "partition", "committed", "end", "lag", "lag s", "status"):
            table.add_column(column)
        for name, entry in report.items():
            for p in entry.partitions:
                table.add_row(
                    name,
                    p.topic,
                    str(p.partition),
                    "never" if p.never_committed else str(p.committed),
                    str(p.end),
                    str(p.lag),
                    str(p.lag_seconds),
                    p.status.name,
                )
            table.add_row(name, "", "", "", "", str(entry.total_lag), "", entry.status.name)
            if entry.reason:
                table.add_row(name, f"[red]{entry.reason}[/red]", *[""] * 6)
        return table

    settings = get_settings()
    reader, status_reader = OffsetReader(settings), StatusReader(settings)
    groups = watched_groups(group)
    monitor = LagMonitor(groups=tuple(groups))
    report: LagReport = {}
    try:
        with Live(console=err, auto_refresh=False, transient=as_json) as live:
            taken = 0
            while watch or taken < samples:
                monitor.observe(reader.read(groups))
                monitor.observe_status(status_reader.read())
                taken += 1
                report = monitor.report(time.time())
                live.update(render(report), refresh=True)
                if watch or taken < samples:
                    time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
        status_reader.close()
    print_json_line({"groups": report_json(report)})
