"""The simulated kubelet's device manager: which pod holds which GPU lives in the kubelet, never on the pod,
an isolated GPU is never given out, and the node agent names exactly the holders the service evicts.

Where it sits: integration ring for chaos/sim (``kubelet``, ``ClusterState.gpu_allocation``,
``attach_gpu_node``) joined with the simulated GPU node (``chaos.sim.gpu_node``), the simulated kubelet's
PodResources gRPC socket (``chaos.sim.podresources_server``) read by the agent's real client and holder view
(``remediator.adapters.podresources``, ``remediator.agent.holders``), the real command responder
(``remediator.agent.commands``), the real Kubernetes adapter over the simulator's HTTP API and the
``evict_gpu_pods`` step. No NATS: the agent port calls the responder directly.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from chaos.kubelet import mirror_pods
from chaos.sim import ClusterState, KubeApiServer, seed_cluster
from chaos.sim.gpu_node import SimGpuNode
from chaos.sim.podresources_server import PodResourcesServers
from playbooks.catalog import PlaybookCatalog
from playbooks.steps import StepContext, StepFailed, evict_gpu_pods
from remediator.adapters.kube import AsyncKube, KubeAdapter
from remediator.adapters.podresources import PodResourcesClient
from remediator.agent.commands import CommandResponder
from remediator.agent.holders import KubeletHolders, PodUids
from remediator.agent.state import StateStore
from remediator.contracts import AgentCommand, AgentReply, Decision, GpuRef
from remediator.settings import Settings

ANNOTATION = "gpu-remediator.io/gpu-indices"  # what the simulator once wrote and no cluster writes
NODE = "gpu-node-0"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def no_pod_carries_gpu_indices(cluster: ClusterState) -> bool:
    return all(ANNOTATION not in (p["metadata"].get("annotations") or {}) for p in cluster.list_pods())


def holders(cluster: ClusterState, node: str, index: int) -> list[tuple[str, str]]:
    return [(h.name, h.uid) for h in cluster.gpu_allocation(node).get(index, [])]


def attached(cluster: ClusterState, tmp_path: Path, node: str) -> SimGpuNode:
    sim = SimGpuNode(tmp_path / node, name=node, gpus=8)
    cluster.attach_gpu_node(node, sim)
    return sim


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory for unix sockets (pytest's tmp_path can be over the 107-byte address limit)."""
    with tempfile.TemporaryDirectory(prefix="kubelet-") as d:
        yield Path(d)


def kubelet_view(cluster: ClusterState, sim: SimGpuNode, socket: Path) -> tuple[PodResourcesServers, KubeletHolders]:
    """The node's kubelet PodResources socket served from ``cluster``, and the agent's holder view on it (the
    pods' UIDs from the node's pod-log and kubelet pod directories, as on a real node)."""
    mirror_pods(cluster, {sim.name: sim})
    servers = PodResourcesServers(cluster, {sim.name: sim})
    servers.serve(sim.name, socket)
    view = KubeletHolders(PodResourcesClient(socket), lambda: [sim.identity(i) for i in range(sim.gpu_count())],
                          uids=PodUids(sim.pod_logs_dir, sim.kubelet_pods_dir))
    return servers, view


def test_the_allocation_is_the_kubelets_and_reaches_the_agent_over_grpc(tmp_path: Path, sockets: Path) -> None:
    cluster = seed_cluster(1, gpus_per_pod=4)
    cluster.add_deployment("serve", "infer", replicas=2, gpus_per_pod=2)
    sim = attached(cluster, tmp_path, NODE)
    servers, view = kubelet_view(cluster, sim, sockets / "pr.sock")
    alloc = cluster.gpu_allocation(NODE)
    assert sorted(alloc) == list(range(8))
    (train,) = cluster.job_pods("Job", "training", "train-0")
    assert all(alloc[i][0].name == train["metadata"]["name"] and alloc[i][0].container == "trainer"
               for i in range(4))
    infer = {h[0].name for i, h in alloc.items() if i >= 4}
    assert len(infer) == 2 and cluster.gpu_indices_of("serve", sorted(infer)[0]) in ([4, 5], [6, 7])
    assert no_pod_carries_gpu_indices(cluster)

    # The kubelet's socket serves the allocation, device IDs being GPU UUIDs, pods by namespace and name
    # only; the agent's view joins it with the GPUs and finds each UID in the kubelet's pod directories.
    try:
        entries = {p.name: p for p in PodResourcesClient(sockets / "pr.sock").list()}
        (devices,) = entries[train["metadata"]["name"]].containers[0].devices
        assert (devices.resource_name, list(devices.device_ids)) == (
            "nvidia.com/gpu", [sim.identity(i).uuid for i in range(4)])
        (holder,) = view.gpu_holders(sim.identity(2)) or ()
        assert (holder.namespace, holder.name, holder.uid) == ("training", train["metadata"]["name"],
                                                                train["metadata"]["uid"])

        # A pod that goes gives its GPUs back, and the next answer says so.
        cluster.delete("jobs", "train-0", "training", propagation="Background")
        assert sorted(cluster.gpu_allocation(NODE)) == [4, 5, 6, 7]
        assert view.gpu_holders(sim.identity(2)) == ()
    finally:
        servers.stop()
    # No socket (a node without a kubelet answering): the view cannot tell, and says why.
    assert view.gpu_holders(sim.identity(0)) is None
    assert view.last_error is not None and "does not exist" in view.last_error


