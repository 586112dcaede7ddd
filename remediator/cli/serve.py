"""``remediator serve``: one service replica (HTTP ingest, handlers, executor) until SIGTERM/SIGINT.

Where it sits: the production entry point; builds ``Settings`` from the environment and the flags and runs
``remediator.service.Service``. It never loads the chaos package.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import time
from typing import Any

import click

from remediator import eventloop, heap
from remediator.cli.edges import load_settings
from remediator.settings import Settings

_RECANCEL_S = 0.5  # how often a stop signal's cancel is repeated until serve took it


@click.command()
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, help="kubeconfig of the cluster.")
@click.option("--nats", "nats_url", default=None, help="NATS URL (default: REMEDIATOR_NATS_URL, else embedded).")
@click.option("--http", "http", default=None, help="HOST:PORT for the HTTP API (default 127.0.0.1:8080).")
@click.option("--dry-run", is_flag=True, default=None, help="Record what would be done; touch nothing.")
@click.option("--data-dir", default=None,
              help="Persistent store of the embedded nats-server: JetStream and its operator, account and role "
                   "credentials (DIR/identity, mode 0600).")
@click.option("--nats-port", type=click.IntRange(1, 65535), default=None,
              help="Port of the embedded nats-server (default: a free one).")
@click.option("--insecure-no-auth", is_flag=True, default=None,
              help="Serve /v1/* without bearer tokens (development only; said at every start and in /readyz).")
@click.option("--log-level", default="INFO", show_default=True)
def serve(kubeconfig: str | None, nats_url: str | None, http: str | None, dry_run: bool | None,
          data_dir: str | None, nats_port: int | None, insecure_no_auth: bool | None, log_level: str) -> None:
    """Run the service: ingest, handlers and executor against one cluster."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format='{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}')
    given = {"kubeconfig": kubeconfig, "nats_url": nats_url, "http": http, "dry_run": dry_run, "data_dir": data_dir,
             "nats_port": nats_port, "insecure_no_auth": insecure_no_auth}
    overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    settings = load_settings(**overrides)
    _check_tokens(settings)
    eventloop.run(_serve(settings))


def _check_tokens(settings: Settings) -> None:
    """Refuse to serve an open API by accident: tokens must be configured (and parse), or
    ``--insecure-no-auth`` given, which is then said at every start."""
    from remediator.ingest.auth import ApiTokens, TokenConfigError

    try:
        tokens = ApiTokens.from_settings(settings.api_tokens, settings.api_tokens_file)
    except TokenConfigError as e:
        raise click.UsageError(str(e)) from None
    if tokens and settings.insecure_no_auth:
        raise click.UsageError("--insecure-no-auth and API tokens exclude each other: drop one")
    if not tokens and not settings.insecure_no_auth:
        raise click.UsageError("no API tokens: set REMEDIATOR_API_TOKENS (TOKEN or SCOPE:TOKEN, comma-separated) or "
                               "REMEDIATOR_API_TOKENS_FILE, or pass --insecure-no-auth (development only)")
    if not tokens:
        click.echo("WARNING: HTTP authentication is off (--insecure-no-auth): anyone who reaches the API can post "
                   "faults", err=True)


async def _freeze_once_nodes_listed(service: Any) -> None:
    """Freeze the heap again once the node cache's first list is in, when start-up did not wait that long
    (100,000 nodes take longer than its 5 s): the cache lives as long as the process, and each full pass of
    the cyclic collector over it would stop the event loop for a second or more. ``gc.freeze`` alone is
    cheap; no collection runs here."""
    cache = getattr(service.kube.sync, "node_cache", None) if service.kube is not None else None
    if cache is None or cache.synced:
        return
    while not await asyncio.to_thread(cache.wait_synced, 1.0):  # a second at most in a thread at shutdown
        pass
    gc.freeze()
    logging.getLogger("remediator.serve").info("node cache listed: heap frozen")


async def _serve(settings: Settings) -> None:
    """Run one replica until SIGTERM/SIGINT. The first signal cancels whatever runs (starting included:
    connecting to a NATS that is away) and stops every part within ``shutdown_timeout_s``; past that, or on
    a second signal, the embedded nats-server is killed and the process exits at once (status 1).

    The handlers are installed before anything else (importing the service takes a second or more, and a
    signal then went to asyncio's own handler), and the cancel is repeated until this coroutine took it: a
    library may swallow one (eventloop: 3.11's ``wait_for``)."""
    log = logging.getLogger("remediator.serve")
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    stopping: list[float] = []
    taken: list[bool] = []  # the cancel reached this coroutine: stopping runs
    services: list[Any] = []  # the Service, once imported and made

    def force_exit(why: str) -> None:
        log.error("%s; exiting now", why)
        if services and services[0].nats is not None:  # never orphan the embedded server
            services[0].nats.kill()
        os._exit(1)

    def cancel_until_taken() -> None:
        if not taken and not main_task.done():
            main_task.cancel()
            loop.call_later(_RECANCEL_S, cancel_until_taken)

    def on_signal(sig: signal.Signals) -> None:
        if stopping:
            force_exit(f"second {sig.name}")
        stopping.append(time.monotonic())
        log.info("%s: stopping (at most %gs)", sig.name, settings.shutdown_timeout_s)
        loop.call_later(settings.shutdown_timeout_s, force_exit,
                        f"not stopped within shutdown_timeout_s={settings.shutdown_timeout_s:g}s")
        cancel_until_taken()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    from remediator.bus import redact_url
    from remediator.service import Service

    service = Service(settings)
    services.append(service)
    freezer: asyncio.Task[None] | None = None
    try:
        await service.start()
        # Everything allocated so far lives for the whole process: keep it out of the collector's way
        # (full collections cost about 15 % of the ingest path's CPU otherwise), and collect less often.
        heap.settle()
        freezer = asyncio.create_task(_freeze_once_nodes_listed(service), name="gc-freeze")
        click.echo(f"remediator serving on {service.http_url}, bus {redact_url(service.nats_url)}", err=True)
        await service.wait()
    except asyncio.CancelledError:
        if not stopping:
            raise
    finally:
        taken.append(True)
        if freezer is not None:
            freezer.cancel()
        await service.stop()
        if stopping:
            click.echo(f"remediator stopped {time.monotonic() - stopping[0]:.1f}s after the signal", err=True)
