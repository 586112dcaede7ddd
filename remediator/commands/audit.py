"""``remediator audit list|show|verify|export``: reading the audit trail after an incident.

Where it sits: an operator tool over the AUDIT stream (DESIGN.md §8); read-only.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime
from typing import Any

import click

from remediator.audit import AuditQuery, iter_records, query, verify_chains
from remediator.contracts import AuditRecord
from remediator.settings import Settings


def _nats_url(nats_url: str | None) -> str:
    url = nats_url or Settings().nats_url
    if not url:
        raise click.UsageError("no NATS URL: pass --nats URL or set REMEDIATOR_NATS_URL")
    return url


async def _with_js(url: str, fn: Any) -> Any:
    import nats

    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=2)
    try:
        return await fn(nc.jetstream())
    finally:
        await nc.close()


def format_record(r: AuditRecord) -> str:
    gpu = f" gpu={r.gpu}" if r.gpu else ""
    inc = f" [{r.incident}]" if r.incident else ""
    return f"{r.time:%Y-%m-%dT%H:%M:%S.%fZ}"[:-4] + f"Z #{r.seq:<4} {r.node}{gpu}{inc} {r.what}: {r.why}"


_nats_opt = click.option("--nats", "nats_url", default=None, help="NATS URL (default REMEDIATOR_NATS_URL).")


@click.group()
def audit() -> None:
    """Review the audit trail: list, show an incident, verify the hash chains, export JSON Lines."""


@audit.command("list")
@_nats_opt
@click.option("--node", default=None)
@click.option("--gpu", default=None, help="GPU key (UUID, else PCI id).")
@click.option("--incident", default=None)
@click.option("--job", default=None)
@click.option("--fingerprint", default=None, help="Alertmanager fingerprint.")
@click.option("--since", type=click.DateTime(), default=None)
@click.option("--until", type=click.DateTime(), default=None)
@click.option("--json", "as_json", is_flag=True)
def list_(nats_url: str | None, node: str | None, gpu: str | None, incident: str | None, job: str | None,
          fingerprint: str | None, since: datetime | None, until: datetime | None, as_json: bool) -> None:
    """Records matching every given filter, in order."""
    from datetime import UTC

    q = AuditQuery(node=node, gpu=gpu, incident=incident, job=job, fingerprint=fingerprint,
                   since=since.replace(tzinfo=UTC) if since else None,
                   until=until.replace(tzinfo=UTC) if until else None)
    records: list[AuditRecord] = asyncio.run(_with_js(_nats_url(nats_url), lambda js: query(js, q)))
    if as_json:
        sys.stdout.write(json.dumps([r.model_dump(mode="json") for r in records]) + "\n")
    else:
        for r in records:
            click.echo(format_record(r))


@audit.command("show")
@_nats_opt
@click.argument("incident")
def show(nats_url: str | None, incident: str) -> None:
    """The timeline of one incident, with before/after of each step."""
    records: list[AuditRecord] = asyncio.run(
        _with_js(_nats_url(nats_url), lambda js: query(js, AuditQuery(incident=incident))))
    if not records:
        raise click.ClickException(f"no audit records for incident {incident}")
    for r in records:
        click.echo(format_record(r))
        for label, data in (("before", r.before), ("after", r.after)):
            if data:
                click.echo(f"    {label}: {json.dumps(data, sort_keys=True)[:400]}")


@audit.command("verify")
@_nats_opt
@click.option("--json", "as_json", is_flag=True)
def verify(nats_url: str | None, as_json: bool) -> None:
    """Check every chain's hashes and links; exit 1 when one is broken."""

    async def collect(js: Any) -> list[AuditRecord]:
        return [r async for r in iter_records(js)]

    reports = verify_chains(asyncio.run(_with_js(_nats_url(nats_url), collect)))
    if as_json:
        sys.stdout.write(json.dumps([r.__dict__ for r in reports]) + "\n")
    else:
        for rep in reports:
            click.echo(f"{rep.chain:<32} {rep.records:>6} records  {'ok' if rep.ok else 'BROKEN: ' + rep.problem}")
    if not all(r.ok for r in reports):
        sys.exit(1)


@audit.command("export")
@_nats_opt
@click.option("--node", default=None)
def export(nats_url: str | None, node: str | None) -> None:
    """Every record as JSON Lines on standard output."""

    async def dump(js: Any) -> None:
        async for r in iter_records(js, node):
            sys.stdout.write(r.model_dump_json() + "\n")

    asyncio.run(_with_js(_nats_url(nats_url), dump))