async def test_an_isolated_gpu_is_never_given_to_a_new_pod(tmp_path: Path) -> None:
    cluster = seed_cluster(2)
    cluster.delete("pytorchjobs", "pytorch-0", "training")  # both nodes empty of training pods
    attached(cluster, tmp_path, "gpu-node-1")
    sim = SimGpuNode.attach(tmp_path / "gpu-node-1")  # the agent's own handle, as in another process
    isolated = await sim.isolate_gpu(sim.identity(7))  # what the agent's isolate_gpu does on the node
    assert isolated.ok
    assert cluster.unhealthy_gpus("gpu-node-1") == {7}
    assert cluster.node("gpu-node-1")["status"]["allocatable"]["nvidia.com/gpu"] == "7"

    cluster.add_statefulset("training", "big", replicas=2, gpus_per_pod=8)
    big = {p["metadata"]["name"]: p for p in cluster.list_pods("training")}
    bound = [n for n, p in big.items() if p["spec"].get("nodeName")]
    assert [big[n]["spec"]["nodeName"] for n in bound] == ["gpu-node-0"]  # the node with GPU 7 out takes none
    (pending,) = cluster.pending_pods()
    assert pending["status"]["conditions"][0]["reason"] == "Unschedulable"
    assert 7 not in cluster.gpu_allocation("gpu-node-1")

    # Smaller pods land on the node, on every GPU but 7.
    cluster.delete("statefulsets", "big", "training")
    cluster.add_deployment("training", "small", replicas=4, gpus_per_pod=2,
                           node_selector={"kubernetes.io/hostname": "gpu-node-1"})
    assert sorted(cluster.gpu_allocation("gpu-node-1")) == [0, 1, 2, 3, 4, 5]
    assert len(cluster.pending_pods()) == 1  # GPU 6 alone is free: not enough

    # Created straight onto the node, an 8-GPU pod fails admission as the kubelet rejects it.
    cluster.create("pods", {"metadata": {"name": "pinned"}, "spec": {"nodeName": "gpu-node-1", "containers": [
        {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}, "training")
    pinned = cluster.pod("training", "pinned")
    assert (pinned["status"]["phase"], pinned["status"]["reason"]) == ("Failed", "UnexpectedAdmissionError")
    assert cluster.gpu_indices_of("training", "pinned") == []

    # Released, the GPU is healthy again and the pending pod takes it.
    await sim.release_gpu(sim.identity(7))
    assert cluster.unhealthy_gpus("gpu-node-1") == set()
    assert cluster.pending_pods() == []
    assert sorted(cluster.gpu_allocation("gpu-node-1")) == list(range(8))
    assert no_pod_carries_gpu_indices(cluster)


class ResponderPort:
    """The agent port over the real command responder, without NATS."""

    def __init__(self, responder: CommandResponder) -> None:
        self.responder = responder
        self.verbs: list[str] = []

    async def call(self, node: str, verb: Any, *, command_id: str, gpu: GpuRef | None = None,
                   params: dict[str, Any] | None = None, timeout_s: float | None = None) -> AgentReply:
        self.verbs.append(verb)
        return await self.responder.handle(AgentCommand(id=command_id, verb=verb, gpu=gpu, params=params or {}))


@pytest.fixture
async def rig(tmp_path: Path, sockets: Path
              ) -> AsyncIterator[tuple[ClusterState, SimGpuNode, CommandResponder, AsyncKube]]:
    cluster = seed_cluster(1, gpus_per_pod=4)
    cluster.add_deployment("serve", "infer", replicas=2, gpus_per_pod=2)
    sim = attached(cluster, tmp_path, NODE)
    servers, view = kubelet_view(cluster, sim, sockets / "pr.sock")
    responder = CommandResponder(node=NODE, gpus=sim, host=sim, pods=sim, state=StateStore(tmp_path / "agent"),
                                 pod_resources=view)
    with KubeApiServer(cluster) as server:
        adapter = KubeAdapter(str(server.write_kubeconfig(tmp_path / "kubeconfig")), drain_grace_period_s=0)
        kube = AsyncKube(adapter)
        try:
            yield cluster, sim, responder, kube
        finally:
            adapter.close()
            servers.stop()


def decision(index: int) -> Decision:
    return Decision(incident_id="inc-7", handler="xid", playbook="gpu-memory-fatal", node=NODE,
                    gpu=GpuRef(index=index), group="gpu", reason="Xid 48", event_id="ev-7", kind="xid",
                    decided_at=T0)


async def test_isolating_gpu_7_evicts_exactly_the_pods_the_kubelet_says_hold_it(
        rig: tuple[ClusterState, SimGpuNode, CommandResponder, AsyncKube]) -> None:
    cluster, _, responder, kube = rig
    on_gpu7 = holders(cluster, NODE, 7)
    assert len(on_gpu7) == 1
    others = {p["metadata"]["uid"] for p in cluster.pods_on(NODE)} - {uid for _, uid in on_gpu7}

    isolated = await responder.handle(AgentCommand(id="iso-7", verb="isolate_gpu", gpu=GpuRef(index=7)))
    assert isolated.ok and isolated.changed and isolated.after["holders_known"] is True
    assert [(h["name"], h["uid"]) for h in isolated.after["holders"]] == on_gpu7
    assert cluster.unhealthy_gpus(NODE) == {7}

    agents = ResponderPort(responder)
    ctx = StepContext(decision=decision(7), playbook=PlaybookCatalog.load().get("gpu-memory-fatal"), kube=kube,
                      agents=agents, settings=Settings(), clock=lambda: T0, audit=None,  # type: ignore[arg-type]
                      step_key="evict", timeout_s=30.0)
    change = await evict_gpu_pods(ctx, {"grace_period_s": 0})

    assert agents.verbs == ["status"]
    assert [(p["name"], p["uid"]) for p in change.after["evicted"]] == on_gpu7
    assert change.before["holders"][0]["uid"] == on_gpu7[0][1]
    left = {p["metadata"]["uid"] for p in cluster.pods_on(NODE)}
    assert others <= left and not ({uid for _, uid in on_gpu7} & left)
    # The ReplicaSet's replacement finds no room: GPU 7 is out and the other GPUs are held.
    assert [p["metadata"]["namespace"] for p in cluster.pending_pods()] == ["serve"]
    assert 7 not in cluster.gpu_allocation(NODE)
    assert no_pod_carries_gpu_indices(cluster)

    # Asked again, nobody holds GPU 7 and nothing is evicted.
    again = await evict_gpu_pods(ctx, {"grace_period_s": 0})
    assert not again.changed and "no pod holds GPU" in again.detail


async def test_an_agent_that_cannot_tell_the_holders_says_so_and_nobody_is_evicted(
        rig: tuple[ClusterState, SimGpuNode, CommandResponder, AsyncKube], tmp_path: Path) -> None:
    cluster, sim, _, kube = rig

    # an agent with no PodResources socket (started without one on a node where none is mounted)
    blind = CommandResponder(node=NODE, gpus=sim, host=sim, pods=sim, state=StateStore(tmp_path / "blind"))
    reply = await blind.handle(AgentCommand(id="iso-3", verb="isolate_gpu", gpu=GpuRef(index=3)))
    assert reply.ok and reply.after["holders_known"] is False and reply.after["holders"] == []
    assert "unknown" in reply.detail
    before = {p["metadata"]["uid"] for p in cluster.pods_on(NODE)}
    ctx = StepContext(decision=decision(3), playbook=PlaybookCatalog.load().get("gpu-memory-fatal"), kube=kube,
                      agents=ResponderPort(blind), settings=Settings(), clock=lambda: T0,
                      audit=None, step_key="evict", timeout_s=30.0)  # type: ignore[arg-type]

    with pytest.raises(StepFailed, match="cannot tell which pods hold GPU"):
        await evict_gpu_pods(ctx, {})
    assert {p["metadata"]["uid"] for p in cluster.pods_on(NODE)} == before


async def test_status_names_every_gpus_holders(
        rig: tuple[ClusterState, SimGpuNode, CommandResponder, AsyncKube]) -> None:
    cluster, _, responder, _ = rig
    everything = await responder.handle(AgentCommand(id="s-all", verb="status"))
    assert everything.ok and everything.after["holders_known"] is True
    by_index = {g["index"]: [(h["name"], h["uid"]) for h in g["holders"]] for g in everything.after["gpus"]}
    assert by_index == {i: holders(cluster, NODE, i) for i in range(8)}
    one = await responder.handle(AgentCommand(id="s-5", verb="status", gpu=GpuRef(index=5)))
    assert [(h["name"], h["uid"]) for h in one.after["holders"]] == holders(cluster, NODE, 5)
    assert one.after["holders"][0]["container"] == "infer"
