"""Operator controls: ``remediator breaker status|reset --reason …`` and ``remediator approve INCIDENT``.

Where it sits: a leaf of the CLI, beside the executor. Both write the KV state every executor replica reads
(the breaker in the safety ledger ``safety.ledger``, approvals under ``approval.<incident>`` in
``remediator-state``) by compare-and-set (``remediator.kv``), and both leave an audit record naming the
person and the reason: for a breaker reset ``--actor`` (default ``$USER``); for an approval the identity
the NATS server authenticated (``nats_identity``), never a name given on the command line. ``approve``
refuses an unknown incident, a finished run and an incident already approved. Every command takes
``--nats URL`` (``REMEDIATOR_NATS_URL``).
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
from remediator.signing import Signer, SigningKeyError, load_signer
from remediator.subjects import STATE_BUCKET, approval_key

_nats_option = click.option("--nats", "nats_url", envvar="REMEDIATOR_NATS_URL", required=True,
                            help="NATS server URL (env REMEDIATOR_NATS_URL).")
_creds_option = click.option(
    "--creds", default=None, metavar="FILE", envvar="REMEDIATOR_NATS_CREDS_FILE",
    type=click.Path(dir_okay=False, exists=True),
    help="The operator's NATS .creds file (env REMEDIATOR_NATS_CREDS_FILE); needed on a server with auth.")
_actor_option = click.option("--actor", default=None, help="Who is acting, for the audit trail (default: $USER).")


def _actor(actor: str | None) -> str:
    if actor:
        return actor
    try:
        return f"human:{getpass.getuser()}"
    except Exception:  # no login name in a container: still say it was a person
        return "human:unknown"


def operator_signer(creds: str | None = None) -> Signer | None:
    """The key an operator's audit records are signed with: ``signing_seed_file`` when set, else the seed of
    the operator's NATS ``creds``; None (unsigned, which ``audit verify`` reports) when neither is given.
    Its public key belongs in ``REMEDIATOR_AUDIT_TRUST_KEYS``."""
    from remediator.settings import Settings

    path = Settings().signing_seed_file or creds
    if not path:
        click.echo("warning: no signing key (REMEDIATOR_SIGNING_SEED_FILE or NATS creds): this audit record is "
                   "unsigned and `audit verify` will report it", err=True)
        return None
    try:
        return load_signer(path)
    except SigningKeyError as e:
        raise click.ClickException(str(e)) from None


async def _state(url: str, creds: str | None = None) -> tuple[Any, Any, Any]:
    # through bus.Credentials, so the connection also takes the role's own reply inbox from the creds file
    opts: dict[str, Any] = {"credentials": bus.Credentials(creds_file=creds)} if creds else {}
    # Bounded, one line on failure (remediator.cli.edges); a bus without the bucket names `bus init`.
    from nats.js.errors import NotFoundError

    from remediator.errors import SetupError
    from remediator.settings import Settings

    nc, js = await bus.connect_within(url, Settings().startup_timeout_s, name="remediator-operator", quiet=True,
                                      **opts)
    try:
        return nc, js, await js.key_value(STATE_BUCKET)
    except NotFoundError as e:
        await nc.close()
        raise SetupError(f"no KV bucket {STATE_BUCKET} on {url}; run `remediator bus init` against it") from e
    except BaseException:
        await nc.close()
        raise


async def breaker_status(url: str, creds: str | None = None) -> dict[str, Any]:
    nc, _js, kv = await _state(url, creds)
    try:
        ledger = await LedgerStore(kv).read()
        b = ledger.breaker
        return {"open": b.open, "tripped_at": b.tripped_at.isoformat() if b.tripped_at else None,
                "reason": b.reason, "recent_quarantines": len(b.quarantines),
                "reservations": len(ledger.reservations), "handovers": len(ledger.handovers)}
    finally:
        await nc.close()


async def breaker_reset(url: str, reason: str, actor: str, creds: str | None = None) -> dict[str, Any]:
    """Close the breaker (its quarantine count starts over); reservations are kept. Audited."""
    nc, js, kv = await _state(url, creds)
    try:
        try:
            before = await LedgerStore(kv).reset_breaker()
        except LostRace as e:
            raise click.ClickException("the safety ledger kept changing; try again") from e
        await AuditLog(js, actor, signer=operator_signer(creds)).append(
            None, "breaker_reset", reason, before=before.to_json(), after=BreakerState().to_json())
        return {"open": False, "was_open": before.open, "reason": reason, "actor": actor}
    finally:
        await nc.close()


class ApprovalRefused(click.ClickException):
    """``approve`` of an incident that has no run waiting, or that someone already decided."""


async def nats_identity(nc: Any, creds: str | None = None) -> str:
    """Who the server authenticated this connection as: ``nats:<account>/<user>`` from the server's own
    ``$SYS.REQ.USER.INFO`` answer (``anonymous`` on a server without users), with the user JWT's ``name``
    claim when ``creds`` holds the JWT of that very user. Never a name the caller chose."""
    try:
        reply = await nc.request("$SYS.REQ.USER.INFO", b"", timeout=2.0)
        data = json.loads(reply.data).get("data") or {}
    except Exception as e:  # an old server or a permission that forbids it: no identity, no approval
        raise click.ClickException(f"the NATS server did not say who this connection is ({e!r}); "
                                   "an approval needs an authenticated identity") from None
    account = str(data.get("account_name") or data.get("account") or "?")
    user = str(data.get("user") or "anonymous")
    if creds:
        name = _jwt_name(creds, user)
        if name:
            return f"nats:{account}/{name}"
    return f"nats:{account}/{user}"


def _jwt_name(creds: str, user: str) -> str | None:
    """The ``name`` of the user JWT in the ``creds`` file when its subject is ``user`` (the key the server
    authenticated), else None."""
    import base64
    import re
    from pathlib import Path

    text = Path(creds).read_text()
    m = re.search(r"-----BEGIN NATS USER JWT-----\s*(\S+)\s*------END NATS USER JWT------", text)
    if m is None:
        return None
    try:
        payload = m.group(1).split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return None
    return str(claims.get("name")) if claims.get("sub") == user and claims.get("name") else None


async def approve_incident(url: str, incident: str, reason: str, *, creds: str | None = None) -> dict[str, Any]:
    """Record an approval of ``incident`` by the connection's authenticated identity (``nats_identity``).
    Audited. Refuses (``ApprovalRefused``) an incident with no run (unknown), a finished run, and an
    incident someone already approved."""
    nc, js, kv = await _state(url, creds)
    try:
        actor = await nats_identity(nc, creds)
        run, _ = await RunLog(kv).get(incident)
        if run is None:
            raise ApprovalRefused(f"unknown incident {incident}: no run of it is waiting for an approval")
        if run.status == "finished":
            raise ApprovalRefused(f"incident {incident} is already decided: its run finished "
                                  f"({run.outcome or 'no outcome'})")
        approvals = json_documents(kv)
        key = approval_key(incident)
        existing = await approvals.get(key)
        if existing.value is not None:
            raise ApprovalRefused(f"incident {incident} is already approved by {existing.value.get('by')} "
                                  f"at {existing.value.get('at')}")
        body: dict[str, Any] = {"incident": incident, "by": actor, "reason": reason, "at": utcnow().isoformat()}
        try:
            await approvals.put(key, body, existing.revision)
        except LostRace:
            raise ApprovalRefused(f"incident {incident} was approved by someone else just now") from None
        await AuditLog(js, actor, signer=operator_signer(creds)).append(
            run.node, "approval", reason or "approved", incident=incident, after=body)
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
@_creds_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def status(nats_url: str, creds: str | None, as_json: bool) -> None:
    """Show whether the breaker is open, since when and why."""
    doc = asyncio.run(breaker_status(nats_url, creds))
    state = "OPEN" if doc["open"] else "closed"
    _emit(doc, as_json, f"breaker {state}" + (f" since {doc['tripped_at']}: {doc['reason']}" if doc["open"] else "")
          + f"; {doc['recent_quarantines']} recent quarantines")


@breaker.command("reset")
@_nats_option
@_creds_option
@click.option("--reason", required=True, help="Why it is safe to resume (kept in the audit trail).")
@_actor_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def reset(nats_url: str, creds: str | None, reason: str, actor: str | None, as_json: bool) -> None:
    """Close the breaker so quarantines resume."""
    if not reason.strip():
        click.echo("--reason must say why", err=True)
        sys.exit(2)
    doc = asyncio.run(breaker_reset(nats_url, reason, _actor(actor), creds))
    _emit(doc, as_json, "breaker closed" if doc["was_open"] else "breaker was not open; count reset")


@click.command("approve")
@click.argument("incident")
@_nats_option
@click.option("--reason", default="", help="Why (kept in the audit trail).")
@click.option("--creds", default=None, metavar="FILE", type=click.Path(dir_okay=False, exists=True),
              help="The operator's NATS .creds file; the approval is recorded under the identity it proves.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def approve(incident: str, nats_url: str, reason: str, creds: str | None, as_json: bool) -> None:
    """Approve the steps of INCIDENT marked ``requires_approval``, as the identity NATS authenticated.

    Refuses, with one line and exit 1, an unknown incident, a finished one and one already approved."""
    doc = asyncio.run(approve_incident(nats_url, incident, reason, creds=creds))
    _emit(doc, as_json, f"{incident} approved by {doc.get('by')}")
