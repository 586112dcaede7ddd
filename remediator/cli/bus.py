"""``remediator bus init``: declare the streams, KV buckets and consumers of DESIGN.md §4 (idempotent);
``remediator bus creds``: write a role's NATS ``.creds`` file (``remediator.identity``).

Where it sits: the one provisioning step. ``serve`` runs the same ``bus.provision`` only on its embedded
development server; against a configured bus it (and ``agent``) only verifies (``bus.verify``). In
production an operator (or a Helm hook) runs this command once per change, so no pod start mutates the bus.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from remediator.identity.issuer import MAX_TTL_S
from remediator.settings import Settings


@click.group()
def bus() -> None:
    """The NATS JetStream layout the service runs on."""


@bus.command("init")
@click.option("--nats", "nats_url", default=None, metavar="URL",
              help="NATS server URL(s), comma-separated (default: $REMEDIATOR_NATS_URL).")
@click.option("--replicas", default=None, type=click.IntRange(1, 5),
              help="Replicas of what is created: 1 on a single server, 3 on a production NATS cluster "
                   "(default: $REMEDIATOR_BUS_REPLICAS, else 1). Existing streams are raised to it, never lowered.")
@click.option("--allow-lower-replicas", is_flag=True,
              help="Lower existing streams and buckets that have more replicas than --replicas.")
@click.option("--reset-consumers", is_flag=True,
              help="Apply the declared settings to existing durable consumers (by default an operator's "
                   "tuning, e.g. an ack wait, is kept and reported as drift).")
@click.option("--json", "as_json", is_flag=True, help="Print the list of changes and drift as one JSON document.")
def init(nats_url: str | None, replicas: int | None, allow_lower_replicas: bool, reset_consumers: bool,
         as_json: bool) -> None:
    """Create what is missing of the FAULTS, REMEDIATIONS, AUDIT and DEADLETTER streams, the KV buckets and
    the durable consumers, and report drift. Running it again changes nothing and prints nothing new."""
    from remediator.cli.edges import bounded, load_settings

    settings = load_settings()
    url = nats_url or settings.nats_url
    if not url:
        raise click.UsageError("no NATS server: pass --nats URL or set REMEDIATOR_NATS_URL")
    want = replicas or settings.bus_replicas
    changes = bounded(_init(url, settings, want, allow_lower_replicas, reset_consumers),
                      settings.startup_timeout_s + 30,  # connecting: startup_timeout_s
                      f"provisioning {bus_redact(url)}")
    if as_json:
        click.echo(json.dumps(changes))
        return
    for line in changes:
        click.echo(line, err=line.startswith("drift:"))
    made = [c for c in changes if not c.startswith("drift:")]
    click.echo(f"bus at {bus_redact(url)}: " + (f"{len(made)} change(s)" if made else "already up to date")
               + (f", {len(changes) - len(made)} drift(s) kept" if len(made) < len(changes) else ""), err=True)


async def _init(url: str, settings: Settings, replicas: int, lower: bool, reset: bool) -> list[str]:
    from remediator import bus as bus_mod

    nc, js = await bus_mod.connect_within(url, settings.startup_timeout_s, name="remediator-bus-init",
                                          credentials=bus_mod.Credentials.from_settings(settings), quiet=True,
                                          max_reconnect_attempts=0, allow_reconnect=False)
    try:
        return await bus_mod.provision(js, settings, replicas=replicas, lower_replicas=lower,
                                       reset_consumers=reset)
    finally:
        await nc.close()


def bus_redact(url: str) -> str:
    from remediator.bus import redact_url

    return redact_url(url)


@bus.command("creds")
@click.option("--role", required=True, help="ingest, dispatcher, executor, service, operator, auditor, agent or admin.")
@click.option("--node", default=None, metavar="NAME", help="The node of an agent (role agent only).")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the .creds file (mode 0600; it holds a secret seed).")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Issue for the embedded operator in DIR/identity (what `serve --data-dir DIR` runs).")
@click.option("--signing-key", default=None, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Seed file of the production account's signing key (the agents' scoped key for --role agent).")
@click.option("--account", default=None, metavar="PUBKEY",
              help="With --signing-key: the account's public key (A…), when the key is a signing key of it.")
@click.option("--ttl", "ttl_s", type=click.IntRange(1, MAX_TTL_S), default=None,
              help="Seconds the credentials live (default: no expiry).")
@click.option("--nats", "nats_url", default=None, metavar="URL",
              help="Announce an agent's key on this bus (default: the data dir's running server).")
@click.option("--json", "as_json", is_flag=True, help="Print what was issued (never the secret) as JSON.")
def creds(role: str, node: str | None, out: Path, data_dir: Path | None, signing_key: Path | None,
          account: str | None, ttl_s: int | None, nats_url: str | None, as_json: bool) -> None:
    """Write a role's NATS .creds file. An agent's credentials name its node only; its public key is also
    announced in KV (agentkey.<node>), the key the executor verifies that agent's replies with."""
    from remediator.identity import keys
    from remediator.identity.issuer import Issuer
    from remediator.identity.keys import IdentityError
    from remediator.identity.store import OperatorStore
    from remediator.natsd import running_url

    if (data_dir is None) == (signing_key is None):
        raise click.UsageError("give exactly one of --data-dir DIR and --signing-key FILE")
    try:
        if data_dir is not None:
            if not (data_dir / "identity" / "keys.json").exists():
                raise click.ClickException(f"{data_dir} holds no embedded operator; run `remediator serve "
                                           f"--data-dir {data_dir}` once first, or give --signing-key")
            store = OperatorStore.open(data_dir / "identity")
            issuer = store.issuer()
            nats_url = nats_url or running_url(data_dir)
        else:
            assert signing_key is not None
            key = keys.read_seed_file(signing_key, "account")
            account_key = account or key.public_key
            if keys.public_kind(account_key) != "account":
                raise click.UsageError("--account takes the account's public key (A…)")
            issuer = Issuer(account_key, roles_key=key, agents_key=key)
        issued = issuer.issue(role, node=node, now=datetime.now(UTC),
                              ttl=timedelta(seconds=ttl_s) if ttl_s else None)
        from remediator.identity import creds as creds_file

        assert issued.user is not None  # made here: this command writes the seed too
        creds_file.write(out, issued.jwt, issued.user)
    except (IdentityError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    announced = None
    if issued.node is not None:
        announced = _announce(issued, nats_url, data_dir)
    doc = {"path": str(out), "role": issued.role, "node": issued.node, "public_key": issued.public_key,
           "expires_at": issued.expires_at.isoformat() if issued.expires_at else None, "announced": announced}
    if as_json:
        click.echo(json.dumps(doc))
    click.echo(f"wrote {out} (role {issued.role}" + (f", node {issued.node}" if issued.node else "")
               + f", user {issued.public_key}" + (f", expires {doc['expires_at']}" if ttl_s else "") + ")",
               err=True)
    if issued.node is not None and not announced:
        click.echo(f"warning: the agent key of {issued.node} was not announced (no bus given or reachable): the "
                   f"executor refuses its replies until it is; pass --nats URL", err=True)


def _announce(issued: Any, nats_url: str | None, data_dir: Path | None) -> bool:
    """Write the agent's key to KV, as ``admin`` of the embedded store or with the settings' credentials."""
    if not nats_url:
        return False
    from remediator import bus as bus_mod
    from remediator.identity import agents

    if data_dir is not None:
        from remediator.identity.store import OperatorStore

        admin = OperatorStore.open(data_dir / "identity").role_creds("admin")
        credentials = bus_mod.Credentials(creds_file=str(admin))
    else:
        credentials = bus_mod.Credentials.from_settings(Settings())

    async def run() -> None:
        nc, js = await bus_mod.connect(nats_url, name="remediator-bus-creds", credentials=credentials,
                                       allow_reconnect=False, max_reconnect_attempts=0)
        try:
            await agents.announce(js, issued)
        finally:
            await nc.close()

    try:
        asyncio.run(asyncio.wait_for(run(), 10))
    except Exception as e:
        click.echo(f"warning: announcing the agent key failed: {type(e).__name__}: {e}", err=True)
        return False
    return True


# Secret names the chart reads by default (deploy/chart/values.yaml): what `bus operator` writes maps onto them.
CHART_SECRETS = {
    "gpu-remediator-nats-auth": ("auth.conf", "auth.conf"),
    "gpu-remediator-nats-service": ("user.creds", "service/user.creds"),
    "gpu-remediator-nats-admin": ("user.creds", "admin/user.creds"),
    "gpu-remediator-nats-agent-signer": ("seed", "agent-signer/seed"),
    "gpu-remediator-signing-key": ("seed", "signing/seed"),
}


@bus.command("operator")
@click.option("--data-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Keep the operator's keys in DIR/identity (created on first use, mode 0700; keep it safe: it "
                   "mints every identity). Running again loads them, so what was issued stays valid.")
@click.option("--out", "out", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Where to write what the chart's Secrets hold (default: DIR/chart).")
@click.option("--revoke", "revoke", multiple=True, metavar="UKEY",
              help="Revoke every JWT issued so far to this user public key (U…; repeatable): written into the "
                   "account JWT (auth.conf) and, with --push, into the running servers.")
@click.option("--push", "push_url", default=None, metavar="URL",
              help="Push the account JWT to the running servers' full resolver ($SYS.REQ.CLAIMS.UPDATE, as a "
                   "system-account user kept in DIR/identity): revocations and key changes apply without a "
                   "restart.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written and the public keys as JSON.")
def operator(data_dir: Path, out: Path | None, revoke: tuple[str, ...], push_url: str | None,
             as_json: bool) -> None:
    """Make (or load) a NATS operator, system account and remediator account for a production bus, and
    write what the Helm chart needs: auth.conf (operator JWT, system account, resolver_preload — the
    bundled NATS includes it), the service and admin .creds, the agents' scoped signing key and the
    service's signing key. Prints the kubectl commands that create the chart's Secrets, and the values to
    set (nats.account, identity.trustKeys). No secret is printed."""
    from remediator.identity import creds as creds_file
    from remediator.identity import keys
    from remediator.identity.keys import IdentityError
    from remediator.identity.store import OperatorStore
    from remediator.signing import local_signer

    out = out or data_dir / "chart"
    now = datetime.now(UTC)
    try:
        store = OperatorStore.open(data_dir / "identity")
        for user in revoke:
            store.revoke(user, now=now)
        keys.write_secret(out / "auth.conf", store.auth_config(now=now))
        for role in ("service", "admin"):
            src = store.role_creds(role, now=now)
            jwt_text, seed = creds_file.read_jwt(src), creds_file.read_seed(src)
            creds_file.write(out / role / "user.creds", jwt_text, seed)
        keys.write_secret(out / "agent-signer" / "seed", store.agents_key.seed.decode() + "\n")
        signer = local_signer(data_dir / "identity" / "service.nk")
        keys.write_secret(out / "signing" / "seed", keys.read_secret(data_dir / "identity" / "service.nk"))
        for folder in (out, *(p for p in out.iterdir() if p.is_dir())):
            folder.chmod(0o700)
    except (IdentityError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    pushed = None
    if push_url is not None:
        from remediator.cli.edges import bounded

        pushed = bounded(_push_account(push_url, store, now), 30, f"pushing the account JWT to {bus_redact(push_url)}")
    doc = {"out": str(out), "operator": store.operator.public_key, "system_account": store.system.public_key,
           "revoked": sorted(store.revocations), "pushed": pushed,
           "account": store.account.public_key, "agents_signing_key": store.agents_key.public_key,
           "service_key": signer.public_key,
           "secrets": {name: {"key": key, "file": str(out / rel)} for name, (key, rel) in CHART_SECRETS.items()}}
    if as_json:
        click.echo(json.dumps(doc))
    click.echo(f"wrote the chart's NATS identity to {out} (account {store.account.public_key})", err=True)
    if revoke:
        click.echo(f"revoked {len(revoke)} user key(s) in the account JWT (auth.conf: update the Secret "
                   "gpu-remediator-nats-auth too, for servers started later)", err=True)
    if pushed is not None:
        click.echo(f"pushed the account JWT to {bus_redact(push_url or '')}: {pushed}", err=True)
    for name, (key, rel) in CHART_SECRETS.items():
        click.echo(f"  kubectl -n NAMESPACE create secret generic {name} --from-file={key}={out / rel}", err=True)
    click.echo(f"  helm values: --set nats.account={store.account.public_key} "
               f"--set identity.trustKeys={{{signer.public_key}}}", err=True)


async def _push_account(url: str, store: Any, now: datetime) -> str:
    """Send the account JWT to the servers' full resolver; their answer, or ``ClickException``."""
    from remediator import bus as bus_mod

    system = bus_mod.Credentials(creds_file=str(store.system_creds(now=now)))
    nc, _js = await bus_mod.connect_within(url, 10, name="remediator-bus-operator", credentials=system,
                                           quiet=True, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        msg = await nc.request("$SYS.REQ.CLAIMS.UPDATE", store.account_jwt(now).encode(), timeout=10)
    finally:
        await nc.close()
    try:
        answer = json.loads(msg.data)
    except ValueError:
        raise click.ClickException(f"the servers answered the account update with {msg.data[:200]!r}") from None
    if answer.get("error"):
        raise click.ClickException(f"the servers refused the account update: {answer['error']}")
    return str((answer.get("data") or {}).get("message") or "updated")
