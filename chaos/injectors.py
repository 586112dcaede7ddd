"""Fault injectors: GPU faults made to arrive the two ways they do in production.

Where it sits: between the drill runner (``chaos.runner``, which builds one injector per fault of a drill
file through ``chaos.schema``) and the world (``chaos.world.World``) they act on. Faults arrive as
Alertmanager webhook payloads (``WebhookXid``, ``AlertReplay``: version 4, as dcgm-exporter alerts look,
POSTed with a bearer token) or through the simulated GPU nodes, which the real agents read like a real
node (``AgentXid`` in the kernel log, ``AgentEcc`` in NVML's counters, ``AgentOrphan`` as a process
holding GPU memory whose pod is gone, ``AgentMemoryGrowth`` as a training pod's process whose GPU memory keeps
growing until its job is restarted, ``NcclRanks`` as PyTorch watchdog lines in the training pods'
container logs).

Each injector declares the ``FaultEvent`` kind and code the fault produces (``chaos.faults.Injector``);
nothing else types them. The machinery around the faults breaking (NATS, the Kubernetes API, the service,
an agent, people) is ``chaos.actions``'.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Literal

import httpx

from chaos.faults import Fault, Injector, Via
from chaos.kubelet import pod_job, pod_rank
from chaos.sim import TRAINING_NAMESPACE
from chaos.sim.gpu_node import GIB
from chaos.world import TOKEN, World
from remediator.contracts import Kind

ORPHAN_PID = 48_213  # the orphaned process ``AgentOrphan`` leaves behind (``chaos.checks.orphan_killed``)


def _stamp(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _alert(world: World, node: str, gpu: int, labels: dict[str, str], summary: str,
           fingerprint: str, starts: datetime) -> dict[str, Any]:
    base = {"alertname": "GPUXidError", "Hostname": node, "gpu": str(gpu), "device": f"nvidia{gpu}",
            "UUID": world.gpu_uuid(node, gpu), "pci_bus_id": world.gpu_pci(node, gpu),
            "modelName": "NVIDIA H100 80GB HBM3", "instance": "10.42.0.17:9400", "job": "gpu-metrics",
            "severity": "critical"}
    return {"status": "firing", "labels": {**base, **labels}, "annotations": {"summary": summary},
            "startsAt": _stamp(starts), "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": fingerprint}


async def _post(world: World, alerts: list[dict[str, Any]], status: str = "firing") -> dict[str, Any]:
    payload = {"version": "4", "groupKey": "{}:{alertname=\"GPUXidError\"}", "truncatedAlerts": 0,
               "status": status, "receiver": "gpu-remediator", "groupLabels": {"alertname": "GPUXidError"},
               "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
               "alerts": alerts}
    # As Alertmanager does, a 5xx (the bus failing over) is retried, here for up to 30 s; a 4xx is not.
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        try:
            r = await world.http.post(f"{world.base_url}/v1/alertmanager", json=payload,
                                      headers={"Authorization": f"Bearer {TOKEN}"})
        except httpx.TransportError:
            if asyncio.get_running_loop().time() > deadline:
                raise
        else:
            if r.status_code < 500 or asyncio.get_running_loop().time() > deadline:
                break
        await asyncio.sleep(0.5)
    if r.status_code != 200:
        raise RuntimeError(f"webhook answered {r.status_code}: {r.text}")
    body: dict[str, Any] = r.json()
    return body


class _XidInjector(Injector):
    """An injector of one Xid: kind ``xid``, code the Xid number."""

    kind: ClassVar[Kind] = "xid"
    xid: int

    @property
    def code(self) -> int:
        return self.xid


@dataclass(frozen=True)
class WebhookXid(_XidInjector):
    """Xid alert(s) as dcgm-exporter + Alertmanager send them; ``times`` repeats the very same notification,
    ``jobs`` sends one alert per job, each naming that job's pod on the node the way dcgm-exporter's pod
    mapping does (``pod``, ``namespace``): different workloads on the same GPU. The alert never names the
    job; the service finds it from the pod's owner."""

    type: ClassVar[str] = "webhook_xid"
    via: ClassVar[Via] = "webhook"
    xid: int
    times: int = 1
    jobs: tuple[str, ...] = ()

    async def __call__(self, world: World, fault: Fault) -> None:
        assert fault.gpu is not None
        starts = datetime.now(UTC).replace(microsecond=0)
        summary = f"Xid {self.xid} on GPU {fault.gpu} of {fault.node}"
        if self.jobs:
            for i, job in enumerate(self.jobs):
                pod = next((p for p in world.cluster.pods_on(fault.node) if pod_job(p) == job), None)
                if pod is None:
                    raise RuntimeError(f"no pod of job {job} runs on {fault.node}")
                alert = _alert(world, fault.node, fault.gpu, {"xid": str(self.xid), "pod": pod["metadata"]["name"],
                                                              "namespace": pod["metadata"]["namespace"]},
                               summary, f"{fault.name}-{i:02d}", starts + timedelta(seconds=i))
                body = await _post(world, [alert])
                fault.event_ids += body.get("ids", [])
            return
        alert = _alert(world, fault.node, fault.gpu, {"xid": str(self.xid)}, summary, f"{fault.name}-fp", starts)
        for _ in range(self.times):
            body = await _post(world, [alert])
            fault.event_ids += body.get("ids", [])


