"""The simulated cluster's vocabulary: the resources it serves, the API error, stored objects and watch
events, and the small readings of an object every other part of the simulator shares.

Where it sits: the bottom of ``chaos.sim``. The store (``store``), the controllers, the scheduler, the
kubelet's device manager, the disruption controller, the API verbs (``apiserver``) and the HTTP front
(``kube_api``) all import from here; this module imports nothing of theirs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
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
KUBERNETES_VERSION = "v1.36.0"

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
    # Dynamic Resource Allocation as a v1.36 server serves it (``chaos.sim.dra``): the GA types at
    # resource.k8s.io/v1, DeviceTaintRule at v1beta2 only (it reaches v1 in 1.37), so a client that looks
    # the version up by discovery finds each where it is.
    ResourceType("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False, "deviceclass"),
    ResourceType("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, "resourceclaim", (),
                 ("status",)),
    ResourceType("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True,
                 "resourceclaimtemplate"),
    ResourceType("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False, "resourceslice"),
    ResourceType("resource.k8s.io", "v1beta2", "devicetaintrules", "DeviceTaintRule", False, "devicetaintrule",
                 (), ("status",)),
)
BY_PLURAL: dict[str, ResourceType] = {rt.plural: rt for rt in RESOURCES}
OWNER_PLURAL = {"Job": "jobs", "PyTorchJob": "pytorchjobs", "DaemonSet": "daemonsets", "ReplicaSet": "replicasets",
                 "StatefulSet": "statefulsets", "Deployment": "deployments"}
# Owners whose lost pods a controller replaces (DaemonSets are handled per node).
REPLACING_KINDS = frozenset({"Job", "PyTorchJob", "ReplicaSet", "StatefulSet"})
# Owners that replace a terminating pod at once (a fresh name); the others wait until its name is free.
EAGER_KINDS = frozenset({"Job", "ReplicaSet"})
# Objects with a spec a controller acts on.
CONTROLLED_TYPES = frozenset({"jobs", "pytorchjobs", "deployments", "replicasets", "statefulsets"})
WORKLOAD_TYPES = frozenset({"deployments", "replicasets", "statefulsets"})
GENERATION_TYPES = frozenset({"daemonsets", "jobs", "pytorchjobs", "poddisruptionbudgets", "devicetaintrules",
                              "deviceclasses", *WORKLOAD_TYPES})
SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
            409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid",
            429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}
DEFAULT_TOLERATIONS: tuple[Obj, ...] = (
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


def natural_key(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def gpu_request(pod: Obj) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers", []):
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU_RESOURCE, (res.get("requests") or {}).get(GPU_RESOURCE, 0))
        total += int(value)
    return total



def is_terminal(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def is_terminating(obj: Obj) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def is_active(pod: Obj) -> bool:
    """Neither finished nor on its way out: what controllers and PodDisruptionBudgets count."""
    return not is_terminal(pod) and not is_terminating(pod)


def stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def template_hash(template: Obj) -> str:
    """A stable 10-character ``pod-template-hash`` (kube-controller-manager's alphabet) for a pod template."""
    digest = int.from_bytes(hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()[:8], "big")
    out = []
    for _ in range(10):
        digest, i = divmod(digest, len(SUFFIX_ALPHABET))
        out.append(SUFFIX_ALPHABET[i])
    return "".join(out)


def daemonset_selects(ds: Obj, node: Obj | None) -> bool:
    """Whether the DaemonSet's pod template's nodeSelector selects ``node`` (what its
    ``desiredNumberScheduled`` counts)."""
    if node is None:
        return False
    selector = ds["spec"]["template"].get("spec", {}).get("nodeSelector") or {}
    labels = node["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def pod_ready(pod: Obj) -> bool:
    if pod.get("status", {}).get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []))


def controller_ref(obj: Obj) -> Obj | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def tolerates(tolerations: Iterable[Obj], taint: Obj) -> bool:
    """Whether any of ``tolerations`` tolerates ``taint``, as ``Toleration.ToleratesTaint`` in
    k8s.io/api/core/v1 decides (and DRA's device tolerations, which follow the same rules): an effect, when
    set, must match; a key, when set, must match (an empty key with ``Exists`` tolerates every taint);
    ``Exists`` ignores the value, ``Equal`` (or no operator) needs it equal; any other operator tolerates
    nothing."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("key") and t.get("key") != taint.get("key"):
            continue
        op = t.get("operator") or "Equal"
        if op == "Exists":
            return True
        if op == "Equal" and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def node_ready(node: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions", []))


def blocking_taints(node: Obj) -> list[Obj]:
    return [t for t in node.get("spec", {}).get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]



def rank_key(pod: Obj) -> tuple[int, tuple[Any, ...]]:
    for c in pod.get("spec", {}).get("containers", []):
        for e in c.get("env") or []:
            if e.get("name") == "RANK" and str(e.get("value", "")).isdigit():
                return int(e["value"]), natural_key(pod["metadata"]["name"])
    return 0, natural_key(pod["metadata"]["name"])


def copy_obj(obj: Obj) -> Obj:
    result: Obj = json.loads(json.dumps(obj))
    return result


# --- seeding ---------------------------------------------------------------------------------------



def node_open(node: Obj) -> bool:
    """Whether a node takes new pods at all: Ready and not cordoned (``spec.unschedulable``)."""
    return not node.get("spec", {}).get("unschedulable") and node_ready(node)


def container_gpu_requests(pod: Obj) -> list[tuple[str, int]]:
    """``(container name, nvidia.com/gpu count)`` for each container of ``pod`` that asks for GPUs (the
    limit, else the request, as the device plugin's extended resource is counted)."""
    out: list[tuple[str, int]] = []
    for c in pod.get("spec", {}).get("containers", []):
        res = c.get("resources") or {}
        value = int((res.get("limits") or {}).get(GPU_RESOURCE, (res.get("requests") or {}).get(GPU_RESOURCE, 0)))
        if value:
            out.append((str(c.get("name", "")), value))
    return out
