"""The simulated nodes' kubelets: a bound pod starts, and its GPUs come from a device manager that keeps
the allocation where a real kubelet keeps it.

Where it sits: beside the scheduler, on the ``Store``. When a pod is bound to a node (by the scheduler,
by the seeder, or created with ``spec.nodeName``), the kubelet of that node starts it (``Running`` and
``Ready`` at once, with container statuses and a pod IP) and its device manager assigns concrete GPUs to
each container that requests ``nvidia.com/gpu``: the lowest free healthy indices, as the kubelet's device
manager hands device IDs to a container. A pod that is deleted (or finishes) gives its GPUs back; a pod in
graceful termination keeps them until it is gone. Nothing is written onto the pod object: a real cluster
keeps this in the kubelet (its device-manager checkpoint, served by the PodResources API), so here it is
read through ``ClusterState.gpu_allocation``/``pod_resources``, which the simulated kubelet serves to the
node agent over the PodResources gRPC API (``chaos.sim.podresources_server``), as a real kubelet does.

Device health is what the NVIDIA device plugin would report: a GPU marked unhealthy with
``set_gpu_health``, or one the attached simulated GPU node reports as drained (``nvidia-smi drain``, the
agent's ``isolate_gpu``) or lost, is never assigned and lowers the node's ``allocatable``; running pods are
not touched. A pod created with ``spec.nodeName`` on a node without enough free healthy GPUs fails
admission (``Failed``, reason ``UnexpectedAdmissionError``), as the kubelet rejects it.

A pod using DRA ResourceClaims (``chaos.sim.dra``) gets exactly the devices its allocated claims name
(``claim_devices``), reported per container as PodResources ``dynamic_resources`` (``claim_name``,
``claim_namespace``, ``claim_resources[]`` with ``driver_name``, ``pool_name``, ``device_name``,
``cdi_devices[].name``) and no device-plugin ``devices``; a node without ``nvidia.com/gpu`` capacity (no
device plugin) keeps its ``allocatable`` as it is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, KeysView
from dataclasses import dataclass, field
from typing import Protocol

from chaos.sim.resources import (
    BY_PLURAL,
    GPU_RESOURCE,
    Obj,
    ResourceType,
    container_gpu_requests,
    gpu_request,
    is_terminal,
)
from chaos.sim.store import Store


@dataclass(frozen=True)
class DeviceHolder:
    """One container that holds a GPU: what the kubelet's PodResources API reports for the device."""

    namespace: str
    name: str
    uid: str
    container: str

    def to_dict(self) -> dict[str, str]:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid, "container": self.container}


class GpuNodeView(Protocol):
    """What the kubelet of a node sees of that node's GPUs (``SimGpuNode`` implements it): the device
    plugin's health and device IDs."""

    def unhealthy_devices(self) -> set[int]: ...

    def device_ids(self) -> list[str]: ...


@dataclass
class _Allocation:
    node: str
    holder: DeviceHolder
    containers: list[tuple[str, list[int]]]
    dynamic: dict[str, list[Obj]] = field(default_factory=dict)   # container -> DRA dynamic_resources

    @property
    def indices(self) -> list[int]:
        return sorted(i for _, ids in self.containers for i in ids)


