"""The service process: HTTP ingest, dispatch (handlers) and the executor, wired together over one bus.

Where it sits: below the CLI (``remediator serve``, and ``demo``/``bench`` which run it in-process), above
everything else. It connects to NATS (or starts an embedded ``nats-server`` when no URL is configured),
provisions the bus in development, and runs three concurrent parts until asked to stop:

    uvicorn(ingest app) ──► FAULTS ──► Dispatcher ──► REMEDIATIONS ──► Executor ──► Kubernetes / agents

The two consumers are faststream subscribers (``remediator.consumers``) on one ``NatsBroker``, started inside
this event loop with a second connection of its own; ingest, the dispatcher's and executor's publishes, KV
and the audit trail use the first.

It is the composition root: the one place that turns ``Settings`` into parts. The handler registry is built
here from the settings' ``handlers`` section (``configured_registry``: every family bound to its policy) and
handed to the ``Dispatcher``, with the owner resolver (``remediator.owners``) that names each event's job
from its pod's owner references; no part configures itself from a module global.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import uvicorn
from faststream.nats import NatsBroker
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext

from handlers import HandlerPolicies, build_registry
from handlers.base import HandlerRegistry
from handlers.rules import RulesError, RulesSource
from playbooks.catalog import PlaybookCatalog
from remediator import bus, consumers, telemetry
from remediator.adapters.agent import AgentClient, AgentKeys
from remediator.adapters.kube import AsyncKube
from remediator.audit import AuditLog
from remediator.audit_api import routes as audit_api
from remediator.audit_api.reader import AuditReader
from remediator.contracts import utcnow
from remediator.dispatch import Dispatcher
from remediator.errors import RemediatorError, SetupError
from remediator.executor import Executor
from remediator.identity import http as identity_http
from remediator.ingest.app import create_app
from remediator.ingest.server import uvicorn_limits
from remediator.metrics import ServiceMetrics
from remediator.natsd import EmbeddedNats
from remediator.owners import OwnerResolver
from remediator.readiness import Readiness
from remediator.reconciler import Reconciler
from remediator.rules_watch import watch_rules
from remediator.settings import Settings
from remediator.signing import service_signer
from remediator.subjects import FAULTS_STREAM, STATE_BUCKET

log = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside our event loop: signals belong to the process owner (``serve``), not to uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def configured_registry(settings: Settings) -> HandlerRegistry:
    """The handler registry ``settings`` ask for: every family bound to the policy of its thresholds."""
    return build_registry(HandlerPolicies.from_settings(settings.handlers_view()))


async def _detect_gpu_allocation(kube: AsyncKube) -> None:
    try:
        log.info("GPU allocation: %s", await kube.gpu_allocation_mode())
    except RemediatorError as e:
        log.warning("GPU allocation not detected at start (%s); the first GPU withdrawal detects it", e)


def _kube_port(settings: Settings) -> AsyncKube:
    """The Kubernetes port, or a ``SetupError`` naming the kubeconfig when its configuration cannot be
    loaded (a missing or unreadable file, no in-cluster service account and no ~/.kube/config)."""
    try:
        return AsyncKube.from_settings(settings)
    except Exception as e:
        where = settings.kubeconfig or "in-cluster config or ~/.kube/config"
        raise SetupError(f"cannot load the Kubernetes configuration from {where} ({type(e).__name__}: {e}); "
                         "pass --kubeconfig FILE or set REMEDIATOR_KUBECONFIG") from e


def default_actor() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


# parts that end once their work is done; any other part ending stops the service
ONE_SHOT_TASKS = frozenset({"gpu-allocation"})

@dataclass
class Service:
    """One replica. ``start`` returns once HTTP is listening and the consumers run; ``stop`` drains them."""

    settings: Settings
    clock: Callable[[], datetime] = utcnow
    provision: bool | None = None  # None: provision only an embedded server; False: verify; True: provision
    http_enabled: bool = True
    nats: EmbeddedNats | None = None
    nc: NATS | None = None
    js: JetStreamContext | None = None
    audit: AuditLog | None = None
    registry: HandlerRegistry | None = None
    rules: RulesSource | None = None  # the operator rules file, hot-reloaded (remediator.rules_watch)
    dispatcher: Dispatcher | None = None
    executor: Executor | None = None
    reconciler: Reconciler | None = None
    kube: AsyncKube | None = None
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)
    broker: NatsBroker | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    _http: uvicorn.Server | None = None
    readiness: Readiness | None = None
    _stopping: asyncio.Task[None] | None = None

    @property
    def nats_url(self) -> str:
        if self.settings.nats_url:
            return self.settings.nats_url
        assert self.nats is not None
        return self.nats.url

    @property
    def http_url(self) -> str:
        return f"http://{self.settings.http_host}:{self.settings.http_port}"

    async def start(self) -> None:
        """Start every part; on any failure (or cancellation) stop what was started, the embedded
        nats-server included, and re-raise. A bus that is unreachable or not provisioned, or a Kubernetes
        configuration that cannot be loaded, raises ``SetupError`` naming the fix within
        ``startup_timeout_s``. Only the embedded development server is provisioned here (``provision``
        None); a production bus is only verified (``remediator bus init`` declares it)."""
        try:
            await self._start()
        except BaseException:
            await asyncio.shield(self.stop())
            raise

    async def _start(self) -> None:
        s = self.settings
        if not s.nats_url:  # the embedded server runs with auth too (operator in DATA_DIR/identity)
            self.nats = EmbeddedNats(data_dir=s.data_dir, port=s.nats_port, secure=True)
            await asyncio.to_thread(self.nats.start)
            log.info("embedded nats-server on %s (store %s)", self.nats.url, self.nats.data_dir)
        credentials = (bus.Credentials(creds_file=self.nats.creds("service")) if self.nats is not None
                       else bus.Credentials.from_settings(s))
        # publishes (events, decisions, audit, KV) wait out a stream leader's election (bus.LEADER_WAIT_S)
        self.nc, self.js = await bus.connect_within(self.nats_url, s.startup_timeout_s,
                                                    name=s.replica_id or default_actor(), credentials=credentials,
                                                    leader_wait_s=bus.LEADER_WAIT_S)
        if self.provision or (self.provision is None and self.nats is not None):
            await self._provision(s)
        else:
            await asyncio.wait_for(bus.verify(self.js, s), s.startup_timeout_s)
        actor = s.replica_id or default_actor()
        telemetry.setup(otlp_endpoint=s.otlp_endpoint)  # spans built and exported only for a configured collector
        self.registry = configured_registry(s)
        # One key signs this replica's audit records, checkpoints and agent commands (signing_seed_file, else
        # <data dir>/identity/service.nk, made once): agents and `audit verify` trust its public key.
        signer = service_signer(s.data_dir or (self.nats.data_dir if self.nats is not None else None),
                                s.signing_seed_file)
        if not (s.signing_seed_file or s.data_dir or self.nats is not None):
            log.warning("no signing_seed_file: audit records and agent commands are signed by a key of this "
                        "process only (%s), which no agent or verifier trusts after a restart", signer.public_key)
        self.audit = AuditLog.for_replica(self.js, s, actor, signer, clock=self.clock,
                                         observers=[self.metrics.observe])
        self.kube = _kube_port(s)
        self.metrics.watch_limiter(self.kube.sync.limiter)  # /metrics: the client rate limit's queue per lane
        # Nodes from a list-then-watch in memory; reads go to the API server until its first list is in.
        await self.kube.start(wait_s=min(5.0, s.startup_timeout_s))
        # How a withdrawn GPU is kept from the scheduler (REMEDIATOR_GPU_ALLOCATION: auto reads the cluster's
        # DRA ResourceSlices once), found in the background so an API server slow at start delays nothing.
        self._tasks.append(asyncio.create_task(_detect_gpu_allocation(self.kube), name="gpu-allocation"))
        hs = s.handlers_view()
        self.rules = RulesSource(hs.rules_file)
        try:
            self.rules.load()  # an invalid rules file stops the start, naming each FILE:LINE problem
        except RulesError as e:
            raise SetupError(f"rules file: {e}") from e
        self.dispatcher = await Dispatcher.create(self.nc, self.js, s, self.audit, registry=self.registry,
                                                  clock=self.clock, origins=OwnerResolver(self.kube),
                                                  rules=self.rules.current)
        if hs.rules_file:
            self._tasks.append(asyncio.create_task(watch_rules(self.rules, self._stop, hs.rules_poll_s),
                                                   name="rules-watch"))
        self.executor = Executor(self.nc, self.js, s, self.kube, self.audit, PlaybookCatalog.load(),
                                 AgentClient(self.nc, signer=signer, command_ttl_s=s.agent_command_ttl_s,
                                             keys=AgentKeys(self.nc, cache_s=s.agent_key_cache_s)),
                                 clock=self.clock)
        self.reconciler = Reconciler(await self.js.key_value(STATE_BUCKET), self.kube, self.audit,
                                     taint_key=s.taint_key, withdrawn_key=s.gpu_withdrawn_taint_key,
                                     resync_s=s.safety_view().reconcile_resync_s,
                                     watch_timeout_s=s.safety_view().reconcile_watch_s, clock=self.clock)
        self._tasks.append(asyncio.create_task(self.reconciler.run(self._stop), name="reconciler"))
        self.broker = consumers.consumer_broker(self.nats_url, name=f"{actor}-consumers", auth=bus.auth_of(self.nc))
        consumers.declare_dispatch(self.broker, self.dispatcher)
        consumers.declare_executor(self.broker, self.executor, concurrency=s.executor_concurrency)
        await consumers.start(self.broker, self.js, (consumers.DISPATCH, consumers.EXECUTOR))
        self.readiness = self._readiness()
        await self.readiness.check()  # /readyz answers from the first probe on
        self._tasks.append(asyncio.create_task(self.readiness.run(), name="readiness"))
        if self.http_enabled:
            app = create_app(settings=s, nc=self.nc, js=self.js, audit=self.audit,
                             service_metrics=self.metrics.render, readiness=self.readiness.report)
            audit_api.mount(app, AuditReader(self.js), s)  # the read-only /v1/audit API and /audit/ view
            identity = self._agent_identity(s)
            if identity is not None:  # POST /v1/identity/agent: agents' credentials after a TokenReview
                app.include_router(identity_http.router(identity))
            config = uvicorn.Config(app, host=s.http_host, port=s.http_port, log_level="warning",
                                    access_log=False, lifespan="off",
                                    **uvicorn_limits(s.http_header_timeout_s, s.http_keep_alive_s))
            self._http = _EmbeddedServer(config)
            self._tasks.append(asyncio.create_task(self._http.serve(), name="http"))
            while not self._http.started:
                if self._tasks[-1].done():
                    self._tasks[-1].result()  # raises: the port is taken, say
                await asyncio.sleep(0.02)

    def _readiness(self) -> Readiness:
        """The conditions of ``/readyz``: the bus, the durable consumers, the Kubernetes API."""
        nc, js, kube, s = self.nc, self.js, self.kube, self.settings
        assert nc is not None and js is not None and kube is not None

        async def bus_ok() -> str | None:
            if not nc.is_connected:
                return "NATS is not connected (reconnecting)"
            if not await bus.bus_ready(nc, js, timeout=s.readiness_timeout_s):
                return f"JetStream does not answer for the {FAULTS_STREAM} stream"
            return None

        async def consumers_ok() -> str | None:
            if not nc.is_connected:
                return "unknown while NATS is not connected"
            return await consumers.missing(js)

        async def kube_ok() -> str | None:
            await kube.ping(s.readiness_timeout_s)
            return None

        return Readiness({"bus": bus_ok, "consumers": consumers_ok, "kubernetes": kube_ok},
                         interval_s=s.readiness_interval_s, timeout_s=s.readiness_timeout_s,
                         on_change=lambda c: self.metrics.set_ready(c.name, c.ok))

    def _agent_identity(self, s: Settings) -> identity_http.AgentIdentity | None:
        """The agent-identity endpoint, when this replica holds an agents signing key: the embedded
        store's, or the production account's (``nats_agent_signing_key`` with ``nats_account``)."""
        if self.nats is not None and self.nats.store is not None:
            issuer = self.nats.store.issuer()
        elif s.nats_agent_signing_key:
            from remediator.identity import keys
            from remediator.identity.issuer import Issuer

            try:
                key = keys.read_seed_file(s.nats_agent_signing_key, "account")
            except ValueError as e:
                raise SetupError(f"REMEDIATOR_NATS_AGENT_SIGNING_KEY: {e}") from None
            issuer = Issuer(s.nats_account or key.public_key, agents_key=key)
        else:
            return None
        assert self.kube is not None and self.js is not None
        return identity_http.AgentIdentity(self.kube, issuer, self.js, audience=s.identity_audience,
                                           namespace=s.identity_namespace, daemonset=s.identity_daemonset,
                                           ttl=timedelta(seconds=s.identity_ttl_s), clock=self.clock,
                                           observe=self.metrics.identity_request)

    async def _provision(self, s: Settings) -> None:
        """Declare the bus: on the embedded server as its ``admin`` identity (the service's own may not
        change streams), elsewhere through the service's connection."""
        if self.nats is None or not self.nats.secure:
            assert self.js is not None
            await bus.provision(self.js, s)
            return
        nc, js = await bus.connect_within(self.nats_url, s.startup_timeout_s, name="remediator-provision",
                                          credentials=bus.Credentials(creds_file=self.nats.creds("admin")))
        try:
            await bus.provision(js, s)
        finally:
            await nc.close()

    async def wait(self) -> None:
        """Until a part fails (re-raised) or ``stop`` is called."""
        stopper = asyncio.create_task(self._stop.wait())
        waiting = {*self._tasks, stopper}
        try:
            while True:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is not stopper and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
                # a one-shot part that finished its work (gpu-allocation) does not stop the service
                if stopper in done or any(t.get_name() not in ONE_SHOT_TASKS for t in done):
                    return
        finally:
            stopper.cancel()

    async def stop(self) -> None:
        """Stop every part that was started; idempotent (a second call waits for the first). Each step is
        bounded, so stopping ends with NATS or Kubernetes away too; the embedded nats-server is always
        stopped."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop_parts())
        await asyncio.shield(self._stopping)

    async def _stop_parts(self) -> None:
        try:
            await self._stop_consumers_and_tasks()
        finally:
            if self.kube is not None:  # its worker threads and connection pool
                self.kube.close()
            await self._flush_audit()
            if self.nc is not None:
                try:
                    await asyncio.wait_for(self.nc.drain(), 5)
                except Exception:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(self.nc.close(), 2)
            if self.nats is not None:
                await asyncio.to_thread(self.nats.close)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.to_thread(telemetry.flush), 5)

    async def _flush_audit(self) -> None:
        """Anchor every chain head this replica wrote since its last checkpoint (bounded: NATS may be away)."""
        if self.audit is not None and self.nc is not None and self.nc.is_connected:
            try:
                await asyncio.wait_for(self.audit.flush(), 5)
            except Exception as e:
                log.warning("audit checkpoints at stop not written: %s", type(e).__name__)

    async def _stop_consumers_and_tasks(self) -> None:
        self._stop.set()
        if self._http is not None:
            self._http.should_exit = True
        if self.broker is not None:  # stops fetching, lets running handlers finish, then cancels them
            try:
                await asyncio.wait_for(self.broker.stop(), consumers.GRACEFUL_STOP_S + 5)
            except Exception as e:  # NATS away: what it had not settled comes back after the ack wait
                log.warning("stopping the consumers: %s", type(e).__name__)
        if self.readiness is not None:
            for t in self._tasks:
                if t.get_name() == "readiness":
                    t.cancel()
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=10)
            for t in pending:
                t.cancel()

    async def __aenter__(self) -> Service:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