@dataclass(frozen=True)
class AlertReplay(_XidInjector):
    """One Alertmanager notification delivered the ways an HA pair and its retries deliver it.

    The firing notification goes out ``times`` times, ``concurrent`` copies at once (both members of an HA
    pair notify; each retries). With ``resolved="early"`` the ``resolved`` notification of the same alert
    overtakes the retries: it arrives after the first firing copy and before the others, so the receiver
    sees firing, resolved, firing, ... (out of order); with ``"first"`` it overtakes them all and arrives
    before any firing copy. With ``"never"`` no resolved ever comes (Alertmanager does not guarantee one).
    Every copy carries the same fingerprint and ``startsAt``, hence the same event id: the repeats are
    duplicates the bus drops, and the resolved is a separate, informative event.
    """

    type: ClassVar[str] = "alert_replay"
    via: ClassVar[Via] = "webhook"
    xid: int
    times: int = 3
    concurrent: int = 2
    resolved: Literal["never", "early", "first"] = "never"

    async def __call__(self, world: World, fault: Fault) -> None:
        assert fault.gpu is not None
        starts = datetime.now(UTC).replace(microsecond=0)
        firing = _alert(world, fault.node, fault.gpu, {"xid": str(self.xid)},
                        f"Xid {self.xid} on GPU {fault.gpu} of {fault.node}", f"{fault.name}-fp", starts)
        sends: list[tuple[str, dict[str, Any]]] = [("firing", firing)] * self.times
        if self.resolved != "never":
            gone = {**firing, "status": "resolved", "endsAt": _stamp(datetime.now(UTC) + timedelta(seconds=1))}
            sends.insert(0 if self.resolved == "first" else 1, ("resolved", gone))
        wave_size = max(1, self.concurrent)
        for i in range(0, len(sends), wave_size):
            wave = sends[i:i + wave_size]
            bodies = await asyncio.gather(*(_post(world, [alert], status) for status, alert in wave))
            for body in bodies:
                fault.event_ids += body.get("ids", [])


@dataclass(frozen=True)
class AgentXid(_XidInjector):
    """An Xid line in the node's kernel log (the driver's wording for the code, or ``text``), read by its
    agent."""

    type: ClassVar[str] = "agent_xid"
    via: ClassVar[Via] = "agent"
    xid: int
    text: str | None = None

    async def __call__(self, world: World, fault: Fault) -> None:
        assert fault.gpu is not None
        world.sim(fault.node).inject_xid(fault.gpu, self.xid, self.text)


@dataclass(frozen=True)
class AgentEcc(Injector):
    """ECC counters the agent's NVML poller reads: a double-bit error count or a pending row remap."""

    type: ClassVar[str] = "agent_ecc"
    via: ClassVar[Via] = "agent"
    kind: ClassVar[Kind] = "ecc"
    dbe: int | None = None
    remap_pending: bool | None = None

    @property
    def code(self) -> str:
        # the counter names of the agent's NVML poller (remediator.agent.nvml_poller)
        return "dbe_volatile" if self.dbe is not None else "row_remap_pending"

    async def __call__(self, world: World, fault: Fault) -> None:
        assert fault.gpu is not None
        world.sim(fault.node).set_ecc(fault.gpu, dbe=self.dbe, remap_pending=self.remap_pending)


