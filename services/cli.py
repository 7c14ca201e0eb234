"""The `egoline` command. It only composes: each package owns its commands in its `cli.py`
(stack, schemas, db and gc, manifest and lineage, agent, cache, lag, synth, bench, demo), and
`serve` picks which stage's app to run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from services.agent import cli as agent_cli
from services.bench import cli as bench_cli
from services.common.settings import Settings, get_settings
from services.contracts import cli as contracts_cli
from services.demo import cli as demo_cli
from services.lag import cli as lag_cli
from services.manifest import cli as manifest_cli
from services.metadata import cli as metadata_cli
from services.reader import cli as reader_cli
from services.stack import cli as stack_cli
from services.synth import cli as synth_cli

if TYPE_CHECKING:
    import threading

    from faststream import FastStream

app = typer.Typer(help="egoline: streaming ingestion for robotics video", no_args_is_help=True)

# --- the stage services ------------------------------------------------------------------
# Imported only for the stage `serve` runs: each pulls in PyAV, faststream or the warehouse.
STAGE_APPS = {
    "decode": "services.decode.app",
    "validate": "services.validate.app",
    "shard": "services.shard.app",
    "metadata": "services.metadata.app",
}
SERVE_STAGES = (*STAGE_APPS, "lag")


@app.command("serve")
def serve(
    stage: Annotated[str, typer.Argument(help="decode | validate | shard | metadata | lag")],
    group: Annotated[
        list[str] | None,
        typer.Option(help="lag only: more consumer groups to watch besides the pipeline's"),
    ] = None,
) -> None:
    """Run one pipeline service (its own consumer group) until SIGTERM/SIGINT; it serves
    /metrics, /healthz and /readyz on EGOLINE_METRICS_PORT (docs/metrics.md)."""
    import importlib

    from services.common.serve import run_service, run_threaded_service

    if stage not in SERVE_STAGES:
        raise typer.BadParameter(f"unknown stage {stage!r}; one of {', '.join(SERVE_STAGES)}")
    if group and stage != "lag":
        raise typer.BadParameter("--group applies to `serve lag` only")
    settings = get_settings()
    if stage == "lag":

        def serve_lag_until(stop: threading.Event) -> None:
            from services.lag.app import serve_lag
            from services.stack.corpus import corpus_reader

            # the corpus view's panels read the warehouse; without one they answer an error
            corpus = corpus_reader(settings)
            try:
                port = settings.metrics_port or 9308
                serve_lag(settings, port, group or [], stop, corpus.panels())
            finally:
                corpus.close()

        run_threaded_service(settings, serve_lag_until)
        return

    def build_app(stage_settings: Settings) -> FastStream:
        module = importlib.import_module(STAGE_APPS[stage])
        stream_app: FastStream = module.build_app(stage_settings)
        return stream_app

    run_service(settings, stage, build_app)


# Each package's commands and groups, merged at the top level in this order (`egoline --help`).
for package_app in (
    synth_cli.app,
    manifest_cli.app,
    lag_cli.app,
    demo_cli.app,
    stack_cli.app,
    contracts_cli.app,
    metadata_cli.app,
    agent_cli.app,
    reader_cli.app,
    bench_cli.app,
):
    app.add_typer(package_app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
