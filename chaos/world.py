"""The world a drill acts on: NATS, the simulated cluster and GPU nodes, their agents, and the service.

Where it sits: under the drill runner (``chaos.runner``), above the simulator (``chaos.sim``) and the
service (``remediator.service``, run as ``chaos.replica`` replicas). ``environment`` starts, on one
machine:

* an embedded ``nats-server`` with JetStream (its store in a temporary directory, or in ``data_dir``), in
  operator mode: the replicas connect as the ``service`` role, each agent with its own node's credentials
  (announced as its key in KV), the harness's observer as ``admin`` (it declares the bus);
* the Kubernetes API simulator with N GPU nodes, their training pods (PyTorchJobs and batch Jobs),
  DaemonSet pods and PodDisruptionBudgets, plus any extra Jobs a drill pins to a node (``ExtraJob``);
* one simulated GPU node per Kubernetes node and the real node agent on it (on every node, or on the nodes
  a drill names), and a kubelet (``Kubelet``) that stops a pod's GPU processes when the API server deletes
  or evicts it;
* a service replica (HTTP ingest, dispatch, executor) with its own Kubernetes API endpoint and, when the
  drill may crash it, its own TCP path to the bus;
* an observer connection to NATS that reads the audit trail without depending on any replica.

It yields a ``World``: what an injector (``chaos.injectors``), a chaos action (``chaos.actions``) and a
check (``chaos.checks``) can touch. Everything is stopped on exit, whatever the drill did to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from nats.aio.client import Client as NATS
from nats.js.client import JetStreamContext

from chaos import replica as replicas
from chaos.faults import Fault, Progress
from chaos.kubelet import Kubelet, gpu_indices, mirror_pods, pod_job
from chaos.nats_cluster import NatsCluster
from chaos.replica import Replica, TcpRelay
from chaos.sim import GPU_RESOURCE, TRAINING_NAMESPACE, KubeApiServer, seed_cluster
from chaos.sim import gpu_operator as sim_gpu_operator
from chaos.sim.cluster import ClusterState, InjectedFault
from chaos.sim.gpu_node import SimFleet, SimGpuNode
from remediator import bus
from remediator.audit import iter_records
from remediator.contracts import AuditRecord
from remediator.identity import agents as agents_identity
from remediator.identity import creds
from remediator.identity.issuer import Issued
from remediator.natsd import EmbeddedNats, free_port
from remediator.service import Service
from remediator.settings import Settings
from remediator.signing import SERVICE_KEY_FILE, service_signer

TOKEN = "demo-token"  # the bearer token the harness's replicas accept on their ingest


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
    seeded_pods: dict[str, list[dict[str, Any]]]  # node -> its training pods at the start
    faults: list[Fault] = field(default_factory=list)
    nats_server: EmbeddedNats | None = None
    root: Path = field(default_factory=Path)
    label: str = "drill"
    overrides: dict[str, Any] = field(default_factory=dict)
    crashable: bool = False
    agent_options: dict[str, Any] = field(default_factory=dict)  # every agent's AgentConfig fields
    replicas: list[Replica] = field(default_factory=list)
    nc: NATS | None = None
    js: JetStreamContext | None = None
    kube_faults: list[InjectedFault] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    start_rv: int = 0
    crash_times: list[float] = field(default_factory=list)  # monotonic times replicas were lost
    nats_cluster: NatsCluster | None = None  # nats_servers=3: the bus; nats_server then only holds its identity

    def agent_config(self, node: str) -> dict[str, Any]:
        """``node``'s agent's ``AgentConfig`` fields: the shared options, its own credentials and its node's
        kubelet PodResources socket."""
        own = self.root / "creds" / f"{node}.creds"
        ids = {"creds_file": str(own), "signing_seed_file": str(own)} if own.exists() else {}
        return {"pod_resources_socket": self.fleet.sockets[node], **self.agent_options, **ids}

    def gpu_uuid(self, node: str, index: int) -> str:
        return self.fleet.nodes[node].identity(index).uuid or ""

    def gpu_pci(self, node: str, index: int) -> str:
        return self.fleet.nodes[node].identity(index).pci_bus_id or ""

    def sim(self, node: str) -> SimGpuNode:
        return self.fleet.nodes[node]

    def gpus_of(self, pod: dict[str, Any]) -> set[int]:
        """The GPU indices ``pod`` holds on its node (or held when it last ran, for an evicted pod)."""
        return gpu_indices(self.cluster, pod)

    def training_pods(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.cluster.pods_on(node) if p["metadata"]["namespace"] == TRAINING_NAMESPACE]

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
        if self.nats_cluster is not None:
            return self.nats_cluster.url
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


def harness_settings(nats_url: str, kubeconfig: Path, replica_id: str, overrides: Mapping[str, Any]) -> Settings:
    """The service's settings in a drill's world: fast drains, hold-downs and retries (nothing here changes
    what the guards decide), then the drill's own ``overrides``."""
    base: dict[str, Any] = {
        "nats_url": nats_url, "http": f"127.0.0.1:{free_port()}", "api_tokens": TOKEN, "kubeconfig": str(kubeconfig),
        "replica_id": replica_id, "drain_timeout_s": 30, "drain_grace_period_s": 0, "nak_delay_s": 0.5,
        "verify_hold_down_s": 1.0, "verify_interval_s": 0.25, "lock_wait_s": 60,
        "memleak_orphan_for_s": 2,  # orphaned memory acted on after 2 s, through this replica's registry only
    }
    return Settings(**{**base, **overrides})


