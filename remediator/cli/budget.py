"""Operator view of the blast-radius budget: ``remediator budget list`` and ``remediator budget release``.

Where it sits: a leaf of the CLI, beside ``remediator.cli.operator``. Both read the safety ledger
(``safety.ledger`` in ``remediator-state``) that every executor replica books its reservations in; ``release``
removes one entry by compare-and-set (``remediator.safety.LedgerStore``) and leaves a ``settled`` audit record
naming the person (``--actor``, default ``$USER``) and the reason. What a reservation or a handover is, and how
the budget counts, is in ARCHITECTURE.md ("Lifecycle, budgets and the reconciler").
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from typing import Any

import click

from remediator.audit import AuditLog
from remediator.cli.operator import _actor, _actor_option, _nats_option, _state
from remediator.run import RunLog
from remediator.safety import Ledger, LedgerStore

__all__ = ["budget", "budget_list", "budget_release", "matching"]


def _entries(ledger: Ledger) -> list[tuple[str, str, Mapping[str, Any]]]:
    return [*(("reservation", k, v) for k, v in sorted(ledger.reservations.items())),
            *(("handover", k, v) for k, v in sorted(ledger.handovers.items()))]


def matching(ledger: Ledger, ref: str) -> list[tuple[str, str, Mapping[str, Any]]]:
    """The ledger entries ``ref`` names: a reservation key (``<node>|<gpu>``, ``<node>|`` for a node), an
    incident id, or a node name (every entry of that node)."""
    return [(subject, key, e) for subject, key, e in _entries(ledger)
            if ref in (key, e.get("incident"), e.get("node"))]


async def budget_list(url: str) -> dict[str, Any]:
    """Every reservation (with its run's status) and every handover in the ledger."""
    nc, _js, kv = await _state(url)
    try:
        ledger = await LedgerStore(kv).read()
        runs = RunLog(kv)
        reservations = []
        for key, r in sorted(ledger.reservations.items()):
            run, _ = await runs.get(str(r.get("incident")))
            reservations.append({"key": key, **dict(r),
                                 "run": (run.outcome or run.status) if run is not None else None})
        handovers = [{"key": key, **dict(h)} for key, h in sorted(ledger.handovers.items())]
        return {"reservations": reservations, "handovers": handovers}
    finally:
        await nc.close()


async def budget_release(url: str, ref: str, reason: str, actor: str) -> dict[str, Any]:
    """Release what ``ref`` names (see ``matching``) from the ledger; each removal audited with ``actor``.
    Releasing what is already gone changes nothing and says so."""
    nc, js, kv = await _state(url)
    try:
        store = LedgerStore(kv)
        audit = AuditLog(js, actor)
        released: list[dict[str, Any]] = []
        for subject, key, entry in matching(await store.read(), ref):
            incident = str(entry.get("incident"))
            if subject == "reservation":
                gone = await store.release(key, incident)
            else:
                gone = await store.settle_handover(key, incident)
            if gone is None:
                continue
            gpu = gone.get("gpu")
            await audit.append(str(gone.get("node")), "settled", f"{subject} {key} of {incident} released by "
                               f"{actor}: {reason}", incident=incident, gpu=str(gpu) if gpu else None,
                               actor=actor, after={"subject": subject, "key": key, "by": "operator",
                                                   "reason": reason, "entry": dict(gone)})
            released.append({"subject": subject, "key": key, **dict(gone)})
        return {"released": released, "reason": reason, "actor": actor}
    finally:
        await nc.close()


@click.group()
def budget() -> None:
    """Blast-radius budget reservations and handed-over targets."""


@budget.command("list")
@_nats_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def list_cmd(nats_url: str, as_json: bool) -> None:
    """List the reservations of running playbooks and the targets handed over to a person."""
    doc = asyncio.run(budget_list(nats_url))
    if as_json:
        click.echo(json.dumps(doc))
        return
    if not doc["reservations"] and not doc["handovers"]:
        click.echo("no reservations, nothing handed over", err=True)
    for r in doc["reservations"]:
        click.echo(f"reserved  {r['key']:<40} {r.get('kind', '?'):<4} pool {r.get('pool')} incident "
                   f"{r.get('incident')} since {r.get('at')} (run: {r.get('run') or 'none'})", err=True)
    for h in doc["handovers"]:
        click.echo(f"handed    {h['key']:<40} {h.get('kind', '?'):<4} pool {h.get('pool')} incident "
                   f"{h.get('incident')} {h.get('outcome')} at {h.get('at')}, left {h.get('left')}", err=True)


@budget.command("release")
@click.argument("reservation")
@_nats_option
@click.option("--reason", required=True, help="Why it is safe to release (kept in the audit trail).")
@_actor_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def release_cmd(reservation: str, nats_url: str, reason: str, actor: str | None, as_json: bool) -> None:
    """Release RESERVATION: a key as `budget list` shows it, an incident id, or a node name."""
    if not reason.strip():
        click.echo("--reason must say why", err=True)
        sys.exit(2)
    doc = asyncio.run(budget_release(nats_url, reservation, reason, _actor(actor)))
    if as_json:
        click.echo(json.dumps(doc))
    elif doc["released"]:
        for r in doc["released"]:
            click.echo(f"released {r['subject']} {r['key']} (incident {r.get('incident')})", err=True)
    else:
        click.echo(f"nothing in the ledger matches {reservation!r} (already released?)", err=True)
