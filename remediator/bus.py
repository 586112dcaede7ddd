"""The bus: connecting to NATS, declaring JetStream (DESIGN.md §4), publishing events, settling messages.

Where it sits: under everything that talks to NATS. Ingest and the agent call ``publish_event``; the
dispatcher and the executor consume through the durable pull consumers that ``provision`` declares and end
every delivery with ``settle``, the one function that maps an outcome to ack, nak or term:

============================  ===================================================================
outcome                       what happens to the message
============================  ===================================================================
no error                      ack
``TemporaryError(delay)``     nak with ``delay`` (else the configured nak delay)
no leader, bus timed out      nak with the configured delay; one log line, as for a ``TemporaryError``
any other ``Exception``       nak with the configured delay (a bug may be transient; it is retried)
last allowed delivery failed  copied to ``deadletter.<stream>.<node>``, then term
``PermanentError``            copied to ``deadletter.<stream>.<node>``, then term
``CancelledError``            nak without delay (another replica takes it), then re-raised
============================  ===================================================================

A message is only terminated after its dead-letter copy is persisted; when that copy cannot be written the
message is nakked instead, so nothing is dropped. Streams and consumers are declared here and nowhere else
(``remediator bus init``), never as a side effect of a pod start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import re
import ssl
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from remediator import eventloop, subjects
from remediator.contracts import FaultEvent
from remediator.errors import PermanentError, SetupError, TemporaryError
from remediator.settings import Settings

log = logging.getLogger(__name__)

__all__ = [
    "DISPATCH_CONSUMER",
    "EXECUTOR_CONSUMER",
    "LEADER_WAIT_S",
    "NATS",
    "BusNotProvisioned",
    "Credentials",
    "LeaderWaitingJetStream",
    "PermanentError",
    "TemporaryError",
    "auth_of",
    "await_leaders",
    "bus_ready",
    "connect",
    "connect_within",
    "dead_letter_publisher",
    "decision_incident",
    "num_delivered",
    "provision",
    "publish_event",
    "redact_url",
    "settle",
    "verify",
    "verify_capture",
]

DISPATCH_CONSUMER = "dispatch"
EXECUTOR_CONSUMER = "executor"

# Header names we set besides JetStream's own.
MSG_ID_HEADER = "Nats-Msg-Id"
TRACEPARENT_HEADER = "traceparent"
DEAD_LETTER_REASON_HEADER = "Remediator-Dead-Letter-Reason"
ORIGINAL_SUBJECT_HEADER = "Remediator-Original-Subject"
ORIGINAL_SEQUENCE_HEADER = "Remediator-Original-Sequence"
INCIDENT_HEADER = "Remediator-Incident"  # on a dead letter whose message belongs to an incident

DAY_S = 86_400
FAULTS_MAX_AGE_S = 30 * DAY_S  # events are replayable history for a month; incidents live in KV and AUDIT
DISPATCH_MAX_ACK_PENDING = 256  # per-node order comes from the node lock and CAS, not from the consumer
EXECUTOR_MAX_ACK_PENDING = 64  # the floor of the executor's pending limit (executor_max_ack_pending)
EXECUTOR_REPLICA_ROOM = 2  # replicas the executor's pending limit leaves room for (the chart runs 2)


def executor_max_ack_pending(settings: Settings) -> int:
    """The executor consumer's ``max_ack_pending``, derived from ``executor_concurrency``: each replica holds
    ``executor_concurrency`` decisions at once plus the one its pull loop waits with, and the limit leaves
    room for ``EXECUTOR_REPLICA_ROOM`` replicas at that concurrency (never below 64), so the consumer never
    silently caps the concurrency a replica is configured with. The blast-radius budget bounds the
    playbooks in flight too."""
    return max(EXECUTOR_MAX_ACK_PENDING, EXECUTOR_REPLICA_ROOM * (settings.executor_concurrency + 1))


# --- connection -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    """How a client proves who it is to NATS: a ``.creds`` file (user JWT and seed), or an nkey seed file;
    TLS with a CA, and a client certificate and key. Paths only: the secrets stay in their files and are
    never printed or logged. ``inbox_prefix`` None: the one the creds file's role may subscribe to
    (``remediator.identity.roles``), else nats-py's ``_INBOX``."""

    creds_file: str | None = None
    nkey_seed_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    inbox_prefix: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Credentials:
        return cls(settings.nats_creds_file, settings.nats_nkey_seed_file, settings.nats_tls_ca,
                   settings.nats_tls_cert, settings.nats_tls_key)

    def __bool__(self) -> bool:
        return any((self.creds_file, self.nkey_seed_file, self.tls_ca, self.tls_cert, self.tls_key))

    def options(self) -> dict[str, Any]:
        """The ``nats.connect`` options; ``ValueError`` naming the file and the fix when one is unusable."""
        from remediator.identity import creds, jwt, roles

        opts: dict[str, Any] = {}
        inbox = self.inbox_prefix
        if self.creds_file:
            token = creds.read_jwt(self.creds_file)  # checks the file is there, bounded and a creds file
            creds.read_seed(self.creds_file)
            opts["user_credentials"] = self.creds_file
            who = roles.identity_of_tags(jwt.decode(token).nats.get("tags") or [])
            if inbox is None and who is not None:
                inbox = who.inbox
        elif self.nkey_seed_file:
            from remediator.identity import keys

            keys.read_seed_file(self.nkey_seed_file, "user")
            opts["nkeys_seed"] = self.nkey_seed_file
        if inbox:
            opts["inbox_prefix"] = inbox
        if self.tls_ca or self.tls_cert:
            opts["tls"] = _tls_context(self)
        return opts


