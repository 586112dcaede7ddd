"""The simulated cluster's state: the objects a Kubernetes API server would hold, and the controllers.

Where it sits: chaos/sim, below ``kube_api`` (the HTTP front that kubectl and the official client talk
to) and beside the simulated GPU nodes. Drills, demos and benchmarks seed a cluster here, start a
``KubeApiServer`` on it, point the service at the kubeconfig it writes, inject faults, and then read the
outcome back through this module's Python API (``node``, ``pods_on``, ``job_restarts``, ...).

What it holds: nodes, pods, events, namespaces, PodDisruptionBudgets (policy/v1), DaemonSets, Deployments,
ReplicaSets and StatefulSets (apps/v1), Jobs (batch/v1), Leases (coordination.k8s.io/v1) and Kubeflow
PyTorchJobs (kubeflow.org/v1). Every
object carries ``metadata.uid``, ``creationTimestamp`` and a ``resourceVersion`` taken from one global
counter bumped on every change; watch events are kept in a bounded history (410 Gone past it).

What runs on every change, synchronously, so a test sees the effect as soon as its request returns:

- a job controller: a pod owned by a Job or PyTorchJob that is deleted or evicted is replaced (Job pods
  get a fresh ``<job>-<5 chars>`` name, PyTorchJob pods keep ``<job>-<replica type>-<index>``); each
  controller pass that recreates pods of a job bumps the job's ``sim.gpu-remediator.io/restarts``
  annotation, so "the job runs again" is observable; ``restart_job`` deletes and recreates every rank;
- a DaemonSet controller: a deleted DaemonSet pod comes back on its node (if the node still tolerates it);
- workload controllers (apps/v1): a Deployment owns one ReplicaSet ``<deployment>-<pod-template-hash>``
  (``ownerReferences`` with ``controller: true``; a template change creates a new one and scales the old
  ones to 0 at once, a Recreate rollout); a ReplicaSet keeps ``replicas`` pods ``<rs>-<5 chars>``
  (replacing a terminating pod at once, as the real controller does); a StatefulSet keeps pods
  ``<sts>-0`` … ``<sts>-(N-1)`` with stable names (a lost pod comes back under the same name once the old
  one is gone; all ordinals are created at once, as with ``podManagementPolicy: Parallel``). Their pods
  go through the scheduler like any other (GPU requests honoured), and their status
  (``replicas``/``readyReplicas``/``availableReplicas``, Deployment conditions) follows the pods;
- a scheduler: a pending pod goes to a Ready, schedulable (not ``spec.unschedulable``) node whose
  NoSchedule/NoExecute taints it tolerates, whose labels satisfy its ``nodeSelector`` and that has
  enough free healthy GPUs, scanned round-robin from a rotating start as kube-scheduler does; otherwise it
  stays Pending with ``PodScheduled=False/Unschedulable``. A pod becomes Running and Ready as soon as it
  is bound;
- a taint manager: a new NoExecute taint deletes the pods on the node that do not tolerate it;
- a disruption controller: PodDisruptionBudget status (``disruptionsAllowed``, ``currentHealthy``, ...)
  follows the pods it selects; ``block_pdb`` pins ``disruptionsAllowed`` at 0 for a drill.

The simulated device mapping: a pod that requests ``nvidia.com/gpu`` is given concrete GPU indices on its
node when it is bound, recorded in the pod annotation ``gpu-remediator.io/gpu-indices`` as a
comma-separated list (``"0,1,2,3"``). That is what the node agent would learn from the kubelet
pod-resources API on a real node. A GPU marked unhealthy with ``set_gpu_health`` is never assigned and
lowers the node's ``allocatable`` (what the NVIDIA device plugin does), without touching running pods.

Seeded cluster (``seed_cluster``): nodes ``gpu-node-0`` … ``gpu-node-(N-1)`` labelled
``nvidia.com/gpu.present=true`` and ``gpu-remediator.io/pool=pool-a`` (``pool-b``, … in contiguous blocks
when ``pools > 1``), each with ``nvidia.com/gpu`` capacity and a Ready condition. Nodes come in blocks of
``2 * pytorchjob_ranks``: the first half of a block runs one PyTorchJob ``pytorch-<k>`` (one rank per
node: ``<job>-master-0`` is rank 0, ``<job>-worker-<i>`` is rank ``i + 1``; labels
``training.kubeflow.org/job-name``, ``training.kubeflow.org/replica-type`` (``master``/``worker``) and
``training.kubeflow.org/replica-index``; env ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``; a memory-backed
``emptyDir`` at ``/dev/shm``), the other half one single-pod Job ``train-<node index>`` each (label
``job-name``). Leftover nodes get Jobs. Training pods live in namespace ``training`` and request
``gpus_per_pod`` GPUs (half a node by default, so evicted pods find room elsewhere). Every node also runs
``gpu-operator/nvidia-dcgm-exporter`` and ``gpu-remediator/gpu-remediator-agent`` DaemonSet pods, and
every training job has a PodDisruptionBudget ``<job>-pdb`` that allows one disruption. No Deployments or
StatefulSets are seeded, so seeded layouts stay as they are; ``add_deployment``/``add_statefulset`` add them.

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

import base64
import bisect
import copy
import hashlib
import json
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from chaos.sim.kube_patch import MERGE_PATCH, STRATEGIC_MERGE_PATCH, PatchError, apply_patch
from chaos.sim.kube_select import FieldSelector, LabelSelector, SelectorError
from remediator.contracts import POOL_LABEL

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_INDICES_ANNOTATION = "gpu-remediator.io/gpu-indices"
RESTARTS_ANNOTATION = "sim.gpu-remediator.io/restarts"
TRAINING_NAMESPACE = "training"
KUBEFLOW_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
KUBEFLOW_REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_NAME_LABEL = "job-name"
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"
STATEFULSET_POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
CONTROLLER_REVISION_HASH_LABEL = "controller-revision-hash"
DEFAULT_GRACE_PERIOD_S = 30
KUBERNETES_VERSION = "v1.32.4"

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    """One served resource, as API discovery describes it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "nodes", "Node", False, "node", ("no",), ("status",)),
    ResourceType("", "v1", "pods", "Pod", True, "pod", ("po",), ("status", "eviction"), ("all",)),
    ResourceType("", "v1", "events", "Event", True, "event", ("ev",)),
    ResourceType("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",), ("status",),
                 verbs=("create", "delete", "get", "list", "patch", "update", "watch")),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, "poddisruptionbudget",
                 ("pdb",), ("status",)),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, "daemonset", ("ds",), ("status",), ("all",)),
    ResourceType("apps", "v1", "deployments", "Deployment", True, "deployment", ("deploy",), ("status",), ("all",)),
    ResourceType("apps", "v1", "replicasets", "ReplicaSet", True, "replicaset", ("rs",), ("status",), ("all",)),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet", True, "statefulset", ("sts",), ("status",), ("all",)),
    ResourceType("batch", "v1", "jobs", "Job", True, "job", (), ("status",), ("all",)),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, "lease"),
    ResourceType("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", True, "pytorchjob", (), ("status",)),
)
BY_PLURAL: dict[str, ResourceType] = {rt.plural: rt for rt in RESOURCES}
_OWNER_PLURAL = {"Job": "jobs", "PyTorchJob": "pytorchjobs", "DaemonSet": "daemonsets", "ReplicaSet": "replicasets",
                 "StatefulSet": "statefulsets", "Deployment": "deployments"}
# Owners whose lost pods a controller replaces (DaemonSets are handled per node).
_REPLACING_KINDS = frozenset({"Job", "PyTorchJob", "ReplicaSet", "StatefulSet"})
# Owners that replace a terminating pod at once (a fresh name); the others wait until its name is free.
_EAGER_KINDS = frozenset({"Job", "ReplicaSet"})
# Objects with a spec a controller acts on.
_CONTROLLED_TYPES = frozenset({"jobs", "pytorchjobs", "deployments", "replicasets", "statefulsets"})
_WORKLOAD_TYPES = frozenset({"deployments", "replicasets", "statefulsets"})
_GENERATION_TYPES = frozenset({"daemonsets", "jobs", "pytorchjobs", "poddisruptionbudgets", *_WORKLOAD_TYPES})
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
            409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid",
            429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}
_DEFAULT_TOLERATIONS: tuple[Obj, ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
     "tolerationSeconds": 300},
)


def resource_type(resource: str | ResourceType) -> ResourceType:
    """The served resource named by its plural (``"nodes"``, ``"pytorchjobs"``) or given directly."""
    if isinstance(resource, ResourceType):
        return resource
    try:
        return BY_PLURAL[resource]
    except KeyError:
        raise ValueError(f"the simulator does not serve {resource!r}") from None


class ApiError(Exception):
    """An API failure with the HTTP code, ``Status.reason`` and message a real API server would send."""

    def __init__(self, code: int, message: str, *, reason: str | None = None, details: Obj | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.message = message
        self.details = details
        self.retry_after = retry_after

    def status(self) -> Obj:
        """The ``Status`` object for the response body."""
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": self.message, "reason": self.reason, "code": self.code}
        details = dict(self.details or {})
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        if details:
            body["details"] = details
        return body

    @classmethod
    def not_found(cls, rt: ResourceType, name: str) -> ApiError:
        return cls(404, f'{rt.group_resource} "{name}" not found', details=_details(rt, name))

    @classmethod
    def conflict(cls, rt: ResourceType, name: str, why: str) -> ApiError:
        return cls(409, f'Operation cannot be fulfilled on {rt.group_resource} "{name}": {why}',
                   details=_details(rt, name))

    @classmethod
    def already_exists(cls, rt: ResourceType, name: str) -> ApiError:
        return cls(409, f'{rt.group_resource} "{name}" already exists', reason="AlreadyExists",
                   details=_details(rt, name))


def _details(rt: ResourceType, name: str) -> Obj:
    d: Obj = {"name": name, "kind": rt.plural}
    if rt.group:
        d["group"] = rt.group
    return d


class StoredObject:
    """A committed object: ``obj`` must never be modified; ``raw()`` is its JSON, computed once."""

    __slots__ = ("_raw", "obj")

    def __init__(self, obj: Obj) -> None:
        self.obj = obj
        self._raw: bytes | None = None

    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = json.dumps(self.obj, separators=(",", ":")).encode()
        return self._raw


class WatchEvent(NamedTuple):
    """One change, as a watch reports it; ``prev`` is the object before a MODIFIED or DELETED change."""

    rv: int
    type: str
    plural: str
    namespace: str
    obj: Obj
    prev: Obj | None


@dataclass
class ListResult:
    """A list response: read-only stored objects, the list's resourceVersion, the next page's token."""

    entries: list[StoredObject]
    resource_version: str
    continue_token: str | None = None
    remaining: int | None = None


@dataclass
class InjectedFault:
    """A chaos rule: requests whose method and path match are delayed and/or answered with ``status``.

    ``remaining`` counts the requests it still applies to (``None``: until removed); ``hits`` counts those
    it applied to.
    """

    method: str
    path: re.Pattern[str]
    status: int | None = None
    latency_s: float = 0.0
    remaining: int | None = 1
    retry_after: int | None = None
    message: str = ""
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return (self.method in ("*", method.upper())) and self.path.search(path) is not None

    def error(self) -> ApiError:
        assert self.status is not None
        msg = self.message or f"injected by the chaos simulator ({self.status})"
        return ApiError(self.status, msg, retry_after=self.retry_after)


@dataclass
class _Dirty:
    """Work the controllers owe after a change; drained by ``ClusterState._reconcile``."""

    owners: set[tuple[str, str, str]] = field(default_factory=set)        # (plural, ns, name) lost pods
    status: set[tuple[str, str, str]] = field(default_factory=set)        # owners whose status may change
    ds_nodes: set[tuple[str, str, str]] = field(default_factory=set)      # (ns, daemonset, node)
    sched_new: list[Key] = field(default_factory=list)                    # newly pending pods
    sched_nodes: set[str] = field(default_factory=set)                    # nodes that gained room
    pdbs: set[Key] = field(default_factory=set)                           # PDBs to recompute
    noexecute: set[str] = field(default_factory=set)                      # nodes with new NoExecute taints
    restarted: set[tuple[str, str, str]] = field(default_factory=set)     # owners recreated this pass

    def empty(self) -> bool:
        return not (self.owners or self.ds_nodes or self.sched_new or self.sched_nodes or self.pdbs
                    or self.noexecute or self.status)


def _natural_key(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _gpu_request(pod: Obj) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers", []):
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU_RESOURCE, (res.get("requests") or {}).get(GPU_RESOURCE, 0))
        total += int(value)
    return total


def _gpu_indices(pod: Obj) -> list[int]:
    text = (pod["metadata"].get("annotations") or {}).get(GPU_INDICES_ANNOTATION, "")
    return [int(p) for p in text.split(",") if p.strip().isdigit()]


def _terminal(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def _terminating(obj: Obj) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _active(pod: Obj) -> bool:
    """Neither finished nor on its way out: what controllers and PodDisruptionBudgets count."""
    return not _terminal(pod) and not _terminating(pod)


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _template_hash(template: Obj) -> str:
    """A stable 10-character ``pod-template-hash`` (kube-controller-manager's alphabet) for a pod template."""
    digest = int.from_bytes(hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()[:8], "big")
    out = []
    for _ in range(10):
        digest, i = divmod(digest, len(_SUFFIX_ALPHABET))
        out.append(_SUFFIX_ALPHABET[i])
    return "".join(out)


def _ready(pod: Obj) -> bool:
    if pod.get("status", {}).get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []))


