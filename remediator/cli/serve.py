"""``remediator serve``: one service replica (HTTP ingest, handlers, executor) until SIGTERM/SIGINT.

Where it sits: the production entry point; builds ``Settings`` from the environment and the flags and runs
``remediator.service.Service``. It never loads the chaos package.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from typing import Any

import click

from remediator.settings import Settings


@click.command()
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, help="kubeconfig of the cluster.")
@click.option("--nats", "nats_url", default=None, help="NATS URL (default: REMEDIATOR_NATS_URL, else embedded).")
@click.option("--http", "http", default=None, help="HOST:PORT for the HTTP API (default 127.0.0.1:8080).")
@click.option("--dry-run", is_flag=True, default=None, help="Record what would be done; touch nothing.")
@click.option("--data-dir", default=None, help="Persistent JetStream store for the embedded nats-server.")
@click.option("--log-level", default="INFO", show_default=True)
def serve(kubeconfig: str | None, nats_url: str | None, http: str | None, dry_run: bool | None,
          data_dir: str | None, log_level: str) -> None:
    """Run the service: ingest, handlers and executor against one cluster."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format='{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}')
    given = {"kubeconfig": kubeconfig, "nats_url": nats_url, "http": http, "dry_run": dry_run, "data_dir": data_dir}
    overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    try:
        settings = Settings(**overrides)
    except Exception as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        import uvloop

        uvloop.run(_serve(settings))
    except ImportError:  # uvloop is optional (uvicorn[standard] brings it); asyncio's loop works too
        asyncio.run(_serve(settings))


async def _serve(settings: Settings) -> None:
    from remediator.service import Service

    service = Service(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(service.stop()))
    await service.start()
    # Everything allocated so far lives for the whole process: keep it out of the collector's way
    # (full collections cost about 15 % of the ingest path's CPU otherwise).
    gc.collect()
    gc.freeze()
    click.echo(f"remediator serving on {service.http_url}, bus {service.nats_url}", err=True)
    try:
        await service.wait()
    finally:
        await service.stop()
