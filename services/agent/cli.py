"""`egoline agent ...`: the device upload agent (one-shot upload, watch loop, queue status)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from services.common.output import err, print_json_line
from services.common.settings import get_device_settings

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

    from services.agent.runner import Agent
    from services.agent.runner import Progress as AgentProgress

app = typer.Typer()
agent_app = typer.Typer(help="The device upload agent", no_args_is_help=True)
app.add_typer(agent_app, name="agent")


def _agent_progress(progress: RichProgress) -> AgentProgress:
    """Wire the agent's callbacks to a rich progress display: one bar per file, one total."""
    from services.agent.runner import Progress

    total = progress.add_task("total", total=0)
    tasks: dict[str, TaskID] = {}

    def start(queue_id: str, size: int) -> None:
        tasks[queue_id] = progress.add_task(Path(queue_id).name[:28], total=size)
        progress.update(total, total=(progress.tasks[total].total or 0) + size)

    def advance(queue_id: str, n: int) -> None:
        progress.advance(tasks[queue_id], n)
        progress.advance(total, n)

    def done(queue_id: str, state: str, why: str | None) -> None:
        if why:
            err.print(f"[yellow]{state}[/] {Path(queue_id).name}: {why}")

    return Progress(start, advance, done)


def _transfer_progress() -> RichProgress:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    return Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
    )


def _agent(progress: AgentProgress) -> Agent:
    from services.agent.runner import make_agent
    from services.common.objectstore import object_store

    settings = get_device_settings()
    return make_agent(settings, object_store(settings), progress)


@agent_app.command("upload")
def agent_upload(
    paths: Annotated[list[Path], typer.Argument(help="episode folders, or folders of them")],
    publish_timeout_s: Annotated[float, typer.Option(help="wait this long for Kafka")] = 60.0,
) -> None:
    """Upload finished episodes and announce each on `episodes.uploaded` (one shot)."""
    from services.agent.recordings import find_ready

    dirs: list[Path] = []
    for path in paths:
        dirs += find_ready(path, "marker", 0, 0)
    with _transfer_progress() as bars:
        agent = _agent(_agent_progress(bars))
        counts = agent.run_once(dirs, publish_timeout_s)
    print_json_line({"queued": len(dirs), **counts, "parts_resent": agent.journal.parts_resent()})
    if counts.get("failed") or counts.get("retry") or counts.get("uploaded"):
        raise typer.Exit(1)


@agent_app.command("watch")
def agent_watch(directory: Annotated[Path, typer.Argument(help="where recordings appear")]) -> None:
    """Upload every finished recording that appears under DIR until SIGTERM/SIGINT."""
    from services.common.serve import stop_on_signals

    stop = stop_on_signals()
    with _transfer_progress() as bars:
        agent = _agent(_agent_progress(bars))
        agent.watch(directory, stop)
    print_json_line(agent.journal.counts())


@agent_app.command("status")
def agent_status(
    as_json: Annotated[bool, typer.Option("--json", help="print only the JSON line")] = False,
) -> None:
    """The agent's queue: pending, uploading, published, failed (with reasons)."""
    from rich.table import Table

    from services.agent.journal import Journal

    journal = Journal(get_device_settings().agent.state_dir / "journal.sqlite")
    rows = journal.episodes()
    if not as_json:
        table = Table(title="egoline agent")
        for column in ("episode folder", "state", "bytes", "reason"):
            table.add_column(column)
        for row in rows:
            table.add_row(
                Path(row.directory).name, row.state, str(row.bytes_total), row.reason or ""
            )
        Console(stderr=True).print(table)
    print_json_line(
        {
            "counts": journal.counts(),
            "parts_resent": journal.parts_resent(),
            "episodes": [
                {"folder": r.directory, "state": r.state, "reason": r.reason} for r in rows
            ],
        }
    )
