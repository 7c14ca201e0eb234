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


# --- the whole fleet: `egoline up`, `status`, `down` --------------------------------------
@app.command("up")
def up(
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="run in the background; `egoline down` stops")
    ] = False,
    keep_stack: Annotated[
        bool, typer.Option(help="on stop, leave the embedded Kafka, Postgres and S3 running")
    ] = False,
    timeout_s: Annotated[float, typer.Option(help="--detach: wait this long for ready")] = 180.0,
    no_view: Annotated[
        bool, typer.Option("--no-view", help="log lines instead of the live view", hidden=True)
    ] = False,
) -> None:
    """Start the embedded stack (or use the configured endpoints) and the whole fleet —
    decode, validate, shard, metadata, lag — as supervised processes (restarted with backoff
    if one crashes; logs under <stack dir>/logs), with a live view. Ctrl-C or SIGTERM stops
    everything it started. Then `egoline agent watch DIR` is all a device needs."""
    import contextlib
    import signal
    import sys
    import time

    from services.common.serve import stop_on_signals
    from services.stack import up as fleet_up

    settings = get_settings()
    if detach:
        try:
            state = fleet_up.detach(
                settings, timeout_s, log=lambda line: err.print(f"[dim]up:[/] {line}")
            )
        except (RuntimeError, TimeoutError) as exc:
            err.print(f"[red]{exc}[/]")
            raise typer.Exit(1) from exc
        err.print(f"[green]up[/] page {state.url}; `egoline down` stops it")
        print_json_line(
            {
                "status": "up",
                "supervisor_pid": state.supervisor_pid,
                "url": state.url,
                "services": {n: r.pid for n, r in state.services.items()},
                "logs": state.log_dir,
            }
        )
        return
    stop = stop_on_signals()
    # A closed terminal (SIGHUP) stops everything too, the same way as Ctrl-C.
    signal.signal(signal.SIGHUP, lambda *_: stop.set())

    def log(line: str) -> None:
        # The terminal may be gone (SIGHUP): never let a log line abort the shutdown.
        with contextlib.suppress(OSError):
            err.print(f"[dim]{time.strftime('%H:%M:%S')} up:[/] {line}")

    if no_view or not sys.stderr.isatty():
        try:
            fleet_up.supervise(settings, stop, keep_stack=keep_stack, log=log)
        except fleet_up.AlreadyUp as exc:
            err.print(f"[red]{exc}[/]")
            raise typer.Exit(1) from exc
        return
    from rich.live import Live

    from services.stack.view import render

    last = 0.0
    with Live(console=err, refresh_per_second=2, transient=False) as live:

        def show(_state: object) -> None:
            nonlocal last
            if time.monotonic() - last >= 2.0:
                last = time.monotonic()
                with contextlib.suppress(OSError):
                    live.update(render(fleet_up.status(get_settings())))

        try:
            fleet_up.supervise(settings, stop, on_tick=show, keep_stack=keep_stack, log=log)
        except fleet_up.AlreadyUp as exc:
            err.print(f"[red]{exc}[/]")
            raise typer.Exit(1) from exc


@app.command("status")
def status(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON line")] = False,
) -> None:
    """What `egoline up` runs and what the warehouse holds: services, episodes per state,
    throughput, rejects by reason, lag per group."""
    from services.stack import up as fleet_up
    from services.stack.view import render

    doc = fleet_up.status(get_settings())
    if not as_json:
        err.print(render(doc))
    print_json_line(doc)


@app.command("down")
def down(
    timeout_s: Annotated[float, typer.Option(help="wait this long for a graceful stop")] = 60.0,
) -> None:
    """Stop what `egoline up` started: the fleet, then the embedded services it started."""
    from services.stack import up as fleet_up

    report = fleet_up.down(get_settings().stack_dir, timeout_s)
    if not report["stopped"]:
        err.print(f"nothing to stop: {report['reason']}")
    elif report["leftover"]:
        err.print(f"[red]still running:[/] {', '.join(report['leftover'])}")
    else:
        err.print(f"stopped: {', '.join([*report['services'], *report['stack']])}")
    print_json_line(report)
    if report["leftover"]:
        raise typer.Exit(1)