def _tls_context(c: Credentials) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        if c.tls_ca:
            ctx.load_verify_locations(cafile=c.tls_ca)
        if c.tls_cert:
            if not c.tls_key:
                raise ValueError("a TLS client certificate needs its key: set REMEDIATOR_NATS_TLS_KEY")
            ctx.load_cert_chain(c.tls_cert, c.tls_key)
    except (OSError, ssl.SSLError) as e:  # the message names the file, never its content
        raise ValueError(f"NATS TLS files unusable ({type(e).__name__}: {getattr(e, 'strerror', None) or e}); "
                         "check REMEDIATOR_NATS_TLS_CA/_CERT/_KEY") from None
    return ctx


_AUTH_OF: weakref.WeakKeyDictionary[NATS, dict[str, Any]] = weakref.WeakKeyDictionary()


def auth_of(nc: NATS) -> dict[str, Any]:
    """The identity options ``nc`` was connected with (for another connection as the same identity)."""
    return dict(_AUTH_OF.get(nc, {}))


def redact_url(url: str) -> str:
    """``url`` (comma-separated servers) without any ``user:password@`` or token: what may be printed."""
    return ",".join(re.sub(r"^([a-z+]+://)[^@/]*@", r"\1", u.strip()) for u in url.split(","))


LEADER_WAIT_S = 10.0
"""How long a service publish waits out a JetStream leader election (``LeaderWaitingJetStream``).

nats-server's Raft groups campaign 4 to 9 s after they last heard their leader (``minElectionTimeout``,
``maxElectionTimeout`` in server/raft.go), and the meta group elects first when its leader was lost too; in
our three-server drills every stream and consumer had a new leader 4 to 8.5 s after its server was SIGKILLed."""


class LeaderWaitingJetStream(JetStreamContext):
    """A JetStream context whose publishes wait out a leader election instead of failing at once.

    While a stream (or KV bucket) has no Raft leader, nobody listens on its subjects and a publish is
    answered "no responders" (``NoStreamResponseError``): nothing was stored. The publish is sent again,
    0.1 s later and then at most a second apart, until ``leader_wait_s`` has passed; then the error is
    raised as ever (ingest answers 503 with Retry-After, a handler's delivery is nakked). Safe to repeat for
    exactly that error only: a timeout may hide a stored message, so it is never retried here. KV buckets
    opened from this context (``key_value``) publish through it too. Used by the service (``serve``), the
    only long-running publisher that cannot spool; one-shot probes (``verify_capture``) publish once.
    """

    def __init__(self, conn: NATS, *, leader_wait_s: float = LEADER_WAIT_S, **opts: Any) -> None:
        super().__init__(conn, **opts)
        self.leader_wait_s = leader_wait_s
        self.elections_waited = 0  # publishes that found no leader at first and were sent again

    async def publish(self, subject: str, payload: bytes = b"", timeout: float | None = None,  # noqa: ASYNC109
                      stream: str | None = None, headers: dict[str, Any] | None = None,
                      msg_ttl: float | None = None) -> js_api.PubAck:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.leader_wait_s
        pause = 0.1
        waited = False
        while True:
            try:
                return await super().publish(subject, payload, timeout, stream,
                                             dict(headers) if headers is not None else None, msg_ttl)
            except NoStreamResponseError:
                left = deadline - loop.time()
                if left <= 0:
                    raise
                if not waited:
                    waited = True
                    self.elections_waited += 1
                    log.info("no JetStream leader answers on %s; waiting up to %gs for an election",
                             subject, self.leader_wait_s)
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, 1.0)

    async def publish_once(self, subject: str, payload: bytes = b"", timeout: float | None = None,  # noqa: ASYNC109
                           stream: str | None = None, headers: dict[str, Any] | None = None) -> js_api.PubAck:
        """``JetStreamContext.publish``: no waiting (a probe asking whether any stream captures a subject)."""
        return await super().publish(subject, payload, timeout, stream, headers)


