"""``remediator bus init``: declare the streams, KV buckets and consumers of DESIGN.md §4 (idempotent).

Where it sits: the one provisioning step. ``serve`` runs the same ``bus.provision`` in development; in
production an operator (or a Helm hook) runs this command once per change, so no pod start mutates the bus.
"""

from __future__ import annotations

import asyncio
import json

import click

from remediator.settings import Settings


@click.group()
def bus() -> None:
    """The NATS JetStream layout the service runs on."""


@bus.command("init")
@click.option("--nats", "nats_url", default=None, metavar="URL",
              help="NATS server URL(s), comma-separated (default: $REMEDIATOR_NATS_URL).")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(1, 5),
              help="Stream replicas: 1 on a single server, 3 on a production NATS cluster.")
@click.option("--json", "as_json", is_flag=True, help="Print the list of changes as one JSON document.")
def init(nats_url: str | None, replicas: int, as_json: bool) -> None:
    """Create or update the FAULTS, REMEDIATIONS, AUDIT and DEADLETTER streams, the KV buckets and the
    durable consumers. Running it again changes nothing and prints nothing new."""
    settings = Settings()
    url = nats_url or settings.nats_url
    if not url:
        raise click.UsageError("no NATS server: pass --nats URL or set REMEDIATOR_NATS_URL")
    try:
        changes = asyncio.run(_init(url, settings, replicas))
    except Exception as e:
        raise click.ClickException(f"provisioning {url} failed: {type(e).__name__}: {e}") from e
    if as_json:
        click.echo(json.dumps(changes))
        return
    for line in changes:
        click.echo(line)
    click.echo(f"bus at {url}: " + (f"{len(changes)} change(s)" if changes else "already up to date"), err=True)


async def _init(url: str, settings: Settings, replicas: int) -> list[str]:
    from remediator import bus as bus_mod

    nc, js = await bus_mod.connect(url, name="remediator-bus-init", max_reconnect_attempts=0,
                                   allow_reconnect=False)
    try:
        return await bus_mod.provision(js, settings, replicas=replicas)
    finally:
        await nc.close()
