"""`egoline schemas export`: regenerate the committed JSON Schemas and the AsyncAPI document."""

from __future__ import annotations

from pathlib import Path

import typer

from services.common.output import err

app = typer.Typer()
schemas_app = typer.Typer(help="Event schemas", no_args_is_help=True)
app.add_typer(schemas_app, name="schemas")


@schemas_app.command("export")
def schemas_export() -> None:
    """Regenerate the committed JSON Schemas and the AsyncAPI document."""
    from schemas.compat import export
    from services.contracts.asyncapi import write_asyncapi

    for path in export():
        err.print(f"wrote {path}")
    err.print(f"wrote {write_asyncapi(Path('docs/asyncapi.json'))}")