class Kubelets:
    """Every node's kubelet: pod start-up and the GPU device manager (lock held by the caller)."""

    def __init__(self, store: Store) -> None:
        self.s = store
        self._marked: dict[str, set[int]] = {}          # set_gpu_health: marked unhealthy by hand
        self._reported: dict[str, set[int]] = {}        # reported unhealthy by an attached GPU node
        self._views: dict[str, GpuNodeView] = {}
        self._by_uid: dict[str, _Allocation] = {}
        self._by_node: dict[str, dict[int, str]] = {}   # node -> GPU index -> pod uid
        self._held: dict[str, list[int]] = {}           # pod uid -> the GPUs it held (kept after it goes)
        # DRA: per container of a pod using ResourceClaims, its GPU indices and PodResources
        # dynamic_resources entries (``Dra.container_devices``, set by ``ClusterState``).
        self.claim_devices: Callable[[Obj], list[tuple[str, list[int], list[Obj]]]] | None = None
        store.listeners.append(self.on_change)

    # --- pod start-up ---------------------------------------------------------------------------

    def start(self, pod: Obj, node_name: str) -> Obj:
        """``pod`` bound to ``node_name`` and running: what the node's kubelet reports once it started it."""
        node = self.s.obj("nodes", "", node_name)
        host_ip = "10.0.0.1"
        if node is not None:
            host_ip = next((a["address"] for a in (node.get("status") or {}).get("addresses", [])
                            if a.get("type") == "InternalIP"), host_ip)
        now = self.s.ts()
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node_name
        ip = self.s.next_ip()
        containers = new["spec"].get("containers", [])
        new["status"] = {
            "phase": "Running",
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                           for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                     "PodScheduled")],
            "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": ip, "podIPs": [{"ip": ip}],
            "startTime": now, "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
            "containerStatuses": [
                {"name": c["name"], "ready": True, "restartCount": 0, "started": True,
                 "image": c.get("image", ""), "imageID": f"{c.get('image', '')}@sha256:{'0' * 64}",
                 "containerID": f"containerd://{self.s.rng.getrandbits(128):032x}",
                 "state": {"running": {"startedAt": now}}, "lastState": {}}
                for c in containers],
        }
        claims = pod.get("status", {}).get("resourceClaimStatuses")
        if claims:  # written by the resourceclaim controller; the kubelet keeps it
            new["status"]["resourceClaimStatuses"] = claims
        return new

    def admit(self, pod: Obj, node_name: str) -> Obj:
        """A pod created already bound to ``node_name``: started, or ``Failed`` when the node's device
        manager cannot give it the GPUs it requests (the kubelet's ``UnexpectedAdmissionError``)."""
        need = gpu_request(pod)
        if need and self.free_gpus(node_name, need) is None:
            available = min(len(self._free(node_name)), self._room(node_name))
            new = copy.deepcopy(pod)
            new["spec"]["nodeName"] = node_name
            new["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                             "message": f"Pod was rejected: Allocate failed due to requested number of devices "
                                        f"unavailable for {GPU_RESOURCE}. Requested: {need}, Available: "
                                        f"{available}, which is unexpected", "startTime": self.s.ts()}
            return new
        return self.start(pod, node_name)

    # --- device health --------------------------------------------------------------------------

    def attach(self, node: str, view: GpuNodeView) -> None:
        """Let ``view`` (the node's simulated GPUs) report device health and receive the allocation."""
        self._views[node] = view
        self._reported.pop(node, None)

    @property
    def attached(self) -> bool:
        """Whether any simulated GPU node reports device health here."""
        return bool(self._views)

    def attached_nodes(self) -> KeysView[str]:
        """The nodes whose simulated GPU node is attached: the only ones whose boot id can change from outside."""
        return self._views.keys()

    def unhealthy(self, node: str) -> set[int]:
        """GPU indices of ``node`` the device plugin reports unhealthy (marked by hand or by the GPU node)."""
        return self._marked.get(node, set()) | self._reported.get(node, set())

    def mark(self, node: str, index: int, healthy: bool) -> None:
        """``set_gpu_health``: the device plugin marks one GPU (un)healthy."""
        bad = self._marked.setdefault(node, set())
        if healthy:
            bad.discard(index)
        else:
            bad.add(index)

    def allocatable(self, node: Obj) -> Obj:
        """``status.allocatable`` of ``node`` with ``nvidia.com/gpu`` lowered by its unhealthy GPUs."""
        if GPU_RESOURCE not in node["status"].get("capacity", {}):  # no device plugin (DRA): nothing to lower
            return dict(node["status"].get("allocatable", {}))
        cap = int(node["status"].get("capacity", {}).get(GPU_RESOURCE, 0))
        bad = self.unhealthy(node["metadata"]["name"])
        return {**node["status"].get("allocatable", {}), GPU_RESOURCE: str(max(0, cap - len(bad)))}

    def poll(self) -> bool:
        """Read the attached GPU nodes' device health; where it changed, commit the node's new
        ``allocatable`` (the scheduler then sees it). True when anything changed."""
        changed = False
        for name, view in sorted(self._views.items()):
            bad = set(view.unhealthy_devices())
            if bad == self._reported.get(name):
                continue
            self._reported[name] = bad
            node = self.s.obj("nodes", "", name)
            if node is None:
                continue
            alloc = self.allocatable(node)
            if alloc != node["status"].get("allocatable"):
                self.s.commit(BY_PLURAL["nodes"], {**node, "status": {**node["status"], "allocatable": alloc}},
                              "MODIFIED")
                changed = True
        return changed

    # --- the device manager ---------------------------------------------------------------------

    def _free(self, node_name: str) -> list[int]:
        node = self.s.obj("nodes", "", node_name)
        if node is None:
            return []
        cap = int(node["status"].get("capacity", {}).get(GPU_RESOURCE, 0))
        used = self._by_node.get(node_name, {})
        bad = self.unhealthy(node_name)
        return [i for i in range(cap) if i not in used and i not in bad]

    def _room(self, node_name: str) -> int:
        """How many more GPUs ``allocatable`` lets the node hand out."""
        node = self.s.obj("nodes", "", node_name)
        if node is None:
            return 0
        alloc = int(node["status"].get("allocatable", {}).get(GPU_RESOURCE, 0))
        return alloc - len(self._by_node.get(node_name, {}))

    def free_gpus(self, node_name: str, need: int) -> list[int] | None:
        """The lowest ``need`` free healthy GPU indices on the node, or None if it lacks room."""
        node = self.s.obj("nodes", "", node_name)
        if node is None:
            return None
        if need == 0:
            return []
        if need > self._room(node_name):
            return None
        free = self._free(node_name)
        return free[:need] if len(free) >= need else None

    def on_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        """Store listener: a pod that goes (or finishes) releases its GPUs; a bound pod gets them."""
        if rt.plural != "pods":
            return
        if old is not None:
            uid = old["metadata"]["uid"]
            if uid in self._by_uid and (new is None or is_terminal(new) or new["metadata"]["uid"] != uid):
                self._release(uid)
        if new is not None and new.get("spec", {}).get("nodeName") and not is_terminal(new) \
                and new["metadata"]["uid"] not in self._by_uid:
            self._allocate(new, new["spec"]["nodeName"])

    def _allocate(self, pod: Obj, node: str) -> None:
        if self.claim_devices is not None and pod.get("spec", {}).get("resourceClaims"):
            self._allocate_claims(pod, node, self.claim_devices(pod))
            return
        wants = container_gpu_requests(pod)
        indices = self.free_gpus(node, sum(n for _, n in wants))
        if not wants or indices is None:
            return
        meta = pod["metadata"]
        containers: list[tuple[str, list[int]]] = []
        for cname, n in wants:
            containers.append((cname, indices[:n]))
            indices = indices[n:]
        holder = DeviceHolder(meta["namespace"], meta["name"], meta["uid"], "")
        a = _Allocation(node, holder, containers)
        self._by_uid[holder.uid] = a
        slots = self._by_node.setdefault(node, {})
        for i in a.indices:
            slots[i] = holder.uid
        self._held[holder.uid] = a.indices

    def _allocate_claims(self, pod: Obj, node: str, devices: list[tuple[str, list[int], list[Obj]]]) -> None:
        """A pod whose GPUs come from its allocated ResourceClaims: the kubelet prepares exactly those devices
        (the DRA driver's NodePrepareResources) and reports them as ``dynamic_resources``."""
        if not devices:
            return
        meta = pod["metadata"]
        holder = DeviceHolder(meta["namespace"], meta["name"], meta["uid"], "")
        a = _Allocation(node, holder, [(c, ids) for c, ids, _ in devices], {c: dyn for c, _, dyn in devices})
        self._by_uid[holder.uid] = a
        slots = self._by_node.setdefault(node, {})
        for i in a.indices:
            slots[i] = holder.uid
        self._held[holder.uid] = a.indices

    def _release(self, uid: str) -> None:
        a = self._by_uid.pop(uid)
        slots = self._by_node.get(a.node, {})
        for i in a.indices:
            if slots.get(i) == uid:
                del slots[i]

    def allocation(self, node: str) -> dict[int, list[DeviceHolder]]:
        """GPU index -> the containers that hold it, on ``node``."""
        out: dict[int, list[DeviceHolder]] = {}
        for index, uid in sorted(self._by_node.get(node, {}).items()):
            a = self._by_uid[uid]
            for cname, ids in a.containers:
                if index in ids:
                    h = a.holder
                    out.setdefault(index, []).append(DeviceHolder(h.namespace, h.name, h.uid, cname))
        return out

    def indices_of(self, uid: str) -> list[int]:
        """The GPUs the pod with ``uid`` holds now; [] when it holds none."""
        a = self._by_uid.get(uid)
        return a.indices if a is not None else []

    def held_by(self, uid: str) -> list[int]:
        """The GPUs the pod with ``uid`` holds, or held when it last ran (for checks after it is gone)."""
        return list(self._held.get(uid, []))

    def pod_resources(self, node: str) -> list[Obj]:
        """``node``'s allocation in the shape of the kubelet's PodResources ``List`` reply (``name``,
        ``namespace``, ``containers[].devices[]`` with ``resource_name`` and ``device_ids``), plus each
        pod's ``uid``. Device IDs are the attached GPU node's (GPU UUIDs), else the indices as text."""
        view = self._views.get(node)
        ids = view.device_ids() if view is not None else []

        def device_id(i: int) -> str:
            return ids[i] if i < len(ids) else str(i)

        pods = sorted((self._by_uid[uid] for uid in set(self._by_node.get(node, {}).values())),
                      key=lambda a: (a.holder.namespace, a.holder.name))
        def container(cname: str, ids_: list[int], a: _Allocation) -> Obj:
            if cname in a.dynamic:  # DRA: the claim's devices, no device-plugin device IDs
                return {"name": cname, "devices": [], "dynamic_resources": a.dynamic[cname]}
            return {"name": cname, "devices": [{"resource_name": GPU_RESOURCE,
                                                "device_ids": [device_id(i) for i in ids_]}]}

        return [{"name": a.holder.name, "namespace": a.holder.namespace, "uid": a.holder.uid,
                 "containers": [container(cname, ids_, a) for cname, ids_ in a.containers]}
                for a in pods]


