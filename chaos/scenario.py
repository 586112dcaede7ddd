"""Chaos scenarios: the world the demo and the drills run in, what they inject into it and how they judge it.

Where it sits: chaos tooling on top of everything, under ``chaos.demo`` (the standard faults of
``remediator demo``) and ``chaos.drill`` (the YAML drills of ``remediator drill``). Nothing on the service's
path imports it. ``environment`` starts, on one machine:

* an embedded ``nats-server`` with JetStream;
* the Kubernetes API simulator (``chaos.sim``) with N GPU nodes, their training pods (PyTorchJobs and batch
  Jobs), DaemonSet pods and PodDisruptionBudgets, plus any extra Jobs a drill pins to a node;
* one simulated GPU node per Kubernetes node (``chaos.sim.gpu_node``) and the real node agent on it (on
  every node, or on the nodes a drill names), and optionally a kubelet that stops a pod's GPU processes when
  the API server deletes or evicts it;
* a service replica (HTTP ingest, dispatch, executor) with its own Kubernetes API endpoint and, when the
  scenario may crash it, its own TCP path to the bus, so that ``kill_replica`` can cut both at once;
* an observer connection to NATS that reads the audit trail without depending on any replica.

It yields a ``World``: what a fault's injector, a chaos action and a check can touch. Faults (``Fault``)
arrive the two ways they do in production: as Alertmanager webhook payloads (``webhook_xid``,
``alert_replay``) or through the simulated nodes, which the agents read like a real node (``agent_xid``,
``agent_ecc``, ``agent_orphan``, ``nccl_ranks``). Chaos actions break the machinery around the faults: the
bus (``nats_restart``), the Kubernetes API (``kube_api_errors``, ``kube_latency``), the service
(``kill_replica``), an agent (``agent_disconnect``) and people (``manual_uncordon``, ``opt_out``,
``block_pdb``). ``follow`` reads a fault's decision and playbook outcome back from the audit trail,
``settle_faults`` waits until every fault came to rest, and ``judge`` compares what happened with what
should have (the checks below say what must, and must not, be true of the cluster and the GPUs).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import httpx
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext

from chaos.sim import KubeApiServer, seed_cluster
from chaos.sim.cluster import ClusterState, InjectedFault
from chaos.sim.gpu_node import SimFleet, SimGpuNode, sim_agent
from handlers import memleak as memleak_handler
from remediator import bus
from remediator.audit import iter_records
from remediator.bus import EXECUTOR_CONSUMER
from remediator.contracts import OPT_OUT_LABEL, AuditRecord
from remediator.natsd import EmbeddedNats, free_port
from remediator.service import Service
from remediator.settings import Settings
from remediator.subjects import REMEDIATIONS_STREAM

Progress = Callable[[str], None]
TOKEN = "demo-token"
GIB = 1 << 30
GPU_INDICES_ANNOTATION = "gpu-remediator.io/gpu-indices"


# --- replicas: a service that can die like a process ---------------------------------------------------

_REPLICA: contextvars.ContextVar[Replica | None] = contextvars.ContextVar("chaos_replica", default=None)


def _install_task_tags(loop: asyncio.AbstractEventLoop) -> Any:
    """Make every task remember the replica it was started for (the context variable ``_REPLICA`` at the
    time it was created), so that ``kill_replica`` can cancel exactly that replica's tasks, its NATS
    client's included. Returns the previous factory, which ``environment`` puts back on exit."""
    previous = loop.get_task_factory()

    def factory(lp: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        task: asyncio.Future[Any] = (previous(lp, coro, **kwargs) if previous is not None
                                     else asyncio.Task(coro, loop=lp, **kwargs))
        ctx = kwargs.get("context")
        replica = ctx.get(_REPLICA) if ctx is not None else _REPLICA.get()
        if replica is not None and isinstance(task, asyncio.Task):
            replica.tasks.add(task)
        return task

    loop.set_task_factory(factory)
    return previous


class TcpRelay:
    """A TCP relay from a loopback port to ``host:port`` (the replica's way to the bus).

    ``cut()`` drops every relayed connection at once and refuses new ones, as the network does when the
    process on one end dies: nothing the replica still had buffered reaches the server.
    """

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._cut = False
        self.port = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:  # the server is down (nats_restart): the client sees a dropped connection
            writer.transport.abort()
            return
        if self._cut:  # cut while connecting
            writer.transport.abort()
            up_writer.transport.abort()
            return
        pair = {writer, up_writer}
        self._writers |= pair
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            for w in pair:
                w.transport.abort()
                self._writers.discard(w)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65_536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()  # one side gone: so is the other

    def cut(self) -> None:
        """Synchronously: stop accepting, and reset every relayed connection."""
        self._cut = True
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            await self._server.wait_closed()


@dataclass
class Replica:
    """One service replica with its own Kubernetes API endpoint and, when crashable, its own path to NATS."""

    index: int
    service: Service
    kube: KubeApiServer
    relay: TcpRelay | None = None
    tasks: weakref.WeakSet[asyncio.Task[Any]] = field(default_factory=weakref.WeakSet)
    alive: bool = True

    @property
    def actor(self) -> str:
        return self.service.settings.replica_id


# --- the world ---------------------------------------------------------------------------------------


@dataclass
class Outage:
    """A stretch of time a chaos action took something away: the bus (``node`` None) or one node's agent."""

    what: str
    node: str | None
    start: datetime
    end: datetime | None = None

    def covers(self, when: datetime, node: str) -> bool:
        return (self.node is None or self.node == node) and self.start <= when and (
            self.end is None or when <= self.end)


@dataclass(frozen=True)
class ExtraJob:
    """A single-pod batch Job pinned to ``node`` with ``gpus`` GPUs, added to the seeded cluster."""

    name: str
    node: str
    gpus: int = 2


@dataclass
class World:
    """Everything a fault's injector, a chaos action and a check can touch."""

    cluster: ClusterState
    fleet: SimFleet
    settings: Settings
    http: httpx.AsyncClient
    base_url: str
    started: datetime
    seeded_pods: dict[str, list[dict[str, Any]]]
    faults: list[Fault] = field(default_factory=list)
    nats_server: EmbeddedNats | None = None
    root: Path = field(default_factory=Path)
    label: str = "demo"
    overrides: dict[str, Any] = field(default_factory=dict)
    crashable: bool = False
    agent_options: dict[str, Any] = field(default_factory=dict)
    replicas: list[Replica] = field(default_factory=list)
    nc: NATS | None = None
    js: JetStreamContext | None = None
    kube_faults: list[InjectedFault] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    start_rv: int = 0

    def gpu_uuid(self, node: str, index: int) -> str:
        return self.fleet.nodes[node].identity(index).uuid or ""

    def gpu_pci(self, node: str, index: int) -> str:
        return self.fleet.nodes[node].identity(index).pci_bus_id or ""

    def sim(self, node: str) -> SimGpuNode:
        return self.fleet.nodes[node]

    def training_pods(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.cluster.pods_on(node) if p["metadata"]["namespace"] == "training"]

    def tainted(self, node: str) -> bool:
        return any(t["key"] == self.settings.taint_key for t in self.cluster.taints(node))

    def out_of_service(self, node: str) -> bool:
        return self.cluster.is_cordoned(node) or self.tainted(node)

    @property
    def replica(self) -> Replica:
        """The replica serving now (the newest one alive)."""
        return next(r for r in reversed(self.replicas) if r.alive)

    @property
    def nats_url(self) -> str:
        assert self.nats_server is not None
        return self.nats_server.url

    async def records(self) -> list[AuditRecord] | None:
        """The whole audit trail through the observer connection; None while the bus does not answer."""
        assert self.js is not None
        try:
            return [r async for r in iter_records(self.js)]
        except asyncio.CancelledError:
            raise
        except Exception:  # the bus is restarting, or a fetch timed out: try again on the next poll
            return None


@dataclass
class Fault:
    """One injected fault and what must come of it."""

    name: str
    via: Literal["webhook", "agent"]
    kind: str
    code: int | str
    node: str
    gpu: int | None
    playbook: str | None  # None: no remediation may start (recorded only)
    outcomes: tuple[str, ...]  # acceptable playbook outcomes
    inject: Callable[[World, Fault], Awaitable[None]]
    check: Callable[[World, Fault], list[str]]
    event_ids: list[str] = field(default_factory=list)
    job: str | None = None  # set by injectors whose events are found by job (NCCL)


@dataclass
class FaultResult:
    fault: Fault
    incident: str | None = None
    playbook: str | None = None
    outcome: str = "pending"
    actions: list[str] = field(default_factory=list)
    timeline: list[AuditRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    injected_at: datetime | None = None
    rest_at: datetime | None = None  # time of the audit record with which the fault came to rest

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def rest_s(self) -> float | None:
        """Seconds from injection to rest, by the audit trail's clock."""
        if self.injected_at is None or self.rest_at is None:
            return None
        return max(0.0, (self.rest_at - self.injected_at).total_seconds())

    def to_json(self) -> dict[str, Any]:
        f = self.fault
        # exactly the fault document of DESIGN.md §10; problems and the timeline go to stderr
        return {"name": f.name, "kind": f.kind, "code": f.code, "node": f.node, "gpu": f.gpu,
                "playbook": self.playbook, "actions": self.actions, "outcome": self.outcome, "passed": self.passed}


# --- injectors ---------------------------------------------------------------------------------------

Injector = Callable[[World, Fault], Awaitable[None]]


def _alert(world: World, node: str, gpu: int, labels: dict[str, str], summary: str,
           fingerprint: str, starts: datetime) -> dict[str, Any]:
    base = {"alertname": "GPUXidError", "Hostname": node, "gpu": str(gpu), "device": f"nvidia{gpu}",
            "UUID": world.gpu_uuid(node, gpu), "pci_bus_id": world.gpu_pci(node, gpu),
            "modelName": "NVIDIA H100 80GB HBM3", "instance": "10.42.0.17:9400", "job": "gpu-metrics",
            "severity": "critical"}
    return {"status": "firing", "labels": {**base, **labels}, "annotations": {"summary": summary},
            "startsAt": _stamp(starts), "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": fingerprint}


def _stamp(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


async def _post(world: World, alerts: list[dict[str, Any]], status: str = "firing") -> dict[str, Any]:
    payload = {"version": "4", "groupKey": "{}:{alertname=\"GPUXidError\"}", "truncatedAlerts": 0,
               "status": status, "receiver": "gpu-remediator", "groupLabels": {"alertname": "GPUXidError"},
               "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
               "alerts": alerts}
    r = await world.http.post(f"{world.base_url}/v1/alertmanager", json=payload,
                              headers={"Authorization": f"Bearer {TOKEN}"})
    if r.status_code != 200:
        raise RuntimeError(f"webhook answered {r.status_code}: {r.text}")
    body: dict[str, Any] = r.json()
    return body


def webhook_xid(times: int = 1, pods: tuple[str, ...] = ()) -> Injector:
    """Xid alert(s) as dcgm-exporter + Alertmanager send them; ``times`` repeats the very same notification,
    ``pods`` sends one alert per pod (different workloads on the same GPU)."""

    async def inject(world: World, f: Fault) -> None:
        assert f.gpu is not None
        starts = datetime.now(UTC).replace(microsecond=0)
        summary = f"Xid {f.code} on GPU {f.gpu} of {f.node}"
        if pods:
            for i, pod in enumerate(pods):
                alert = _alert(world, f.node, f.gpu, {"xid": str(f.code), "pod": pod, "namespace": "training"},
                               summary, f"{f.name}-{i:02d}", starts + timedelta(seconds=i))
                body = await _post(world, [alert])
                f.event_ids += body.get("ids", [])
            return
        alert = _alert(world, f.node, f.gpu, {"xid": str(f.code)}, summary, f"{f.name}-fp", starts)
        for _ in range(times):
            body = await _post(world, [alert])
            f.event_ids += body.get("ids", [])

    return inject


def alert_replay(times: int = 3, concurrent: int = 2,
                 resolved: Literal["never", "early", "first"] = "never") -> Injector:
    """One Alertmanager notification delivered the ways an HA pair and its retries deliver it.

    The firing notification goes out ``times`` times, ``concurrent`` copies at once (both members of an HA
    pair notify; each retries). With ``resolved="early"`` the ``resolved`` notification of the same alert
    overtakes the retries: it arrives after the first firing copy and before the others, so the receiver
    sees firing, resolved, firing, ... (out of order); with ``"first"`` it overtakes them all and arrives
    before any firing copy. With ``"never"`` no resolved ever comes (Alertmanager does not guarantee one).
    Every copy carries the same fingerprint and ``startsAt``, hence the same event id: the repeats are
    duplicates the bus drops, and the resolved is a separate, informative event.
    """

    async def inject(world: World, f: Fault) -> None:
        assert f.gpu is not None
        starts = datetime.now(UTC).replace(microsecond=0)
        firing = _alert(world, f.node, f.gpu, {"xid": str(f.code)}, f"Xid {f.code} on GPU {f.gpu} of {f.node}",
                        f"{f.name}-fp", starts)
        sends: list[tuple[str, dict[str, Any]]] = [("firing", firing)] * times
        if resolved != "never":
            gone = {**firing, "status": "resolved", "endsAt": _stamp(datetime.now(UTC) + timedelta(seconds=1))}
            sends.insert(0 if resolved == "first" else 1, ("resolved", gone))
        for i in range(0, len(sends), max(1, concurrent)):
            wave = sends[i:i + max(1, concurrent)]
            bodies = await asyncio.gather(*(_post(world, [alert], status) for status, alert in wave))
            for body in bodies:
                f.event_ids += body.get("ids", [])

    return inject


def agent_xid(text: str | None = None) -> Injector:
    async def inject(world: World, f: Fault) -> None:
        assert f.gpu is not None and isinstance(f.code, int)
        world.sim(f.node).inject_xid(f.gpu, f.code, text)

    return inject


def agent_ecc(*, dbe: int | None = None, remap_pending: bool | None = None) -> Injector:
    async def inject(world: World, f: Fault) -> None:
        assert f.gpu is not None
        world.sim(f.node).set_ecc(f.gpu, dbe=dbe, remap_pending=remap_pending)

    return inject


async def agent_orphan(world: World, f: Fault) -> None:
    assert f.gpu is not None
    world.sim(f.node).orphan(f.gpu, pid=48_213, used_bytes=12 * GIB)


def nccl_ranks(job: str, lagging: int | None) -> Injector:
    """Every rank of ``job`` logs the PyTorch watchdog timeout of the same collective. With ``lagging``,
    that rank is stuck one collective earlier, and rank 0's desync report (TORCH_NCCL_DESYNC_DEBUG) names it."""

    async def inject(world: World, f: Fault) -> None:
        f.job = job
        ranks = {}
        for pod in world.cluster.job_pods("PyTorchJob", "training", job):
            rank = pod_rank(pod)
            assert rank is not None, f"pod {pod['metadata']['name']} has no RANK"
            ranks[rank] = (pod["spec"]["nodeName"], pod["metadata"]["name"])
        for rank, (node, name) in sorted(ranks.items()):
            world.sim(node).nccl_timeout(name, rank, 41_873 if rank == lagging else 41_874)
            if lagging is not None and rank == 0:
                world.sim(node).pod_log(name, (
                    "[rank0]:[E1130 03:12:07.412345 2161 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) "
                    f"Rank 0] To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are: "
                    f"[{lagging}] finished collective #41873, but didn't join collective #41874"))
                await asyncio.sleep(1.5)  # rank 0's log is read before the lagging rank's own timeout

    return inject


def pod_rank(pod: dict[str, Any]) -> int | None:
    """The global rank of a training pod: the RANK the operator sets in its environment."""
    for container in pod["spec"].get("containers", []):
        for env in container.get("env", []):
            if env.get("name") == "RANK" and str(env.get("value", "")).isdigit():
                return int(env["value"])
    return None


# --- chaos actions: the machinery around the faults breaks ------------------------------------------


async def nats_restart(world: World, down_s: float) -> str:
    """Stop the nats-server (SIGTERM, as a pod eviction would), keep it down ``down_s`` seconds, start it
    again on the same port with the same store. Returns what happened, for the report."""
    assert world.nats_server is not None
    t0 = time.monotonic()
    await asyncio.to_thread(world.nats_server.stop)
    stopped = time.monotonic()
    outage = Outage("nats-server", None, datetime.now(UTC))
    world.outages.append(outage)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(world.nats_server.start)
    outage.end = datetime.now(UTC)
    return (f"nats-server down {time.monotonic() - stopped:.1f}s (stopping took {stopped - t0:.1f}s), "
            f"back on {world.nats_server.url}")


def kube_api_errors(world: World, status: int, *, count: int, method: str = "*", path: str = ".*",
                    retry_after: int | None = None) -> InjectedFault:
    """The next ``count`` matching Kubernetes API requests are answered with ``status`` (``Retry-After``)."""
    fault = world.cluster.inject_error(status, method=method, path=path, count=count, retry_after=retry_after)
    world.kube_faults.append(fault)
    return fault


async def kube_latency(world: World, seconds: float, *, method: str = "*", path: str = ".*",
                       for_s: float | None = None) -> str:
    """Delay matching Kubernetes API requests by ``seconds``, for ``for_s`` seconds (None: until the end)."""
    fault = world.cluster.add_latency(seconds, method=method, path=path)
    world.kube_faults.append(fault)
    if for_s is None:
        return f"{seconds:g}s added to {method} {path}"
    await asyncio.sleep(for_s)
    world.cluster.remove_fault(fault)
    return f"{seconds:g}s added to {fault.hits} requests ({method} {path}) for {for_s:g}s"


async def kill_replica(world: World) -> Replica:
    """The serving replica's process dies mid-flight, and a fresh replica starts on the same bus.

    Without yielding to the event loop (so none of its coroutines runs in between): its Kubernetes API
    endpoint goes away, its connections to NATS are reset, its HTTP listener closes. Then every task it
    started is cancelled — no graceful drain: nothing it buffered reaches the bus, its node locks are not
    released and its messages are not nakked, so recovery takes what it takes after a real crash (the
    lock TTL, the consumer's ack wait). Returns the new replica.
    """
    old = world.replica
    if old.relay is None:
        raise RuntimeError("kill_replica needs a crashable environment (environment(crashable=True))")
    old.kube.stop()
    old.relay.cut()
    http = getattr(old.service, "_http", None)  # a process that dies closes its listening sockets
    for srv in getattr(http, "servers", None) or []:
        srv.close()
    old.alive = False
    for _ in range(20):
        live = [t for t in list(old.tasks) if not t.done()]
        if not live:
            break
        for t in live:
            t.cancel()
        await asyncio.wait(live, timeout=0.5)
    if old.service.executor is not None:
        old.service.executor.close()
    return await start_replica(world)


async def agent_disconnect(world: World, node: str, down_s: float) -> str:
    """Stop ``node``'s agent, keep it down ``down_s`` seconds (what the node logs meanwhile waits in its
    kernel log), then start a fresh agent on the same state directory."""
    await world.fleet.agents[node].stop()
    outage = Outage(f"the agent of {node}", node, datetime.now(UTC))
    world.outages.append(outage)
    await asyncio.sleep(down_s)
    agent = sim_agent(world.sim(node), nats_url=world.nats_url, **world.agent_options)
    world.fleet.agents[node] = agent
    await agent.start()
    outage.end = datetime.now(UTC)
    return f"agent of {node} down {down_s:g}s, restarted"


def manual_uncordon(world: World, node: str, *, remove_taint: bool = False) -> str:
    """A person runs ``kubectl uncordon`` (and, with ``remove_taint``, removes the quarantine taint)."""
    patch: dict[str, Any] = {"spec": {"unschedulable": None}}
    if remove_taint:
        patch["spec"]["taints"] = [t for t in world.cluster.taints(node) if t.get("key") != world.settings.taint_key]
    world.cluster.patch("nodes", node, patch)
    return f"a person uncordoned {node}" + (" and removed the quarantine taint" if remove_taint else "")


def opt_out(world: World, node: str) -> str:
    """A person labels ``node`` ``gpu-remediator.io/opt-out=true``."""
    world.cluster.patch("nodes", node, {"metadata": {"labels": {OPT_OUT_LABEL: "true"}}})
    return f"{node} labelled {OPT_OUT_LABEL}=true"


def block_pdb(world: World, namespace: str, name: str, blocked: bool = True) -> str:
    world.cluster.block_pdb(namespace, name, blocked)
    return f"PodDisruptionBudget {namespace}/{name} {'refuses' if blocked else 'allows'} evictions"


async def set_redelivery(world: World, ack_wait_s: float) -> None:
    """Shorten the executor consumer's ack wait, so a crashed replica's decision comes back in seconds (the
    production ack wait is minutes). Replicas started later must not re-provision the bus."""
    assert world.js is not None
    info = await world.js.consumer_info(REMEDIATIONS_STREAM, EXECUTOR_CONSUMER)
    config = info.config
    config.ack_wait = ack_wait_s
    await world.js.add_consumer(REMEDIATIONS_STREAM, config)


# --- checks ------------------------------------------------------------------------------------------

Check = Callable[[World, Fault], list[str]]


def node_quarantined(world: World, f: Fault) -> list[str]:
    problems = []
    if not world.tainted(f.node):
        problems.append(f"{f.node} does not carry the {world.settings.taint_key} taint")
    if not world.cluster.is_cordoned(f.node):
        problems.append(f"{f.node} is not cordoned")
    return problems


def node_drained(world: World, f: Fault) -> list[str]:
    seeded = {p["metadata"]["uid"] for p in world.seeded_pods[f.node]}
    left = [p["metadata"]["name"] for p in world.training_pods(f.node) if p["metadata"]["uid"] in seeded]
    daemons = [p for p in world.cluster.pods_on(f.node) if p["metadata"]["namespace"] != "training"]
    problems = node_quarantined(world, f)
    if left:
        problems.append(f"training pods still on {f.node}: {left}")
    if len(daemons) < 2:
        problems.append(f"DaemonSet pods were evicted from {f.node}")
    return problems


def drained_then_returned(world: World, f: Fault) -> list[str]:
    """The node was drained while its links were reset and, the reset having healed it, is back in service."""
    seeded = {p["metadata"]["uid"] for p in world.seeded_pods[f.node]}
    left = [p["metadata"]["name"] for p in world.training_pods(f.node) if p["metadata"]["uid"] in seeded]
    problems = node_in_service(world, f)
    if left:
        problems.append(f"training pods were not drained from {f.node}: {left}")
    return problems


def node_in_service(world: World, f: Fault) -> list[str]:
    problems = []
    if world.tainted(f.node) or world.cluster.is_cordoned(f.node):
        problems.append(f"{f.node} was taken out of service")
    return problems


def gpu_untouched(world: World, f: Fault) -> list[str]:
    assert f.gpu is not None
    st = world.sim(f.node).gpu_state(f.gpu)
    problems = node_in_service(world, f)
    if st.get("isolated") or st.get("reset_count", 0):
        problems.append(f"GPU {f.gpu} of {f.node} was isolated or reset")
    return problems


def _gpu_indices(pod: dict[str, Any]) -> set[int]:
    return {int(i) for i in pod["metadata"].get("annotations", {}).get(GPU_INDICES_ANNOTATION, "").split(",") if i}


def only_that_gpu(world: World, f: Fault) -> list[str]:
    """Per-GPU remediation: the node stays in service and pods on other GPUs keep running."""
    assert f.gpu is not None
    problems = node_in_service(world, f)
    for pod in world.seeded_pods[f.node]:
        if _restarted_job(world, pod):
            continue  # its job was restarted by another fault of the demo (NCCL): a new pod, by design
        indices = _gpu_indices(pod)
        still_there = any(p["metadata"]["uid"] == pod["metadata"]["uid"] for p in world.training_pods(f.node))
        if f.gpu not in indices and not still_there:
            problems.append(f"pod {pod['metadata']['name']} (GPUs {sorted(indices)}) was evicted too")
        if f.gpu in indices and still_there:
            problems.append(f"pod {pod['metadata']['name']} bound to GPU {f.gpu} is still running")
    targets = {g.gpu for g in world.faults if g.node == f.node}
    others = [i for i in range(8) if i not in targets and world.sim(f.node).gpu_state(i).get("isolated")]
    if others:
        problems.append(f"other GPUs of {f.node} isolated: {others}")
    return problems


def only_its_pod_evicted(world: World, f: Fault) -> list[str]:
    """Exactly one pod was bound to the faulty GPU, and only it went: every other pod of the node (on other
    GPUs) still runs, no other GPU of the node was isolated or reset, the node stayed in service."""
    assert f.gpu is not None
    bound = [p for p in world.seeded_pods[f.node] if f.gpu in _gpu_indices(p)]
    problems = [] if len(bound) == 1 else [
        f"the drill needs exactly one pod on GPU {f.gpu} of {f.node}; {len(bound)} are bound to it"]
    running = {p["metadata"]["uid"] for p in world.training_pods(f.node)}
    for pod in world.seeded_pods[f.node]:
        name, on_gpu = pod["metadata"]["name"], f.gpu in _gpu_indices(pod)
        if on_gpu and pod["metadata"]["uid"] in running:
            problems.append(f"pod {name} bound to GPU {f.gpu} is still running")
        if not on_gpu and pod["metadata"]["uid"] not in running:
            problems.append(f"pod {name} (GPUs {sorted(_gpu_indices(pod))}) was evicted too")
    sim = world.sim(f.node)
    touched = [i for i in range(sim.gpu_count()) if i != f.gpu
               and (sim.gpu_state(i).get("isolated") or sim.gpu_state(i).get("reset_count"))]
    if touched:
        problems.append(f"other GPUs of {f.node} were isolated or reset: {touched}")
    return problems + node_in_service(world, f)


def _restarted_job(world: World, pod: dict[str, Any]) -> bool:
    job = pod["metadata"].get("labels", {}).get("training.kubeflow.org/job-name")
    return job is not None and world.cluster.job_restarts("PyTorchJob", "training", job) > 0


def gpu_isolated(world: World, f: Fault) -> list[str]:
    assert f.gpu is not None
    problems = only_that_gpu(world, f)
    if not world.sim(f.node).gpu_state(f.gpu).get("isolated"):
        problems.append(f"GPU {f.gpu} of {f.node} is not isolated")
    return problems


def gpu_reset_and_returned(world: World, f: Fault) -> list[str]:
    assert f.gpu is not None
    st = world.sim(f.node).gpu_state(f.gpu)
    problems = only_that_gpu(world, f)
    if not st.get("reset_count"):
        problems.append(f"GPU {f.gpu} of {f.node} was never reset")
    if st.get("isolated"):
        problems.append(f"GPU {f.gpu} of {f.node} is still isolated after a passing health check")
    return problems


def orphan_killed(world: World, f: Fault) -> list[str]:
    assert f.gpu is not None
    problems = only_that_gpu(world, f)
    procs = world.sim(f.node).gpu_state(f.gpu).get("processes", [])
    if any(p.get("pid") == 48_213 for p in procs):
        problems.append("the orphaned process still holds GPU memory")
    return problems


def job_restarted(job: str, suspect: str | None) -> Check:
    def check(world: World, f: Fault) -> list[str]:
        problems = []
        if world.cluster.job_restarts("PyTorchJob", "training", job) < 1:
            problems.append(f"PyTorchJob {job} was not restarted")
        pods = world.cluster.job_pods("PyTorchJob", "training", job)
        if not pods or any(p.get("status", {}).get("phase") != "Running" for p in pods):
            problems.append(f"PyTorchJob {job} is not running again: "
                            f"{[(p['metadata']['name'], p.get('status', {}).get('phase')) for p in pods]}")
        if suspect is not None:
            if not world.tainted(suspect):
                problems.append(f"suspect node {suspect} was not tainted out")
            if any(p["spec"].get("nodeName") == suspect for p in pods):
                problems.append(f"a rank of {job} was placed back on the suspect node {suspect}")
        else:
            nodes = {p["spec"].get("nodeName") for p in pods}
            problems += [f"{n} was tainted although no node was suspect" for n in nodes if n and world.tainted(n)]
        return problems

    return check


def escalated_only(world: World, f: Fault) -> list[str]:
    problems = node_in_service(world, f)
    node = world.cluster.node(f.node)
    if "gpu-remediator.io/escalated" not in node["metadata"].get("annotations", {}):
        problems.append(f"{f.node} carries no escalation annotation for a person")
    return problems


def gpu_isolated_and_escalated(world: World, f: Fault) -> list[str]:
    return gpu_isolated(world, f) + [p for p in escalated_only(world, f) if "out of service" not in p]


# The checks a drill may name (``check:`` of a fault's expectation).
CHECKS: dict[str, Check] = {
    "node_quarantined": node_quarantined,
    "node_drained": node_drained,
    "drained_then_returned": drained_then_returned,
    "node_in_service": node_in_service,
    "gpu_untouched": gpu_untouched,
    "only_that_gpu": only_that_gpu,
    "only_its_pod_evicted": only_its_pod_evicted,
    "gpu_isolated": gpu_isolated,
    "gpu_reset_and_returned": gpu_reset_and_returned,
    "orphan_killed": orphan_killed,
    "escalated_only": escalated_only,
    "gpu_isolated_and_escalated": gpu_isolated_and_escalated,
}


# --- following the audit trail ---------------------------------------------------------------------


def match_events(records: list[AuditRecord], world: World, f: Fault) -> set[str]:
    """Ids of the events this fault produced: known for webhooks, found by node/GPU/kind for agents."""
    if f.event_ids:
        return set(f.event_ids)
    gpu_key = world.gpu_uuid(f.node, f.gpu) if f.gpu is not None else None
    ids = set()
    for r in records:
        if r.what != "event_accepted" or r.event_id is None or r.time < world.started:
            continue
        kind_code = r.why.split(" from ", 1)[0]  # dispatch writes "<kind> <code> from <source>"
        if not kind_code.startswith(f"{f.kind} "):
            continue
        if f.kind.startswith("nccl"):
            if r.job == f.job:
                ids.add(r.event_id)
        elif r.node == f.node and r.gpu == gpu_key and kind_code == f"{f.kind} {f.code}":
            ids.add(r.event_id)
    return ids


def follow(records: list[AuditRecord], world: World, f: Fault, res: FaultResult) -> bool:
    """Fill ``res`` from the audit trail; True once the fault has come to rest."""
    ids = match_events(records, world, f)
    if not ids:
        return False
    # the dispatcher's decisions (the executor's "received" records carry no handler); a later one supersedes
    decisions = [r for r in records if r.what == "decision" and r.event_id in ids and "handler" in r.after]
    decisions = decisions[-1:]
    if f.playbook is None:
        verdicts = [r for r in records if r.event_id in ids and r.what in ("event_ignored", "incident_updated")]
        res.timeline = [r for r in records if r.event_id in ids]
        if decisions:
            res.playbook = str(decisions[0].after.get("playbook"))
            res.incident = decisions[0].incident
        res.outcome = "recorded" if verdicts and not decisions else res.outcome
        if verdicts or decisions:
            res.rest_at = (verdicts or decisions)[0].time
        return bool(verdicts) or bool(decisions)
    if not decisions:
        return False
    first = decisions[0]
    res.incident, res.playbook = first.incident, str(first.after.get("playbook"))
    res.timeline = [r for r in records if r.incident == res.incident or
                    (r.event_id in ids and r.what == "event_accepted")]
    finished = [r for r in res.timeline if r.what == "playbook_finished"]
    res.actions = [r.why.split(":")[0] for r in res.timeline if r.what == "step_succeeded"]
    if finished:
        res.outcome = str(finished[-1].after.get("outcome", "unknown"))
        res.rest_at = finished[-1].time
        return True
    res.outcome = "running"
    return False


async def settle_faults(world: World, results: list[FaultResult], progress: Progress, timeout_s: float,
                        poll_s: float = 0.5) -> set[str]:
    """Follow every fault until it comes to rest or ``timeout_s`` passes; returns the names at rest."""
    deadline = time.monotonic() + timeout_s
    settled: set[str] = set()
    while time.monotonic() < deadline and len(settled) < len(results):
        records = await world.records()
        for res in results if records is not None else []:
            if res.fault.name in settled:
                continue
            assert records is not None
            if follow(records, world, res.fault, res):
                settled.add(res.fault.name)
                progress(f"✓ {res.fault.name:<26} {res.playbook or 'no playbook'} → {res.outcome}"
                         + (f" [{', '.join(res.actions)}]" if res.actions else ""))
        await asyncio.sleep(poll_s)
    return settled


def judge(world: World, results: list[FaultResult], settled: set[str], timeout_s: float) -> None:
    """Write each fault's problems: not at rest, the wrong playbook or outcome, its checks failing."""
    for res in results:
        f = res.fault
        if f.name not in settled:
            res.problems.append(f"did not come to rest within {timeout_s:.0f}s (last seen: {res.outcome})")
        if res.playbook != f.playbook:
            res.problems.append(f"expected playbook {f.playbook or 'none'}, got {res.playbook or 'none'}")
        if f.playbook is not None and res.outcome not in f.outcomes:
            res.problems.append(f"expected outcome {' or '.join(f.outcomes)}, got {res.outcome}")
        if f.name in settled:
            res.problems += f.check(world, f)


async def inject_fault(world: World, f: Fault, res: FaultResult, progress: Progress) -> None:
    progress(f"→ inject {f.name:<26} {f.kind} {f.code} on {f.node}"
             + (f" GPU {f.gpu}" if f.gpu is not None else "") + f" via {f.via}")
    res.injected_at = datetime.now(UTC)
    await f.inject(world, f)


async def inject_and_follow(world: World, faults: list[Fault], progress: Progress,
                            timeout_s: float) -> list[FaultResult]:
    """Inject every fault at once, follow them to rest and judge them (the demo's run)."""
    results = [FaultResult(f) for f in faults]
    for res in results:
        await inject_fault(world, res.fault, res, progress)
    settled = await settle_faults(world, results, progress, timeout_s)
    judge(world, results, settled, timeout_s)
    return results


# --- the environment -----------------------------------------------------------------------------------


def harness_settings(nats_url: str, kubeconfig: Path, replica_id: str, overrides: Mapping[str, Any]) -> Settings:
    """The service's settings in a scenario: fast drains, hold-downs and retries (nothing here changes what
    the guards decide), then the scenario's own ``overrides``."""
    base: dict[str, Any] = {
        "nats_url": nats_url, "http": f"127.0.0.1:{free_port()}", "api_tokens": TOKEN, "kubeconfig": str(kubeconfig),
        "replica_id": replica_id, "drain_timeout_s": 30, "drain_grace_period_s": 0, "nak_delay_s": 0.5,
        "verify_hold_down_s": 1.0, "verify_interval_s": 0.25, "lock_wait_s": 60,
    }
    return Settings(**{**base, **overrides})


async def start_replica(world: World, kube: KubeApiServer | None = None) -> Replica:
    """Start one more service replica on the world's bus, with its own Kubernetes API endpoint; only the
    first one provisions the bus (later ones join it, as replicas of a Deployment do)."""
    index = len(world.replicas)
    kube = kube or KubeApiServer(world.cluster).start()
    kubeconfig = kube.write_kubeconfig(world.root / ("kubeconfig" if index == 0 else f"kubeconfig-{index}"))
    relay = await TcpRelay("127.0.0.1", world.nats_server.port).start() if (
        world.crashable and world.nats_server is not None) else None
    settings = harness_settings(relay.url if relay else world.nats_url, kubeconfig,
                                f"{world.label}-replica-{index}", world.overrides)
    service = Service(settings, provision=index == 0)
    replica = Replica(index, service, kube, relay)
    world.replicas.append(replica)
    token = _REPLICA.set(replica)
    try:
        await service.start()
    finally:
        _REPLICA.reset(token)
    world.base_url = service.http_url
    return replica


def mirror_pods(cluster: ClusterState, fleet: SimFleet | Mapping[str, SimGpuNode]) -> None:
    """What the kubelet knows on each simulated node: its pods, and the training pods' GPU processes."""
    nodes = fleet.nodes if isinstance(fleet, SimFleet) else fleet
    pid = 20_000
    for node in cluster.node_names():
        sim = nodes[node]
        for pod in cluster.pods_on(node):
            meta = pod["metadata"]
            labels = meta.get("labels", {})
            job = labels.get("training.kubeflow.org/job-name") or labels.get("job-name")
            uid = sim.add_pod(meta["name"], namespace=meta["namespace"], uid=meta["uid"], job=job,
                              rank=pod_rank(pod))
            for index in meta.get("annotations", {}).get(GPU_INDICES_ANNOTATION, "").split(","):
                if index:
                    pid += 1
                    sim.add_process(int(index), pid, 30 * GIB, uid)


class Kubelet:
    """The simulated nodes' kubelets, following the API server: a pod that is deleted or evicted stops (its
    GPU processes exit, then the node forgets the pod); a pod newly bound to a node is known to it (it holds
    no GPU memory: the simulation does not run workloads)."""

    def __init__(self, cluster: ClusterState, fleet: SimFleet, since_rv: int) -> None:
        self.cluster = cluster
        self.fleet = fleet
        self.rv = since_rv

    def sync(self) -> None:
        events = self.cluster.events_since(self.rv)
        for ev in events:
            self.rv = ev.rv
            if ev.plural != "pods":
                continue
            meta, node = ev.obj["metadata"], ev.obj.get("spec", {}).get("nodeName")
            sim = self.fleet.nodes.get(node or "")
            if sim is None:
                continue
            known = meta["uid"] in (sim.running_pod_uids() or ())
            if ev.type == "DELETED" or meta.get("deletionTimestamp"):
                if known:
                    for i in range(sim.gpu_count()):
                        for pid, proc in sim.gpu_state(i).get("processes", {}).items():
                            if proc.get("pod_uid") == meta["uid"]:
                                sim.remove_process(int(pid))
                    sim.delete_pod(meta["uid"])
            elif not known:
                labels = meta.get("labels", {})
                sim.add_pod(meta["name"], namespace=meta["namespace"], uid=meta["uid"], rank=pod_rank(ev.obj),
                            job=labels.get("training.kubeflow.org/job-name") or labels.get("job-name"))

    async def run(self, every_s: float = 0.1) -> None:
        while True:
            self.sync()
            await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def environment(progress: Progress, *, nodes: int = 8, pools: int = 1, gpus: int = 8,
                      settings: Mapping[str, Any] | None = None, agents: Collection[str] | None = None,
                      jobs: Sequence[ExtraJob] = (), label: str = "demo", crashable: bool = False,
                      kubelet: bool = False) -> AsyncIterator[World]:
    """NATS, the simulated cluster and GPU nodes, the agents and one service replica; yields the ``World``.

    ``settings`` override the service's settings (``harness_settings``); ``agents`` names the nodes that
    run an agent (default: all); ``jobs`` are extra Jobs pinned to nodes; ``crashable`` routes each
    replica's NATS connection through a relay ``kill_replica`` can cut; ``kubelet`` stops the GPU processes
    of pods the API server deletes. Everything is stopped on exit, whatever the scenario did to it.
    """
    memleak_handler.configure(memleak_handler.MemleakPolicy(orphan_for=timedelta(seconds=2)))
    loop = asyncio.get_running_loop()
    previous_factory = _install_task_tags(loop)
    try:
        with tempfile.TemporaryDirectory(prefix=f"remediator-{label}-") as tmp, EmbeddedNats() as nats_server:
            root = Path(tmp)
            progress(f"• embedded nats-server with JetStream on {nats_server.url}")
            cluster = seed_cluster(nodes=nodes, gpus_per_node=gpus, pools=pools)
            for job in jobs:
                _add_job(cluster, job)
            names = cluster.node_names()
            seeded = {n: [p for p in cluster.pods_on(n) if p["metadata"]["namespace"] == "training"] for n in names}
            kube = KubeApiServer(cluster).start()
            try:
                kubeconfig = root / "kubeconfig"
                progress(f"• Kubernetes API simulator on {kube.url}: {nodes} GPU nodes, "
                         f"{sum(len(v) for v in seeded.values())} training pods (kubeconfig {kubeconfig})")
                agent_options: dict[str, Any] = {"nvml_interval_s": 0.5}
                fleet = SimFleet(root / "nodes", names, nats_url=nats_server.url, gpus=gpus,
                                 agent_options=agent_options)
                with_agents = set(names) if agents is None else set(agents)
                for n in set(names) - with_agents:
                    del fleet.agents[n]
                async with fleet:
                    mirror_pods(cluster, fleet)
                    progress(f"• {nodes} simulated GPU nodes x {gpus} GPUs, "
                             + ("each with its node agent" if with_agents == set(names)
                                else f"node agents on {len(with_agents)} of them"))
                    nc, js = await bus.connect(nats_server.url, name=f"{label}-observer")
                    async with httpx.AsyncClient(timeout=10) as http:
                        world = World(cluster, fleet, Settings(), http, "", datetime.now(UTC), seeded,
                                      nats_server=nats_server, root=root, label=label,
                                      overrides=dict(settings or {}), crashable=crashable,
                                      agent_options=agent_options, nc=nc, js=js)
                        sync_task: asyncio.Task[None] | None = None
                        try:
                            replica = await start_replica(world, kube)
                            world.settings = replica.service.settings
                            progress(f"• service: ingest on {replica.service.http_url}, dispatch, executor")
                            world.started = datetime.now(UTC) - timedelta(seconds=1)
                            world.start_rv = cluster.resource_version
                            if kubelet:
                                sync_task = asyncio.create_task(Kubelet(cluster, fleet, world.start_rv).run())
                            yield world
                        finally:
                            if sync_task is not None:
                                sync_task.cancel()
                                with contextlib.suppress(asyncio.CancelledError):
                                    await sync_task
                            await _stop_replicas(world)
                            with contextlib.suppress(Exception):
                                await nc.close()
            finally:
                kube.stop()
    finally:
        loop.set_task_factory(previous_factory)


async def _stop_replicas(world: World) -> None:
    for rep in reversed(world.replicas):
        if rep.alive:
            rep.alive = False
            await rep.service.stop()
            if rep.service.executor is not None:
                rep.service.executor.close()
        rep.kube.stop()
        if rep.relay is not None:
            await rep.relay.close()


def _add_job(cluster: ClusterState, job: ExtraJob) -> None:
    part = {"app.kubernetes.io/part-of": "training"}
    resources = {"limits": {"nvidia.com/gpu": str(job.gpus)}, "requests": {"nvidia.com/gpu": str(job.gpus)}}
    cluster.create("jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job.name, "labels": part},
        "spec": {"template": {"metadata": {"labels": part}, "spec": {
            "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": job.node},
            "containers": [{"name": "worker", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                            "resources": resources}]}}}}, namespace="training")
    placed = [p for p in cluster.pods_on(job.node) if p["metadata"].get("labels", {}).get("job-name") == job.name]
    if not placed:
        raise ValueError(f"job {job.name}: no room for {job.gpus} GPUs on {job.node}")
