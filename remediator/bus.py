"""The bus: connecting to NATS, declaring JetStream (DESIGN.md §4), publishing events, settling messages.

Where it sits: under everything that talks to NATS. Ingest and the agent call ``publish_event``; the
dispatcher and the executor consume through the durable pull consumers that ``provision`` declares and end
every delivery with ``settle``, the one function that maps an outcome to ack, nak or term:

============================  ===================================================================
outcome                       what happens to the message
============================  ===================================================================
no error                      ack
``TemporaryError(delay)``     nak with ``delay`` (else the configured nak delay)
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
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from remediator import subjects
from remediator.contracts import FaultEvent
from remediator.errors import PermanentError, TemporaryError
from remediator.settings import Settings

log = logging.getLogger(__name__)

__all__ = [
    "DISPATCH_CONSUMER",
    "EXECUTOR_CONSUMER",
    "NATS",
    "PermanentError",
    "TemporaryError",
    "bus_ready",
    "connect",
    "dead_letter_publisher",
    "provision",
    "publish_event",
    "settle",
]

DISPATCH_CONSUMER = "dispatch"
EXECUTOR_CONSUMER = "executor"

# Header names we set besides JetStream's own.
MSG_ID_HEADER = "Nats-Msg-Id"
TRACEPARENT_HEADER = "traceparent"
DEAD_LETTER_REASON_HEADER = "Remediator-Dead-Letter-Reason"
ORIGINAL_SUBJECT_HEADER = "Remediator-Original-Subject"
ORIGINAL_SEQUENCE_HEADER = "Remediator-Original-Sequence"

DAY_S = 86_400
FAULTS_MAX_AGE_S = 30 * DAY_S  # events are replayable history for a month; incidents live in KV and AUDIT
DISPATCH_ACK_WAIT_S = 60.0  # a decision is KV reads/writes and one publish: seconds, not minutes
EXECUTOR_ACK_WAIT_S = 600.0  # a playbook step (drain) may run minutes; the executor also sends in-progress
DISPATCH_MAX_ACK_PENDING = 256  # per-node order comes from the node lock and CAS, not from the consumer
EXECUTOR_MAX_ACK_PENDING = 64  # playbooks in flight per replica set; the blast-radius budget bounds it too


# --- connection -----------------------------------------------------------------------------------


async def connect(url: str, name: str = "remediator", **opts: Any) -> tuple[NATS, JetStreamContext]:
    """Connect to ``url`` (comma-separated servers allowed) and return the client and its JetStream context.

    Once connected the client reconnects forever, waiting at most 2 s between attempts, and buffers up to
    8 MiB of publishes while it does; the initial connection fails after one round over the servers so a
    mistyped URL is reported, not retried forever. Connection changes are logged. ``opts`` override any of
    these (they are ``nats.connect`` options).
    """

    async def on_error(e: Exception) -> None:
        log.warning("nats error: %s", e)

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining):  # our own close() disconnects too: not worth a warning
            log.warning("nats disconnected from %s; reconnecting", url)

    async def on_reconnected() -> None:
        log.info("nats reconnected to %s", nc.connected_url.netloc if nc.connected_url else url)

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
    options.update(opts)
    servers = [s.strip() for s in url.split(",") if s.strip()]
    nc = await nats.connect(servers, **options)
    return nc, nc.jetstream(timeout=5.0)


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


@dataclass(frozen=True)
class _StreamSpec:
    config: js_api.StreamConfig
    # fields compared with the server's config to decide whether an update is needed
    compared: tuple[str, ...] = ("subjects", "retention", "storage", "duplicate_window", "max_age",
                                 "max_bytes", "discard", "num_replicas")


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
            num_replicas=replicas)),
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
         pull(DISPATCH_CONSUMER, "fault events to handlers", DISPATCH_ACK_WAIT_S, DISPATCH_MAX_ACK_PENDING)),
        (subjects.REMEDIATIONS_STREAM,
         pull(EXECUTOR_CONSUMER, "decisions to the executor", EXECUTOR_ACK_WAIT_S, EXECUTOR_MAX_ACK_PENDING)),
    ]


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


async def _ensure_stream(js: JetStreamContext, spec: _StreamSpec) -> str | None:
    name = spec.config.name
    assert name is not None
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        await js.add_stream(spec.config)
        return f"created stream {name} ({', '.join(spec.config.subjects or [])})"
    diffs = _differences(spec.config, info.config, spec.compared)
    if not diffs:
        return None
    await js.update_stream(spec.config)
    return f"updated stream {name}: {'; '.join(diffs)}"


async def _ensure_bucket(js: JetStreamContext, bucket: str, *, history: int, ttl_s: float | None,
                         replicas: int) -> str | None:
    stream = f"KV_{bucket}"
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        await js.create_key_value(js_api.KeyValueConfig(
            bucket=bucket, history=history, ttl=ttl_s, storage=js_api.StorageType.FILE, replicas=replicas))
        return f"created KV bucket {bucket} (history {history}" + (f", ttl {ttl_s:g}s)" if ttl_s else ")")
    want = js_api.StreamConfig(max_msgs_per_subject=history, max_age=float(ttl_s or 0),
                               num_replicas=replicas)
    diffs = _differences(want, info.config, ("max_msgs_per_subject", "max_age", "num_replicas"))
    if not diffs:
        return None
    config = info.config
    config.max_msgs_per_subject = history
    config.max_age = float(ttl_s or 0)
    config.num_replicas = replicas
    await js.update_stream(config)
    return f"updated KV bucket {bucket}: {'; '.join(diffs)}"


async def _ensure_consumer(js: JetStreamContext, stream: str, config: js_api.ConsumerConfig) -> str | None:
    name = config.durable_name
    assert name is not None
    try:
        info = await js.consumer_info(stream, name)
    except NotFoundError:
        await js.add_consumer(stream, config)
        return (f"created consumer {stream}/{name} (explicit ack, ack_wait {config.ack_wait:g}s, "
                f"max_deliver {config.max_deliver})")
    diffs = _differences(config, info.config,
                         ("ack_policy", "ack_wait", "max_deliver", "max_ack_pending", "deliver_policy"))
    if not diffs:
        return None
    # Same durable name, editable fields: the server updates the consumer in place, keeping its position.
    await js.add_consumer(stream, config)
    return f"updated consumer {stream}/{name}: {'; '.join(diffs)}"


async def provision(js: JetStreamContext, settings: Settings, *, replicas: int = 1) -> list[str]:
    """Declare the streams, KV buckets and durable consumers of DESIGN.md §4; idempotent.

    Returns one line per stream, bucket or consumer it created or updated (empty when everything already
    matched). An existing stream whose configuration differs in a compared field (subjects, retention,
    storage, duplicate window, age/size limits, replicas) is updated in place; the server refuses changes
    it cannot make (storage type, work-queue retention) and that error is raised unchanged.
    ``replicas`` is 1 on a single server and 3 on a production NATS cluster.
    """
    done: list[str] = []
    for spec in _stream_specs(settings, replicas):
        line = await _ensure_stream(js, spec)
        if line:
            done.append(line)
    for bucket, history, ttl in ((subjects.STATE_BUCKET, 5, None),
                                 (subjects.LOCKS_BUCKET, 1, float(settings.lock_ttl_s))):
        line = await _ensure_bucket(js, bucket, history=history, ttl_s=ttl, replicas=replicas)
        if line:
            done.append(line)
    for stream, config in _consumer_specs(settings):
        line = await _ensure_consumer(js, stream, config)
        if line:
            done.append(line)
    for line in done:
        log.info("bus: %s", line)
    return done


async def provision_at(url: str, settings: Settings, *, name: str = "remediator-provision") -> list[str]:
    """``provision`` over a connection of its own to ``url`` (benchmarks and tools that need just that)."""
    nc, js = await connect(url, name=name)
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


def _num_delivered(msg: Msg) -> int:
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
        delivered = _num_delivered(msg)
        if delivered < max_deliver:
            delay = nak_delay
            if isinstance(error, TemporaryError) and error.delay is not None:
                delay = error.delay
            if isinstance(error, TemporaryError):  # an expected condition: one line, no traceback
                log.info("%s: %s (delivery %d/%d), retrying in %gs",
                         msg.subject, error, delivered, max_deliver, delay)
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


def dead_letter_publisher(js: JetStreamContext, *, timeout: float = 5.0,
                          on_dead_letter: Callable[[Msg, str, str], Awaitable[None]] | None = None
                          ) -> DeadLetter:
    """A ``dead_letter`` callback for ``settle``: copy the message to ``deadletter.<stream>.<node>``.

    The copy keeps the body and headers and adds the reason, the original subject and stream sequence; its
    ``Nats-Msg-Id`` is ``dl|<stream>|<sequence>`` so a retried dead-lettering is stored once. ``<node>`` is
    the last token of the original subject (``faults.<source>.<node>``, ``remediation.<node>``).
    ``on_dead_letter(msg, reason, subject)`` runs after the copy is acked (e.g. to write the audit record).
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
        await js.publish(subject, msg.data, timeout=timeout, stream=subjects.DEAD_LETTER_STREAM,
                         headers=headers)
        if on_dead_letter is not None:
            await on_dead_letter(msg, reason, subject)

    return dead_letter
