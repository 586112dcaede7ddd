"""``remediator demo``: the whole system on one machine, with the standard faults injected and checked.

Where it sits: chaos tooling on top of everything. It starts an embedded ``nats-server``, the Kubernetes API
simulator with 8 GPU nodes (training pods of PyTorchJobs and batch Jobs, DaemonSet pods), one simulated GPU
node and its real agent per Kubernetes node, and the service (HTTP ingest, handlers, executor) pointed at
the simulator. Then it injects faults the two ways they arrive in production:

* as Alertmanager webhook payloads (version 4, as dcgm-exporter alerts look), POSTed over HTTP with a bearer
  token — Xid 79 three times (HA pair and retries), a single Xid 13, Xid 13 in three jobs, Xid 48, an Xid
  the catalog does not know;
* through the simulated nodes, which the agents read like a real node — kernel-log Xids (119, 64, 74),
  NVML ECC counters (double-bit error, row-remap pending), an orphaned process holding GPU memory, and
  PyTorch NCCL watchdog lines in the training pods' container logs.

For each fault it follows the audit trail to the decision and the playbook's outcome, checks the cluster
and the GPU state against what should have happened (and what must not have), prints each incident's
audit timeline, and passes only if every fault was handled as expected.

Demo-only settings, said on screen: an 8-node pool may have half its nodes out of service (the default
budget of 10 % would keep all but one node-level playbook waiting, which is the guard doing its job), the
breaker threshold is above the number of faults, health hold-downs are one second, and an orphan is acted
on after two seconds instead of ten minutes.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import httpx

from chaos.sim import KubeApiServer, seed_cluster
from chaos.sim.cluster import ClusterState
from chaos.sim.gpu_node import SimFleet, SimGpuNode
from handlers import memleak as memleak_handler
from remediator.audit import iter_records
from remediator.contracts import AuditRecord
from remediator.natsd import EmbeddedNats, free_port
from remediator.service import Service
from remediator.settings import Settings

Progress = Callable[[str], None]
TOKEN = "demo-token"
NODES = 8
GIB = 1 << 30


@dataclass
class World:
    """Everything a fault's injector and checks can touch."""

    cluster: ClusterState
    fleet: SimFleet
    settings: Settings
    http: httpx.AsyncClient
    base_url: str
    started: datetime
    seeded_pods: dict[str, list[dict[str, Any]]]
    faults: list[Fault] = field(default_factory=list)

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