async def start_replica(world: World, kube: KubeApiServer | None = None) -> Replica:
    """Start one more service replica on the world's bus, with its own Kubernetes API endpoint; only the
    first one provisions the bus (later ones join it, as replicas of a Deployment do)."""
    index = len(world.replicas)
    kube = kube or KubeApiServer(world.cluster).start()
    kubeconfig = kube.write_kubeconfig(world.root / ("kubeconfig" if index == 0 else f"kubeconfig-{index}"))
    relay = await TcpRelay("127.0.0.1", world.nats_server.port).start() if (
        world.crashable and world.nats_server is not None and world.nats_cluster is None) else None
    settings = harness_settings(relay.url if relay else world.nats_url, kubeconfig,
                                f"{world.label}-replica-{index}", world.overrides)
    if world.nats_server is not None and world.nats_server.secure:  # replicas connect as the service role
        settings = settings.model_copy(update={"nats_creds_file": world.nats_server.creds("service")})
        if index == 0:  # the service role may not declare streams: the harness does, as bus init would
            await bus.provision(_admin(world), settings)
    service = Service(settings, provision=index == 0 and not (world.nats_server and world.nats_server.secure))
    replica = Replica(index, service, kube, relay)
    world.replicas.append(replica)
    with replicas.starting(replica):
        await service.start()
    world.base_url = service.http_url
    return replica


def _admin(world: World) -> JetStreamContext:
    assert world.js is not None
    return world.js


def issue_agent_creds(server: EmbeddedNats, nodes: Sequence[str], root: Path) -> dict[str, Issued]:
    """Each node's own agent credentials from the embedded operator, written to ``root/<node>.creds``."""
    assert server.store is not None
    now = datetime.now(UTC)
    issued = {n: server.store.issue("agent", node=n, now=now) for n in nodes}
    for n, one in issued.items():
        assert one.user is not None
        creds.write(root / f"{n}.creds", one.jwt, one.user)
    return issued