async def connect(url: str, name: str = "remediator", *, credentials: Credentials | None = None,
                  leader_wait_s: float = 0.0, **opts: Any) -> tuple[NATS, JetStreamContext]:
    """Connect to ``url`` (comma-separated servers allowed) and return the client and its JetStream context.

    Once connected the client reconnects forever, waiting at most 2 s between attempts, and buffers up to
    8 MiB of publishes while it does; the initial connection fails after one round over the servers so a
    mistyped URL is reported, not retried forever. Connection changes are logged (the URL without any
    user:password). ``credentials`` say who connects (``Credentials.options``); ``opts`` override any of
    these (they are ``nats.connect`` options). ``leader_wait_s`` > 0 returns a ``LeaderWaitingJetStream``
    whose publishes wait that long for a stream leader to be elected.
    """
    shown = redact_url(url)

    async def on_error(e: Exception) -> None:
        log.warning("nats error: %s", e)

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining):  # our own close() disconnects too: not worth a warning
            log.warning("nats disconnected from %s; reconnecting", shown)

    async def on_reconnected() -> None:
        log.info("nats reconnected to %s", redact_url(nc.connected_url.geturl()) if nc.connected_url else shown)

    async def on_closed() -> None:
        log.info("nats connection closed")

    options: dict[str, Any] = {
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 2,
        "connect_timeout": 2,
        "ping_interval": 20,
        "max_outstanding_pings": 3,
        "pending_size": 8 * 1024 * 1024,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
        "closed_cb": on_closed,
    }
    auth = credentials.options() if credentials is not None else {}
    options.update(auth)
    options.update(opts)
    servers = [s.strip() for s in url.split(",") if s.strip()]
    nc = await nats.connect(servers, **options)
    _AUTH_OF[nc] = auth
    if leader_wait_s > 0:
        return nc, LeaderWaitingJetStream(nc, timeout=5.0, leader_wait_s=leader_wait_s)
    return nc, nc.jetstream(timeout=5.0)


async def connect_within(url: str, timeout_s: float, name: str = "remediator", *, quiet: bool = False,
                         **opts: Any) -> tuple[NATS, JetStreamContext]:
    """``connect``, giving up after ``timeout_s`` with a ``SetupError`` that names the servers, the last
    connection error and the setting to check (nats-py retries an initial connection for as long as it may
    reconnect, which for the service is forever). ``quiet`` (one-shot commands): connection errors are
    logged at DEBUG instead of WARNING, and the last one is named in the error."""
    last: list[BaseException] = []

    async def remember(e: Exception) -> None:
        last[:] = [e]
        log.debug("nats: %s", e)

    if quiet:
        opts["error_cb"] = remember
    attempt = asyncio.ensure_future(connect(url, name=name, **opts))
    try:  # not asyncio.wait_for: on 3.11 it can wait for ever on a connect that swallowed its cancel (eventloop)
        return await eventloop.wait_within(attempt, timeout_s)
    except asyncio.CancelledError:
        if attempt.done() and not attempt.cancelled() and attempt.exception() is None:
            await attempt.result()[0].close()  # connected as we were cancelled: not left reconnecting for ever
        raise
    except (TimeoutError, nats.errors.NoServersError, OSError) as e:
        why = last[0] if last else e
        because = f"{type(why).__name__}: {why}" if str(why) else type(why).__name__
        raise SetupError(f"cannot reach NATS at {redact_url(url)} within {timeout_s:g}s ({because}); "
                         "check --nats URL / REMEDIATOR_NATS_URL and that the servers are up") from e


_IMPOSSIBLE_SEQUENCE = str(2**63 - 1)
_WRONG_LAST_SEQUENCE = 10071  # JetStream's error code: the stream captured the subject, the expectation failed
_WRONG_STREAM = 10060  # JetStream's error code: another stream captures the subject


async def verify_capture(js: JetStreamContext, subject: str, stream: str, *,
                         timeout: float = 5.0) -> str | None:  # noqa: ASYNC109
    """Why ``stream`` would not store what is published on ``subject`` (one line naming the fix), or None
    when it would. Checked without storing anything and with no right beyond publishing on ``subject`` (all
    a node agent holds): a JetStream publish expecting ``stream`` and an impossible last subject sequence is
    refused by the stream that captures the subject ("wrong last sequence": it is there) and answered by
    nobody when no stream does."""
    headers = {"Nats-Expected-Stream": stream, "Nats-Expected-Last-Subject-Sequence": _IMPOSSIBLE_SEQUENCE}
    publish = js.publish_once if isinstance(js, LeaderWaitingJetStream) else js.publish
    try:
        await publish(subject, b"", timeout=timeout, headers=headers)
    except APIError as e:
        if e.err_code == _WRONG_LAST_SEQUENCE:
            return None
        if e.err_code == _WRONG_STREAM:
            return f"{subject} is captured by another stream than {stream}; run `remediator bus init` on a bus " \
                   "whose streams were declared by it"
        return f"JetStream refused a check of {stream} for {subject}: {e.description or e}"
    except (nats.errors.NoRespondersError, NoStreamResponseError):
        return f"no stream captures {subject} (stream {stream} missing): run `remediator bus init`"
    except nats.errors.TimeoutError:
        return (f"no answer from JetStream for {subject} within {timeout:g}s: the stream {stream} is missing or "
                "unavailable, or these credentials may not publish there")
    return f"a check message on {subject} was stored by {stream}; its expectation headers were ignored"


