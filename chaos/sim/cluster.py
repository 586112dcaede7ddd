"""The simulated cluster: ``ClusterState``, one small facade over an in-memory Kubernetes, and
``seed_cluster``, the cluster drills start from.

Where it sits: chaos/sim, below ``kube_api`` (the HTTP front that kubectl and the official client talk
to) and beside the simulated GPU nodes (``gpu_node``). Drills, demos and benchmarks seed a cluster here,
start a ``KubeApiServer`` on it, point the service at the kubeconfig it writes, inject faults, and read
the outcome back through this facade (``node``, ``pods_on``, ``job_restarts``, ``gpu_allocation``, ...).

What it is made of, each a module with one role, all under one lock:

- ``resources``: the served resource types, ``ApiError``, stored objects and watch events;
- ``store``: every object, the global resourceVersion, the watch history (410 Gone past it), the indexes
  and the work a change leaves for the controllers;
- ``apiserver``: the verbs (get, list, create, replace, patch, delete, deletecollection, eviction) with
  kube-apiserver's validation, defaulting and refusals;
- ``controllers`` and ``workloads``: the loop that runs after every change; Job, PyTorchJob, DaemonSet,
  Deployment, ReplicaSet and StatefulSet controllers, the NoExecute taint manager, graceful deletion;
- ``scheduler``: binds pending pods to nodes whose taints, cordon, selector and free GPUs allow it;
- ``kubelet``: starts bound pods and keeps the GPU device allocation (pod, container -> GPU indices)
  where a real kubelet keeps it, never on the pod; device health from ``set_gpu_health`` and from the
  attached simulated GPU nodes (an isolated or lost GPU is never assigned);
- ``disruption``: PodDisruptionBudget status and the eviction check;
- ``faults``: injected API errors and latency, request counters;
- ``seeding``: the seeded layout (see that module).

Waiting: ``wait_for(predicate, timeout)`` re-checks after every change, every request served (so a test
can wait on ``request_counts``) and every injected fault hit.

Deletion: immediate by default. With ``graceful_deletion`` on (constructor argument or property),
deleting or evicting a bound, running pod marks it terminating instead, as the kubelet's graceful
shutdown would: ``metadata.deletionTimestamp`` (now + the grace period) and
``deletionGracePeriodSeconds`` are set, the pod stays listed (``kubectl get`` shows ``Terminating``) and
keeps its GPUs, and it disappears once the state's clock passes its deletionTimestamp: on the next API
request, controller pass or ``tick()``. The grace period is ``gracePeriodSeconds`` from the request, else
the pod's ``spec.terminationGracePeriodSeconds`` (30); 0, an unscheduled pod or a finished pod go at once.
A terminating pod does not count as healthy for PodDisruptionBudgets and is evicted without a PDB check;
Jobs and ReplicaSets replace it at once, fixed-name owners (StatefulSet, PyTorchJob, DaemonSet) once it
is gone. Cascading deletes from an owner and the NoExecute taint manager go the same way; deleting a
node or a namespace removes its pods at once.

Deliberate simplifications: no finalizers; pods do not complete; a batch/v1 Job deleted without
``propagationPolicy`` orphans its pods, as the real API does, while every other owner cascades; workload
``spec.selector`` and template labels are validated on create only; no PersistentVolumeClaims for
StatefulSets, no ``/scale`` subresource.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from chaos.sim.apiserver import ApiServer
from chaos.sim.controllers import Controllers
from chaos.sim.disruption import Disruption
from chaos.sim.dra import Dra
from chaos.sim.faults import FaultInjector, InjectedFault
from chaos.sim.kube_patch import MERGE_PATCH
from chaos.sim.kubelet import DeviceHolder, GpuNodeView, Kubelets
from chaos.sim.resources import (
    BY_PLURAL,
    GPU_PRESENT_LABEL,
    GPU_RESOURCE,
    JOB_NAME_LABEL,
    KUBEFLOW_JOB_NAME_LABEL,
    KUBEFLOW_REPLICA_INDEX_LABEL,
    KUBEFLOW_REPLICA_TYPE_LABEL,
    KUBERNETES_VERSION,
    OWNER_PLURAL,
    RESOURCES,
    RESTARTS_ANNOTATION,
    TRAINING_NAMESPACE,
    ApiError,
    ListResult,
    Obj,
    ResourceType,
    StoredObject,
    WatchEvent,
    controller_ref,
    copy_obj,
    is_active,
    rank_key,
    resource_type,
)
from chaos.sim.scheduler import Scheduler
from chaos.sim.seeding import Seeder
from chaos.sim.store import Store
from chaos.sim.workloads import workload_manifest

__all__ = [
    "BY_PLURAL",
    "GPU_PRESENT_LABEL",
    "GPU_RESOURCE",
    "JOB_NAME_LABEL",
    "KUBEFLOW_JOB_NAME_LABEL",
    "KUBEFLOW_REPLICA_INDEX_LABEL",
    "KUBEFLOW_REPLICA_TYPE_LABEL",
    "KUBERNETES_VERSION",
    "RESOURCES",
    "RESTARTS_ANNOTATION",
    "TRAINING_NAMESPACE",
    "ApiError",
    "ClusterState",
    "DeviceHolder",
    "GpuNodeView",
    "InjectedFault",
    "ListResult",
    "ResourceType",
    "StoredObject",
    "WatchEvent",
    "freeze_heap",
    "seed_cluster",
]


class ClusterState:
    """Thread-safe in-memory cluster; one ``RLock`` guards everything.

    Two faces. The Python API (``node``, ``pods_on``, ``patch``, ``evict``, ``inject_error``, ...) returns
    deep copies the caller owns. The ``api_*`` methods serve ``kube_api`` and return stored objects that
    must not be modified. Both run the controllers before returning.

    ``graceful_deletion`` (off by default: deletion is immediate) makes pod deletion and eviction graceful;
    see the module docstring.
    """

    def __init__(self, *, clock: Callable[[], datetime] | None = None, seed: int = 0,
                 history: int = 50_000, graceful_deletion: bool = False) -> None:
        self._store = Store(clock=clock, seed=seed, history=history, graceful_deletion=graceful_deletion)
        self._kubelets = Kubelets(self._store)
        self._disruption = Disruption(self._store)
        self._dra = Dra(self._store)
        self._kubelets.claim_devices = self._dra.container_devices
        self._scheduler = Scheduler(self._store, self._kubelets, self._dra)
        self._controllers = Controllers(self._store, self._scheduler, self._kubelets, self._disruption)
        self._dra.delete_pod = self._controllers.delete_pod
        self._api = ApiServer(self._store, self._controllers, self._kubelets, self._disruption)
        self._faults = FaultInjector(self._store.lock, self._store.wakeup)

    # --- clock, versions, deletion mode ---------------------------------------------------------

    def now(self) -> datetime:
        """The state's clock (injected; wall clock by default)."""
        return self._store.clock()

    @property
    def resource_version(self) -> int:
        """The global resourceVersion counter: the version of the most recent change."""
        with self._store.lock:
            return self._store.rv

    @property
    def graceful_deletion(self) -> bool:
        """Whether deleting or evicting a running pod leaves it terminating for its grace period."""
        return self._store.graceful

    @graceful_deletion.setter
    def graceful_deletion(self, enabled: bool) -> None:
        with self._store.lock:
            self._store.graceful = enabled

    def tick(self) -> None:
        """Finish the graceful deletions whose grace period has passed on the state's clock (every API
        request does this too) and run the controllers."""
        with self._store.lock:
            self._controllers.tick()

    def terminating_pods(self) -> dict[str, datetime]:
        """``namespace/name`` -> when it goes, for each pod in graceful termination."""
        with self._store.lock:
            return {f"{ns}/{name}": when for (ns, name), when in sorted(self._store.terminating.items())}

    # --- the API server's interface: stored (read-only) objects ----------------------------------

    def api_get(self, rt: ResourceType, namespace: str, name: str) -> StoredObject:
        """The stored object or ``ApiError`` 404."""
        return self._api.get(rt, namespace, name)

    def api_list(self, rt: ResourceType, namespace: str | None, *, label_selector: str | None = None,
                 field_selector: str | None = None, limit: int = 0,
                 continue_token: str | None = None) -> ListResult:
        """List (one namespace or all), filtered by selectors, paginated by ``limit``/``continue``."""
        return self._api.list_objects(rt, namespace, label_selector=label_selector, field_selector=field_selector,
                              limit=limit, continue_token=continue_token)

    def api_create(self, rt: ResourceType, namespace: str | None, body: Any, *, dry_run: bool = False) -> Obj:
        """Create ``body``; 409 AlreadyExists, 400/422 for a body that does not fit the request."""
        return self._api.create(rt, namespace, body, dry_run=dry_run)

    def api_replace(self, rt: ResourceType, namespace: str | None, name: str, body: Any, *,
                    subresource: str | None = None, dry_run: bool = False) -> Obj:
        """PUT: 409 Conflict when ``metadata.resourceVersion`` is set and stale."""
        return self._api.replace(rt, namespace, name, body, subresource=subresource, dry_run=dry_run)

    def api_patch(self, rt: ResourceType, namespace: str | None, name: str, body: bytes | Any,
                  content_type: str, *, subresource: str | None = None, dry_run: bool = False) -> Obj:
        """PATCH with merge, strategic-merge (built-in types only) or JSON patch."""
        return self._api.patch(rt, namespace, name, body, content_type, subresource=subresource, dry_run=dry_run)

    def api_delete(self, rt: ResourceType, namespace: str | None, name: str, *, propagation: str | None = None,
                   precondition_uid: str | None = None, precondition_rv: str | None = None,
                   grace_period: int | None = None, dry_run: bool = False) -> Obj:
        """Delete (a pod gracefully when ``graceful_deletion`` is on); see ``ApiServer.delete``."""
        return self._api.delete(rt, namespace, name, propagation=propagation, precondition_uid=precondition_uid,
                                precondition_rv=precondition_rv, grace_period=grace_period, dry_run=dry_run)

    def api_delete_collection(self, rt: ResourceType, namespace: str | None, *, label_selector: str | None = None,
                              field_selector: str | None = None, propagation: str | None = None,
                              grace_period: int | None = None, dry_run: bool = False) -> list[Obj]:
        """Delete every match in one controller pass (so a gang restart counts once)."""
        return self._api.delete_collection(rt, namespace, label_selector=label_selector,
                                           field_selector=field_selector, propagation=propagation,
                                           grace_period=grace_period, dry_run=dry_run)

    def api_evict(self, namespace: str, name: str, body: Any = None, *, dry_run: bool = False) -> None:
        """The pods/eviction subresource (409 on a failed precondition, 429 when a PDB refuses)."""
        self._api.evict(namespace, name, body, dry_run=dry_run)

    # --- watch ----------------------------------------------------------------------------------

    def events_since(self, rv: int) -> list[WatchEvent]:
        """Every change after ``rv``; ``ApiError`` 410 when ``rv`` is older than the kept history."""
        with self._store.lock:
            self._controllers.tick()
            return self._store.events_since(rv)

    def wait_changed(self, rv: int, timeout: float) -> None:
        """Block until the resourceVersion passes ``rv`` or ``timeout`` seconds elapse."""
        self._store.wait_changed(rv, timeout)

    def wake_watchers(self) -> None:
        self._store.wake_watchers()

    def wait_for(self, predicate: Callable[[ClusterState], bool], timeout: float) -> bool:
        """Wait until ``predicate(self)`` holds; False after ``timeout`` seconds. It is checked after every
        change, every request served (``request_counts``), every fault hit, and every 50 ms while pods are
        terminating (their grace period runs on the state's clock) or GPU nodes are attached (their device
        health is read on each check)."""
        deadline = time.monotonic() + timeout
        with self._store.lock:
            while True:
                self._controllers.tick()
                if predicate(self):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                poll = self._store.terminating or self._kubelets.attached
                self._store.wakeup.wait(min(left, 0.05) if poll else left)

    # --- chaos hooks ----------------------------------------------------------------------------

    def inject_error(self, status: int, *, method: str = "*", path: str = ".*", count: int | None = 1,
                     retry_after: int | None = None, message: str = "") -> InjectedFault:
        """Answer the next ``count`` requests matching ``method`` (or ``*``) and the path regex with an
        error ``Status`` of ``status`` (e.g. 500, 503, 429), with a ``Retry-After`` header when given.

        ``path`` is searched (``re.search``) in the URL path without the query string.
        ``count=None`` keeps the fault until ``remove_fault``/``clear_faults``.
        """
        return self._faults.inject_error(status, method=method, path=path, count=count, retry_after=retry_after,
                                         message=message)

    def add_latency(self, seconds: float, *, method: str = "*", path: str = ".*",
                    count: int | None = None) -> InjectedFault:
        """Delay matching requests by ``seconds`` (all of them until removed, or the next ``count``)."""
        return self._faults.add_latency(seconds, method=method, path=path, count=count)

    def remove_fault(self, fault: InjectedFault) -> None:
        self._faults.remove_fault(fault)

    def clear_faults(self) -> None:
        self._faults.clear_faults()

    def take_faults(self, method: str, path: str) -> tuple[float, ApiError | None]:
        """For the server: the latency to add and the error to answer with, consuming matching faults."""
        return self._faults.take_faults(method, path)

    def record_request(self, verb: str, resource: str) -> None:
        """Count one request served and wake ``wait_for`` callers (watchers are not woken)."""
        self._faults.record_request(verb, resource)

    def request_counts(self) -> dict[str, int]:
        """Requests served, keyed ``"<verb> <resource>"``: ``"patch nodes"``, ``"create pods/eviction"``,
        ``"list pods"``, ``"get /version"`` (non-resource paths are counted by path)."""
        return self._faults.request_counts()

    def count(self, verb: str, resource: str) -> int:
        return self._faults.count(verb, resource)

    def reset_counters(self) -> None:
        self._faults.reset_counters()

    # --- Python API: copies the caller owns -----------------------------------------------------

    def get(self, resource: str | ResourceType, name: str, namespace: str | None = None) -> Obj:
        """One object (``ApiError`` 404 if absent)."""
        rt = resource_type(resource)
        return copy_obj(self.api_get(rt, namespace or "", name).obj)

    def list_objects(self, resource: str | ResourceType, namespace: str | None = None, *,
                     label_selector: str | None = None, field_selector: str | None = None) -> list[Obj]:
        """Objects of one type (one namespace, or all), sorted by namespace and name."""
        rt = resource_type(resource)
        result = self.api_list(rt, namespace, label_selector=label_selector, field_selector=field_selector)
        return [copy_obj(e.obj) for e in result.entries]

    def create(self, resource: str | ResourceType, obj: Obj, namespace: str | None = None) -> Obj:
        """Create an object (namespace from the argument or ``obj.metadata.namespace``)."""
        rt = resource_type(resource)
        ns = namespace if namespace is not None else (obj.get("metadata") or {}).get("namespace")
        return copy_obj(self.api_create(rt, ns, obj))

    def replace(self, resource: str | ResourceType, name: str, obj: Obj, namespace: str | None = None, *,
                subresource: str | None = None) -> Obj:
        """PUT semantics: 409 when ``obj`` carries a stale ``metadata.resourceVersion``."""
        return copy_obj(self.api_replace(resource_type(resource), namespace, name, obj, subresource=subresource))

    def patch(self, resource: str | ResourceType, name: str, patch: Any, namespace: str | None = None, *,
              content_type: str = MERGE_PATCH, subresource: str | None = None) -> Obj:
        """Patch an object; ``patch`` is decoded JSON (a dict, or a list for JSON patch)."""
        return copy_obj(self.api_patch(resource_type(resource), namespace, name, patch, content_type,
                                    subresource=subresource))

    def delete(self, resource: str | ResourceType, name: str, namespace: str | None = None, *,
               propagation: str | None = None, grace_period: int | None = None) -> Obj:
        """Delete; ``propagation`` Orphan/Background/Foreground (batch/v1 Jobs default to Orphan);
        ``grace_period`` for a pod when ``graceful_deletion`` is on."""
        return copy_obj(self.api_delete(resource_type(resource), namespace, name, propagation=propagation,
                                     grace_period=grace_period))

    def evict(self, namespace: str, name: str, *, uid: str | None = None, grace_period: int | None = None) -> None:
        """Evict a pod as the Eviction API would (``ApiError`` 409 when ``uid`` is not the pod's, 429 when a
        PDB refuses)."""
        options: Obj = {}
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        if grace_period is not None:
            options["gracePeriodSeconds"] = grace_period
        self.api_evict(namespace, name, {"apiVersion": "policy/v1", "kind": "Eviction",
                                         "metadata": {"name": name, "namespace": namespace},
                                         "deleteOptions": options})

    def node(self, name: str) -> Obj:
        return self.get("nodes", name)

    def list_nodes(self, label_selector: str | None = None) -> list[Obj]:
        return self.list_objects("nodes", label_selector=label_selector)

    def node_names(self) -> list[str]:
        """Node names in natural order (``gpu-node-2`` before ``gpu-node-10``)."""
        with self._store.lock:
            return list(self._store.node_order)

    def pod(self, namespace: str, name: str) -> Obj:
        return self.get("pods", name, namespace)

    def list_pods(self, namespace: str | None = None, *, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[Obj]:
        return self.list_objects("pods", namespace, label_selector=label_selector, field_selector=field_selector)

    def pods_on(self, node: str) -> list[Obj]:
        """Pods bound to ``node`` (terminating ones included), sorted by namespace and name."""
        with self._store.lock:
            self._controllers.tick()
            pods = self._store.objects["pods"]
            return [copy_obj(pods[k].obj) for k in sorted(self._store.pods_by_node.get(node, {})) if k in pods]

    def pending_pods(self) -> list[Obj]:
        with self._store.lock:
            self._controllers.tick()
            pods = self._store.objects["pods"]
            return [copy_obj(pods[k].obj) for k in sorted(self._store.pending) if k in pods]

    def is_cordoned(self, node: str) -> bool:
        return bool(self.node(node).get("spec", {}).get("unschedulable"))

    def taints(self, node: str) -> list[Obj]:
        return list(self.node(node).get("spec", {}).get("taints") or [])

    def gpus_in_use(self, node: str) -> dict[int, str]:
        """GPU index -> ``namespace/pod`` of the pod its kubelet's device manager gave it to."""
        with self._store.lock:
            self._controllers.tick()
            return {i: f"{hs[0].namespace}/{hs[0].name}" for i, hs in self._kubelets.allocation(node).items()}

    def gpu_allocation(self, node: str) -> dict[int, list[DeviceHolder]]:
        """GPU index -> the containers holding it on ``node``: the device manager's allocation, which a
        real node's kubelet serves through its PodResources API. Nothing of it is written onto pods."""
        with self._store.lock:
            self._controllers.tick()
            return self._kubelets.allocation(node)

    def gpu_indices_of(self, namespace: str, name: str) -> list[int]:
        """The GPU indices the pod ``namespace/name`` holds on its node now (``ApiError`` 404 if absent)."""
        with self._store.lock:
            self._controllers.tick()
            pod = self._store.obj("pods", namespace, name)
            if pod is None:
                raise ApiError.not_found(BY_PLURAL["pods"], name)
            return self._kubelets.indices_of(pod["metadata"]["uid"])

    def gpus_held_by(self, uid: str) -> list[int]:
        """The GPU indices the pod with ``uid`` holds, or held when it last ran: for checks made after a
        pod was evicted (what a node's device-manager checkpoint said while the pod ran)."""
        with self._store.lock:
            return self._kubelets.held_by(uid)

    def pod_resources(self, node: str) -> list[Obj]:
        """The kubelet PodResources ``List`` view of ``node``: every pod holding GPUs there, with
        ``name``, ``namespace``, ``uid`` and ``containers[].devices[]`` (``resource_name``,
        ``device_ids``: the attached GPU node's UUIDs, else the indices)."""
        with self._store.lock:
            self._controllers.tick()
            return self._kubelets.pod_resources(node)

    def attach_gpu_node(self, node: str, view: GpuNodeView) -> None:
        """Join a simulated GPU node (``chaos.sim.gpu_node.SimGpuNode``) to ``node``'s kubelet: the GPUs it
        reports drained (isolated) or lost count as unhealthy, as the device plugin would report them, and
        it receives the node's device allocation, which its node agent reads back as the GPU's holders."""
        with self._store.lock:
            self._kubelets.attach(node, view)
            if self._store.obj("resourceslices", "", self._dra.slice_name(node)) is not None:
                # the DRA driver's kubelet plugin on that node now reads the GPUs' real identities
                ids = view.device_ids()
                gpu_state = getattr(view, "gpu_state", None)
                pcis = [str(gpu_state(i)["pci"]) for i in range(len(ids))] if callable(gpu_state) else None
                self._dra.publish(node, len(ids), ids, pcis)
            self._controllers.reboots.adopt(node)  # status.nodeInfo.bootID: the GPU node's boot id
            self._controllers.reconcile()

    # --- reboots (``controllers.Reboots``) --------------------------------------------------------

    def reboot_node(self, node: str) -> None:
        """Reboot ``node`` as its host would: the attached GPU node reboots (new boot id), or, without one,
        the node gets a new boot id; either way it is NotReady for ``reboot_down_s`` and then Ready with the
        new ``status.nodeInfo.bootID``."""
        with self._store.lock:
            if self._store.obj("nodes", "", node) is None:
                raise ApiError.not_found(BY_PLURAL["nodes"], node)
            self._controllers.reboots.reboot(node)
            self._controllers.tick()

    def reboots(self, node: str) -> int:
        """How many times ``node`` went down for a reboot (its boot id changed)."""
        with self._store.lock:
            self._controllers.tick()
            return self._controllers.reboots.count.get(node, 0)

    @property
    def reboot_down_s(self) -> float:
        """How long a rebooting node stays NotReady (on the state's clock)."""
        return self._controllers.reboots.down_s

    @reboot_down_s.setter
    def reboot_down_s(self, seconds: float) -> None:
        with self._store.lock:
            self._controllers.reboots.down_s = seconds

    @property
    def reboot_annotation(self) -> str:
        """The node annotation the simulated node-repair controller reboots nodes for."""
        return self._controllers.reboots.annotation

    @reboot_annotation.setter
    def reboot_annotation(self, key: str) -> None:
        with self._store.lock:
            self._controllers.reboots.annotation = key

    # --- DRA (``chaos.sim.dra``) ------------------------------------------------------------------

    @property
    def gpu_allocation_mode(self) -> str:
        """``dra`` when the DRA driver publishes ResourceSlices here, else ``device-plugin``."""
        with self._store.lock:
            return "dra" if self._dra.enabled else "device-plugin"

    def device_taints(self, node: str, index: int) -> list[Obj]:
        """The taints on ``node``'s DRA device for GPU ``index`` (its own and every DeviceTaintRule's)."""
        with self._store.lock:
            return [copy_obj(t) for d in self._dra.devices(node) if d.index == index for t in self._dra.taints(d)]

    def claims_of(self, namespace: str, pod: str) -> list[Obj]:
        """The ResourceClaims the pod uses (made by the resourceclaim controller from its templates)."""
        with self._store.lock:
            obj = self._store.obj("pods", namespace, pod)
            if obj is None:
                raise ApiError.not_found(BY_PLURAL["pods"], pod)
            return [copy_obj(c) for _, c, _ in self._dra.pod_claims(obj) if c is not None]

    def set_node_ready(self, node: str, ready: bool = True) -> Obj:
        """Flip the node's Ready condition (a NotReady node takes no new pods)."""
        with self._store.lock:
            current = self._store.obj("nodes", "", node)
            if current is None:
                raise ApiError.not_found(BY_PLURAL["nodes"], node)
            conds = [dict(c) for c in current["status"].get("conditions", [])]
            for c in conds:
                if c.get("type") == "Ready":
                    c.update({"status": "True" if ready else "False",
                              "reason": "KubeletReady" if ready else "KubeletNotReady",
                              "lastTransitionTime": self._store.ts(), "lastHeartbeatTime": self._store.ts()})
            out = self._api.write(BY_PLURAL["nodes"], current, {**current, "status": {**current["status"],
                                                                                  "conditions": conds}},
                              "status", False)
            return copy_obj(out)

    def set_gpu_health(self, node: str, index: int, healthy: bool) -> Obj:
        """Mark one GPU (un)healthy, as the device plugin would: an unhealthy GPU is never assigned and the
        node's ``allocatable`` ``nvidia.com/gpu`` drops by one; running pods are not touched."""
        with self._store.lock:
            current = self._store.obj("nodes", "", node)
            if current is None:
                raise ApiError.not_found(BY_PLURAL["nodes"], node)
            self._kubelets.mark(node, index, healthy)
            alloc = self._kubelets.allocatable(current)
            out = self._api.write(BY_PLURAL["nodes"], current, {**current, "status": {**current["status"],
                                                                                      "allocatable": alloc}},
                                  "status", False)
            if healthy:
                self._store.dirty.sched_nodes.add(node)
                self._controllers.reconcile()
            return copy_obj(out)

    def unhealthy_gpus(self, node: str) -> set[int]:
        """GPU indices of ``node`` that are never assigned: marked with ``set_gpu_health`` or reported drained
        or lost by the attached simulated GPU node."""
        with self._store.lock:
            self._controllers.tick()
            return self._kubelets.unhealthy(node)

    def block_pdb(self, namespace: str, name: str, blocked: bool = True) -> Obj:
        """Make a PodDisruptionBudget refuse every eviction (``disruptionsAllowed: 0``) or allow again."""
        with self._store.lock:
            if self._store.obj("poddisruptionbudgets", namespace, name) is None:
                raise ApiError.not_found(BY_PLURAL["poddisruptionbudgets"], name)
            self._disruption.block((namespace, name), blocked)
            self._controllers.reconcile()
            return self.get("poddisruptionbudgets", name, namespace)

    def pdb_for(self, namespace: str, pod: str) -> Obj | None:
        """The PodDisruptionBudget covering a pod, if any."""
        with self._store.lock:
            obj = self._store.obj("pods", namespace, pod)
            if obj is None:
                raise ApiError.not_found(BY_PLURAL["pods"], pod)
            pdbs = self._disruption.pdbs_for(obj)
            return copy_obj(pdbs[0]) if pdbs else None

    def owner_of(self, namespace: str, pod: str) -> tuple[str, str, str] | None:
        """``(kind, namespace, name)`` of the pod's controller (Job, PyTorchJob, DaemonSet, ReplicaSet,
        StatefulSet), if any."""
        ref = controller_ref(self.pod(namespace, pod))
        return None if ref is None else (str(ref["kind"]), namespace, str(ref["name"]))

    def jobs_on(self, node: str) -> list[tuple[str, str, str]]:
        """Training jobs with a pod on ``node``: ``(kind, namespace, name)``, kind ``Job``/``PyTorchJob``."""
        found: list[tuple[str, str, str]] = []
        for pod in self.pods_on(node):
            ref = controller_ref(pod)
            if ref and ref.get("kind") in ("Job", "PyTorchJob"):
                item = (str(ref["kind"]), pod["metadata"]["namespace"], str(ref["name"]))
                if item not in found:
                    found.append(item)
        return found

    def _controller_obj(self, kind: str, namespace: str, name: str) -> tuple[str, Obj]:
        plural = OWNER_PLURAL.get(kind)
        if plural is None or plural == "daemonsets":
            raise ValueError(f"unknown job kind {kind!r}: use one of Job, PyTorchJob, Deployment, ReplicaSet, "
                             "StatefulSet")
        owner = self._store.obj(plural, namespace, name)
        if owner is None:
            raise ApiError.not_found(BY_PLURAL[plural], name)
        return plural, owner

    def _controlled_pods(self, plural: str, owner: Obj) -> list[Obj]:
        """The pods a controller object owns (a Deployment's through its ReplicaSets), terminating included."""
        if plural == "deployments":
            return [p for rs in self._controllers.workloads.owned_replicasets(owner["metadata"]["uid"])
                    for p in self._controllers.owned_pods(rs["metadata"]["uid"])]
        return self._controllers.owned_pods(owner["metadata"]["uid"])

    def job_pods(self, kind: str, namespace: str, name: str) -> list[Obj]:
        """Live pods (neither finished nor terminating) of a Job, PyTorchJob, Deployment, ReplicaSet or
        StatefulSet, ordered by rank (PyTorchJob: master-0 first), then by name in natural order."""
        with self._store.lock:
            self._controllers.tick()
            plural, owner = self._controller_obj(kind, namespace, name)
            pods = [copy_obj(p) for p in self._controlled_pods(plural, owner) if is_active(p)]
        return sorted(pods, key=rank_key)

    def job_restarts(self, kind: str, namespace: str, name: str) -> int:
        """How many controller passes recreated pods of the job (the ``sim.gpu-remediator.io/restarts``
        annotation; a Deployment's is the sum over its ReplicaSets); 0 for a job that never lost a pod."""
        with self._store.lock:
            plural, owner = self._controller_obj(kind, namespace, name)
            counted = (self._controllers.workloads.owned_replicasets(owner["metadata"]["uid"])
                       if plural == "deployments" else [owner])
            return sum(int((o["metadata"].get("annotations") or {}).get(RESTARTS_ANNOTATION, "0")) for o in counted)

    def restart_job(self, kind: str, namespace: str, name: str) -> list[Obj]:
        """Delete every pod of a Job, PyTorchJob, ReplicaSet or StatefulSet at once, immediately even with
        ``graceful_deletion`` on, and let the controller recreate the whole gang (one restart); returns the
        new pods. A Deployment restarts through its ReplicaSet."""
        if kind == "Deployment":
            raise ValueError("unknown job kind 'Deployment' for restart_job: restart its ReplicaSet")
        with self._store.lock:
            plural, owner = self._controller_obj(kind, namespace, name)
            for pod in self._controlled_pods(plural, owner):
                self._store.remove(BY_PLURAL["pods"], pod)
            self._controllers.reconcile()
        return self.job_pods(kind, namespace, name)

    def add_deployment(self, namespace: str, name: str, *, replicas: int = 1, gpus_per_pod: int = 0,
                       labels: dict[str, str] | None = None, node_selector: dict[str, str] | None = None,
                       image: str = "nvcr.io/nvidia/tritonserver:24.05-py3") -> Obj:
        """Create an apps/v1 Deployment (and the namespace if missing) whose pods request ``gpus_per_pod``
        GPUs; its controller creates the ReplicaSet and the scheduler places the pods before this returns.
        ``labels`` (default ``app: <name>``) are the selector and the pod labels."""
        return self.create("deployments", self._workload(namespace, name, replicas, gpus_per_pod, labels,
                                                         node_selector, image, "Deployment"), namespace)

    def add_statefulset(self, namespace: str, name: str, *, replicas: int = 1, gpus_per_pod: int = 0,
                        labels: dict[str, str] | None = None, node_selector: dict[str, str] | None = None,
                        image: str = "nvcr.io/nvidia/pytorch:24.05-py3", service_name: str | None = None) -> Obj:
        """Create an apps/v1 StatefulSet (and the namespace if missing): pods ``<name>-0`` …
        ``<name>-(replicas-1)`` requesting ``gpus_per_pod`` GPUs each, placed by the scheduler."""
        obj = self._workload(namespace, name, replicas, gpus_per_pod, labels, node_selector, image, "StatefulSet")
        obj["spec"]["serviceName"] = service_name or name
        return self.create("statefulsets", obj, namespace)

    def _workload(self, namespace: str, name: str, replicas: int, gpus: int, labels: dict[str, str] | None,
                  node_selector: dict[str, str] | None, image: str, kind: str) -> Obj:
        if replicas < 0 or gpus < 0:
            raise ValueError("replicas and gpus_per_pod must not be negative")
        with self._store.lock:
            if self._store.obj("namespaces", "", namespace) is None:
                self.create("namespaces", {"metadata": {"name": namespace,
                                                        "labels": {"kubernetes.io/metadata.name": namespace}}})
        return workload_manifest(kind, namespace, name, replicas, gpus, labels, node_selector, image)

    def events(self, namespace: str | None = None) -> list[Obj]:
        """Kubernetes Events (core v1) created through the API."""
        return self.list_objects("events", namespace)

    def snapshot(self) -> dict[str, int]:
        """Object counts per resource, for logs and benchmark reports."""
        with self._store.lock:
            return {plural: len(objs) for plural, objs in self._store.objects.items()}



def seed_cluster(nodes: int, gpus_per_node: int = 8, pools: int = 1, *, gpus_per_pod: int | None = None,
                 pytorchjob_ranks: int = 2, clock: Callable[[], datetime] | None = None,
                 seed: int = 0, graceful_deletion: bool = False, gpu_allocation: str = "device-plugin",
                 gpu_pods_per_node: int | None = None) -> ClusterState:
    """A cluster of ``nodes`` GPU nodes with training jobs, DaemonSets and PDBs (the layout is described in
    ``chaos.sim.seeding``).

    ``pools`` splits the nodes into contiguous blocks ``pool-a``, ``pool-b``, …; ``gpus_per_pod``
    defaults to half a node; ``pytorchjob_ranks`` is the number of nodes (one rank each) per PyTorchJob.
    No Deployments or StatefulSets are seeded: add them with ``add_deployment``/``add_statefulset``.
    ``graceful_deletion`` turns graceful pod termination on from the start (``ClusterState``).
    ``gpu_allocation`` is ``device-plugin`` (``nvidia.com/gpu``) or ``dra`` (NVIDIA's DRA driver: ResourceSlices
    and claims, ``chaos.sim.dra``); ``gpu_pods_per_node`` M seeds M single-pod Jobs per node instead, each
    holding ``gpus_per_node / M`` GPUs (``chaos.sim.seeding``).
    """
    if nodes < 0 or gpus_per_node < 1 or pools < 1 or pytorchjob_ranks < 1:
        raise ValueError("nodes >= 0, gpus_per_node >= 1, pools >= 1 and pytorchjob_ranks >= 1 are required")
    if gpu_allocation not in ("device-plugin", "dra"):
        raise ValueError(f"gpu_allocation must be device-plugin or dra, not {gpu_allocation!r}")
    if gpu_pods_per_node is not None and not (1 <= gpu_pods_per_node <= gpus_per_node
                                              and gpus_per_node % gpu_pods_per_node == 0):
        raise ValueError("gpu_pods_per_node must divide gpus_per_node")
    per_pod = gpus_per_pod if gpus_per_pod is not None else max(1, gpus_per_node // 2)
    if not 1 <= per_pod <= gpus_per_node:
        raise ValueError("gpus_per_pod must be between 1 and gpus_per_node")
    state = ClusterState(clock=clock, seed=seed, graceful_deletion=graceful_deletion)
    # Seeding only allocates objects that live on (no cyclic garbage): with the cyclic collector running, each
    # of its full passes walks everything seeded so far, quadratic in the cluster's size (most of the time of
    # a 100,000-node seed). It is paused for the seed, and restored as it was.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with state._store.lock:
            Seeder(state._store, state._controllers, state._api, gpus_per_node, per_pod, allocation=gpu_allocation,
                   pods_per_node=gpu_pods_per_node).seed(nodes, pools, pytorchjob_ranks)
    finally:
        if collecting:
            gc.enable()
    return state


def freeze_heap() -> None:
    """Keep what the process holds now (a seeded cluster) out of the cyclic collector's passes for good
    (``gc.freeze``), as a long-running server does once started. A process that serves a large simulated
    cluster calls it after seeding: a full pass over a 100,000-node cluster stops the API server for seconds,
    which the real one (Go) never does."""
    gc.collect()
    gc.freeze()
