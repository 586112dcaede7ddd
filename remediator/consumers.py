"""The consumers: FAULTS → dispatch and REMEDIATIONS → executor, declared as faststream JetStream pull subscribers.

Where it sits: between the bus and the two per-message entry points. ``bus.provision`` declares the streams and
the durable pull consumers ``dispatch`` and ``executor`` (``remediator bus init``); this module binds to them
and hands every delivery, as the raw ``nats.aio.msg.Msg``, to ``Dispatcher.on_message`` or
``Executor.on_message``, which parse it, do the work and settle it through ``bus.settle``. The service
(``remediator.service``) runs both subscribers on one broker; ``Dispatcher.run``/``Executor.run`` run one each.

What is declared (``declare_dispatch``, ``declare_executor``) is kept apart from how it runs (``start``,
``run_until``), as in faststream itself:

================  ==========================================  ===========================================
                  dispatch                                    executor
================  ==========================================  ===========================================
stream            ``JStream("FAULTS", declare=False)``        ``JStream("REMEDIATIONS", declare=False)``
durable           ``dispatch``                                ``executor``
pull              ``PullSub(batch_size=128, timeout=0.5)``    ``PullSub(batch_size=1, timeout=0.5)``
concurrency       the fetched batch at once, one node in      ``max_workers=executor_concurrency``
                  order (below)
ack policy        ``AckPolicy.MANUAL``                        ``AckPolicy.MANUAL``
================  ==========================================  ===========================================

Declaring nothing: ``declare=False`` keeps faststream from creating or updating the streams, and ``start``
checks that both durable consumers exist before the broker subscribes, so binding never creates one with
faststream's defaults (a pod start never mutates the bus; DESIGN.md §4).

Acknowledgement: ``AckPolicy.MANUAL`` (faststream's enum, ``faststream.AckPolicy``; not
``faststream.nats.AckPolicy``, which is the JetStream consumer setting), on the broker and on each subscriber.
faststream neither acks before nor after the handler and never rejects on an exception; ``bus.settle`` is the
one place that maps an outcome to ack, nak with a delay, or dead-letter then term. faststream's default,
``REJECT_ON_ERROR``, would terminate a message on its first exception.

The handler's argument: the broker's decoder (``_the_delivery``) hands each handler the delivery itself, body
unread, and FastDepends is off (``apply_types=False``). faststream would otherwise JSON-parse the body before
the handler (a malformed one would fail outside ``settle``, unsettled, instead of going to the dead letter),
and FastDepends resolves a ``Context(...)`` parameter in a worker thread, which reorders messages (below).

Ordering, dispatch: faststream's pull subscriber fetches up to ``batch_size`` messages, starts one task per
message in fetch order, and fetches again only when the whole batch is done. The handler's first step is to
take the lock of the message's node (``NodeOrder``, the last subject token); ``asyncio.Lock`` queues waiters
first come, first served. Nothing between faststream's task start and that lock suspends (parser, filter and
decoder are plain coroutines; no DI), so each task reaches the lock in the same loop step it starts in, in
fetch order, which is stream order: one node's messages run in stream order, other nodes' concurrently. That
is what the hand-written loop did (group a batch by node, ``gather`` the groups). A test in
tests/unit/test_consumer_routing.py pins this; a faststream upgrade that adds a suspension there (a thread
hop, I/O) would break it. As before, a redelivery comes back in a later batch, so across redeliveries and
replicas order comes from the node history's compare-and-set, not from here.

Concurrency, executor: ``max_workers`` makes faststream run at most ``executor_concurrency`` handlers at
once from an in-memory queue the pull loop fills one message at a time (``batch_size=1``); a free worker
takes the next decision without waiting for slow ones, as before. The pull loop waits for a free worker
before it puts a message on the queue, so one fetched decision waits for a slot (``executor_concurrency + 1``
delivered at most; its ack wait runs); the old loop fetched only for free slots. Per-node exclusion is the
node lock in KV, not this process.

Idle fetches: nats-py can end an empty pull with the built-in ``TimeoutError``, where faststream's pull loop
expects ``nats.errors.TimeoutError``; ``consumer_broker`` installs the translation
(``install_fetch_timeout_translation``) when it builds a consumer's broker, never at import.

Stopping: ``broker.stop()`` stops fetching, waits up to ``GRACEFUL_STOP_S`` for running handlers, then
cancels the rest, which ``bus.settle`` naks without delay. A message delivered by the pull request still
open while stopping is dropped unsettled by faststream and comes back after the consumer's ack wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import nats.errors
from faststream import AckPolicy
from faststream.message import StreamMessage
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.subscriber.usecases import LogicSubscriber
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from remediator.bus import DISPATCH_CONSUMER, EXECUTOR_CONSUMER, auth_of
from remediator.subjects import FAULTS_STREAM, FAULTS_WILDCARD, REMEDIATIONS_STREAM, REMEDIATIONS_WILDCARD

log = logging.getLogger(__name__)

__all__ = [
    "ACK_POLICY",
    "DISPATCH",
    "DISPATCH_BATCH",
    "EXECUTOR",
    "GRACEFUL_STOP_S",
    "PULL_TIMEOUT_S",
    "Binding",
    "MessageConsumer",
    "MissingConsumer",
    "NodeOrder",
    "broker_like",
    "consumer_broker",
    "declare_dispatch",
    "declare_executor",
    "install_fetch_timeout_translation",
    "missing",
    "node_token_of",
    "run_until",
    "start",
    "translate_fetch_timeouts",
]

ACK_POLICY = AckPolicy.MANUAL  # bus.settle acks, naks and terms; faststream does none of it
DISPATCH_BATCH = 128  # messages per pull; one batch is handled at once, node by node in order
PULL_TIMEOUT_S = 0.5  # how long one pull request waits for messages (also how long stopping waits for it)
GRACEFUL_STOP_S = 10.0  # how long stopping waits for running handlers before cancelling them


class MessageConsumer(Protocol):
    """A per-message entry point: handles one delivery and settles it (``bus.settle``) before returning."""

    async def on_message(self, msg: Msg) -> None: ...


class MissingConsumer(RuntimeError):
    """A durable consumer the subscribers bind to does not exist: the bus was not provisioned."""


@dataclass(frozen=True)
class Binding:
    """Where a subscriber reads: the stream, its subjects and the durable consumer ``bus.provision`` made."""

    stream: str
    subject: str
    durable: str


DISPATCH = Binding(stream=FAULTS_STREAM, subject=FAULTS_WILDCARD, durable=DISPATCH_CONSUMER)
EXECUTOR = Binding(stream=REMEDIATIONS_STREAM, subject=REMEDIATIONS_WILDCARD, durable=EXECUTOR_CONSUMER)


class NodeOrder:
    """One ``asyncio.Lock`` per node token, forgotten when nobody holds it or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, node: str) -> AsyncIterator[None]:
        """Run the block after every earlier ``hold`` of ``node`` (first come, first served)."""
        lock, users = self._locks.get(node) or (asyncio.Lock(), 0)
        self._locks[node] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[node]
            if users == 1:
                del self._locks[node]
            else:
                self._locks[node] = (lock, users - 1)


