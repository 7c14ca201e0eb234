"""`egoline demo`: the whole pipeline end to end on the embedded stack, in one command."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from services.common.output import err, print_json_line
from services.common.settings import get_settings

app = typer.Typer()


@app.command("demo")
def demo(
    episodes: Annotated[int, typer.Option(min=1)] = 20,
    seed: int = 0,
    timeout_s: Annotated[float, typer.Option(help="give up waiting after this long")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="print only the JSON line")] = False,
) -> None:
    """Bring up the stack, synthesize episodes, run every service, upload, catalog, manifest."""
    from dataclasses import asdict

    from rich.table import Table

    from services.common.settings import reset_settings_cache
    from services.demo.run import run_demo
    from services.stack.provision import stack_up as bring_up

    base = get_settings()
    bring_up(base, log=lambda line: err.print(f"[dim]stack:[/] {line}"))
    reset_settings_cache()
    settings = get_settings()
    result = run_demo(settings, episodes, seed, settings.stack_dir / "demo", timeout_s)
    if not as_json:
        table = Table(title="egoline demo")
        table.add_column("what")
        table.add_column("value", justify="right")
        for key, value in asdict(result).items():
            table.add_row(key, str(value))
        Console().print(table)
        err.print("the stack keeps running for inspection; `egoline stack down` stops it")
    print_json_line(asdict(result))
    if result.cataloged != result.episodes:
        raise typer.Exit(1)