@dataclass(frozen=True)
class AgentOrphan(Injector):
    """A process holding 12 GiB of GPU memory whose pod is gone (``ORPHAN_PID``)."""

    type: ClassVar[str] = "agent_orphan"
    via: ClassVar[Via] = "agent"
    kind: ClassVar[Kind] = "memory_leak"

    @property
    def code(self) -> str:
        return "orphaned_memory"  # what the agent's orphan finder reports (remediator.agent.orphans)

    async def __call__(self, world: World, fault: Fault) -> None:
        assert fault.gpu is not None
        world.sim(fault.node).orphan(fault.gpu, pid=ORPHAN_PID, used_bytes=12 * GIB)


@dataclass(frozen=True)
class AgentMemoryGrowth(Injector):
    """The process of the training pod that holds the fault's GPU leaks ``mib_per_s`` MiB of GPU memory a
    second, as NVML reports it to the agent's memory-trend watch; once its job is restarted, the new pod's
    processes run at the job's earlier use again (``SimGpuNode.leak_memory``)."""

    type: ClassVar[str] = "agent_memory_growth"
    via: ClassVar[Via] = "agent"
    kind: ClassVar[Kind] = "memory_leak"
    mib_per_s: int = 2048

    @property
    def code(self) -> str:
        return "process_growth"  # what the agent's memory-trend watch reports (remediator.agent.memtrend)

    async def __call__(self, world: World, fault: Fault) -> None:
        assert fault.gpu is not None
        pods = [p for p in world.training_pods(fault.node) if fault.gpu in world.gpus_of(p)]
        if not pods:
            raise RuntimeError(f"no training pod holds GPU {fault.gpu} of {fault.node}")
        world.sim(fault.node).leak_memory(fault.gpu, pods[0]["metadata"]["uid"], bytes_per_s=self.mib_per_s << 20)


@dataclass(frozen=True)
class NcclRanks(Injector):
    """Every rank of PyTorchJob ``job`` logs the PyTorch watchdog timeout of the same collective. With
    ``lagging``, that rank is stuck one collective earlier, and rank 0's desync report
    (TORCH_NCCL_DESYNC_DEBUG) names it. Its events are found by job, not by GPU."""

    type: ClassVar[str] = "nccl_ranks"
    via: ClassVar[Via] = "agent"
    kind: ClassVar[Kind] = "nccl_timeout"
    pytorch_job: str
    lagging: int | None = None

    @property
    def code(self) -> str:
        return "watchdog_timeout"

    @property
    def job(self) -> str:
        return self.pytorch_job

    async def __call__(self, world: World, fault: Fault) -> None:
        ranks = {}
        for pod in world.cluster.job_pods("PyTorchJob", TRAINING_NAMESPACE, self.pytorch_job):
            rank = pod_rank(pod)
            assert rank is not None, f"pod {pod['metadata']['name']} has no RANK"
            ranks[rank] = (pod["spec"]["nodeName"], pod["metadata"]["name"])
        for rank, (node, name) in sorted(ranks.items()):
            world.sim(node).nccl_timeout(name, rank, 41_873 if rank == self.lagging else 41_874)
            if self.lagging is not None and rank == 0:
                world.sim(node).pod_log(name, (
                    "[rank0]:[E1130 03:12:07.412345 2161 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) "
                    f"Rank 0] To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are: "
                    f"[{self.lagging}] finished collective #41873, but didn't join collective #41874"))
                await asyncio.sleep(1.5)  # rank 0's log is read before the lagging rank's own timeout


# Every injector by the ``type`` a drill file names it with.
INJECTORS: dict[str, type[Injector]] = {
    cls.type: cls for cls in (WebhookXid, AlertReplay, AgentXid, AgentEcc, AgentOrphan, AgentMemoryGrowth,
                              NcclRanks)
}
