"""Operator controls: ``remediator breaker status|reset --reason …`` and ``remediator approve INCIDENT``.

Where it sits: a leaf of the CLI, beside the executor. Both write the KV state every executor replica reads
(the breaker in the safety ledger ``safety.ledger``, approvals under ``approval.<incident>`` in
``remediator-state``) by compare-and-set (``remediator.kv``), and both leave an audit record naming the
person (``--actor``, default ``$USER``) and the reason. Every command takes ``--nats URL`` (``REMEDIATOR_NATS_URL``).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import sys
from typing import Any

import click

from remediator import bus
from remediator.audit import AuditLog
from remediator.contracts import utcnow
from remediator.kv import LostRace, json_documents
from remediator.run import RunLog
from remediator.safety import BreakerState, LedgerStore
from remediator.subjects import STATE_BUCKET, approval_key

_nats_option = click.option("--nats", "nats_url", envvar="REMEDIATOR_NATS_URL", required=True,
                            help="NATS server URL (env REMEDIATOR_NATS_URL).")
_actor_option = click.option("--actor", default=None, help="Who is acting, for the audit trail (default: $USER).")


def _actor(actor: str | None) -> str:
    if actor:
        return actor
    try:
        return f"human:{getpass.getuser()}"
    except Exception:  # no login name in a container: still say it was a person
        return "human:unknown"


async def _state(url: str) -> tuple[Any, Any, Any]:
    nc, js = await bus.connect(url, name="remediator-operator")
    return nc, js, await js.key_value(STATE_BUCKET)


async def breaker_status(url: str) -> dict[str, Any]:
    nc, _js, kv = await _state(url)
    try:
        ledger = await LedgerStore(kv).read()
        b = ledger.breaker
        return {"open": b.open, "tripped_at": b.tripped_at.isoformat() if b.tripped_at else None,
                "reason": b.reason, "recent_quarantines": len(b.quarantines),
                "reservations": len(ledger.reservations)}
    finally:
        await nc.close()


async def breaker_reset(url: str, reason: str, actor: str) -> dict[str, Any]:
    """Close the breaker (its quarantine count starts over); reservations are kept. Audited."""
    nc, js, kv = await _state(url)
    try:
        try:
            before = await LedgerStore(kv).reset_breaker()
        except LostRace as e:
            raise click.ClickException("the safety ledger kept changing; try again") from e
        await AuditLog(js, actor).append(None, "breaker_reset", reason, before=before.to_json(),
                                         after=BreakerState().to_json())
        return {"open": False, "was_open": before.open, "reason": reason, "actor": actor}
    finally:
        await nc.close()


async def approve_incident(url: str, incident: str, reason: str, actor: str) -> dict[str, Any]:
    """Record an approval of ``incident`` (idempotent: the first approval stands). Audited."""
    nc, js, kv = await _state(url)
    try:
        run, _ = await RunLog(kv).get(incident)
        approvals = json_documents(kv)
        key = approval_key(incident)
        existing = await approvals.get(key)
        if existing.value is not None:
            return {**existing.value, "already": True}
        body: dict[str, Any] = {"incident": incident, "by": actor, "reason": reason, "at": utcnow().isoformat()}
        try:
            await approvals.put(key, body, existing.revision)
        except LostRace:
            return {**((await approvals.get(key)).value or {}), "already": True}
        node = run.node if run is not None else None
        await AuditLog(js, actor).append(node, "approval", reason or "approved", incident=incident, after=body)
        return {**body, "already": False}
    finally:
        await nc.close()


def _emit(doc: dict[str, Any], as_json: bool, line: str) -> None:
    if as_json:
        click.echo(json.dumps(doc))
    else:
        click.echo(line, err=True)


@click.group()
def breaker() -> None:
    """The circuit breaker that stops quarantines during a storm."""


@breaker.command("status")
@_nats_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def status(nats_url: str, as_json: bool) -> None:
    """Show whether the breaker is open, since when and why."""
    doc = asyncio.run(breaker_status(nats_url))
    state = "OPEN" if doc["open"] else "closed"
    _emit(doc, as_json, f"breaker {state}" + (f" since {doc['tripped_at']}: {doc['reason']}" if doc["open"] else "")
          + f"; {doc['recent_quarantines']} recent quarantines")


@breaker.command("reset")
@_nats_option
@click.option("--reason", required=True, help="Why it is safe to resume (kept in the audit trail).")
@_actor_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def reset(nats_url: str, reason: str, actor: str | None, as_json: bool) -> None:
    """Close the breaker so quarantines resume."""
    if not reason.strip():
        click.echo("--reason must say why", err=True)
        sys.exit(2)
    doc = asyncio.run(breaker_reset(nats_url, reason, _actor(actor)))
    _emit(doc, as_json, "breaker closed" if doc["was_open"] else "breaker was not open; count reset")


@click.command("approve")
@click.argument("incident")
@_nats_option
@click.option("--reason", default="", help="Why (kept in the audit trail).")
@_actor_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def approve(incident: str, nats_url: str, reason: str, actor: str | None, as_json: bool) -> None:
    """Approve the steps of INCIDENT marked ``requires_approval``."""
    doc = asyncio.run(approve_incident(nats_url, incident, reason, _actor(actor)))
    _emit(doc, as_json, f"{incident} approved by {doc.get('by')}" + (" (already)" if doc.get("already") else ""))