async def bus_ready(nc: NATS, js: JetStreamContext, *, timeout: float = 1.0) -> bool:  # noqa: ASYNC109
    """True when ``nc`` is connected and JetStream answers for the FAULTS stream within ``timeout``."""
    if not nc.is_connected:
        return False
    try:
        await asyncio.wait_for(js.stream_info(subjects.FAULTS_STREAM), timeout)
    except asyncio.CancelledError:
        raise
    except Exception:
        return False
    return True


# --- provisioning ---------------------------------------------------------------------------------


class BusNotProvisioned(SetupError):
    """The bus lacks a stream, KV bucket or durable consumer the service needs, or holds one whose settings
    are incompatible with it (``verify``). ``problems`` names each; the message says how to fix it."""

    def __init__(self, problems: list[str], replicas: int) -> None:
        self.problems = problems
        self.replicas = replicas
        super().__init__(f"the bus is not provisioned for this service: {'; '.join(problems)}; run "
                         f"`remediator bus init --replicas {replicas}` against it (REMEDIATOR_BUS_REPLICAS "
                         "says how many replicas the service expects)")


@dataclass(frozen=True)
class _StreamSpec:
    config: js_api.StreamConfig
    # fields compared with the server's config to decide whether an update is needed (replicas apart)
    compared: tuple[str, ...] = ("subjects", "retention", "storage", "duplicate_window", "max_age",
                                 "max_bytes", "discard")


def _stream_specs(settings: Settings, replicas: int) -> list[_StreamSpec]:
    dup = float(settings.duplicate_window_s)
    audit_age = float(settings.audit_max_age_days * DAY_S)
    file = js_api.StorageType.FILE
    return [
        _StreamSpec(js_api.StreamConfig(
            name=subjects.FAULTS_STREAM, subjects=[subjects.FAULTS_WILDCARD],
            description="every accepted fault event (faults.<source>.<node>)",
            retention=js_api.RetentionPolicy.LIMITS, storage=file, duplicate_window=dup,
            max_age=float(FAULTS_MAX_AGE_S), max_bytes=-1, discard=js_api.DiscardPolicy.OLD,
            num_replicas=replicas)),
        _StreamSpec(js_api.StreamConfig(
            name=subjects.REMEDIATIONS_STREAM, subjects=[subjects.REMEDIATIONS_WILDCARD],
            description="decisions waiting for the executor (remediation.<node>)",
            retention=js_api.RetentionPolicy.WORK_QUEUE, storage=file, duplicate_window=dup,
            max_age=0.0, max_bytes=-1, discard=js_api.DiscardPolicy.OLD, num_replicas=replicas)),
        _StreamSpec(js_api.StreamConfig(
            name=subjects.AUDIT_STREAM, subjects=[subjects.AUDIT_WILDCARD],
            description="hash-chained audit trail (audit.<node>, audit._cluster)",
            retention=js_api.RetentionPolicy.LIMITS, storage=file, duplicate_window=dup,
            max_age=audit_age, max_bytes=settings.audit_max_bytes, discard=js_api.DiscardPolicy.OLD,
            num_replicas=replicas, allow_direct=True),  # chain heads read by direct get (remediator.audit)
            compared=(*_StreamSpec.compared, "allow_direct")),
        # Signed checkpoints of the audit chains' heads, apart from AUDIT so that purging one leaves the
        # other; kept longer than the records they anchor, the last 10,000 per chain.
        _StreamSpec(js_api.StreamConfig(
            name=subjects.AUDIT_CHECKPOINT_STREAM, subjects=[subjects.AUDIT_CHECKPOINT_WILDCARD],
            description="signed checkpoints of the audit chain heads (auditcp.<node>)",
            retention=js_api.RetentionPolicy.LIMITS, storage=file, duplicate_window=dup,
            max_age=2 * audit_age, max_bytes=-1, max_msgs_per_subject=10_000,
            discard=js_api.DiscardPolicy.OLD, num_replicas=replicas)),
        # Dead letters are evidence an audit record points at: they are kept as long as the audit trail.
        _StreamSpec(js_api.StreamConfig(
            name=subjects.DEAD_LETTER_STREAM, subjects=[subjects.DEAD_LETTER_WILDCARD],
            description="messages that exhausted their deliveries or failed permanently",
            retention=js_api.RetentionPolicy.LIMITS, storage=file, duplicate_window=dup,
            max_age=audit_age, max_bytes=-1, discard=js_api.DiscardPolicy.OLD, num_replicas=replicas)),
    ]