@dataclass
class FaultResult:
    fault: Fault
    incident: str | None = None
    playbook: str | None = None
    outcome: str = "pending"
    actions: list[str] = field(default_factory=list)
    timeline: list[AuditRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        f = self.fault
        # exactly the fault document of DESIGN.md §10; problems and the timeline go to stderr
        return {"name": f.name, "kind": f.kind, "code": f.code, "node": f.node, "gpu": f.gpu,
                "playbook": self.playbook, "actions": self.actions, "outcome": self.outcome, "passed": self.passed}


# --- injectors ---------------------------------------------------------------------------------------


def _alert(world: World, node: str, gpu: int, labels: dict[str, str], summary: str,
           fingerprint: str, starts: datetime) -> dict[str, Any]:
    base = {"alertname": "GPUXidError", "Hostname": node, "gpu": str(gpu), "device": f"nvidia{gpu}",
            "UUID": world.gpu_uuid(node, gpu), "pci_bus_id": world.gpu_pci(node, gpu),
            "modelName": "NVIDIA H100 80GB HBM3", "instance": "10.42.0.17:9400", "job": "gpu-metrics",
            "severity": "critical"}
    return {"status": "firing", "labels": {**base, **labels}, "annotations": {"summary": summary},
            "startsAt": starts.isoformat().replace("+00:00", "Z"), "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": fingerprint}


async def _post(world: World, alerts: list[dict[str, Any]]) -> dict[str, Any]:
    payload = {"version": "4", "groupKey": "{}:{alertname=\"GPUXidError\"}", "truncatedAlerts": 0,
               "status": "firing", "receiver": "gpu-remediator", "groupLabels": {"alertname": "GPUXidError"},
               "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
               "alerts": alerts}
    r = await world.http.post(f"{world.base_url}/v1/alertmanager", json=payload,
                              headers={"Authorization": f"Bearer {TOKEN}"})
    if r.status_code != 200:
        raise RuntimeError(f"webhook answered {r.status_code}: {r.text}")
    body: dict[str, Any] = r.json()
    return body


def webhook_xid(times: int = 1, pods: tuple[str, ...] = ()) -> Callable[[World, Fault], Awaitable[None]]:
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


def agent_xid(text: str | None = None) -> Callable[[World, Fault], Awaitable[None]]:
    async def inject(world: World, f: Fault) -> None:
        assert f.gpu is not None and isinstance(f.code, int)
        world.sim(f.node).inject_xid(f.gpu, f.code, text)

    return inject


def agent_ecc(*, dbe: int | None = None,
              remap_pending: bool | None = None) -> Callable[[World, Fault], Awaitable[None]]:
    async def inject(world: World, f: Fault) -> None:
        assert f.gpu is not None
        world.sim(f.node).set_ecc(f.gpu, dbe=dbe, remap_pending=remap_pending)

    return inject


async def agent_orphan(world: World, f: Fault) -> None:
    assert f.gpu is not None
    world.sim(f.node).orphan(f.gpu, pid=48_213, used_bytes=12 * GIB)


def nccl_ranks(job: str, lagging: int | None) -> Callable[[World, Fault], Awaitable[None]]:
    """Every rank of ``job`` logs the PyTorch watchdog timeout of the same collective. With ``lagging``,
    that rank is stuck one collective earlier, and rank 0's desync report (TORCH_NCCL_DESYNC_DEBUG) names it."""

    async def inject(world: World, f: Fault) -> None:
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


# --- checks ------------------------------------------------------------------------------------------


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


def only_that_gpu(world: World, f: Fault) -> list[str]:
    """Per-GPU remediation: the node stays in service and pods on other GPUs keep running."""
    assert f.gpu is not None
    problems = node_in_service(world, f)
    for pod in world.seeded_pods[f.node]:
        if _restarted_job(world, pod):
            continue  # its job was restarted by another fault of the demo (NCCL): a new pod, by design
        indices = {int(i) for i in pod["metadata"].get("annotations", {}).get(
            "gpu-remediator.io/gpu-indices", "").split(",") if i}
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


def job_restarted(job: str, suspect: str | None) -> Callable[[World, Fault], list[str]]:
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


def standard_faults() -> list[Fault]:
    """The demo's faults: every playbook family, through webhooks and through the agents."""
    ok = ("completed",)
    return [
        Fault("xid79-gpu-lost", "webhook", "xid", 79, "gpu-node-2", 1, "gpu-lost", ("escalated",),
              webhook_xid(times=3), node_drained),
        Fault("xid13-single", "webhook", "xid", 13, "gpu-node-3", 0, None, (), webhook_xid(), gpu_untouched),
        Fault("xid48-dbe", "webhook", "xid", 48, "gpu-node-3", 5, "gpu-memory-fatal", ok, webhook_xid(),
              gpu_reset_and_returned),
        Fault("xid13-three-jobs", "webhook", "xid", 13, "gpu-node-3", 6, "app-xid-hardware-suspect",
              (*ok, "escalated"), webhook_xid(pods=("train-a-0", "train-b-0", "train-c-0")),
              only_that_gpu),
        Fault("xid-unknown", "webhook", "xid", 999, "gpu-node-7", 3, "unknown-xid", ("escalated",),
              webhook_xid(), escalated_only),
        Fault("xid119-gsp-hang", "agent", "xid", 119, "gpu-node-4", 6, "gsp-hang", ok,
              agent_xid("Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
                        "(GSP_RM_CONTROL) (0x20802a02 0x8)."), gpu_reset_and_returned),
        Fault("ecc-dbe", "agent", "ecc", "dbe_volatile", "gpu-node-7", 5, "gpu-memory-fatal", ok,
              agent_ecc(dbe=2), gpu_reset_and_returned),
        Fault("row-remap-pending", "agent", "ecc", "row_remap_pending", "gpu-node-5", 7, "row-remap-pending", ok,
              agent_ecc(remap_pending=True), gpu_reset_and_returned),
        Fault("xid64-remap-failure", "agent", "xid", 64, "gpu-node-5", 4, "memory-retirement-failure",
              ("escalated",), agent_xid(), gpu_isolated_and_escalated),
        Fault("xid74-nvlink", "agent", "xid", 74, "gpu-node-6", 4, "nvlink", (*ok, "escalated"),
              agent_xid("NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
              drained_then_returned),
        Fault("orphaned-memory", "agent", "memory_leak", "orphan", "gpu-node-0", 6, "memory-leak", ok,
              agent_orphan, orphan_killed),
        Fault("nccl-timeout-no-suspect", "agent", "nccl_timeout", "watchdog_timeout", "gpu-node-4", None,
              "nccl-timeout-no-suspect", ok, nccl_ranks("pytorch-1", lagging=None), job_restarted("pytorch-1", None)),
        Fault("nccl-timeout-suspect", "agent", "nccl_timeout", "watchdog_timeout", "gpu-node-1", None,
              "nccl-timeout-suspect", (*ok, "escalated"), nccl_ranks("pytorch-0", lagging=1),
              job_restarted("pytorch-0", "gpu-node-1")),
    ]


# --- following the audit trail ---------------------------------------------------------------------


def _match_events(records: list[AuditRecord], world: World, f: Fault) -> set[str]:
    """Ids of the events this fault produced: known for webhooks, found by node/GPU/kind for agents."""
    if f.event_ids:
        return set(f.event_ids)
    gpu_key = world.gpu_uuid(f.node, f.gpu) if f.gpu is not None else None
    ids = set()
    for r in records:
        if r.what != "event_accepted" or r.event_id is None or r.time < world.started:
            continue
        if not r.why.startswith(f"{f.kind} "):
            continue
        if f.kind.startswith("nccl"):
            job = "pytorch-1" if "no-suspect" in f.name else "pytorch-0"
            if r.job == job:
                ids.add(r.event_id)
        elif r.node == f.node and r.gpu == gpu_key and r.why.startswith(f"{f.kind} {f.code}"):
            ids.add(r.event_id)
    return ids


def follow(records: list[AuditRecord], world: World, f: Fault, res: FaultResult) -> bool:
    """Fill ``res`` from the audit trail; True once the fault has come to rest."""
    ids = _match_events(records, world, f)
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
        return True
    res.outcome = "running"
    return False


# --- the run -----------------------------------------------------------------------------------------


@dataclass
class DemoReport:
    results: list[FaultResult]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "faults": [r.to_json() for r in self.results]}


def demo_settings(nats_url: str, kubeconfig: Path) -> Settings:
    return Settings(
        nats_url=nats_url, http=f"127.0.0.1:{free_port()}", api_tokens=TOKEN, kubeconfig=str(kubeconfig),
        replica_id="demo-replica-0", drain_timeout_s=30, drain_grace_period_s=0, nak_delay_s=0.5,
        budget_max_node_fraction=0.5, budget_max_gpu_fraction=0.5, breaker_threshold=50,
        verify_hold_down_s=1.0, verify_interval_s=0.25, lock_wait_s=60,
    )


async def run(progress: Progress, *, timeout_s: float = 75.0, faults: list[Fault] | None = None) -> DemoReport:
    t0 = time.monotonic()
    faults = faults if faults is not None else standard_faults()
    memleak_handler.configure(memleak_handler.MemleakPolicy(orphan_for=timedelta(seconds=2)))
    with tempfile.TemporaryDirectory(prefix="remediator-demo-") as tmp, EmbeddedNats() as nats_server:
        root = Path(tmp)
        progress(f"• embedded nats-server with JetStream on {nats_server.url}")
        cluster = seed_cluster(nodes=NODES)
        seeded = {n: [p for p in cluster.pods_on(n) if p["metadata"]["namespace"] == "training"]
                  for n in cluster.node_names()}
        with KubeApiServer(cluster) as kube:
            kubeconfig = kube.write_kubeconfig(root / "kubeconfig")
            progress(f"• Kubernetes API simulator on {kube.url}: {NODES} GPU nodes, "
                     f"{sum(len(v) for v in seeded.values())} training pods (kubeconfig {kubeconfig})")
            settings = demo_settings(nats_server.url, kubeconfig)
            async with SimFleet(root / "nodes", cluster.node_names(), nats_url=nats_server.url, gpus=8,
                                agent_options={"nvml_interval_s": 0.5}) as fleet:
                _mirror_pods(cluster, fleet)
                progress(f"• {NODES} simulated GPU nodes x 8 GPUs, each with its node agent")
                async with Service(settings) as service, httpx.AsyncClient(timeout=10) as http:
                    progress(f"• service: ingest on {service.http_url}, dispatch, executor")
                    world = World(cluster, fleet, settings, http, service.http_url,
                                  datetime.now(UTC) - timedelta(seconds=1), seeded, faults)
                    results = await _inject_and_follow(world, faults, service, progress, timeout_s)
    return DemoReport(results, time.monotonic() - t0)


def _mirror_pods(cluster: ClusterState, fleet: SimFleet) -> None:
    """What the kubelet knows on each simulated node: its pods, and the training pods' GPU processes."""
    pid = 20_000
    for node in cluster.node_names():
        sim = fleet.nodes[node]
        for pod in cluster.pods_on(node):
            meta = pod["metadata"]
            labels = meta.get("labels", {})
            job = labels.get("training.kubeflow.org/job-name") or labels.get("job-name")
            uid = sim.add_pod(meta["name"], namespace=meta["namespace"], uid=meta["uid"], job=job,
                              rank=pod_rank(pod))
            for index in meta.get("annotations", {}).get("gpu-remediator.io/gpu-indices", "").split(","):
                if index:
                    pid += 1
                    sim.add_process(int(index), pid, 30 * GIB, uid)


async def _inject_and_follow(world: World, faults: list[Fault], service: Service, progress: Progress,
                             timeout_s: float) -> list[FaultResult]:
    results = [FaultResult(f) for f in faults]
    for f in faults:
        progress(f"→ inject {f.name:<26} {f.kind} {f.code} on {f.node}"
                 + (f" GPU {f.gpu}" if f.gpu is not None else "") + f" via {f.via}")
        await f.inject(world, f)
    assert service.js is not None
    deadline = time.monotonic() + timeout_s
    settled: set[str] = set()
    while time.monotonic() < deadline and len(settled) < len(results):
        records = [r async for r in iter_records(service.js)]
        for res in results:
            if res.fault.name in settled:
                continue
            if follow(records, world, res.fault, res):
                settled.add(res.fault.name)
                progress(f"✓ {res.fault.name:<26} {res.playbook or 'no playbook'} → {res.outcome}"
                         + (f" [{', '.join(res.actions)}]" if res.actions else ""))
        await asyncio.sleep(0.5)
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
    return results
