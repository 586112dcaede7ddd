"""The simulated nodes' kubelets: what each simulated GPU node knows of the pods the API server binds to it.

Where it sits: between the simulated cluster (``chaos.sim``: the API server's store) and the simulated GPU
nodes (``chaos.sim.gpu_node``), for ``chaos.world`` (a drill's world) and ``remediator sim``. A real node
learns its pods from the kubelet and their GPU processes from the device allocation; here ``mirror_pods``
lays that out once at the start (and, for a ``SimFleet``, serves each node's kubelet PodResources socket
from the cluster: ``chaos.sim.podresources_server``), and ``Kubelet`` follows the API server's changes
afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from chaos.sim.cluster import ClusterState
from chaos.sim.gpu_node import GIB, SimFleet, SimGpuNode
from chaos.sim.gpu_operator import holds_all_gpus
from remediator.contracts import resolve_job


def pod_rank(pod: dict[str, Any]) -> int | None:
    """The global rank of a training pod: the RANK the operator sets in its environment."""
    for container in pod["spec"].get("containers", []):
        for env in container.get("env", []):
            if env.get("name") == "RANK" and str(env.get("value", "")).isdigit():
                return int(env["value"])
    return None


def pod_job(pod: dict[str, Any]) -> str | None:
    """The job of a pod, by the production resolver's labels."""
    return resolve_job(None, pod["metadata"].get("labels", {}))


def gpu_indices(cluster: ClusterState, pod: dict[str, Any]) -> set[int]:
    """The GPU indices the simulated device manager gave ``pod`` on its node (or gave it while it ran, for a
    pod since evicted): what the kubelet knows, never written onto the pod object."""
    return set(cluster.gpus_held_by(pod["metadata"]["uid"]))


def mirror_pods(cluster: ClusterState, fleet: SimFleet | Mapping[str, SimGpuNode]) -> None:
    """What the kubelet knows on each simulated node: its pods, and the training pods' GPU processes; for a
    ``SimFleet``, also each node's PodResources socket, served from ``cluster`` (``serve_pod_resources``)."""
    nodes = fleet.nodes if isinstance(fleet, SimFleet) else fleet
    pid = 20_000
    for node in cluster.node_names():
        sim = nodes[node]
        cluster.attach_gpu_node(node, sim)  # device health as the device plugin reports it
        for pod in cluster.pods_on(node):
            meta = pod["metadata"]
            uid = sim.add_pod(meta["name"], namespace=meta["namespace"], uid=meta["uid"], job=pod_job(pod),
                              rank=pod_rank(pod))
            for index in sorted(gpu_indices(cluster, pod)):
                pid += 1
                sim.add_process(index, pid, 30 * GIB, uid)
            open_all_gpus(sim, pod)
    if isinstance(fleet, SimFleet):
        fleet.serve_pod_resources(cluster)


def open_all_gpus(sim: SimGpuNode, pod: dict[str, Any]) -> None:
    """A pod the container runtime gives every GPU (``NVIDIA_VISIBLE_DEVICES=all``: the GPU Operator's operands,
    ``chaos.sim.gpu_operator``) holds each GPU open: one small process per GPU with the pod's UID."""
    if not holds_all_gpus(pod):
        return
    uid = pod["metadata"]["uid"]
    base = 40_000 + (int(uid.replace("-", "")[:8], 16) % 2_000) * 16
    for index in range(sim.gpu_count()):
        sim.add_process(index, base + index, 64 << 20, uid)


class Kubelet:
    """The simulated nodes' kubelets, following the API server: a pod that is deleted or evicted stops (its
    GPU processes exit, then the node forgets the pod); a pod newly bound to a node is known to it (it holds
    no GPU memory: the simulation does not run workloads, except a restarted pod of a job whose process
    leaked on that node, which runs again at the job's baseline: ``SimGpuNode.start_restarted``)."""

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
            else:
                if not known:
                    sim.add_pod(meta["name"], namespace=meta["namespace"], uid=meta["uid"], rank=pod_rank(ev.obj),
                                job=pod_job(ev.obj))
                    open_all_gpus(sim, ev.obj)
                # a new pod of a job whose process leaked here runs at the job's baseline (gpu_node.leak_memory)
                sim.start_restarted(meta["uid"], sorted(gpu_indices(self.cluster, ev.obj)))

    async def run(self, every_s: float = 0.1) -> None:
        while True:
            self.sync()
            await asyncio.sleep(every_s)