def _controller(obj: Obj) -> Obj | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def _tolerates(tolerations: Iterable[Obj], taint: Obj) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator", "Equal")
        if op == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _node_ready(node: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions", []))


def _blocking_taints(node: Obj) -> list[Obj]:
    return [t for t in node.get("spec", {}).get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]


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
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)    # watchers: the resourceVersion moved
        self._wakeup = threading.Condition(self._lock)     # wait_for: anything it may look at changed
        self._graceful = graceful_deletion
        self._terminating: dict[Key, datetime] = {}         # terminating pods -> when they go
        self._clock = clock or (lambda: datetime.now(UTC))
        self._rng = random.Random(seed)
        self._rv = 1000
        self._store: dict[str, dict[Key, StoredObject]] = {rt.plural: {} for rt in RESOURCES}
        self._sorted: dict[str, list[Key] | None] = {rt.plural: None for rt in RESOURCES}
        self._pods_by_node: dict[str, dict[Key, None]] = {}
        self._pods_by_label: dict[tuple[str, str], set[Key]] = {}
        self._pods_by_owner: dict[str, dict[Key, None]] = {}
        self._pdbs_by_label: dict[tuple[str, str], set[Key]] = {}
        self._pdbs_unindexed: set[Key] = set()
        self._pending: dict[Key, None] = {}
        self._node_order: list[str] = []
        self._sched_cursor = 0
        self._dirty = _Dirty()
        self._blocked_pdbs: set[Key] = set()
        self._unhealthy: dict[str, set[int]] = {}
        self._ip_counter = 0
        self._history: list[WatchEvent] = []
        self._history_rvs: list[int] = []
        self._history_cap = history
        self._history_floor = self._rv
        self._faults: list[InjectedFault] = []
        self._counts: Counter[str] = Counter()

    # --- clock, identity ------------------------------------------------------------------------

    def now(self) -> datetime:
        """The state's clock (injected; wall clock by default)."""
        return self._clock()

    def _ts(self) -> str:
        return self._clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _uid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _suffix(self, n: int = 5) -> str:
        return "".join(self._rng.choice(_SUFFIX_ALPHABET) for _ in range(n))

    def _next_ip(self) -> str:
        self._ip_counter += 1
        n = self._ip_counter
        return f"10.{64 + ((n >> 16) & 63)}.{(n >> 8) & 255}.{n & 255}"

    @property
    def resource_version(self) -> int:
        """The global resourceVersion counter: the version of the most recent change."""
        with self._lock:
            return self._rv

    @property
    def graceful_deletion(self) -> bool:
        """Whether deleting or evicting a running pod leaves it terminating for its grace period."""
        return self._graceful

    @graceful_deletion.setter
    def graceful_deletion(self, enabled: bool) -> None:
        with self._lock:
            self._graceful = enabled

    def tick(self) -> None:
        """Finish the graceful deletions whose grace period has passed on the state's clock (every API
        request does this too) and run the controllers."""
        with self._lock:
            self._tick()

    def terminating_pods(self) -> dict[str, datetime]:
        """``namespace/name`` -> when it goes, for each pod in graceful termination."""
        with self._lock:
            return {f"{ns}/{name}": when for (ns, name), when in sorted(self._terminating.items())}

    # --- storage primitives (lock held) ---------------------------------------------------------

    def _entry(self, plural: str, namespace: str, name: str) -> StoredObject | None:
        return self._store[plural].get((namespace, name))

    def _obj(self, plural: str, namespace: str, name: str) -> Obj | None:
        e = self._store[plural].get((namespace, name))
        return None if e is None else e.obj

    def _sorted_keys(self, plural: str) -> list[Key]:
        keys = self._sorted[plural]
        if keys is None:
            keys = sorted(self._store[plural])
            self._sorted[plural] = keys
        return keys

    def _commit(self, rt: ResourceType, obj: Obj, etype: str) -> Obj:
        """Store (or remove, for DELETED) ``obj`` under a new resourceVersion and tell the controllers."""
        self._rv += 1
        meta = dict(obj["metadata"])
        meta["resourceVersion"] = str(self._rv)
        obj = {**obj, "metadata": meta}
        key: Key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
        store = self._store[rt.plural]
        prev_entry = store.get(key)
        prev = prev_entry.obj if prev_entry is not None else None
        if etype == "DELETED":
            store.pop(key, None)
            self._sorted[rt.plural] = None
        else:
            store[key] = StoredObject(obj)
            if prev is None:
                self._sorted[rt.plural] = None
        self._record(WatchEvent(self._rv, etype, rt.plural, key[0], obj, prev))
        self._after_change(rt, prev, None if etype == "DELETED" else obj)
        self._changed.notify_all()
        self._wakeup.notify_all()
        return obj

    def _record(self, ev: WatchEvent) -> None:
        self._history.append(ev)
        self._history_rvs.append(ev.rv)
        if len(self._history) > 2 * self._history_cap:
            cut = len(self._history) - self._history_cap
            self._history_floor = self._history_rvs[cut - 1]
            del self._history[:cut]
            del self._history_rvs[:cut]

    def _put(self, rt: ResourceType, obj: Obj) -> Obj:
        meta = obj["metadata"]
        key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
        return self._commit(rt, obj, "MODIFIED" if key in self._store[rt.plural] else "ADDED")

    def _remove(self, rt: ResourceType, obj: Obj) -> Obj:
        meta = {**obj["metadata"], "deletionTimestamp": self._ts(), "deletionGracePeriodSeconds": 0}
        return self._commit(rt, {**obj, "metadata": meta}, "DELETED")

    def _new_meta(self, name: str, namespace: str | None = None, **extra: Any) -> Obj:
        meta: Obj = {"name": name, "uid": self._uid(), "creationTimestamp": self._ts()}
        if namespace is not None:
            meta["namespace"] = namespace
        meta.update({k: v for k, v in extra.items() if v is not None})
        return meta

    # --- change hooks: index and mark work (lock held, never commit) ----------------------------

    def _after_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        if rt.plural == "pods":
            self._pod_changed(old, new)
        elif rt.plural == "nodes":
            self._node_changed(old, new)
        elif rt.plural == "poddisruptionbudgets":
            self._pdb_changed(old, new)
        elif rt.plural in _CONTROLLED_TYPES:
            if new is not None and (old is None or old.get("spec") != new.get("spec")):
                self._dirty.owners.add((rt.plural, new["metadata"]["namespace"], new["metadata"]["name"]))
            if rt.plural == "replicasets":
                self._replicaset_changed(old, new)
        elif rt.plural == "daemonsets" and new is not None and old is None:
            for node in self._node_order:
                self._dirty.ds_nodes.add((new["metadata"]["namespace"], new["metadata"]["name"], node))

    def _replicaset_changed(self, old: Obj | None, new: Obj | None) -> None:
        """A Deployment recreates a lost ReplicaSet and sums its ReplicaSets' status."""
        rs = new if new is not None else old
        assert rs is not None
        ref = _controller(rs)
        if not ref or ref.get("kind") != "Deployment":
            return
        key = ("deployments", rs["metadata"]["namespace"], str(ref["name"]))
        if new is None:
            self._dirty.owners.add(key)
        elif old is None or old.get("status") != new.get("status"):
            self._dirty.status.add(key)

    def _pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        if old is not None:
            self._unindex_pod(old)
        if new is not None:
            self._index_pod(new)
        else:
            assert old is not None
            self._terminating.pop((old["metadata"]["namespace"], old["metadata"]["name"]), None)
        for pod in (old, new):
            if pod is not None:
                self._mark_pdbs_for(pod)
                ref = _controller(pod)
                if ref and ref.get("kind") in _OWNER_PLURAL:
                    self._dirty.status.add((_OWNER_PLURAL[ref["kind"]], pod["metadata"]["namespace"],
                                            ref["name"]))
        if new is None and old is not None:
            node = old.get("spec", {}).get("nodeName")
            if node:
                self._dirty.sched_nodes.add(node)
            ref = _controller(old)
            if ref and ref.get("kind") in _REPLACING_KINDS:
                self._dirty.owners.add((_OWNER_PLURAL[ref["kind"]], old["metadata"]["namespace"], ref["name"]))
            elif ref and ref.get("kind") == "DaemonSet" and node:
                self._dirty.ds_nodes.add((old["metadata"]["namespace"], ref["name"], node))
        elif new is not None and old is not None and _terminating(new) and not _terminating(old):
            ref = _controller(new)
            if ref and ref.get("kind") in _EAGER_KINDS:
                self._dirty.owners.add((_OWNER_PLURAL[ref["kind"]], new["metadata"]["namespace"], ref["name"]))
        if new is not None and not new.get("spec", {}).get("nodeName") and not _terminal(new):
            key = (new["metadata"]["namespace"], new["metadata"]["name"])
            if key not in self._pending:
                self._pending[key] = None
                self._dirty.sched_new.append(key)

    def _index_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        node = pod.get("spec", {}).get("nodeName")
        if node:
            self._pods_by_node.setdefault(node, {})[key] = None
        for kv in (meta.get("labels") or {}).items():
            self._pods_by_label.setdefault(kv, set()).add(key)
        ref = _controller(pod)
        if ref is not None:
            self._pods_by_owner.setdefault(ref["uid"], {})[key] = None

    def _unindex_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        node = pod.get("spec", {}).get("nodeName")
        if node and node in self._pods_by_node:
            self._pods_by_node[node].pop(key, None)
        for kv in (meta.get("labels") or {}).items():
            s = self._pods_by_label.get(kv)
            if s is not None:
                s.discard(key)
                if not s:
                    del self._pods_by_label[kv]
        ref = _controller(pod)
        if ref is not None and ref["uid"] in self._pods_by_owner:
            self._pods_by_owner[ref["uid"]].pop(key, None)
        self._pending.pop(key, None)

    def _node_changed(self, old: Obj | None, new: Obj | None) -> None:
        if old is None and new is not None:
            bisect.insort(self._node_order, new["metadata"]["name"], key=_natural_key)
        elif new is None and old is not None and old["metadata"]["name"] in self._node_order:
            self._node_order.remove(old["metadata"]["name"])
        if new is None:
            return
        name = new["metadata"]["name"]
        changed = old is None or any(old.get(k) != new.get(k) for k in ("spec", "status")) or \
            old["metadata"].get("labels") != new["metadata"].get("labels")
        if changed and self._node_open(new):
            self._dirty.sched_nodes.add(name)
        old_noexec = {(t.get("key"), t.get("value"), t.get("effect"))
                      for t in (old or {}).get("spec", {}).get("taints") or [] if t.get("effect") == "NoExecute"}
        if any(t.get("effect") == "NoExecute" and (t.get("key"), t.get("value"), t.get("effect")) not in old_noexec
               for t in new.get("spec", {}).get("taints") or []):
            self._dirty.noexecute.add(name)

    def _pdb_changed(self, old: Obj | None, new: Obj | None) -> None:
        for pdb, add in ((old, False), (new, True)):
            if pdb is None:
                continue
            key = (pdb["metadata"]["namespace"], pdb["metadata"]["name"])
            try:
                terms = LabelSelector.from_api(pdb.get("spec", {}).get("selector")).equality_terms()
            except SelectorError:
                terms = []
            if add:
                if terms:
                    self._pdbs_by_label.setdefault(terms[0], set()).add(key)
                else:
                    self._pdbs_unindexed.add(key)
            else:
                if terms and terms[0] in self._pdbs_by_label:
                    self._pdbs_by_label[terms[0]].discard(key)
                self._pdbs_unindexed.discard(key)
        if new is not None and (old is None or old.get("spec") != new.get("spec")):
            self._dirty.pdbs.add((new["metadata"]["namespace"], new["metadata"]["name"]))

    def _pdbs_for(self, pod: Obj) -> list[Obj]:
        """The PodDisruptionBudgets whose selector matches ``pod``."""
        ns = pod["metadata"]["namespace"]
        labels = pod["metadata"].get("labels") or {}
        candidates: set[Key] = set(self._pdbs_unindexed)
        for kv in labels.items():
            candidates |= self._pdbs_by_label.get(kv, set())
        found = []
        for key in sorted(candidates):
            if key[0] != ns:
                continue
            pdb = self._obj("poddisruptionbudgets", *key)
            if pdb is not None and LabelSelector.from_api(pdb.get("spec", {}).get("selector")).matches(labels):
                found.append(pdb)
        return found

    def _mark_pdbs_for(self, pod: Obj) -> None:
        for pdb in self._pdbs_for(pod):
            self._dirty.pdbs.add((pdb["metadata"]["namespace"], pdb["metadata"]["name"]))

    # --- controllers (lock held) ----------------------------------------------------------------

    def _tick(self) -> None:
        """Lock held: finish due graceful deletions (and run the controllers) when any pod is terminating."""
        if self._terminating:
            self._reconcile()

    def _expire_terminating(self) -> None:
        """Remove the terminating pods whose deletionTimestamp the clock has passed (one pass, so a gang
        deleted together goes together)."""
        if not self._terminating:
            return
        now = self._clock()
        for key in sorted(k for k, when in self._terminating.items() if when <= now):
            self._terminating.pop(key, None)
            pod = self._obj("pods", *key)
            if pod is not None and _terminating(pod):
                self._remove(BY_PLURAL["pods"], pod)

    def _delete_pod(self, pod: Obj, grace_period: int | None = None) -> Obj:
        """Delete a pod the way the API server does: at once, or (``graceful_deletion`` on, a bound pod
        that has not finished, a grace period above 0) by marking it terminating until its grace period
        ends. A pod already terminating only ever has its deadline brought forward."""
        spec = pod.get("spec", {})
        period = grace_period if grace_period is not None else \
            int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_PERIOD_S))
        if not self._graceful or period <= 0 or not spec.get("nodeName") or _terminal(pod):
            return self._remove(BY_PLURAL["pods"], pod)
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        when = self._clock() + timedelta(seconds=period)
        current = self._terminating.get(key)
        if _terminating(pod) and current is not None and current <= when:
            return pod
        self._terminating[key] = when
        return self._commit(BY_PLURAL["pods"], {**pod, "metadata": {
            **meta, "deletionTimestamp": _stamp(when), "deletionGracePeriodSeconds": period}}, "MODIFIED")

    def _reconcile(self) -> None:
        """Run the controllers until nothing is left to do (bounded)."""
        self._expire_terminating()
        for _ in range(20):
            d = self._dirty
            if d.empty():
                break
            if d.noexecute:
                nodes, d.noexecute = d.noexecute, set()
                for node in sorted(nodes):
                    self._taint_manager(node)
            if d.owners:
                owners, d.owners = d.owners, set()
                for plural, ns, name in sorted(owners):
                    self._sync_owner(plural, ns, name)
            if d.ds_nodes:
                pairs, d.ds_nodes = d.ds_nodes, set()
                for ns, ds, node in sorted(pairs):
                    self._sync_daemon_pod(ns, ds, node)
            if d.sched_nodes or d.sched_new:
                self._schedule()
            if d.status and not (d.owners or d.ds_nodes or d.sched_new or d.sched_nodes):
                owners, d.status = d.status, set()
                for plural, ns, name in sorted(owners):
                    self._sync_owner_status(plural, ns, name)
            if d.pdbs and not (d.owners or d.ds_nodes or d.sched_new or d.sched_nodes or d.status):
                pdbs, d.pdbs = d.pdbs, set()
                for key in sorted(pdbs):
                    self._sync_pdb(key)
        restarted, self._dirty.restarted = self._dirty.restarted, set()
        for plural, ns, name in sorted(restarted):
            owner = self._obj(plural, ns, name)
            if owner is None:
                continue
            ann = dict(owner["metadata"].get("annotations") or {})
            ann[RESTARTS_ANNOTATION] = str(int(ann.get(RESTARTS_ANNOTATION, "0")) + 1)
            self._put(BY_PLURAL[plural], {**owner, "metadata": {**owner["metadata"], "annotations": ann}})
        self._dirty.status.clear()

    def _taint_manager(self, node_name: str) -> None:
        node = self._obj("nodes", "", node_name)
        if node is None:
            return
        noexec = [t for t in node.get("spec", {}).get("taints") or [] if t.get("effect") == "NoExecute"]
        for key in list(self._pods_by_node.get(node_name, {})):
            pod = self._obj("pods", *key)
            if pod is None or _terminating(pod):
                continue
            tolerations = pod.get("spec", {}).get("tolerations") or []
            if not all(_tolerates(tolerations, t) for t in noexec):
                self._delete_pod(pod)

    def _owned_pods(self, owner_uid: str) -> list[Obj]:
        pods = []
        for key in list(self._pods_by_owner.get(owner_uid, {})):
            pod = self._obj("pods", *key)
            if pod is not None:
                pods.append(pod)
        return pods

    def _sync_owner(self, plural: str, ns: str, name: str) -> None:
        owner = self._obj(plural, ns, name)
        if owner is None:
            return
        if plural == "deployments":
            self._sync_deployment(owner)
            self._dirty.status.add((plural, ns, name))
            return
        pods = [p for p in self._owned_pods(owner["metadata"]["uid"]) if not _terminal(p)]
        created = 0
        if plural == "jobs":
            spec = owner.get("spec", {})
            done = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                       for c in owner.get("status", {}).get("conditions") or [])
            if spec.get("suspend") or done:
                return
            active = [p for p in pods if not _terminating(p)]
            for _ in range(max(0, int(spec.get("parallelism", 1)) - len(active))):
                self._create_job_pod(owner)
                created += 1
        elif plural == "replicasets":
            created = self._sync_replicaset(owner, [p for p in pods if not _terminating(p)])
        elif plural == "statefulsets":
            created = self._sync_statefulset(owner, pods)
        else:
            existing = {p["metadata"]["name"] for p in pods}
            world = self._world_size(owner)
            for rtype, index, rank in self._ranks(owner):
                pod_name = f"{name}-{rtype.lower()}-{index}"
                if pod_name not in existing:
                    self._create_pytorch_pod(owner, rtype, index, rank, world)
                    created += 1
        if created and self._had_pods(owner):
            self._dirty.restarted.add((plural, ns, name))
        self._dirty.status.add((plural, ns, name))

    def _had_pods(self, owner: Obj) -> bool:
        """Whether the owner ran before (its status saw pods start): a recreation is then a restart."""
        status = owner.get("status") or {}
        return bool(status.get("startTime")) or int(status.get("replicas") or 0) > 0

    # --- apps/v1 workload controllers (lock held) -----------------------------------------------

    def _owned_replicasets(self, owner_uid: str) -> list[Obj]:
        out = []
        for key in self._sorted_keys("replicasets"):
            rs = self._obj("replicasets", *key)
            ref = None if rs is None else _controller(rs)
            if rs is not None and ref is not None and ref.get("uid") == owner_uid:
                out.append(rs)
        return out

    def _sync_deployment(self, dep: Obj) -> None:
        """One ReplicaSet per pod template: create the current one (or set its replicas), scale the others
        to 0."""
        meta, spec = dep["metadata"], dep.get("spec", {})
        replicas = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        pod_hash = _template_hash(template)
        owned = self._owned_replicasets(meta["uid"])
        current = next((rs for rs in owned
                        if (rs["metadata"].get("labels") or {}).get(POD_TEMPLATE_HASH_LABEL) == pod_hash), None)
        for rs in owned:
            if rs is not current and int(rs.get("spec", {}).get("replicas", 0)) != 0:
                self._set_replicas(rs, 0)
        if current is not None:
            if int(current.get("spec", {}).get("replicas", 1)) != replicas:
                self._set_replicas(current, replicas)
            return
        revision = str(1 + max((int((rs["metadata"].get("annotations") or {}).get(
            "deployment.kubernetes.io/revision", "0")) for rs in owned), default=0))
        selector = copy.deepcopy(spec.get("selector") or {})
        selector["matchLabels"] = {**(selector.get("matchLabels") or {}), POD_TEMPLATE_HASH_LABEL: pod_hash}
        tmeta = copy.deepcopy(template.get("metadata") or {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), POD_TEMPLATE_HASH_LABEL: pod_hash}
        rs_meta = self._new_meta(
            f"{meta['name']}-{pod_hash}", meta["namespace"], labels=dict(tmeta["labels"]), generation=1,
            annotations={"deployment.kubernetes.io/revision": revision,
                         "deployment.kubernetes.io/desired-replicas": str(replicas),
                         "deployment.kubernetes.io/max-replicas": str(replicas)},
            ownerReferences=[self._owner_ref(dep, BY_PLURAL["deployments"])])
        if self._obj("replicasets", meta["namespace"], rs_meta["name"]) is not None:
            return  # a ReplicaSet of that name that is not ours: leave it, as the real controller would not adopt
        rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": rs_meta,
              "spec": {"replicas": replicas, "minReadySeconds": int(spec.get("minReadySeconds", 0)),
                       "selector": selector, "template": {**copy.deepcopy(template), "metadata": tmeta}}}
        self._commit(BY_PLURAL["replicasets"], rs, "ADDED")
        ann = {**(meta.get("annotations") or {}), "deployment.kubernetes.io/revision": revision}
        self._put(BY_PLURAL["deployments"], {**dep, "metadata": {**meta, "annotations": ann}})

    def _set_replicas(self, rs: Obj, replicas: int) -> None:
        ann = {**(rs["metadata"].get("annotations") or {})}
        if "deployment.kubernetes.io/desired-replicas" in ann:
            ann["deployment.kubernetes.io/desired-replicas"] = str(replicas)
        meta = {**rs["metadata"], "annotations": ann, "generation": int(rs["metadata"].get("generation", 1)) + 1}
        self._put(BY_PLURAL["replicasets"], {**rs, "metadata": meta, "spec": {**rs["spec"], "replicas": replicas}})

    def _sync_replicaset(self, rs: Obj, active: list[Obj]) -> int:
        """Create pods up to ``replicas`` (returns how many); past it, delete the surplus (unscheduled first,
        then the newest)."""
        want = int(rs.get("spec", {}).get("replicas", 1))
        for _ in range(want - len(active)):
            meta = rs["metadata"]
            pod = self._pod_from_template(rs["spec"].get("template") or {}, name=f"{meta['name']}-{self._suffix()}",
                                          namespace=meta["namespace"], labels={}, owner=rs,
                                          owner_rt=BY_PLURAL["replicasets"], restart_policy="Always")
            self._add_pod(pod, None)
        newest_first = sorted(active, key=lambda p: (p["metadata"].get("creationTimestamp", ""),
                                                     _natural_key(p["metadata"]["name"])), reverse=True)
        surplus = sorted(newest_first, key=lambda p: bool(p.get("spec", {}).get("nodeName")))
        for pod in surplus[:max(0, len(active) - want)]:
            self._delete_pod(pod)
        return max(0, want - len(active))

    def _sync_statefulset(self, sts: Obj, pods: list[Obj]) -> int:
        """Keep ``<sts>-0`` … ``<sts>-(replicas-1)``: create each missing ordinal (once the old pod of that
        name is gone), delete ordinals at or past ``replicas``. Returns how many pods it created."""
        meta, spec = sts["metadata"], sts.get("spec", {})
        want = int(spec.get("replicas", 1))
        created = 0
        for i in range(want):
            if self._obj("pods", meta["namespace"], f"{meta['name']}-{i}") is None:
                self._create_stateful_pod(sts, i)
                created += 1
        prefix = f"{meta['name']}-"
        for pod in pods:
            ordinal = pod["metadata"]["name"][len(prefix):]
            if not _terminating(pod) and ordinal.isdigit() and int(ordinal) >= want:
                self._delete_pod(pod)
        return created

    def _create_stateful_pod(self, sts: Obj, ordinal: int) -> Obj:
        meta, spec = sts["metadata"], sts.get("spec", {})
        name = f"{meta['name']}-{ordinal}"
        labels = {CONTROLLER_REVISION_HASH_LABEL: f"{meta['name']}-{_template_hash(spec.get('template') or {})}",
                  STATEFULSET_POD_NAME_LABEL: name, POD_INDEX_LABEL: str(ordinal)}
        pod = self._pod_from_template(spec.get("template") or {}, name=name, namespace=meta["namespace"],
                                      labels=labels, owner=sts, owner_rt=BY_PLURAL["statefulsets"],
                                      restart_policy="Always")
        pod["spec"]["hostname"] = name
        if spec.get("serviceName"):
            pod["spec"]["subdomain"] = spec["serviceName"]
        return self._add_pod(pod, None)

    @staticmethod
    def _ranks(ptj: Obj) -> list[tuple[str, int, int]]:
        """``(replica type, index, rank)`` for every replica: Master first (rank 0), then Workers."""
        specs = ptj.get("spec", {}).get("pytorchReplicaSpecs") or {}
        out: list[tuple[str, int, int]] = []
        rank = 0
        for rtype in ["Master", *sorted(t for t in specs if t != "Master")]:
            if rtype not in specs:
                continue
            for i in range(int(specs[rtype].get("replicas", 1))):
                out.append((rtype, i, rank))
                rank += 1
        return out

    def _world_size(self, ptj: Obj) -> int:
        return len(self._ranks(ptj))

    def _owner_ref(self, owner: Obj, rt: ResourceType) -> Obj:
        return {"apiVersion": rt.api_version, "kind": rt.kind, "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    def _pod_from_template(self, template: Obj, *, name: str, namespace: str, labels: dict[str, str],
                           owner: Obj, owner_rt: ResourceType, restart_policy: str,
                           env: list[Obj] | None = None) -> Obj:
        tmeta = template.get("metadata") or {}
        spec = copy.deepcopy(template.get("spec") or {})
        spec.setdefault("restartPolicy", restart_policy)
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("serviceAccountName", "default")
        spec["tolerations"] = list(spec.get("tolerations") or []) + [
            dict(t) for t in _DEFAULT_TOLERATIONS if t not in (spec.get("tolerations") or [])]
        if env:
            for c in spec.get("containers", []):
                c["env"] = list(c.get("env") or []) + env
        meta = self._new_meta(name, namespace)
        meta["labels"] = {**(tmeta.get("labels") or {}), **labels}
        if tmeta.get("annotations"):
            meta["annotations"] = dict(tmeta["annotations"])
        meta["ownerReferences"] = [self._owner_ref(owner, owner_rt)]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
                "status": {"phase": "Pending", "qosClass": "BestEffort"}}

    def _create_job_pod(self, job: Obj, *, node: str | None = None) -> Obj:
        meta = job["metadata"]
        labels = {"batch.kubernetes.io/controller-uid": meta["uid"], "batch.kubernetes.io/job-name": meta["name"],
                  "controller-uid": meta["uid"], JOB_NAME_LABEL: meta["name"]}
        pod = self._pod_from_template(job["spec"]["template"], name=f"{meta['name']}-{self._suffix()}",
                                      namespace=meta["namespace"], labels=labels, owner=job,
                                      owner_rt=BY_PLURAL["jobs"], restart_policy="Never")
        return self._add_pod(pod, node)

    def _create_pytorch_pod(self, ptj: Obj, rtype: str, index: int, rank: int, world: int, *,
                            node: str | None = None) -> Obj:
        meta = ptj["metadata"]
        spec = ptj["spec"]["pytorchReplicaSpecs"][rtype]
        labels = {KUBEFLOW_JOB_NAME_LABEL: meta["name"],
                  "training.kubeflow.org/operator-name": "pytorchjob-controller",
                  KUBEFLOW_REPLICA_TYPE_LABEL: rtype.lower(), KUBEFLOW_REPLICA_INDEX_LABEL: str(index)}
        if rtype == "Master":
            labels["training.kubeflow.org/job-role"] = "master"
        env = [{"name": "MASTER_PORT", "value": "23456"}, {"name": "MASTER_ADDR", "value": f"{meta['name']}-master-0"},
               {"name": "WORLD_SIZE", "value": str(world)}, {"name": "RANK", "value": str(rank)},
               {"name": "PYTHONUNBUFFERED", "value": "1"}]
        pod = self._pod_from_template(spec["template"], name=f"{meta['name']}-{rtype.lower()}-{index}",
                                      namespace=meta["namespace"], labels=labels, owner=ptj,
                                      owner_rt=BY_PLURAL["pytorchjobs"],
                                      restart_policy=spec.get("restartPolicy", "OnFailure"), env=env)
        return self._add_pod(pod, node)

    def _add_pod(self, pod: Obj, node: str | None, indices: list[int] | None = None) -> Obj:
        """Commit a new pod: bound to ``node`` (Running) when given, else Pending for the scheduler."""
        if node is not None:
            pod = self._bound(pod, node, indices if indices is not None else self._free_gpus(node, _gpu_request(pod)))
        return self._commit(BY_PLURAL["pods"], pod, "ADDED")

    def _bound(self, pod: Obj, node_name: str, indices: list[int] | None) -> Obj:
        node = self._obj("nodes", "", node_name)
        host_ip = "10.0.0.1"
        if node is not None:
            host_ip = next((a["address"] for a in node["status"].get("addresses", [])
                            if a.get("type") == "InternalIP"), host_ip)
        now = self._ts()
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node_name
        if indices:
            new["metadata"].setdefault("annotations", {})[GPU_INDICES_ANNOTATION] = ",".join(map(str, indices))
        ip = self._next_ip()
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
                 "containerID": f"containerd://{self._rng.getrandbits(128):032x}",
                 "state": {"running": {"startedAt": now}}, "lastState": {}}
                for c in containers],
        }
        return new

    def _sync_daemon_pod(self, ns: str, ds_name: str, node_name: str) -> None:
        ds = self._obj("daemonsets", ns, ds_name)
        node = self._obj("nodes", "", node_name)
        if ds is None or node is None:
            return
        uid = ds["metadata"]["uid"]
        if any(key in self._pods_by_owner.get(uid, {}) for key in self._pods_by_node.get(node_name, {})):
            return
        template = ds["spec"]["template"]
        selector = template.get("spec", {}).get("nodeSelector") or {}
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            return
        tolerations = template.get("spec", {}).get("tolerations") or []
        if not all(_tolerates(tolerations, t) for t in _blocking_taints(node)):
            return
        pod = self._pod_from_template(template, name=f"{ds_name}-{self._suffix()}", namespace=ns,
                                      labels={"controller-revision-hash": "6d4b9c8f7",
                                              "pod-template-generation": "1"},
                                      owner=ds, owner_rt=BY_PLURAL["daemonsets"], restart_policy="Always")
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                    "values": [node_name]}]}]}}}
        pod["spec"]["tolerations"] = pod["spec"]["tolerations"] + [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
        self._add_pod(pod, node_name, [])
        self._dirty.status.add(("daemonsets", ns, ds_name))

    # --- scheduler ------------------------------------------------------------------------------

    def _node_open(self, node: Obj) -> bool:
        return not node.get("spec", {}).get("unschedulable") and _node_ready(node)

    def _free_gpus(self, node_name: str, need: int) -> list[int] | None:
        """The lowest ``need`` free healthy GPU indices on the node, or None if it lacks room."""
        node = self._obj("nodes", "", node_name)
        if node is None:
            return None
        if need == 0:
            return []
        cap = int(node["status"].get("capacity", {}).get(GPU_RESOURCE, 0))
        alloc = int(node["status"].get("allocatable", {}).get(GPU_RESOURCE, 0))
        used: set[int] = set()
        for key in self._pods_by_node.get(node_name, {}):
            pod = self._obj("pods", *key)
            if pod is not None and not _terminal(pod):
                used.update(_gpu_indices(pod))
        if len(used) + need > alloc:
            return None
        bad = self._unhealthy.get(node_name, set())
        free = [i for i in range(cap) if i not in used and i not in bad]
        return free[:need] if len(free) >= need else None

    def _fit(self, pod: Obj, node: Obj) -> list[int] | None:
        if not self._node_open(node):
            return None
        spec = pod.get("spec", {})
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return None
        tolerations = spec.get("tolerations") or []
        if not all(_tolerates(tolerations, t) for t in _blocking_taints(node)):
            return None
        return self._free_gpus(node["metadata"]["name"], _gpu_request(pod))

    def _schedule(self) -> None:
        d = self._dirty
        nodes, d.sched_nodes = d.sched_nodes, set()
        for node_name in sorted(nodes, key=_natural_key):
            node = self._obj("nodes", "", node_name)
            if node is None or not self._node_open(node):
                continue
            for key in list(self._pending):
                pod = self._obj("pods", *key)
                node = self._obj("nodes", "", node_name)
                if pod is None or node is None:
                    continue
                indices = self._fit(pod, node)
                if indices is not None:
                    self._commit(BY_PLURAL["pods"], self._bound(pod, node_name, indices), "MODIFIED")
        new, d.sched_new = d.sched_new, []
        order = self._node_order
        for key in new:
            pod = self._obj("pods", *key)
            if pod is None or key not in self._pending:
                continue
            placed = False
            n = len(order)
            for i in range(n):
                idx = (self._sched_cursor + i) % n
                node = self._obj("nodes", "", order[idx])
                if node is None:
                    continue
                indices = self._fit(pod, node)
                if indices is not None:
                    self._sched_cursor = (idx + 1) % n
                    self._commit(BY_PLURAL["pods"], self._bound(pod, order[idx], indices), "MODIFIED")
                    placed = True
                    break
            if not placed:
                self._mark_unschedulable(pod)

    def _mark_unschedulable(self, pod: Obj) -> None:
        conds = pod.get("status", {}).get("conditions") or []
        if any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conds):
            return
        msg = (f"0/{len(self._node_order)} nodes are available: {_gpu_request(pod)} {GPU_RESOURCE} requested; "
               "no schedulable, untainted node has that many free GPUs.")
        status = {**pod.get("status", {}), "phase": "Pending",
                  "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                  "message": msg, "lastTransitionTime": self._ts()}]}
        self._commit(BY_PLURAL["pods"], {**pod, "status": status}, "MODIFIED")

    # --- owner and PDB status -------------------------------------------------------------------

    def _sync_owner_status(self, plural: str, ns: str, name: str) -> None:
        owner = self._obj(plural, ns, name)
        if owner is None:
            return
        if plural == "deployments":
            self._sync_deployment_status(owner)
            return
        pods = [p for p in self._owned_pods(owner["metadata"]["uid"]) if _active(p)]
        status = dict(owner.get("status") or {})
        generation = owner["metadata"].get("generation", 1)
        if plural in ("replicasets", "statefulsets"):
            ready = sum(1 for p in pods if _ready(p))
            status.update({"replicas": len(pods), "readyReplicas": ready, "availableReplicas": ready,
                           "observedGeneration": generation})
            if plural == "replicasets":
                status["fullyLabeledReplicas"] = len(pods)
            else:
                revision = f"{owner['metadata']['name']}-{_template_hash(owner['spec'].get('template') or {})}"
                status.update({"currentReplicas": len(pods), "updatedReplicas": len(pods),
                               "currentRevision": revision, "updateRevision": revision, "collisionCount": 0})
        elif plural == "jobs":
            status["active"] = len(pods)
            status["ready"] = sum(1 for p in pods if _ready(p))
            status.setdefault("uncountedTerminatedPods", {})
            if pods and "startTime" not in status:
                status["startTime"] = self._ts()
        elif plural == "pytorchjobs":
            counts: dict[str, Obj] = {}
            for rtype, _, _ in self._ranks(owner):
                counts.setdefault(rtype, {"active": 0})
            for p in pods:
                rtype = (p["metadata"].get("labels") or {}).get(KUBEFLOW_REPLICA_TYPE_LABEL, "").capitalize()
                if rtype in counts and _ready(p):
                    counts[rtype]["active"] += 1
            status["replicaStatuses"] = counts
            if pods and "startTime" not in status:
                status["startTime"] = self._ts()
            running = bool(pods) and all(_ready(p) for p in pods) and len(pods) == len(self._ranks(owner))
            status["conditions"] = self._ptj_conditions(status.get("conditions") or [], running)
        elif plural == "daemonsets":
            desired = [n for n in self._node_order if self._ds_wants(owner, n)]
            scheduled = len(pods)
            ready = sum(1 for p in pods if _ready(p))
            status.update({"currentNumberScheduled": scheduled, "desiredNumberScheduled": len(desired),
                           "numberMisscheduled": 0, "numberReady": ready, "numberAvailable": ready,
                           "updatedNumberScheduled": scheduled,
                           "observedGeneration": owner["metadata"].get("generation", 1)})
        if status != owner.get("status"):
            self._put(BY_PLURAL[plural], {**owner, "status": status})

    def _sync_deployment_status(self, dep: Obj) -> None:
        spec = dep.get("spec", {})
        desired = int(spec.get("replicas", 1))
        pod_hash = _template_hash(spec.get("template") or {})
        owned = self._owned_replicasets(dep["metadata"]["uid"])
        counts: Counter[str] = Counter()
        for rs in owned:
            st = rs.get("status") or {}
            for k in ("replicas", "readyReplicas", "availableReplicas"):
                counts[k] += int(st.get(k) or 0)
            if (rs["metadata"].get("labels") or {}).get(POD_TEMPLATE_HASH_LABEL) == pod_hash:
                counts["updatedReplicas"] += int(st.get("replicas") or 0)
        available = counts["availableReplicas"]
        old: dict[str, Obj] = {str(c.get("type")): c for c in (dep.get("status") or {}).get("conditions") or []}
        now = self._ts()

        def condition(ctype: str, ok: bool, reason: str, message: str) -> Obj:
            prev = old.get(ctype)
            status = "True" if ok else "False"
            if prev is not None and prev.get("status") == status and prev.get("reason") == reason:
                return prev
            return {"type": ctype, "status": status, "reason": reason, "message": message, "lastUpdateTime": now,
                    "lastTransitionTime": now}

        current = next((rs for rs in owned
                        if (rs["metadata"].get("labels") or {}).get(POD_TEMPLATE_HASH_LABEL) == pod_hash), None)
        rs_name = current["metadata"]["name"] if current is not None else dep["metadata"]["name"]
        done = counts["updatedReplicas"] == desired and available >= desired and counts["replicas"] == desired
        status: Obj = {
            "observedGeneration": dep["metadata"].get("generation", 1),
            "replicas": counts["replicas"], "updatedReplicas": counts["updatedReplicas"],
            "readyReplicas": counts["readyReplicas"], "availableReplicas": available,
            "unavailableReplicas": max(0, desired - available),
            "conditions": [
                condition("Available", available >= desired,
                          "MinimumReplicasAvailable" if available >= desired else "MinimumReplicasUnavailable",
                          "Deployment has minimum availability." if available >= desired
                          else "Deployment does not have minimum availability."),
                condition("Progressing", True, "NewReplicaSetAvailable" if done else "ReplicaSetUpdated",
                          f'ReplicaSet "{rs_name}" has successfully progressed.' if done
                          else f'ReplicaSet "{rs_name}" is progressing.'),
            ],
        }
        if status != dep.get("status"):
            self._put(BY_PLURAL["deployments"], {**dep, "status": status})

    def _ptj_conditions(self, conds: list[Obj], running: bool) -> list[Obj]:
        now = self._ts()
        out = [c for c in conds if c.get("type") not in ("Running", "Restarting")]
        if not any(c.get("type") == "Created" for c in out):
            out.insert(0, {"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                           "message": "PyTorchJob is created.", "lastUpdateTime": now, "lastTransitionTime": now})
        prev = {c.get("type"): c for c in conds}
        kind = "Running" if running else "Restarting"
        keep = prev.get(kind)
        if keep is not None and keep.get("status") == "True":
            out.append(keep)
        else:
            reason = "PyTorchJobRunning" if running else "PyTorchJobRestarting"
            out.append({"type": kind, "status": "True", "reason": reason,
                        "message": f"PyTorchJob is {kind.lower()}.", "lastUpdateTime": now,
                        "lastTransitionTime": now})
        return out

    def _ds_wants(self, ds: Obj, node_name: str) -> bool:
        node = self._obj("nodes", "", node_name)
        if node is None:
            return False
        selector = ds["spec"]["template"].get("spec", {}).get("nodeSelector") or {}
        labels = node["metadata"].get("labels") or {}
        return all(labels.get(k) == v for k, v in selector.items())

    def _pods_matching(self, ns: str, selector: LabelSelector) -> list[Obj]:
        terms = selector.equality_terms()
        keys = sorted(self._pods_by_label.get(terms[0], set())) if terms else self._sorted_keys("pods")
        out = []
        for key in keys:
            if key[0] != ns:
                continue
            pod = self._obj("pods", *key)
            if pod is not None and selector.matches(pod["metadata"].get("labels")):
                out.append(pod)
        return out

    def _pdb_numbers(self, pdb: Obj) -> tuple[int, int, int, int]:
        """``(expected, current healthy, desired healthy, disruptions allowed)`` for a PDB right now."""
        key = (pdb["metadata"]["namespace"], pdb["metadata"]["name"])
        spec = pdb.get("spec", {})
        pods = [p for p in self._pods_matching(key[0], LabelSelector.from_api(spec.get("selector")))
                if _active(p)]
        expected = len(pods)
        healthy = sum(1 for p in pods if _ready(p))

        def amount(v: Any) -> int:
            if isinstance(v, str) and v.endswith("%"):
                return -(-expected * int(v[:-1]) // 100)
            return int(v)

        if spec.get("minAvailable") is not None:
            desired = amount(spec["minAvailable"])
        elif spec.get("maxUnavailable") is not None:
            desired = max(0, expected - amount(spec["maxUnavailable"]))
        else:
            desired = expected
        allowed = 0 if key in self._blocked_pdbs else max(0, healthy - desired)
        return expected, healthy, desired, allowed

    def _sync_pdb(self, key: Key) -> None:
        pdb = self._obj("poddisruptionbudgets", *key)
        if pdb is None:
            return
        expected, healthy, desired, allowed = self._pdb_numbers(pdb)
        old = pdb.get("status") or {}
        old_cond = next((c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
        cond_status = "True" if allowed > 0 else "False"
        cond = old_cond if old_cond and old_cond.get("status") == cond_status else {
            "type": "DisruptionAllowed", "status": cond_status,
            "reason": "SufficientPods" if allowed > 0 else "InsufficientPods", "message": "",
            "lastTransitionTime": self._ts(), "observedGeneration": pdb["metadata"].get("generation", 1)}
        status = {"observedGeneration": pdb["metadata"].get("generation", 1), "disruptionsAllowed": allowed,
                  "currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
                  "conditions": [cond]}
        if status != old:
            self._put(BY_PLURAL["poddisruptionbudgets"], {**pdb, "status": status})

    # --- the API server's interface: stored (read-only) objects ----------------------------------

    def api_get(self, rt: ResourceType, namespace: str, name: str) -> StoredObject:
        """The stored object or ``ApiError`` 404."""
        with self._lock:
            self._tick()
            entry = self._entry(rt.plural, namespace if rt.namespaced else "", name)
            if entry is None:
                raise ApiError.not_found(rt, name)
            return entry

    def api_list(self, rt: ResourceType, namespace: str | None, *, label_selector: str | None = None,
                 field_selector: str | None = None, limit: int = 0,
                 continue_token: str | None = None) -> ListResult:
        """List (one namespace or all), filtered by selectors, paginated by ``limit``/``continue``."""
        try:
            ls = LabelSelector.parse(label_selector)
            fs = FieldSelector.parse(rt.plural, field_selector)
        except SelectorError as exc:
            raise ApiError(400, str(exc)) from exc
        with self._lock:
            self._tick()
            start: Key | None = None
            if continue_token:
                try:
                    token = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                    start = (str(token["start"][0]), str(token["start"][1]))
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    raise ApiError(400, "continue key is not valid") from exc
            keys = self._candidate_keys(rt, namespace, ls, fs)
            if start is not None:
                keys = keys[bisect.bisect_right(keys, start):]
            entries: list[StoredObject] = []
            next_token = None
            remaining = None
            store = self._store[rt.plural]
            for i, key in enumerate(keys):
                if namespace is not None and rt.namespaced and key[0] != namespace:
                    continue
                entry = store.get(key)
                if entry is None:
                    continue
                obj = entry.obj
                if ls.requirements and not ls.matches(obj["metadata"].get("labels")):
                    continue
                if fs.terms and not fs.matches(obj):
                    continue
                if limit and len(entries) == limit:
                    last = entries[-1].obj["metadata"]
                    next_token = base64.urlsafe_b64encode(json.dumps(
                        {"rv": self._rv, "start": [last.get("namespace", "") if rt.namespaced else "",
                                                   last["name"]]}).encode()).decode()
                    remaining = len(keys) - i
                    break
                entries.append(entry)
            return ListResult(entries, str(self._rv), next_token, remaining)

    def _candidate_keys(self, rt: ResourceType, namespace: str | None, ls: LabelSelector,
                        fs: FieldSelector) -> list[Key]:
        if rt.plural == "pods":
            node = fs.equals("spec.nodeName")
            if node:
                return sorted(self._pods_by_node.get(node, {}))
            terms = ls.equality_terms()
            if terms:
                return sorted(self._pods_by_label.get(terms[0], set()))
        name = fs.equals("metadata.name")
        if name is not None:
            ns = (namespace or "") if rt.namespaced else ""
            if namespace is not None or not rt.namespaced:
                return [(ns, name)] if (ns, name) in self._store[rt.plural] else []
        return self._sorted_keys(rt.plural)

    def api_create(self, rt: ResourceType, namespace: str | None, body: Any, *, dry_run: bool = False) -> Obj:
        """Create ``body``; 409 AlreadyExists, 400/422 for a body that does not fit the request."""
        obj = self._validate_body(rt, namespace, body)
        with self._lock:
            self._tick()
            meta = dict(obj.get("metadata") or {})
            ns = meta.get("namespace", "") if rt.namespaced else ""
            if rt.namespaced and self._obj("namespaces", "", ns) is None:
                raise ApiError.not_found(BY_PLURAL["namespaces"], ns)
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise ApiError(422, f"{rt.kind}.{rt.group or 'core'} is invalid: metadata.name: "
                                        "Required value: name or generateName is required")
                meta["name"] = f"{meta['generateName']}{self._suffix()}"
            if self._obj(rt.plural, ns, meta["name"]) is not None:
                raise ApiError.already_exists(rt, meta["name"])
            meta.update({"uid": self._uid(), "creationTimestamp": self._ts()})
            for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
                meta.pop(k, None)
            if rt.plural in _GENERATION_TYPES:
                meta["generation"] = 1
            obj = {**obj, "apiVersion": rt.api_version, "kind": rt.kind, "metadata": meta}
            obj = self._defaults_on_create(rt, obj)
            if dry_run:
                return obj
            created = self._commit(rt, obj, "ADDED")
            self._reconcile()
            return self._obj(rt.plural, ns, meta["name"]) or created

    def _defaults_on_create(self, rt: ResourceType, obj: Obj) -> Obj:
        if rt.plural == "pods":
            spec = dict(obj.get("spec") or {})
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("restartPolicy", "Always")
            node = spec.get("nodeName")
            obj = {**obj, "spec": spec, "status": {"phase": "Pending", "qosClass": "BestEffort"}}
            if node:
                need = _gpu_request(obj)
                indices = _gpu_indices(obj) or (self._free_gpus(node, need) if need else [])
                obj = self._bound(obj, node, indices or [])
        elif rt.plural == "namespaces":
            obj = {**obj, "spec": obj.get("spec") or {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
        elif rt.plural in _WORKLOAD_TYPES:
            obj = {k: v for k, v in obj.items() if k != "status"}
            obj["spec"] = self._workload_spec(rt, obj["metadata"]["name"], obj.get("spec"))
        elif "status" in rt.subresources and rt.plural != "nodes":
            obj = {k: v for k, v in obj.items() if k != "status"}
        return obj

    @staticmethod
    def _workload_spec(rt: ResourceType, name: str, spec: Any) -> Obj:
        """A Deployment/ReplicaSet/StatefulSet spec validated (422 as the API server words it) and defaulted."""
        def invalid(field_path: str, why: str) -> ApiError:
            return ApiError(422, f'{rt.kind}.{rt.group} "{name}" is invalid: {field_path}: {why}',
                            details={"name": name, "group": rt.group, "kind": rt.kind,
                                     "causes": [{"reason": "FieldValueInvalid", "message": why,
                                                 "field": field_path}]})

        if not isinstance(spec, dict):
            raise invalid("spec", "Required value")
        selector = spec.get("selector")
        if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
            raise invalid("spec.selector", "Required value")
        template = spec.get("template")
        if not isinstance(template, dict) or not isinstance(template.get("spec"), dict) or \
                not template["spec"].get("containers"):
            raise invalid("spec.template.spec.containers", "Required value")
        tlabels = (template.get("metadata") or {}).get("labels") or {}
        try:
            matches = LabelSelector.from_api(selector).matches(tlabels)
        except SelectorError as exc:
            raise invalid("spec.selector", str(exc)) from exc
        if not matches:
            raise invalid("spec.template.metadata.labels", f"Invalid value: {json.dumps(tlabels)}: `selector` "
                                                           "does not match template `labels`")
        replicas = spec.get("replicas", 1)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid("spec.replicas", f"Invalid value: {replicas!r}: must be greater than or equal to 0")
        out = {**spec, "replicas": replicas}
        out.setdefault("revisionHistoryLimit", 10)
        if rt.plural == "deployments":
            out.setdefault("strategy", {"type": "RollingUpdate",
                                        "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
            out.setdefault("progressDeadlineSeconds", 600)
        elif rt.plural == "statefulsets":
            out.setdefault("podManagementPolicy", "OrderedReady")
            out.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
            out.setdefault("persistentVolumeClaimRetentionPolicy", {"whenDeleted": "Retain", "whenScaled": "Retain"})
        if rt.plural == "replicasets":
            out.pop("revisionHistoryLimit")
        return out

    def _validate_body(self, rt: ResourceType, namespace: str | None, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if body.get("kind") not in (None, rt.kind) or body.get("apiVersion") not in (None, rt.api_version):
            raise ApiError(400, f"the API version in the data ({body.get('apiVersion')}) does not match the "
                                f"expected API version ({rt.api_version}) or kind {body.get('kind')} is not "
                                f"{rt.kind}")
        meta = body.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise ApiError(400, "metadata must be an object")
        meta = dict(meta or {})
        if rt.namespaced:
            if namespace is None:
                raise ApiError(405, f"{rt.plural} are namespaced: use /namespaces/<ns>/{rt.plural}")
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(400, "the namespace of the provided object does not match the namespace sent "
                                    "on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return {**body, "metadata": meta}

    def api_replace(self, rt: ResourceType, namespace: str | None, name: str, body: Any, *,
                    subresource: str | None = None, dry_run: bool = False) -> Obj:
        """PUT: 409 Conflict when ``metadata.resourceVersion`` is set and stale."""
        obj = self._validate_body(rt, namespace, body)
        ns = (namespace or "") if rt.namespaced else ""
        with self._lock:
            self._tick()
            current = self._obj(rt.plural, ns, name)
            if current is None:
                raise ApiError.not_found(rt, name)
            if obj["metadata"].get("name") not in (None, name):
                raise ApiError(400, "the name of the object does not match the name on the URL")
            rv = obj["metadata"].get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise ApiError.conflict(rt, name, "the object has been modified; please apply your changes to "
                                                  "the latest version and try again")
            return self._write(rt, current, {**obj, "apiVersion": rt.api_version, "kind": rt.kind},
                               subresource, dry_run)

    def api_patch(self, rt: ResourceType, namespace: str | None, name: str, body: bytes | Any,
                  content_type: str, *, subresource: str | None = None, dry_run: bool = False) -> Obj:
        """PATCH with merge, strategic-merge (built-in types only) or JSON patch."""
        media = content_type.split(";")[0].strip().lower()
        if media == STRATEGIC_MERGE_PATCH and rt.group == "kubeflow.org":
            raise ApiError(415, "the body of the request was in an unknown format - accepted media types "
                                "include: application/json-patch+json, application/merge-patch+json, "
                                "application/apply-patch+yaml")
        ns = (namespace or "") if rt.namespaced else ""
        with self._lock:
            self._tick()
            current = self._obj(rt.plural, ns, name)
            if current is None:
                raise ApiError.not_found(rt, name)
            try:
                patched = apply_patch(current, body, media)
            except PatchError as exc:
                raise ApiError(exc.code, str(exc)) from exc
            meta = patched.get("metadata")
            if not isinstance(meta, dict):
                raise ApiError(422, "metadata must be an object")
            rv = meta.get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise ApiError.conflict(rt, name, "the object has been modified; please apply your changes to "
                                                  "the latest version and try again")
            return self._write(rt, current, patched, subresource, dry_run)

    def _write(self, rt: ResourceType, current: Obj, new: Obj, subresource: str | None, dry_run: bool) -> Obj:
        """Commit an update of ``current`` to ``new``, keeping what a client cannot change."""
        keep = ("name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp",
                "deletionGracePeriodSeconds")
        cmeta = current["metadata"]
        if subresource == "status":
            new = {**current, "status": new.get("status")}
        else:
            meta = {k: v for k, v in (new.get("metadata") or {}).items() if k not in keep}
            meta.update({k: cmeta[k] for k in keep if k in cmeta})
            new = {**new, "apiVersion": rt.api_version, "kind": rt.kind, "metadata": meta}
            if "status" in rt.subresources:
                new = {**new, "status": current.get("status")} if "status" in current else \
                    {k: v for k, v in new.items() if k != "status"}
            if rt.plural in _GENERATION_TYPES and new.get("spec") != current.get("spec"):
                meta["generation"] = int(cmeta.get("generation", 1)) + 1
        if new.get("status") is None:
            new = {k: v for k, v in new.items() if k != "status"}
        if dry_run:
            return new
        committed = self._commit(rt, new, "MODIFIED")
        self._reconcile()
        key = (cmeta.get("namespace", "") if rt.namespaced else "", cmeta["name"])
        latest = self._store[rt.plural].get(key)
        return committed if latest is None else latest.obj

    def api_delete(self, rt: ResourceType, namespace: str | None, name: str, *, propagation: str | None = None,
                   precondition_uid: str | None = None, precondition_rv: str | None = None,
                   grace_period: int | None = None, dry_run: bool = False) -> Obj:
        """Delete (a pod gracefully when ``graceful_deletion`` is on); dependents cascade unless
        ``propagation`` is Orphan (batch/v1 Job default). Returns the object as deleted, or as now
        terminating."""
        ns = (namespace or "") if rt.namespaced else ""
        with self._lock:
            self._tick()
            current = self._obj(rt.plural, ns, name)
            if current is None:
                raise ApiError.not_found(rt, name)
            self._check_preconditions(rt, current, precondition_uid, precondition_rv)
            if dry_run:
                return current
            deleted = self._delete_now(rt, current, propagation, grace_period)
            self._reconcile()
            return deleted

    @staticmethod
    def _check_preconditions(rt: ResourceType, current: Obj, uid: str | None, rv: str | None) -> None:
        name = current["metadata"]["name"]
        if uid and uid != current["metadata"]["uid"]:
            raise ApiError.conflict(rt, name, f"Precondition failed: UID in precondition: {uid}, "
                                              f"UID in object meta: {current['metadata']['uid']}")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise ApiError.conflict(rt, name, "Precondition failed: ResourceVersion in precondition: "
                                              f"{rv}, ResourceVersion in object meta: "
                                              f"{current['metadata']['resourceVersion']}")

    def _delete_now(self, rt: ResourceType, obj: Obj, propagation: str | None,
                    grace_period: int | None = None) -> Obj:
        if rt.plural == "pods":
            return self._delete_pod(obj, grace_period)
        if propagation is None:
            propagation = "Orphan" if rt.plural == "jobs" else "Background"
        deleted = self._remove(rt, obj)
        uid = obj["metadata"]["uid"]
        if rt.plural in _CONTROLLED_TYPES or rt.plural == "daemonsets":
            dependents = [(BY_PLURAL["pods"], p) for p in self._owned_pods(uid)]
            if rt.plural == "deployments":
                dependents = [(BY_PLURAL["replicasets"], rs) for rs in self._owned_replicasets(uid)]
            for dep_rt, dep in dependents:
                if propagation == "Orphan":
                    refs = [r for r in dep["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
                    meta = {k: v for k, v in dep["metadata"].items() if k != "ownerReferences"}
                    if refs:
                        meta["ownerReferences"] = refs
                    self._put(dep_rt, {**dep, "metadata": meta})
                elif dep_rt.plural == "pods":
                    if not _terminating(dep):
                        self._delete_pod(dep)
                else:
                    self._delete_now(dep_rt, dep, propagation)
        elif rt.plural == "nodes":
            for key in list(self._pods_by_node.get(obj["metadata"]["name"], {})):
                bound = self._obj("pods", *key)
                if bound is not None:
                    self._remove(BY_PLURAL["pods"], bound)
        elif rt.plural == "namespaces":
            for other in RESOURCES:
                if other.namespaced:
                    for key in [k for k in self._sorted_keys(other.plural) if k[0] == obj["metadata"]["name"]]:
                        child = self._obj(other.plural, *key)
                        if child is not None:
                            self._remove(other, child)
        return deleted

    def api_delete_collection(self, rt: ResourceType, namespace: str | None, *, label_selector: str | None = None,
                              field_selector: str | None = None, propagation: str | None = None,
                              grace_period: int | None = None, dry_run: bool = False) -> list[Obj]:
        """Delete every match in one controller pass (so a gang restart counts once)."""
        with self._lock:
            found = self.api_list(rt, namespace, label_selector=label_selector, field_selector=field_selector)
            objs = [e.obj for e in found.entries]
            if dry_run:
                return objs
            deleted = [self._delete_now(rt, o, propagation, grace_period) for o in objs
                       if self._obj(rt.plural, o["metadata"].get("namespace", "") if rt.namespaced else "",
                                    o["metadata"]["name"]) is not None]
            self._reconcile()
            return deleted

    def api_evict(self, namespace: str, name: str, body: Any = None, *, dry_run: bool = False) -> None:
        """The pods/eviction subresource: 409 when ``deleteOptions.preconditions`` (uid, resourceVersion)
        do not match the pod, 429 when a PodDisruptionBudget has no disruption left; then the pod is deleted
        (gracefully when ``graceful_deletion`` is on, with ``deleteOptions.gracePeriodSeconds`` if given).
        A pod already terminating is deleted again without a PodDisruptionBudget check."""
        pods = BY_PLURAL["pods"]
        options: Obj = {}
        if body is not None:
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be an Eviction object")
            bname = (body.get("metadata") or {}).get("name")
            if bname not in (None, name):
                raise ApiError(400, "name in URL does not match name in Eviction object")
            raw_options = body.get("deleteOptions")
            if raw_options is not None and not isinstance(raw_options, dict):
                raise ApiError(400, "deleteOptions must be an object")
            options = raw_options or {}
        pre = options.get("preconditions") or {}
        grace = options.get("gracePeriodSeconds")
        if not isinstance(pre, dict) or (grace is not None and not isinstance(grace, int)):
            raise ApiError(400, "deleteOptions.preconditions must be an object and gracePeriodSeconds an integer")
        with self._lock:
            self._tick()
            pod = self._obj("pods", namespace, name)
            if pod is None:
                raise ApiError.not_found(pods, name)
            self._check_preconditions(pods, pod, pre.get("uid"), pre.get("resourceVersion"))
            phase = pod.get("status", {}).get("phase")
            if phase == "Running" and not _terminating(pod):
                pdbs = self._pdbs_for(pod)
                if len(pdbs) > 1:
                    raise ApiError(500, "This pod has more than one PodDisruptionBudget, which the eviction "
                                        "subresource does not support.")
                if pdbs:
                    pdb = pdbs[0]
                    _, healthy, desired, allowed = self._pdb_numbers(pdb)
                    if allowed <= 0:
                        raise ApiError(429, "Cannot evict pod as it would violate the pod's disruption budget.",
                                       details={"causes": [{
                                           "reason": "DisruptionBudget",
                                           "message": f"The disruption budget {pdb['metadata']['name']} needs "
                                                      f"{desired} healthy pods and has {healthy} currently"}]})
            if dry_run:
                return
            self._delete_pod(pod, grace)
            self._reconcile()

    # --- watch ----------------------------------------------------------------------------------

    def events_since(self, rv: int) -> list[WatchEvent]:
        """Every change after ``rv``; ``ApiError`` 410 when ``rv`` is older than the kept history."""
        with self._lock:
            self._tick()
            if rv < self._history_floor:
                raise ApiError(410, f"too old resource version: {rv} ({self._history_floor})")
            i = bisect.bisect_right(self._history_rvs, rv)
            return self._history[i:]

    def wait_changed(self, rv: int, timeout: float) -> None:
        """Block until the resourceVersion passes ``rv`` or ``timeout`` seconds elapse."""
        with self._changed:
            if self._rv <= rv:
                self._changed.wait(timeout)

    def wake_watchers(self) -> None:
        with self._lock:
            self._changed.notify_all()
            self._wakeup.notify_all()

    def wait_for(self, predicate: Callable[[ClusterState], bool], timeout: float) -> bool:
        """Wait until ``predicate(self)`` holds; False after ``timeout`` seconds. It is checked after every
        change, every request served (``request_counts``), every fault hit, and every 50 ms while pods are
        terminating (their grace period runs on the state's clock)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                self._tick()
                if predicate(self):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wakeup.wait(min(left, 0.05) if self._terminating else left)

    # --- chaos hooks ----------------------------------------------------------------------------

    def inject_error(self, status: int, *, method: str = "*", path: str = ".*", count: int | None = 1,
                     retry_after: int | None = None, message: str = "") -> InjectedFault:
        """Answer the next ``count`` requests matching ``method`` (or ``*``) and the path regex with an
        error ``Status`` of ``status`` (e.g. 500, 503, 429), with a ``Retry-After`` header when given.

        ``path`` is searched (``re.search``) in the URL path without the query string.
        ``count=None`` keeps the fault until ``remove_fault``/``clear_faults``.
        """
        fault = InjectedFault(method.upper(), re.compile(path), status=status, remaining=count,
                              retry_after=retry_after, message=message)
        with self._lock:
            self._faults.append(fault)
        return fault

    def add_latency(self, seconds: float, *, method: str = "*", path: str = ".*",
                    count: int | None = None) -> InjectedFault:
        """Delay matching requests by ``seconds`` (all of them until removed, or the next ``count``)."""
        fault = InjectedFault(method.upper(), re.compile(path), latency_s=seconds, remaining=count)
        with self._lock:
            self._faults.append(fault)
        return fault

    def remove_fault(self, fault: InjectedFault) -> None:
        with self._lock:
            self._faults = [f for f in self._faults if f is not fault]

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def take_faults(self, method: str, path: str) -> tuple[float, ApiError | None]:
        """For the server: the latency to add and the error to answer with, consuming matching faults."""
        with self._lock:
            latency = 0.0
            error: ApiError | None = None
            for f in self._faults:
                if not f.matches(method, path):
                    continue
                if f.status is None:
                    latency += f.latency_s
                elif error is None:
                    error = f.error()
                else:
                    continue
                f.hits += 1
                if f.remaining is not None:
                    f.remaining -= 1
                self._wakeup.notify_all()
            self._faults = [f for f in self._faults if f.remaining is None or f.remaining > 0]
            return latency, error

    def record_request(self, verb: str, resource: str) -> None:
        """Count one request served and wake ``wait_for`` callers (watchers are not woken)."""
        with self._lock:
            self._counts[f"{verb} {resource}"] += 1
            self._wakeup.notify_all()

    def request_counts(self) -> dict[str, int]:
        """Requests served, keyed ``"<verb> <resource>"``: ``"patch nodes"``, ``"create pods/eviction"``,
        ``"list pods"``, ``"get /version"`` (non-resource paths are counted by path)."""
        with self._lock:
            return dict(self._counts)

    def count(self, verb: str, resource: str) -> int:
        with self._lock:
            return self._counts.get(f"{verb} {resource}", 0)

    def reset_counters(self) -> None:
        with self._lock:
            self._counts.clear()

    # --- Python API: copies the caller owns -----------------------------------------------------

    def get(self, resource: str | ResourceType, name: str, namespace: str | None = None) -> Obj:
        """One object (``ApiError`` 404 if absent)."""
        rt = resource_type(resource)
        return _copy(self.api_get(rt, namespace or "", name).obj)

    def list_objects(self, resource: str | ResourceType, namespace: str | None = None, *,
                     label_selector: str | None = None, field_selector: str | None = None) -> list[Obj]:
        """Objects of one type (one namespace, or all), sorted by namespace and name."""
        rt = resource_type(resource)
        result = self.api_list(rt, namespace, label_selector=label_selector, field_selector=field_selector)
        return [_copy(e.obj) for e in result.entries]

    def create(self, resource: str | ResourceType, obj: Obj, namespace: str | None = None) -> Obj:
        """Create an object (namespace from the argument or ``obj.metadata.namespace``)."""
        rt = resource_type(resource)
        ns = namespace if namespace is not None else (obj.get("metadata") or {}).get("namespace")
        return _copy(self.api_create(rt, ns, obj))

    def replace(self, resource: str | ResourceType, name: str, obj: Obj, namespace: str | None = None, *,
                subresource: str | None = None) -> Obj:
        """PUT semantics: 409 when ``obj`` carries a stale ``metadata.resourceVersion``."""
        return _copy(self.api_replace(resource_type(resource), namespace, name, obj, subresource=subresource))

    def patch(self, resource: str | ResourceType, name: str, patch: Any, namespace: str | None = None, *,
              content_type: str = MERGE_PATCH, subresource: str | None = None) -> Obj:
        """Patch an object; ``patch`` is decoded JSON (a dict, or a list for JSON patch)."""
        return _copy(self.api_patch(resource_type(resource), namespace, name, patch, content_type,
                                    subresource=subresource))

    def delete(self, resource: str | ResourceType, name: str, namespace: str | None = None, *,
               propagation: str | None = None, grace_period: int | None = None) -> Obj:
        """Delete; ``propagation`` Orphan/Background/Foreground (batch/v1 Jobs default to Orphan);
        ``grace_period`` for a pod when ``graceful_deletion`` is on."""
        return _copy(self.api_delete(resource_type(resource), namespace, name, propagation=propagation,
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
        with self._lock:
            return list(self._node_order)

    def pod(self, namespace: str, name: str) -> Obj:
        return self.get("pods", name, namespace)

    def list_pods(self, namespace: str | None = None, *, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[Obj]:
        return self.list_objects("pods", namespace, label_selector=label_selector, field_selector=field_selector)

    def pods_on(self, node: str) -> list[Obj]:
        """Pods bound to ``node`` (terminating ones included), sorted by namespace and name."""
        with self._lock:
            self._tick()
            return [_copy(self._store["pods"][k].obj) for k in sorted(self._pods_by_node.get(node, {}))
                    if k in self._store["pods"]]

    def pending_pods(self) -> list[Obj]:
        with self._lock:
            self._tick()
            return [_copy(self._store["pods"][k].obj) for k in sorted(self._pending) if k in self._store["pods"]]

    def is_cordoned(self, node: str) -> bool:
        return bool(self.node(node).get("spec", {}).get("unschedulable"))

    def taints(self, node: str) -> list[Obj]:
        return list(self.node(node).get("spec", {}).get("taints") or [])

    def gpus_in_use(self, node: str) -> dict[int, str]:
        """GPU index -> ``namespace/pod`` for the pods bound to ``node``."""
        out: dict[int, str] = {}
        for pod in self.pods_on(node):
            if not _terminal(pod):
                for i in _gpu_indices(pod):
                    out[i] = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        return out

    def set_node_ready(self, node: str, ready: bool = True) -> Obj:
        """Flip the node's Ready condition (a NotReady node takes no new pods)."""
        with self._lock:
            current = self._obj("nodes", "", node)
            if current is None:
                raise ApiError.not_found(BY_PLURAL["nodes"], node)
            conds = [dict(c) for c in current["status"].get("conditions", [])]
            for c in conds:
                if c.get("type") == "Ready":
                    c.update({"status": "True" if ready else "False",
                              "reason": "KubeletReady" if ready else "KubeletNotReady",
                              "lastTransitionTime": self._ts(), "lastHeartbeatTime": self._ts()})
            out = self._write(BY_PLURAL["nodes"], current, {**current, "status": {**current["status"],
                                                                                  "conditions": conds}},
                              "status", False)
            return _copy(out)

    def set_gpu_health(self, node: str, index: int, healthy: bool) -> Obj:
        """Mark one GPU (un)healthy, as the device plugin would: an unhealthy GPU is never assigned and the
        node's ``allocatable`` ``nvidia.com/gpu`` drops by one; running pods are not touched."""
        with self._lock:
            current = self._obj("nodes", "", node)
            if current is None:
                raise ApiError.not_found(BY_PLURAL["nodes"], node)
            bad = self._unhealthy.setdefault(node, set())
            if healthy:
                bad.discard(index)
            else:
                bad.add(index)
            cap = int(current["status"].get("capacity", {}).get(GPU_RESOURCE, 0))
            alloc = {**current["status"].get("allocatable", {}), GPU_RESOURCE: str(max(0, cap - len(bad)))}
            out = self._write(BY_PLURAL["nodes"], current, {**current, "status": {**current["status"],
                                                                                  "allocatable": alloc}},
                              "status", False)
            if healthy:
                self._dirty.sched_nodes.add(node)
                self._reconcile()
            return _copy(out)

    def unhealthy_gpus(self, node: str) -> set[int]:
        with self._lock:
            return set(self._unhealthy.get(node, set()))

    def block_pdb(self, namespace: str, name: str, blocked: bool = True) -> Obj:
        """Make a PodDisruptionBudget refuse every eviction (``disruptionsAllowed: 0``) or allow again."""
        with self._lock:
            if self._obj("poddisruptionbudgets", namespace, name) is None:
                raise ApiError.not_found(BY_PLURAL["poddisruptionbudgets"], name)
            key = (namespace, name)
            if blocked:
                self._blocked_pdbs.add(key)
            else:
                self._blocked_pdbs.discard(key)
            self._sync_pdb(key)
            self._reconcile()
            return self.get("poddisruptionbudgets", name, namespace)

    def pdb_for(self, namespace: str, pod: str) -> Obj | None:
        """The PodDisruptionBudget covering a pod, if any."""
        with self._lock:
            obj = self._obj("pods", namespace, pod)
            if obj is None:
                raise ApiError.not_found(BY_PLURAL["pods"], pod)
            pdbs = self._pdbs_for(obj)
            return _copy(pdbs[0]) if pdbs else None

    def owner_of(self, namespace: str, pod: str) -> tuple[str, str, str] | None:
        """``(kind, namespace, name)`` of the pod's controller (Job, PyTorchJob, DaemonSet, ReplicaSet,
        StatefulSet), if any."""
        ref = _controller(self.pod(namespace, pod))
        return None if ref is None else (str(ref["kind"]), namespace, str(ref["name"]))

    def jobs_on(self, node: str) -> list[tuple[str, str, str]]:
        """Training jobs with a pod on ``node``: ``(kind, namespace, name)``, kind ``Job``/``PyTorchJob``."""
        found: list[tuple[str, str, str]] = []
        for pod in self.pods_on(node):
            ref = _controller(pod)
            if ref and ref.get("kind") in ("Job", "PyTorchJob"):
                item = (str(ref["kind"]), pod["metadata"]["namespace"], str(ref["name"]))
                if item not in found:
                    found.append(item)
        return found

    def _controller_obj(self, kind: str, namespace: str, name: str) -> tuple[str, Obj]:
        plural = _OWNER_PLURAL.get(kind)
        if plural is None or plural == "daemonsets":
            raise ValueError(f"unknown job kind {kind!r}: use one of Job, PyTorchJob, Deployment, ReplicaSet, "
                             "StatefulSet")
        owner = self._obj(plural, namespace, name)
        if owner is None:
            raise ApiError.not_found(BY_PLURAL[plural], name)
        return plural, owner

    def _controlled_pods(self, plural: str, owner: Obj) -> list[Obj]:
        """The pods a controller object owns (a Deployment's through its ReplicaSets), terminating included."""
        if plural == "deployments":
            return [p for rs in self._owned_replicasets(owner["metadata"]["uid"])
                    for p in self._owned_pods(rs["metadata"]["uid"])]
        return self._owned_pods(owner["metadata"]["uid"])

    def job_pods(self, kind: str, namespace: str, name: str) -> list[Obj]:
        """Live pods (neither finished nor terminating) of a Job, PyTorchJob, Deployment, ReplicaSet or
        StatefulSet, ordered by rank (PyTorchJob: master-0 first), then by name in natural order."""
        with self._lock:
            self._tick()
            plural, owner = self._controller_obj(kind, namespace, name)
            pods = [_copy(p) for p in self._controlled_pods(plural, owner) if _active(p)]
        return sorted(pods, key=_rank_key)

    def job_restarts(self, kind: str, namespace: str, name: str) -> int:
        """How many controller passes recreated pods of the job (the ``sim.gpu-remediator.io/restarts``
        annotation; a Deployment's is the sum over its ReplicaSets); 0 for a job that never lost a pod."""
        with self._lock:
            plural, owner = self._controller_obj(kind, namespace, name)
            counted = self._owned_replicasets(owner["metadata"]["uid"]) if plural == "deployments" else [owner]
            return sum(int((o["metadata"].get("annotations") or {}).get(RESTARTS_ANNOTATION, "0")) for o in counted)

    def restart_job(self, kind: str, namespace: str, name: str) -> list[Obj]:
        """Delete every pod of a Job, PyTorchJob, ReplicaSet or StatefulSet at once, immediately even with
        ``graceful_deletion`` on, and let the controller recreate the whole gang (one restart); returns the
        new pods. A Deployment restarts through its ReplicaSet."""
        if kind == "Deployment":
            raise ValueError("unknown job kind 'Deployment' for restart_job: restart its ReplicaSet")
        with self._lock:
            plural, owner = self._controller_obj(kind, namespace, name)
            for pod in self._controlled_pods(plural, owner):
                self._remove(BY_PLURAL["pods"], pod)
            self._reconcile()
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
        with self._lock:
            if self._obj("namespaces", "", namespace) is None:
                self.create("namespaces", {"metadata": {"name": namespace,
                                                        "labels": {"kubernetes.io/metadata.name": namespace}}})
        match = dict(labels or {"app": name})
        container: Obj = {"name": name, "image": image, "resources": {}}
        if gpus:
            container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}, "requests": {GPU_RESOURCE: str(gpus)}}
        pod_spec: Obj = {"containers": [container]}
        if node_selector:
            pod_spec["nodeSelector"] = dict(node_selector)
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": namespace,
                                                                    "labels": dict(match)},
                "spec": {"replicas": replicas, "selector": {"matchLabels": dict(match)},
                         "template": {"metadata": {"labels": dict(match)}, "spec": pod_spec}}}

    def events(self, namespace: str | None = None) -> list[Obj]:
        """Kubernetes Events (core v1) created through the API."""
        return self.list_objects("events", namespace)

    def snapshot(self) -> dict[str, int]:
        """Object counts per resource, for logs and benchmark reports."""
        with self._lock:
            return {plural: len(objs) for plural, objs in self._store.items()}


def _rank_key(pod: Obj) -> tuple[int, tuple[Any, ...]]:
    for c in pod.get("spec", {}).get("containers", []):
        for e in c.get("env") or []:
            if e.get("name") == "RANK" and str(e.get("value", "")).isdigit():
                return int(e["value"]), _natural_key(pod["metadata"]["name"])
    return 0, _natural_key(pod["metadata"]["name"])


def _copy(obj: Obj) -> Obj:
    result: Obj = json.loads(json.dumps(obj))
    return result


# --- seeding ---------------------------------------------------------------------------------------


def _pool_name(k: int) -> str:
    return f"pool-{chr(ord('a') + k)}" if k < 26 else f"pool-{k}"


def seed_cluster(nodes: int, gpus_per_node: int = 8, pools: int = 1, *, gpus_per_pod: int | None = None,
                 pytorchjob_ranks: int = 2, clock: Callable[[], datetime] | None = None,
                 seed: int = 0, graceful_deletion: bool = False) -> ClusterState:
    """A cluster of ``nodes`` GPU nodes with training jobs, DaemonSets and PDBs (see the module docstring).

    ``pools`` splits the nodes into contiguous blocks ``pool-a``, ``pool-b``, …; ``gpus_per_pod``
    defaults to half a node; ``pytorchjob_ranks`` is the number of nodes (one rank each) per PyTorchJob.
    No Deployments or StatefulSets are seeded: add them with ``add_deployment``/``add_statefulset``.
    ``graceful_deletion`` turns graceful pod termination on from the start (``ClusterState``).
    """
    if nodes < 0 or gpus_per_node < 1 or pools < 1 or pytorchjob_ranks < 1:
        raise ValueError("nodes >= 0, gpus_per_node >= 1, pools >= 1 and pytorchjob_ranks >= 1 are required")
    per_pod = gpus_per_pod if gpus_per_pod is not None else max(1, gpus_per_node // 2)
    if not 1 <= per_pod <= gpus_per_node:
        raise ValueError("gpus_per_pod must be between 1 and gpus_per_node")
    state = ClusterState(clock=clock, seed=seed, graceful_deletion=graceful_deletion)
    with state._lock:
        _Seeder(state, gpus_per_node, per_pod).seed(nodes, pools, pytorchjob_ranks)
    return state


class _Seeder:
    """Writes the seeded objects straight into the store, pods already bound where they belong."""

    def __init__(self, state: ClusterState, gpus_per_node: int, gpus_per_pod: int) -> None:
        self.s = state
        self.gpus = gpus_per_node
        self.per_pod = gpus_per_pod

    def seed(self, nodes: int, pools: int, ranks: int) -> None:
        s = self.s
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease", "gpu-operator", "gpu-remediator",
                   TRAINING_NAMESPACE):
            s.api_create(BY_PLURAL["namespaces"], None, {"metadata": {"name": ns,
                                                                      "labels": {"kubernetes.io/metadata.name": ns}}})
        for i in range(nodes):
            pool = _pool_name(min(pools - 1, i * pools // max(nodes, 1)))
            s._commit(BY_PLURAL["nodes"], self.node(i, pool), "ADDED")
        self.daemonset("gpu-operator", "nvidia-dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1",
                              {"app": "nvidia-dcgm-exporter"},
                              [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}])
        self.daemonset("gpu-remediator", "gpu-remediator-agent", "ghcr.io/gpu-remediator/agent:0.1.0",
                               {"app.kubernetes.io/name": "gpu-remediator-agent"}, [{"operator": "Exists"}])
        names = s.node_names()
        block = 2 * ranks
        i = 0
        while i < len(names):
            if i % block == 0 and i + ranks <= len(names):
                self.pytorchjob(f"pytorch-{i // block}", names[i:i + ranks])
                i += ranks
            else:
                self.job(f"train-{i}", names[i])
                i += 1
        s._dirty.owners.clear()
        s._reconcile()

    def node(self, i: int, pool: str) -> Obj:
        name = f"gpu-node-{i}"
        ip = f"10.0.{(i >> 8) & 255}.{i & 255}"
        gpus = str(self.gpus)
        resources = {"cpu": "192", "memory": "2113546Mi", "pods": "110", "ephemeral-storage": "3750000000Ki",
                     "hugepages-1Gi": "0", "hugepages-2Mi": "0", GPU_RESOURCE: gpus}
        now = self.s._ts()
        conds = [{"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": now,
                  "lastTransitionTime": now}
                 for t, r, m in (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                                 ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                                 ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID"))]
        conds.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                      "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                      "lastTransitionTime": now})
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                  "node.kubernetes.io/instance-type": "gpu-8x-h100", GPU_PRESENT_LABEL: "true",
                  "nvidia.com/gpu.count": gpus, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                  POOL_LABEL: pool}
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": self.s._new_meta(name, labels=labels,
                                         annotations={"node.alpha.kubernetes.io/ttl": "0",
                                                      "volumes.kubernetes.io/controller-managed-attach-detach":
                                                          "true"}),
            "spec": {"podCIDR": f"10.{128 + ((i >> 8) & 63)}.{i & 255}.0/24",
                     "providerID": f"sim://gpu-remediator/{name}"},
            "status": {
                "capacity": resources, "allocatable": dict(resources), "conditions": conds,
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"architecture": "amd64", "bootID": str(uuid.UUID(int=i + 1)),
                             "containerRuntimeVersion": "containerd://1.7.22",
                             "kernelVersion": "5.15.0-125-generic", "kubeProxyVersion": KUBERNETES_VERSION,
                             "kubeletVersion": KUBERNETES_VERSION, "machineID": f"{i + 1:032x}",
                             "operatingSystem": "linux", "osImage": "Ubuntu 22.04.5 LTS",
                             "systemUUID": str(uuid.UUID(int=(1 << 64) + i))},
            },
        }

    def daemonset(self, ns: str, name: str, image: str, labels: dict[str, str], tolerations: list[Obj]) -> Obj:
        s = self.s
        template = {"metadata": {"labels": dict(labels)},
                    "spec": {"nodeSelector": {GPU_PRESENT_LABEL: "true"}, "tolerations": tolerations,
                             "containers": [{"name": name.rsplit("-", 1)[0] if name.endswith("exporter") else name,
                                             "image": image, "resources": {}}]}}
        ds = {"apiVersion": "apps/v1", "kind": "DaemonSet",
              "metadata": s._new_meta(name, ns, labels=dict(labels), generation=1),
              "spec": {"selector": {"matchLabels": dict(labels)}, "template": template,
                       "updateStrategy": {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                       "revisionHistoryLimit": 10},
              "status": {"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0,
                         "numberReady": 0}}
        return s._commit(BY_PLURAL["daemonsets"], ds, "ADDED")

    def container(self, name: str, emptydir: bool) -> tuple[Obj, list[Obj]]:
        gpus = str(self.per_pod)
        c: Obj = {"name": name, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                  "command": ["torchrun", "train.py"],
                  "resources": {"limits": {GPU_RESOURCE: gpus}, "requests": {GPU_RESOURCE: gpus}}}
        volumes: list[Obj] = []
        if emptydir:
            c["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
            volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
        return c, volumes

    def job(self, name: str, node: str) -> None:
        s = self.s
        c, _ = self.container("trainer", emptydir=False)
        meta = s._new_meta(name, TRAINING_NAMESPACE, generation=1, labels={"app.kubernetes.io/part-of": "training"})
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
               "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 6, "completionMode": "NonIndexed",
                        "suspend": False, "manualSelector": False,
                        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": meta["uid"]}},
                        "template": {"metadata": {"labels": {"app.kubernetes.io/part-of": "training"}},
                                     "spec": {"containers": [c], "restartPolicy": "Never"}}},
               "status": {}}
        job = s._commit(BY_PLURAL["jobs"], job, "ADDED")
        s._create_job_pod(job, node=node)
        self.pdb(f"{name}-pdb", {JOB_NAME_LABEL: name}, max_unavailable=1)

    def pytorchjob(self, name: str, nodes: list[str]) -> None:
        s = self.s
        c, volumes = self.container("pytorch", emptydir=True)
        template = {"metadata": {"labels": {"app.kubernetes.io/part-of": "training"}},
                    "spec": {"containers": [c], "volumes": volumes}}
        specs: Obj = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": copy.deepcopy(template)}}
        if len(nodes) > 1:
            specs["Worker"] = {"replicas": len(nodes) - 1, "restartPolicy": "OnFailure",
                               "template": copy.deepcopy(template)}
        ptj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
               "metadata": s._new_meta(name, TRAINING_NAMESPACE, generation=1),
               "spec": {"runPolicy": {"cleanPodPolicy": "None", "suspend": False}, "pytorchReplicaSpecs": specs},
               "status": {}}
        ptj = s._commit(BY_PLURAL["pytorchjobs"], ptj, "ADDED")
        world = len(nodes)
        for (rtype, index, rank), node in zip(s._ranks(ptj), nodes, strict=True):
            s._create_pytorch_pod(ptj, rtype, index, rank, world, node=node)
        self.pdb(f"{name}-pdb", {KUBEFLOW_JOB_NAME_LABEL: name}, min_available=max(0, world - 1))

    def pdb(self, name: str, match: dict[str, str], *, min_available: int | None = None,
            max_unavailable: int | None = None) -> None:
        s = self.s
        spec: Obj = {"selector": {"matchLabels": match}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        s._commit(BY_PLURAL["poddisruptionbudgets"],
                  {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                   "metadata": s._new_meta(name, TRAINING_NAMESPACE, generation=1), "spec": spec}, "ADDED")