def _bucket_specs(settings: Settings) -> list[tuple[str, int, float | None]]:
    """(bucket, history, TTL) of every KV bucket."""
    return [(subjects.STATE_BUCKET, 5, None), (subjects.LOCKS_BUCKET, 1, float(settings.lock_ttl_s))]


def _consumer_specs(settings: Settings) -> list[tuple[str, js_api.ConsumerConfig]]:
    def pull(name: str, description: str, ack_wait: float, max_ack_pending: int) -> js_api.ConsumerConfig:
        return js_api.ConsumerConfig(
            name=name, durable_name=name, description=description,
            deliver_policy=js_api.DeliverPolicy.ALL, ack_policy=js_api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait, max_deliver=settings.max_deliver, max_ack_pending=max_ack_pending,
            replay_policy=js_api.ReplayPolicy.INSTANT,
        )

    return [
        (subjects.FAULTS_STREAM,
         pull(DISPATCH_CONSUMER, "fault events to handlers", float(settings.dispatch_ack_wait_s),
              DISPATCH_MAX_ACK_PENDING)),
        (subjects.REMEDIATIONS_STREAM,
         pull(EXECUTOR_CONSUMER, "decisions to the executor", float(settings.executor_ack_wait_s),
              executor_max_ack_pending(settings))),
    ]


_CONSUMER_FIELDS = ("ack_policy", "ack_wait", "max_deliver", "max_ack_pending", "deliver_policy")


def _differences(want: Any, have: Any, fields: tuple[str, ...]) -> list[str]:
    out = []
    for f in fields:
        w, h = getattr(want, f), getattr(have, f)
        if isinstance(w, float) or isinstance(h, float):
            same = abs(float(w or 0) - float(h or 0)) < 1e-3
        elif isinstance(w, list) or isinstance(h, list):
            same = sorted(w or []) == sorted(h or [])
        else:
            same = w == h
        if not same:
            out.append(f"{f} {_show(h)} -> {_show(w)}")
    return out


def _show(v: Any) -> str:
    if hasattr(v, "value"):
        return str(v.value)
    if isinstance(v, float):
        return f"{v:g}s"
    return str(v)


def _replicas_of(config: js_api.StreamConfig) -> int:
    return int(config.num_replicas or 1)


def _replica_change(kind: str, name: str, have: int, want: int, lower: bool) -> tuple[int, str | None]:
    """The replica count to keep for an existing stream or bucket, and a line when it differs from
    ``want``: raised when asked for more, lowered only when ``lower``, else kept and reported."""
    if want > have or (want < have and lower):
        return want, f"num_replicas {have} -> {want}"
    if want < have:
        return have, (f"drift: {kind} {name} keeps {have} replicas (bus init asked for {want}; "
                      "--allow-lower-replicas lowers it)")
    return have, None


async def _ensure_stream(js: JetStreamContext, spec: _StreamSpec, *, lower: bool) -> list[str]:
    name = spec.config.name
    assert name is not None
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        await js.add_stream(spec.config)
        return [f"created stream {name} ({', '.join(spec.config.subjects or [])}, "
                f"{spec.config.num_replicas} replica(s))"]
    diffs = _differences(spec.config, info.config, spec.compared)
    replicas, line = _replica_change("stream", name, _replicas_of(info.config), _replicas_of(spec.config), lower)
    notes: list[str] = []
    if line and line.startswith("drift:"):
        notes.append(line)
    elif line:
        diffs.append(line)
    if not diffs:
        return notes
    config = dataclasses.replace(spec.config, num_replicas=replicas)
    await js.update_stream(config)
    return [f"updated stream {name}: {'; '.join(diffs)}", *notes]


async def _ensure_bucket(js: JetStreamContext, bucket: str, *, history: int, ttl_s: float | None,
                         replicas: int, lower: bool) -> list[str]:
    stream = f"KV_{bucket}"
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        # direct: a key's read is a direct get any replica answers, not a request to the stream leader's API
        await js.create_key_value(js_api.KeyValueConfig(
            bucket=bucket, history=history, ttl=ttl_s, storage=js_api.StorageType.FILE, replicas=replicas,
            direct=True))
        return [f"created KV bucket {bucket} (history {history}" + (f", ttl {ttl_s:g}s" if ttl_s else "")
                + f", {replicas} replica(s))"]
    want = js_api.StreamConfig(max_msgs_per_subject=history, max_age=float(ttl_s or 0), allow_direct=True)
    diffs = _differences(want, info.config, ("max_msgs_per_subject", "max_age", "allow_direct"))
    kept, line = _replica_change("KV bucket", bucket, _replicas_of(info.config), replicas, lower)
    notes: list[str] = []
    if line and line.startswith("drift:"):
        notes.append(line)
    elif line:
        diffs.append(line)
    if not diffs:
        return notes
    config = info.config
    config.max_msgs_per_subject = history
    config.max_age = float(ttl_s or 0)
    config.allow_direct = True
    config.num_replicas = kept
    await js.update_stream(config)
    return [f"updated KV bucket {bucket}: {'; '.join(diffs)}", *notes]