@contextlib.asynccontextmanager
async def environment(progress: Progress, *, nodes: int = 8, pools: int = 1, gpus: int = 8,
                      settings: Mapping[str, Any] | None = None, agents: Collection[str] | None = None,
                      jobs: Sequence[ExtraJob] = (), label: str = "drill", crashable: bool = False,
                      kubelet: bool = True, data_dir: Path | None = None,
                      nats_port: int | None = None, service_replicas: int = 1,
                      nats_servers: int = 1, gpu_operator: bool = False,
                      unmanaged_operands: Sequence[str] = (),
                      gpu_conditions: Sequence[Mapping[str, Any]] = (), gpu_allocation: str = "device-plugin",
                      gpu_pods_per_node: int | None = None) -> AsyncIterator[World]:
    """NATS, the simulated cluster and GPU nodes, the agents and one service replica; yields the ``World``.

    ``settings`` override the service's settings (``harness_settings``); ``agents`` names the nodes that
    run an agent (default: all); ``jobs`` are extra Jobs pinned to nodes; ``crashable`` routes each
    replica's NATS connection through a relay ``chaos.replica.crash`` can cut; ``kubelet`` stops the GPU
    processes of pods the API server deletes; ``data_dir`` and ``nats_port`` are the embedded
    nats-server's store (kept after the run) and port (default: a temporary store, a free port);
    ``service_replicas`` replicas share the bus from the start (the first one's settings declare it);
    ``nats_servers=3`` makes the bus a real three-server NATS cluster (``chaos.nats_cluster``) in the same
    operator mode, every stream and bucket declared R3 (as ``bus init --replicas 3``); ``gpu_operator``
    installs the GPU Operator's operands (``chaos.sim.gpu_operator``, ``unmanaged_operands`` ignoring the
    deploy labels); ``gpu_conditions`` set how a node's GPU resets and reboots behave (``reset``:
    ``fail``/``new_uuid``/``retired_pending`` for ``gpu``; ``reboot``: ``ignored``); ``gpu_allocation`` and
    ``gpu_pods_per_node`` seed the cluster as ``seed_cluster`` does (``dra``: NVIDIA's DRA driver).
    """
    loop = asyncio.get_running_loop()
    previous_factory = replicas.install_task_tags(loop)
    try:
        with (tempfile.TemporaryDirectory(prefix=f"remediator-{label}-") as tmp,
              _bus(data_dir, nats_port, nats_servers) as (nats_server, nats_cluster)):
            root = Path(tmp)
            bus_url = nats_cluster.url if nats_cluster is not None else nats_server.url
            progress(f"• embedded nats-server with JetStream on {nats_server.url}"
                     + (f", store in {data_dir}" if data_dir is not None else "") if nats_cluster is None else
                     f"• NATS cluster of {nats_servers} servers with JetStream (R{nats_servers}) on {bus_url}")
            cluster = seed_cluster(nodes=nodes, gpus_per_node=gpus, pools=pools, gpu_allocation=gpu_allocation,
                                   gpu_pods_per_node=gpu_pods_per_node)
            for job in jobs:
                _add_job(cluster, job)
            if gpu_operator:
                # configured as the README asks: operands tolerate the service's partial-withdrawal taint
                sim_gpu_operator.install(cluster, unmanaged=tuple(unmanaged_operands),
                                         tolerate=(Settings(**(settings or {})).gpu_withdrawn_taint_key,))
            names = cluster.node_names()
            seeded = {n: [p for p in cluster.pods_on(n) if p["metadata"]["namespace"] == TRAINING_NAMESPACE]
                      for n in names}
            kube = KubeApiServer(cluster).start()
            try:
                kubeconfig = root / "kubeconfig"
                progress(f"• Kubernetes API simulator on {kube.url}: {nodes} GPU nodes, "
                         f"{sum(len(v) for v in seeded.values())} training pods (kubeconfig {kubeconfig})")
                # one service key signs for every replica (signing_seed_file), and every agent trusts it
                key_home = data_dir if data_dir is not None else root
                service_key = service_signer(key_home)
                key_file = Path(key_home) / "identity" / SERVICE_KEY_FILE
                agent_options: dict[str, Any] = {"nvml_interval_s": 0.5, "trust_keys": (service_key.public_key,),
                                                 # memory trends in seconds, not minutes (drill timescale)
                                                 "memtrend_interval_s": 0.5, "memtrend_warmup_s": 1.0,
                                                 "memtrend_window_s": 3.0}
                agent_ids = issue_agent_creds(nats_server, names, root / "creds")  # one identity per node
                fleet = SimFleet(root / "nodes", names, nats_url=bus_url, gpus=gpus,
                                 agent_options=agent_options,
                                 agent_creds={n: str(root / "creds" / f"{n}.creds") for n in names})
                with_agents = set(names) if agents is None else set(agents)
                for n in set(names) - with_agents:
                    del fleet.agents[n]
                for cond in gpu_conditions:
                    gpu_node = fleet.nodes[str(cond["node"])]
                    if cond.get("reset"):
                        gpu_node.set_reset_outcome(int(cond["gpu"]), str(cond["reset"]))
                    if cond.get("reboot"):
                        gpu_node.set_reboot_outcome(str(cond["reboot"]))
                async with fleet:
                    mirror_pods(cluster, fleet)
                    progress(f"• {nodes} simulated GPU nodes x {gpus} GPUs, "
                             + ("each with its node agent" if with_agents == set(names)
                                else f"node agents on {len(with_agents)} of them"))
                    nc, js = await bus.connect(bus_url, name=f"{label}-observer",  # the harness: admin
                                               credentials=bus.Credentials(creds_file=nats_server.creds("admin")))
                    async with httpx.AsyncClient(timeout=10) as http:
                        world = World(cluster, fleet, Settings(), http, "", datetime.now(UTC), seeded,
                                      nats_server=nats_server, nats_cluster=nats_cluster, root=root, label=label,
                                      overrides={"signing_seed_file": str(key_file),
                                                 **({"bus_replicas": nats_servers} if nats_servers > 1 else {}),
                                                 **(settings or {})}, crashable=crashable,
                                      agent_options=agent_options, nc=nc, js=js)
                        sync_task: asyncio.Task[None] | None = None
                        try:
                            replica = await start_replica(world, kube)
                            for _ in range(service_replicas - 1):
                                await start_replica(world)
                            for one in agent_ids.values():  # the executor trusts each agent's own key
                                await agents_identity.announce(js, one)
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
                            for rep in reversed(world.replicas):
                                await replicas.stop(rep)
                            with contextlib.suppress(Exception):
                                await nc.close()
            finally:
                kube.stop()
    finally:
        replicas.restore_task_tags(loop, previous_factory)