def node_token_of(subject: str) -> str:
    """The node token of ``faults.<source>.<node>`` or ``remediation.<node>``: the last subject token."""
    return subject.rsplit(".", 1)[-1]


async def _the_delivery(message: StreamMessage[Any]) -> Any:
    """The decoder: hands the handler the delivery itself, body unread (the entry points validate it)."""
    return message.raw_message


# --- declaring ---------------------------------------------------------------------------------------


class _CancelledAtStop(logging.Filter):
    """faststream logs a handler that was cancelled as the consumers stopped (still running after
    ``GRACEFUL_STOP_S``) at ERROR with its traceback, one per handler. That is how stopping works, not a
    failure, and ``bus.settle`` has naked its message: one INFO line each instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info
        if exc and exc[0] is not None and issubclass(exc[0], asyncio.CancelledError):
            record.msg, record.args = "a handler was cancelled as the consumers stopped; its message comes back", None
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


log.addFilter(_CancelledAtStop())


def consumer_broker(url: str, *, name: str, graceful_timeout: float = GRACEFUL_STOP_S,
                    auth: dict[str, Any] | None = None) -> NatsBroker:
    """A faststream broker for the consumers, with its own connection to ``url`` (comma-separated servers).

    Connection behaviour follows ``bus.connect``: reconnect forever, 2 s apart; the first connection gives up
    after one round. ``AckPolicy.MANUAL`` is also the broker default, so no subscriber falls back to
    faststream's. Per-message access logs go to this module's logger at DEBUG. Building one installs the
    fetch-timeout translation (``install_fetch_timeout_translation``). ``auth``: the identity options of
    ``bus.Credentials.options`` (``bus.auth_of`` of a connection), so the broker connects as that identity.
    """
    install_fetch_timeout_translation()  # the pull loops of this broker's subscribers fetch through it
    servers = [s.strip() for s in url.split(",") if s.strip()]
    identity = dict(auth or {})
    identity["security"] = _security(identity.pop("tls", None), identity.pop("user_credentials", None),
                                     identity.pop("nkeys_seed", None))
    broker = NatsBroker(
        servers, name=name, **identity, allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=2,
        connect_timeout=2, ping_interval=20, max_outstanding_pings=3, graceful_timeout=graceful_timeout,
        ack_policy=ACK_POLICY, apply_types=False, decoder=_the_delivery, logger=log, log_level=logging.DEBUG,
    )
    _INBOX_OF[broker] = f"{identity.get('inbox_prefix') or '_INBOX'}.".encode()
    return broker


def _security(tls: Any, creds_file: str | None, nkey_seed_file: str | None) -> Any:
    """``bus.Credentials.options``'s identity as faststream's security object (its own ``user_credentials``
    and ``nkeys_seed`` arguments are deprecated)."""
    from faststream.nats import NatsCredentials, NatsNKey
    from faststream.security import BaseSecurity

    if creds_file:
        return NatsCredentials(creds_file, ssl_context=tls)
    if nkey_seed_file:
        return NatsNKey.from_file(nkey_seed_file, ssl_context=tls)
    return BaseSecurity(ssl_context=tls) if tls is not None else None


_INBOX_OF: weakref.WeakKeyDictionary[NatsBroker, bytes] = weakref.WeakKeyDictionary()


def _inbox_prefix(broker: NatsBroker) -> bytes:
    """Where a pull subscriber of ``broker`` receives: its identity's inbox (faststream defaults every
    subscriber to ``_INBOX.``, which a role of ``remediator.identity.roles`` may not subscribe to)."""
    return _INBOX_OF.get(broker, b"_INBOX.")


def broker_like(nc: NATS, role: str) -> NatsBroker:
    """A ``consumer_broker`` for the servers ``nc`` knows, named after ``nc`` and ``role``."""
    url = ",".join(u.geturl() for u in nc.servers)
    return consumer_broker(url, name=f"{nc.options.get('name') or 'remediator'}-{role}",
                           auth=auth_of(nc))


def declare_dispatch(broker: NatsBroker, dispatcher: MessageConsumer, *,
                     batch: int = DISPATCH_BATCH) -> LogicSubscriber[Any]:
    """Subscribe ``dispatcher.on_message`` to FAULTS through the durable ``dispatch``; one node in order.

    Returns the faststream subscriber.
    """
    order = NodeOrder()
    subscriber = broker.subscriber(
        DISPATCH.subject, stream=JStream(DISPATCH.stream, declare=False), durable=DISPATCH.durable,
        pull_sub=PullSub(batch_size=batch, timeout=PULL_TIMEOUT_S), ack_policy=ACK_POLICY,
        inbox_prefix=_inbox_prefix(broker), title="dispatch",
        description="fault events to the handlers, one node in order",
    )

    async def dispatch_fault(msg: Msg) -> None:
        async with order.hold(node_token_of(msg.subject)):  # no await before this line: see the docstring
            await dispatcher.on_message(msg)

    subscriber(dispatch_fault)
    return subscriber


def declare_executor(broker: NatsBroker, executor: MessageConsumer, *, concurrency: int) -> LogicSubscriber[Any]:
    """Subscribe ``executor.on_message`` to REMEDIATIONS through the durable ``executor``, at most
    ``concurrency`` decisions at once. Returns the faststream subscriber."""
    subscriber = broker.subscriber(
        EXECUTOR.subject, stream=JStream(EXECUTOR.stream, declare=False), durable=EXECUTOR.durable,
        pull_sub=PullSub(batch_size=1, timeout=PULL_TIMEOUT_S), max_workers=concurrency, ack_policy=ACK_POLICY,
        inbox_prefix=_inbox_prefix(broker), title="executor", description="decisions to the executor",
    )

    async def execute_decision(msg: Msg) -> None:
        await executor.on_message(msg)

    subscriber(execute_decision)
    return subscriber


# --- running -----------------------------------------------------------------------------------------


def translate_fetch_timeouts(fetch: Any) -> Any:
    """``fetch`` raising ``nats.errors.TimeoutError`` where it raised the built-in ``TimeoutError``.

    faststream's pull loop treats ``nats.errors.TimeoutError`` as "no messages yet" and fetches again, but
    nats-py 2.16 raises the built-in ``TimeoutError`` from one path of ``PullSubscription.fetch``;
    faststream's supervisor then logs an ERROR with a traceback and restarts the loop. The nats error is a
    subclass of the built-in one, so every other caller catching ``asyncio.TimeoutError`` is unaffected.
    """
    if getattr(fetch, "_remediator_translated", False):
        return fetch

    @functools.wraps(fetch)
    async def translated(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fetch(self, *args, **kwargs)
        except nats.errors.TimeoutError:
            raise
        except TimeoutError as exc:
            raise nats.errors.TimeoutError from exc

    translated._remediator_translated = True  # type: ignore[attr-defined]
    return translated


def install_fetch_timeout_translation() -> None:
    """Make nats-py's ``PullSubscription.fetch`` time out as faststream expects (``translate_fetch_timeouts``).

    Called by ``consumer_broker``, where a consumer is built, so importing this module changes nothing;
    idempotent, and a no-op in a process that never builds a consumer.
    """
    JetStreamContext.PullSubscription.fetch = translate_fetch_timeouts(  # type: ignore[method-assign]
        JetStreamContext.PullSubscription.fetch)


async def missing(js: JetStreamContext, bindings: tuple[Binding, ...] = (DISPATCH, EXECUTOR)) -> str | None:
    """None when every durable consumer of ``bindings`` exists; else one line naming the missing ones and
    the fix (a readiness probe: a deleted consumer stops that half of the pipeline, which must not be
    silent). Other errors (the bus is away) propagate."""
    gone = []
    for b in bindings:
        try:
            await js.consumer_info(b.stream, b.durable)
        except NotFoundError:
            gone.append(f"{b.stream}/{b.durable}")
    if not gone:
        return None
    return f"durable consumer(s) {', '.join(gone)} do not exist; run `remediator bus init` to re-create them"


async def start(broker: NatsBroker, js: JetStreamContext, bindings: tuple[Binding, ...]) -> None:
    """Check that the durable consumers of ``bindings`` exist (``js`` is any connection to the bus), then
    connect ``broker`` and start its subscribers. Raises ``MissingConsumer`` naming the first one missing."""
    for b in bindings:
        try:
            await js.consumer_info(b.stream, b.durable)
        except NotFoundError as exc:
            raise MissingConsumer(
                f"consumer {b.stream}/{b.durable} does not exist; run `remediator bus init` to provision the bus"
            ) from exc
    await broker.start()


async def run_until(broker: NatsBroker, js: JetStreamContext, bindings: tuple[Binding, ...],
                    stop: asyncio.Event) -> None:
    """``start`` the broker, wait for ``stop``, then stop it (also when cancelled)."""
    try:
        await start(broker, js, bindings)
        await stop.wait()
    finally:
        await broker.stop()
