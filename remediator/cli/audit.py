"""``remediator audit list|show|verify|export``: reading the audit trail after an incident.

Where it sits: an operator tool over the AUDIT stream (DESIGN.md §8, §10); read-only. It reads a running
bus (``--nats URL``, else ``REMEDIATOR_NATS_URL``; comma-separated servers like every command) or a stopped
JetStream store (``--data-dir DIR``, e.g. what ``remediator demo --data-dir DIR`` left behind), for which it
starts an embedded ``nats-server`` on that store and stops it again on every way out.

``--since``/``--until`` take the timestamps the audit prints (``2026-11-30T03:12:00.123Z``, the JSON's
``2026-11-30T03:12:00.123456+00:00``, a date, or a time without zone, read as UTC); ``--until`` covers the
whole of the unit it names, so the printed time of a record includes that record. Failures (no server, no
store, no AUDIT stream) are one line on standard error and exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
from nats.errors import Error as NatsError
from nats.errors import NoServersError
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from remediator import bus
from remediator.audit import AuditQuery, iter_records, query, verify_trail
from remediator.audit_api.reader import IncidentFilter, incident_timeline, summarize
from remediator.contracts import AuditRecord
from remediator.natsd import EmbeddedNats, NatsServerNotFound
from remediator.settings import Settings
from remediator.signing import SERVICE_KEY_FILE, SigningKeyError, TrustSet, load_signer
from remediator.subjects import AUDIT_STREAM

T = TypeVar("T")

# how much of a time the text gave: the fraction's digits, else seconds, minutes or the whole day
_TIME_PART = re.compile(r"[T ](\d{2})(?::(\d{2}))?(?::(\d{2})(?:[.,](\d+))?)?")


def parse_time(text: str, *, end: bool = False) -> datetime:
    """A timestamp as the audit prints it, in UTC (a time without zone is UTC).

    ``end``: the last microsecond of the unit the text names (``03:12:00.123Z`` → ``03:12:00.123999``,
    ``2026-11-30`` → the day's last microsecond), for an inclusive ``--until``.
    """
    raw = text.strip()
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 time (e.g. 2026-11-30T03:12:00Z)") from None
    t = t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC)
    if not end:
        return t
    m = _TIME_PART.search(raw)
    if m is None:
        unit = timedelta(days=1)
    elif m.group(4):
        unit = timedelta(seconds=10.0 ** -min(len(m.group(4)), 6))
    elif m.group(3):
        unit = timedelta(seconds=1)
    elif m.group(2):
        unit = timedelta(minutes=1)
    else:
        unit = timedelta(hours=1)
    return t + unit - timedelta(microseconds=1)


class AuditTime(click.ParamType[datetime]):
    """``--since``/``--until``: see ``parse_time``."""

    name = "TIME"

    def __init__(self, *, end: bool = False) -> None:
        self.end = end

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_time(str(value), end=self.end)
        except ValueError as e:
            self.fail(str(e), param, ctx)


@contextlib.contextmanager
def audit_bus(nats_url: str | None, data_dir: str | None) -> Iterator[str]:
    """The URL to read the audit from: ``nats_url`` (else ``REMEDIATOR_NATS_URL``), or an embedded server
    on the stopped store ``data_dir``, stopped when the block is left however it is left."""
    if data_dir is not None:
        if nats_url:
            raise click.UsageError("give either --data-dir or --nats, not both")
        store = Path(data_dir)
        if not (store / "jetstream").is_dir():
            raise click.ClickException(f"{store} holds no JetStream store (no {store / 'jetstream'}); "
                                       "pass the directory given to `remediator demo --data-dir` or `serve`")
        try:
            # a store serve or demo made has its operator in DIR/identity: read it as the auditor role
            server = EmbeddedNats(data_dir=str(store), secure=(store / "identity" / "keys.json").exists())
            server.start()
            if server.secure:
                _CREDENTIALS[server.url] = bus.Credentials(creds_file=server.creds("auditor"))
        except NatsServerNotFound as e:
            raise click.ClickException(str(e)) from None
        except RuntimeError as e:
            raise click.ClickException(f"could not open the store {store}: {e} "
                                       "(is a server still running on it?)") from None
        try:
            yield server.url
        finally:
            _CREDENTIALS.pop(server.url, None)
            server.close()
        return
    url = nats_url or Settings().nats_url
    if not url or not url.strip(" ,"):
        raise click.UsageError("no bus to read: pass --nats URL, set REMEDIATOR_NATS_URL, or --data-dir DIR")
    yield url


_CREDENTIALS: dict[str, bus.Credentials] = {}  # URL of an embedded store opened here → its auditor identity


def _credentials(url: str) -> bus.Credentials:
    """Who reads ``url``: the auditor of an embedded store opened by ``audit_bus``, else the settings'."""
    return _CREDENTIALS.get(url) or bus.Credentials.from_settings(Settings())


async def _quiet(_error: Exception) -> None:
    """Connection errors become one ClickException, not a log line per attempt."""


async def _with_js(url: str, fn: Callable[[JetStreamContext], Awaitable[T]]) -> T:
    try:
        nc, js = await bus.connect(url, name="remediator-audit", max_reconnect_attempts=2, error_cb=_quiet,
                                   credentials=_credentials(url))
    except (NoServersError, OSError, TimeoutError, NatsError) as e:
        raise click.ClickException(f"cannot reach NATS at {bus.redact_url(url)}: {type(e).__name__} {e}".rstrip()
                                       + "; check --nats URL / REMEDIATOR_NATS_URL") from None
    try:
        return await fn(js)
    except NotFoundError:
        raise click.ClickException(f"no {AUDIT_STREAM} stream on {url} (nothing was ever audited there; "
                                   "`remediator bus init` declares it)") from None
    except (NoServersError, TimeoutError, NatsError) as e:
        raise click.ClickException(f"reading the audit from {url} failed: {type(e).__name__} {e}".rstrip()) \
            from None
    finally:
        await nc.close()


def _read(nats_url: str | None, data_dir: str | None, fn: Callable[[JetStreamContext], Awaitable[T]]) -> T:
    with audit_bus(nats_url, data_dir) as url:
        return asyncio.run(_with_js(url, fn))


def format_record(r: AuditRecord) -> str:
    gpu = f" gpu={r.gpu}" if r.gpu else ""
    inc = f" [{r.incident}]" if r.incident else ""
    return f"{r.time:%Y-%m-%dT%H:%M:%S.%fZ}"[:-4] + f"Z #{r.seq:<4} {r.node}{gpu}{inc} {r.what}: {r.why}"


_nats_opt = click.option("--nats", "nats_url", default=None, metavar="URL",
                         help="NATS server URL(s), comma-separated (default REMEDIATOR_NATS_URL).")
_data_dir_opt = click.option("--data-dir", default=None, metavar="DIR",
                             type=click.Path(file_okay=False, exists=True),
                             help="A stopped JetStream store (e.g. the demo's) to open with an embedded server.")


@click.group()
def audit() -> None:
    """Review the audit trail: list, show an incident, verify the hash chains, export JSON Lines."""


@audit.command("list")
@_nats_opt
@_data_dir_opt
@click.option("--node", default=None)
@click.option("--gpu", default=None, help="GPU key (UUID, else PCI id).")
@click.option("--incident", default=None)
@click.option("--job", default=None)
@click.option("--fingerprint", default=None, help="Alertmanager alert fingerprint.")
@click.option("--since", type=AuditTime(), default=None, help="Records at or after this time.")
@click.option("--until", type=AuditTime(end=True), default=None, help="Records at or before this time.")
@click.option("--playbook", default=None, help="Records of incidents whose decision named this playbook.")
@click.option("--outcome", default=None,
              help="Records of incidents that ended so (completed, escalated, …; open, pending-approval).")
@click.option("--json", "as_json", is_flag=True)
def list_(nats_url: str | None, data_dir: str | None, node: str | None, gpu: str | None, incident: str | None,
          job: str | None, fingerprint: str | None, since: datetime | None, until: datetime | None,
          playbook: str | None, outcome: str | None, as_json: bool) -> None:
    """Records matching every given filter, in order (the filters of ``GET /v1/audit/incidents``)."""
    q = AuditQuery(node=node, gpu=gpu, incident=incident, job=job, fingerprint=fingerprint, since=since,
                   until=until)
    if playbook or outcome:
        every = _read(nats_url, data_dir, _all)
        by_incident = {r.incident for r in every if r.incident}
        flt = IncidentFilter(playbook=playbook, outcome=outcome)
        keep = {i for i in by_incident if flt.matches(summarize(incident_timeline(every, i)))}
        records = [r for r in every if q.matches(r) and r.incident in keep]
    else:
        records = _read(nats_url, data_dir, lambda js: query(js, q))
    if as_json:
        sys.stdout.write(json.dumps([r.model_dump(mode="json") for r in records]) + "\n")
    else:
        for r in records:
            click.echo(format_record(r))


async def _all(js: JetStreamContext) -> list[AuditRecord]:
    return [r async for r in iter_records(js)]


@audit.command("show")
@_nats_opt
@_data_dir_opt
@click.argument("incident")
@click.option("--truncate", type=click.IntRange(min=1), default=None, metavar="N",
              help="Cut each before/after to N characters (default: print them whole).")
@click.option("--json", "as_json", is_flag=True, help="The timeline's records as one JSON list.")
def show(nats_url: str | None, data_dir: str | None, incident: str, truncate: int | None, as_json: bool) -> None:
    """The whole timeline of one incident, first record to last, with before/after of each step.

    The records are those of ``GET /v1/audit/incidents/<id>`` in the same order: every record naming the
    incident and the records of the events that opened or updated it (``incident_timeline``)."""
    records = incident_timeline(_read(nats_url, data_dir, _all), incident)
    if not records:
        raise click.ClickException(f"no audit records for incident {incident}")
    if as_json:
        sys.stdout.write(json.dumps([r.model_dump(mode="json") for r in records]) + "\n")
        return
    for r in records:
        click.echo(format_record(r))
        for label, data in (("before", r.before), ("after", r.after)):
            if data:
                text = json.dumps(data, sort_keys=True)
                if truncate is not None and len(text) > truncate:
                    text = text[:truncate] + f"… ({len(text) - truncate} more characters)"
                click.echo(f"    {label}: {text}")


def trust_of(data_dir: str | None, keys: tuple[str, ...]) -> TrustSet | None:
    """Whose signatures ``verify`` accepts: ``--trust-key``s, ``REMEDIATOR_AUDIT_TRUST_KEYS`` and, with
    ``--data-dir``, that store's service key (``identity/service.nk``); None when nothing is named."""
    try:
        trust = TrustSet([*keys, Settings().audit_trust_keys])
        if data_dir is not None and (Path(data_dir) / "identity" / SERVICE_KEY_FILE).exists():
            trust = TrustSet.of(trust.keys, [load_signer(Path(data_dir) / "identity" / SERVICE_KEY_FILE)])
    except SigningKeyError as e:
        raise click.UsageError(f"trust keys: {e}") from None
    return trust or None


@audit.command("verify")
@_nats_opt
@_data_dir_opt
@click.option("--trust-key", "trust_keys", multiple=True, metavar="PUBKEY",
              help="Public nkey of a replica or operator whose records count (repeatable; also "
                   "REMEDIATOR_AUDIT_TRUST_KEYS; --data-dir trusts its store's service key).")
@click.option("--json", "as_json", is_flag=True)
def verify(nats_url: str | None, data_dir: str | None, trust_keys: tuple[str, ...], as_json: bool) -> None:
    """Check every chain: hashes, links, signatures against the trust set, and the signed checkpoints (a
    removed tail, a purged chain or stream); exit 0 when intact, 1 naming the first broken link."""
    trust = trust_of(data_dir, trust_keys)
    if trust is None:
        click.echo("warning: no trust keys (--trust-key, REMEDIATOR_AUDIT_TRUST_KEYS): signatures are checked "
                   "against their own signer only, so a record forged with another key is not detected", err=True)
    reports = _read(nats_url, data_dir, lambda js: verify_trail(js, trust))
    if as_json:
        sys.stdout.write(json.dumps([r.__dict__ for r in reports]) + "\n")
    else:
        for rep in reports:
            click.echo(f"{rep.chain:<32} {rep.records:>6} records  {'ok' if rep.ok else 'BROKEN: ' + rep.problem}")
    broken = [r for r in reports if not r.ok]
    if broken:
        click.echo(f"first broken link: {broken[0].chain}: {broken[0].problem}", err=True)
        sys.exit(1)


@audit.command("export")
@_nats_opt
@_data_dir_opt
@click.option("--node", default=None)
def export(nats_url: str | None, data_dir: str | None, node: str | None) -> None:
    """Every record as JSON Lines on standard output."""

    async def dump(js: JetStreamContext) -> None:
        async for r in iter_records(js, node):
            sys.stdout.write(r.model_dump_json() + "\n")

    _read(nats_url, data_dir, dump)


@audit.command("serve")
@_nats_opt
@_data_dir_opt
@click.option("--http", "http", required=True, metavar="HOST:PORT", help="Where the API and view listen.")
@click.option("--insecure-no-auth", is_flag=True,
              help="Serve without bearer tokens (development only; REMEDIATOR_API_TOKENS otherwise).")
def serve(nats_url: str | None, data_dir: str | None, http: str, insecure_no_auth: bool) -> None:
    """The read-only audit API (/v1/audit/…) and web view (/audit/) on their own, until SIGINT/SIGTERM.

    Tokens come from REMEDIATOR_API_TOKENS (``auditor:TOKEN`` entries); it refuses to start without one
    unless --insecure-no-auth."""
    import uvicorn

    from remediator.audit_api.reader import AuditReader
    from remediator.audit_api.routes import create_audit_app

    class GracefulServer(uvicorn.Server):
        """Stops on SIGINT/SIGTERM without re-raising the signal afterwards, as uvicorn's own
        ``capture_signals`` does: that would kill the process before ``audit_bus`` stops its nats-server."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    host, sep, port = http.rpartition(":")
    if not sep or not port.isdigit():
        raise click.UsageError(f"--http takes HOST:PORT, not {http!r}")
    settings = Settings()
    if not settings.tokens and not insecure_no_auth:
        raise click.UsageError("no bearer tokens: set REMEDIATOR_API_TOKENS (e.g. auditor:TOKEN) or pass "
                               "--insecure-no-auth")

    async def run(url: str) -> None:
        try:
            nc, js = await bus.connect(url, name="remediator-audit-serve", max_reconnect_attempts=-1,
                                       error_cb=_quiet, credentials=_credentials(url))
        except (NoServersError, OSError, TimeoutError, NatsError) as e:
            raise click.ClickException(f"cannot reach NATS at {bus.redact_url(url)}: {type(e).__name__} {e}".rstrip()
                                       + "; check --nats URL / REMEDIATOR_NATS_URL") from None
        try:
            reader = AuditReader(js, trust=trust_of(data_dir, ()))  # whose signatures count, as verify
            try:
                await reader.refresh(force=True)
            except NotFoundError:
                raise click.ClickException(f"no {AUDIT_STREAM} stream on {url}") from None
            app = create_audit_app(reader, settings)
            config = uvicorn.Config(app, host=host or "127.0.0.1", port=int(port), log_level="warning",
                                    access_log=False, lifespan="off")
            click.echo(f"audit API and view on http://{host or '127.0.0.1'}:{port}/audit/ (reading {url})", err=True)
            await GracefulServer(config).serve()
        finally:
            await nc.close()

    with audit_bus(nats_url, data_dir) as url:
        asyncio.run(run(url))