@contextlib.contextmanager
def _bus(data_dir: Path | None, port: int | None, servers: int) -> Iterator[tuple[EmbeddedNats, NatsCluster | None]]:
    """The drill's bus: one embedded nats-server in operator mode, or (``servers`` > 1) a NATS cluster whose
    servers load the same operator configuration; the embedded server then is never started and only holds
    the operator, its credentials and that configuration."""
    store = None if data_dir is None else str(data_dir)
    if servers == 1:
        with EmbeddedNats(data_dir=store, port=port, secure=True) as server:
            yield server, None
        return
    holder = EmbeddedNats(data_dir=store, secure=True)
    try:
        config = holder._write_config()
        cluster = NatsCluster(servers, root=str(Path(holder.data_dir) / "cluster"), config=str(config))
        admin = bus.Credentials(creds_file=holder.creds("admin"))

        async def probe_connect() -> NATS:
            nc, _ = await bus.connect(cluster.url, name="cluster-probe", credentials=admin, connect_timeout=1,
                                      allow_reconnect=False, max_reconnect_attempts=0)
            return nc

        cluster.probe_connect = probe_connect
        with cluster:
            yield holder, cluster
    finally:
        holder.close()


def _add_job(cluster: ClusterState, job: ExtraJob) -> None:
    part = {"app.kubernetes.io/part-of": TRAINING_NAMESPACE}
    resources = {"limits": {GPU_RESOURCE: str(job.gpus)}, "requests": {GPU_RESOURCE: str(job.gpus)}}
    cluster.create("jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job.name, "labels": part},
        "spec": {"template": {"metadata": {"labels": part}, "spec": {
            "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": job.node},
            "containers": [{"name": "worker", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                            "resources": resources}]}}}}, namespace=TRAINING_NAMESPACE)
    placed = [p for p in cluster.pods_on(job.node) if pod_job(p) == job.name]
    if not placed:
        raise ValueError(f"job {job.name}: no room for {job.gpus} GPUs on {job.node}")