async def _ensure_consumer(js: JetStreamContext, stream: str, config: js_api.ConsumerConfig, *,
                           reset: bool) -> list[str]:
    name = config.durable_name
    assert name is not None
    try:
        info = await js.consumer_info(stream, name)
    except NotFoundError:
        await js.add_consumer(stream, config)
        return [f"created consumer {stream}/{name} (explicit ack, ack_wait {config.ack_wait:g}s, "
                f"max_deliver {config.max_deliver})"]
    diffs = _differences(config, info.config, _CONSUMER_FIELDS)
    if not diffs:
        return []
    if not reset:  # an operator may have tuned it (`nats consumer edit`): reported, never undone
        return [f"drift: consumer {stream}/{name} kept as it is on the server ({'; '.join(diffs)} declared); "
                "--reset-consumers applies the declared values"]
    # Same durable name, editable fields: the server updates the consumer in place, keeping its position.
    await js.add_consumer(stream, config)
    return [f"updated consumer {stream}/{name}: {'; '.join(diffs)}"]


async def provision(js: JetStreamContext, settings: Settings, *, replicas: int | None = None,
                    lower_replicas: bool = False, reset_consumers: bool = False,
                    leader_wait_s: float = 30.0) -> list[str]:
    """Declare the streams, KV buckets and durable consumers of DESIGN.md §4; idempotent.

    Returns one line per stream, bucket or consumer it created or updated, and one ``drift: ...`` line per
    difference it found and kept (empty when everything already matched). What is missing is created with
    ``replicas`` (default ``settings.bus_replicas``: 1 on a single server, 3 on a production cluster). An
    existing stream whose configuration differs in a compared field (subjects, retention, storage, duplicate
    window, age/size limits) is updated in place, and its replicas raised to ``replicas``; they are never
    lowered unless ``lower_replicas``. An existing durable consumer is never changed unless
    ``reset_consumers`` (an operator's tuned ack wait stays); its differences are reported. The server
    refuses changes it cannot make (storage type, work-queue retention) and that error is raised unchanged.
    It returns once every stream, bucket and consumer has a leader (``await_leaders``, up to
    ``leader_wait_s``).
    """
    want = settings.bus_replicas if replicas is None else replicas
    done: list[str] = []
    for spec in _stream_specs(settings, want):
        done += await _ensure_stream(js, spec, lower=lower_replicas)
    for bucket, history, ttl in _bucket_specs(settings):
        done += await _ensure_bucket(js, bucket, history=history, ttl_s=ttl, replicas=want, lower=lower_replicas)
    for stream, config in _consumer_specs(settings):
        done += await _ensure_consumer(js, stream, config, reset=reset_consumers)
    for line in done:
        (log.warning if line.startswith("drift:") else log.info)("bus: %s", line)
    names = [spec.config.name or "" for spec in _stream_specs(settings, want)]
    names += [f"KV_{bucket}" for bucket, _, _ in _bucket_specs(settings)]
    durables = [(stream, config.durable_name or "") for stream, config in _consumer_specs(settings)]
    await await_leaders(js, names, durables, timeout_s=leader_wait_s)
    return done


