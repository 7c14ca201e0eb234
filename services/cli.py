"""The `egoline` command. It only composes: each package owns its commands in its `cli.py`
(stack, schemas, db and gc, manifest and lineage, agent, cache, lag, synth, bench, demo), and
`serve` picks which stage's app to run."""

from __future__ import annotations

from typing import Annotated

import typer

from services.agent import cli as agent_cli
from services.bench import cli as bench_cli
from services.common.settings import get_settings
from services.contracts import cli as contracts_cli
from services.demo import cli as demo_cli
from services.lag import cli as lag_cli
from services.manifest import cli as manifest_cli
from services.metadata import cli as metadata_cli
from services.reader import cli as reader_cli
from services.stack import cli as stack_cli
from services.synth import cli as synth_cli

app = typer.Typer(help="egoline: streaming ingestion for robotics video", no_args_is_help=True)

# --- services ----------------------------------------------------------------------------
SERVE_STAGES = ("decode", "validate", "shard", "metadata", "lag")


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
    import asyncio
    import logging
    import random
    import time

    from faststream import FastStream

    from services.common.scheduling import start_delay_s

    if stage not in SERVE_STAGES:
        raise typer.BadParameter(f"unknown stage {stage!r}; one of {', '.join(SERVE_STAGES)}")
    if group and stage != "lag":
        raise typer.BadParameter("--group applies to `serve lag` only")
    from services.common.redact import install_log_redaction

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = get_settings()
    install_log_redaction(settings)
    if stage == "lag":
        import signal
        import threading

        from services.lag.app import serve_lag

        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        serve_lag(settings, settings.metrics_port or 9308, group or [], stop)
        return
    # Staggered start: a fleet restarted together doesn't stampede the broker and object store.
    time.sleep(start_delay_s(settings.start_jitter_s, random.Random()))
    apps = {
        "decode": "services.decode.app",
        "validate": "services.validate.app",
        "shard": "services.shard.app",
        "metadata": "services.metadata.app",
    }
    import importlib

    from services.common.health import Liveness
    from services.common.metrics import serve_stage_http

    liveness = Liveness()
    serve_stage_http(settings.metrics_port, settings.metrics_host, stage, liveness)
    stream_app: FastStream = importlib.import_module(apps[stage]).build_app(settings)

    async def run() -> None:
        heartbeat = asyncio.create_task(liveness.beat_forever())
        try:
            await stream_app.run()
        finally:
            heartbeat.cancel()

    asyncio.run(run())


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
