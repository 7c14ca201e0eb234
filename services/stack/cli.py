"""`egoline stack ...`: bring the embedded stack up, probe it, measure the broker, stop it."""

from __future__ import annotations

from typing import Annotated

import typer

from services.common.output import err, print_json_line
from services.common.settings import get_settings

app = typer.Typer()
stack_app = typer.Typer(
    help="The embedded stack (Tansu, PostgreSQL, moto S3)", no_args_is_help=True
)
app.add_typer(stack_app, name="stack")


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
    status = {
        n: {"ok": h.ok, "endpoint": h.endpoint, "detail": h.detail} for n, h in report.items()
    }
    if not as_json:
        for name, h in report.items():
            mark = "[green]ok[/]" if h.ok else "[red]down[/]"
            err.print(f"{mark} {name:9} {h.endpoint or '-'} {h.detail}")
    print_json_line({"status": status})
    if not all(h.ok for h in report.values()):
        raise typer.Exit(1)


@stack_app.command("check-broker")
def stack_check_broker(
    groups: Annotated[bool, typer.Option(help="also the group-rejoin check (up to 30 s)")] = False,
) -> None:
    """Measure the broker's deviations from Apache Kafka (see docs/stack.md)."""
    from services.stack.broker_check import check_broker

    print_json_line(check_broker(get_settings(), groups=groups))


@stack_app.command("down")
def stack_down() -> None:
    """Stop only the processes `stack up` started."""
    from services.stack.launcher import Stack

    stopped = Stack(get_settings().stack_dir).down()
    err.print(f"stopped: {', '.join(stopped) or 'nothing'}")
