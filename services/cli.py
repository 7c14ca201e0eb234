"""The `egoline` command. Thin: every command delegates to the package that owns the work."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from services.common.settings import get_settings

app = typer.Typer(help="egoline: streaming ingestion for robotics video", no_args_is_help=True)
stack_app = typer.Typer(help="The embedded stack (Tansu, PostgreSQL, moto S3)", no_args_is_help=True)
schemas_app = typer.Typer(help="Event schemas", no_args_is_help=True)
db_app = typer.Typer(help="The Postgres warehouse", no_args_is_help=True)
manifest_app = typer.Typer(help="Manifests: build, inspect", no_args_is_help=True)
agent_app = typer.Typer(help="The device upload agent", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
app.add_typer(schemas_app, name="schemas")
app.add_typer(db_app, name="db")
app.add_typer(manifest_app, name="manifest")
app.add_typer(agent_app, name="agent")

err = Console(stderr=True)


def print_json_line(payload: object) -> None:
    """The one JSON line every measuring command prints last."""
    sys.stdout.write(json.dumps(payload, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


# --- stack -------------------------------------------------------------------------------
@stack_app.command("up")
def stack_up() -> None:
    """Start what is not configured, wait until usable, create topics, bucket and tables."""
    from services.stack.provision import stack_up as bring_up

    report = bring_up(get_settings(), log=lambda line: err.print(f"[dim]stack:[/] {line}"))
    for name, h in report.items():
        err.print(f"[green]ok[/] {name:9} {h.endpoint}")


@stack_app.command("status")
def stack_status(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON line")] = False,
) -> None:
    """Probe each service with a real round trip."""
    from services.stack import health

    report = health.check(get_settings())
    status = {n: {"ok": h.ok, "endpoint": h.endpoint, "detail": h.detail} for n, h in report.items()}
    if not as_json:
        for name, h in report.items():
            mark = "[green]ok[/]" if h.ok else "[red]down[/]"
            err.print(f"{mark} {name:9} {h.endpoint or '-'} {h.detail}")
    print_json_line({"status": status})
    if not all(h.ok for h in report.values()):
        raise typer.Exit(1)


@stack_app.command("down")
def stack_down() -> None:
    """Stop only the processes `stack up` started."""
    from services.stack.launcher import Stack

    stopped = Stack(get_settings().stack_dir).down()
    err.print(f"stopped: {', '.join(stopped) or 'nothing'}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