async def await_leaders(js: JetStreamContext, streams: list[str], consumers: list[tuple[str, str]], *,
                        timeout_s: float) -> None:
    """Return once every stream in ``streams`` and every ``(stream, durable)`` in ``consumers`` answers with a
    leader (on one server: at once). A Raft group made a moment ago elects its first leader in its own time,
    and until then its info request times out, so a ``bus init`` that returned before would leave the first
    ``serve`` to fail verifying it. Raises ``TemporaryError`` naming what still has no leader."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    quick = js._nc.jetstream(timeout=1.0, prefix=js._prefix)  # the same connection, with short requests
    pending: list[tuple[str, str | None]] = [(s, None) for s in streams] + [(s, d) for s, d in consumers]
    while True:
        still = []
        for stream, durable in pending:
            try:
                info: Any = await (quick.consumer_info(stream, durable) if durable else quick.stream_info(stream))
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                still.append((stream, durable))
                continue
            if info.cluster is not None and not info.cluster.leader:
                still.append((stream, durable))
        if not still:
            return
        if loop.time() >= deadline:
            names = ", ".join(f"{s} > {d}" if d else s for s, d in still)
            raise TemporaryError(f"no Raft leader within {timeout_s:g}s for {names}; the NATS cluster may be "
                                 "short of servers or still electing: check `nats server report jetstream`, "
                                 "then run `remediator bus init` again")
        pending = still
        await asyncio.sleep(0.2)


async def verify(js: JetStreamContext, settings: Settings, *, replicas: int | None = None,
                 consumers: bool = True) -> None:
    """Check, changing nothing, that the bus holds what ``provision`` declares with settings this service
    can run on; raise ``BusNotProvisioned`` naming every problem.

    Compatible means: every stream and KV bucket exists with its subjects, retention and storage and at
    least ``replicas`` replicas (default ``settings.bus_replicas``); the lock bucket's TTL is set; with
    ``consumers``, both durable consumers exist with explicit acks and at least ``settings.max_deliver``
    deliveries (fewer would drop a message the service means to dead-letter). Anything else an operator
    tuned (ack wait, pending limits, retention ages) is theirs. ``serve`` and ``agent`` call this; only
    ``bus init`` (and ``serve`` on its embedded development server) provisions.
    """
    want = settings.bus_replicas if replicas is None else replicas
    problems: list[str] = []
    for spec in _stream_specs(settings, want):
        name = spec.config.name
        assert name is not None
        try:
            have = (await js.stream_info(name)).config
        except NotFoundError:
            problems.append(f"stream {name} is missing")
            continue
        diffs = _differences(spec.config, have, ("subjects", "retention", "storage"))
        if diffs:
            problems.append(f"stream {name} differs: {'; '.join(d.replace(' -> ', ', declared ') for d in diffs)}")
        if _replicas_of(have) < want:
            problems.append(f"stream {name} has {_replicas_of(have)} replica(s), fewer than {want}")
    for bucket, _history, ttl in _bucket_specs(settings):
        try:
            have = (await js.stream_info(f"KV_{bucket}")).config
        except NotFoundError:
            problems.append(f"KV bucket {bucket} is missing")
            continue
        if _replicas_of(have) < want:
            problems.append(f"KV bucket {bucket} has {_replicas_of(have)} replica(s), fewer than {want}")
        if ttl and not have.max_age:
            problems.append(f"KV bucket {bucket} has no TTL (declared {ttl:g}s)")
    for stream, config in _consumer_specs(settings) if consumers else []:
        try:
            c = (await js.consumer_info(stream, config.durable_name or "")).config
        except NotFoundError:
            problems.append(f"consumer {stream}/{config.durable_name} is missing")
            continue
        if c.ack_policy != js_api.AckPolicy.EXPLICIT:
            problems.append(f"consumer {stream}/{config.durable_name} does not ack explicitly")
        if c.max_deliver not in (None, -1) and int(c.max_deliver or 0) < settings.max_deliver:
            problems.append(f"consumer {stream}/{config.durable_name} delivers at most {c.max_deliver} times, "
                            f"fewer than max_deliver {settings.max_deliver}")
        if (config.durable_name == EXECUTOR_CONSUMER and c.max_ack_pending not in (None, -1)
                and int(c.max_ack_pending or 0) <= settings.executor_concurrency):
            log.warning("consumer %s/%s allows %s decisions pending, which caps executor_concurrency %d; "
                        "run `remediator bus init --reset-consumers` to declare %d", stream, config.durable_name,
                        c.max_ack_pending, settings.executor_concurrency, executor_max_ack_pending(settings))
    if problems:
        raise BusNotProvisioned(problems, want)


async def provision_at(url: str, settings: Settings, *, name: str = "remediator-provision",
                       credentials: Credentials | None = None) -> list[str]:
    """``provision`` over a connection of its own to ``url`` (benchmarks and tools that need just that), as
    ``credentials`` (an ``admin`` identity on a server with auth)."""
    nc, js = await connect(url, name=name, credentials=credentials)
    try:
        return await provision(js, settings)
    finally:
        await nc.close()


# --- publishing -----------------------------------------------------------------------------------


async def publish_event(js: JetStreamContext, event: FaultEvent, *,
                        timeout: float = 5.0,  # noqa: ASYNC109 - JetStream's ack wait, passed to the request
                        traceparent: str | None = None) -> js_api.PubAck:
    """Publish ``event`` to ``faults.<source>.<node>`` and return JetStream's ack.

    ``Nats-Msg-Id`` is the event id, so a repeat inside the FAULTS duplicate window comes back with
    ``ack.duplicate`` set and is not stored twice. ``traceparent`` (W3C) travels as a header, never in the
    body. Raises ``nats.errors.TimeoutError`` (or another ``nats`` error) when the bus does not ack.
    """
    headers = {MSG_ID_HEADER: event.id}
    if traceparent:
        headers[TRACEPARENT_HEADER] = traceparent
    return await js.publish(subjects.faults_subject(event.source, event.node),
                            event.model_dump_json().encode(), timeout=timeout,
                            stream=subjects.FAULTS_STREAM, headers=headers)


# --- settling -------------------------------------------------------------------------------------


Settlement = Literal["ack", "nak", "term"]
DeadLetter = Callable[[Msg, str], Awaitable[None]]


# Expected while the bus fails over (a stream without a leader, a request nobody answered in time): logged in
# one line like a TemporaryError, never with a traceback; retried all the same.
_BUS_UNAVAILABLE = (TemporaryError, NoStreamResponseError, nats.errors.TimeoutError)


def num_delivered(msg: Msg) -> int:
    """Which delivery of its message ``msg`` is (1: the first)."""
    try:
        return msg.metadata.num_delivered
    except Exception:  # not a JetStream delivery (core request in tests): treat as the first one
        return 1


async def settle(msg: Msg, error: BaseException | None, *, max_deliver: int, nak_delay: float,
                 dead_letter: DeadLetter) -> Settlement:
    """Ack, nak or terminate ``msg`` after its handler finished with ``error`` (None: success).

    See the module docstring for the table. ``dead_letter(msg, reason)`` must persist the copy before it
    returns; if it raises, the message is nakked (retried) instead of terminated. ``asyncio.CancelledError``
    (and other ``BaseException``s that are not ``Exception``s) nak the message without delay and are
    re-raised. Cancellation of ``settle`` itself propagates.
    """
    if error is None:
        await msg.ack()
        return "ack"
    if not isinstance(error, Exception):  # CancelledError, KeyboardInterrupt, SystemExit
        try:
            await msg.nak()
        except Exception as e:  # the connection may be going away with the task
            log.warning("could not nak %s while cancelling: %s", msg.subject, e)
        raise error
    if isinstance(error, PermanentError):
        reason = f"permanent error: {error}"
    else:
        delivered = num_delivered(msg)
        if delivered < max_deliver:
            delay = nak_delay
            if isinstance(error, TemporaryError) and error.delay is not None:
                delay = error.delay
            if isinstance(error, _BUS_UNAVAILABLE):  # expected: one line, no traceback
                log.info("%s: %s (delivery %d/%d), retrying in %gs", msg.subject,
                         str(error) or type(error).__name__, delivered, max_deliver, delay)
            else:
                log.warning("unexpected error handling %s (delivery %d/%d), retrying in %gs",
                            msg.subject, delivered, max_deliver, delay, exc_info=error)
            await msg.nak(delay=delay)
            return "nak"
        kind = "temporary" if isinstance(error, TemporaryError) else "unexpected"
        reason = f"{kind} error on delivery {delivered}/{max_deliver}: {str(error) or type(error).__name__}"
    try:
        await dead_letter(msg, reason)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.error("dead-lettering %s failed (%s); nakking it instead", msg.subject, e)
        await msg.nak(delay=nak_delay)
        return "nak"
    await msg.term()
    return "term"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def decision_incident(msg: Msg) -> str | None:
    """The incident of a REMEDIATIONS message (a ``Decision``), None when its body is not one."""
    from pydantic import ValidationError

    from remediator.contracts import Decision

    try:
        return Decision.model_validate_json(msg.data).incident_id
    except ValidationError:
        return None


def dead_letter_publisher(js: JetStreamContext, *, timeout: float = 5.0,
                          on_dead_letter: Callable[[Msg, str, str], Awaitable[None]] | None = None,
                          incident_of: Callable[[Msg], str | None] | None = None) -> DeadLetter:
    """A ``dead_letter`` callback for ``settle``: copy the message to ``deadletter.<stream>.<node>``.

    The copy keeps the body and headers and adds the reason, the original subject and stream sequence, and
    the incident id (``Remediator-Incident``) whenever ``incident_of(msg)`` names one (the executor's
    ``decision_incident``: every REMEDIATIONS message belongs to an incident; a FAULTS event that failed
    before any decision has none); its ``Nats-Msg-Id`` is ``dl|<stream>|<sequence>`` so a retried
    dead-lettering is stored once. ``<node>`` is the last token of the original subject
    (``faults.<source>.<node>``, ``remediation.<node>``). ``on_dead_letter(msg, reason, subject)`` runs
    after the copy is acked (e.g. to write the audit record).
    """

    async def dead_letter(msg: Msg, reason: str) -> None:
        try:
            meta = msg.metadata
            stream, seq = meta.stream, meta.sequence.stream
        except Exception:
            stream, seq = msg.subject.split(".", 1)[0].upper(), 0
        node = subjects.node_from_token(msg.subject.rsplit(".", 1)[-1])
        subject = subjects.dead_letter_subject(stream, node)
        headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
        headers.update({
            DEAD_LETTER_REASON_HEADER: reason[:1024],
            ORIGINAL_SUBJECT_HEADER: msg.subject,
            ORIGINAL_SEQUENCE_HEADER: str(seq),
            MSG_ID_HEADER: f"dl|{stream}|{seq}" if seq else f"dl|{msg.subject}|{_digest(msg.data)}",
        })
        incident = incident_of(msg) if incident_of is not None else None
        if incident:
            headers[INCIDENT_HEADER] = incident[:256]
        await js.publish(subject, msg.data, timeout=timeout, stream=subjects.DEAD_LETTER_STREAM,
                         headers=headers)
        if on_dead_letter is not None:
            await on_dead_letter(msg, reason, subject)

    return dead_letter
