"""Kubernetes adapter: every call the service makes to the Kubernetes API, and the only module that imports
``kubernetes``.

Where it sits: below the executor and its step library (DESIGN.md §7). Playbook steps (``taint``,
``cordon``, ``drain``, ``restart_job``, ``return_to_service``, ``escalate``) and the executor's guards
``await`` an ``AsyncKube`` (the port, typed against ``playbooks.ports.KubePort``); the CLI and tests may
use the synchronous ``KubeAdapter`` under it directly. Nothing above this module sees a kubernetes model
object, an ``ApiException`` or a urllib3 error. What comes back is plain data: dicts shaped like the API's
JSON (camelCase keys inside raw objects, snake_case in the summaries this module builds), and the frozen
``contracts.Change`` (what a mutation changed) and ``contracts.JobRef`` (a job's controller, found by
``find_job``).

``KubeAdapter`` is synchronous and thread-safe; ``AsyncKube`` runs its calls on a bounded thread pool of
its own, the one thread hop between the event loop and the API, so several steps may run at once on
different nodes. One ``urllib3`` pool is shared; the rate limiter holds its own lock; every other piece of
state lives on the stack of one call.

Client discipline, in one place (``KubeAdapter._request``):

* every request, each retry included, first takes a token from a ``LanedLimiter`` (default 20 QPS, burst 40):
  the one PATCH that quarantines a node (``quarantine``) in the ``quarantine`` lane, served first; reads and
  everything else (drains, evictions, their polls) in turn, so neither starves;
* 5xx (but 501), 408, 429 (honouring ``Retry-After``), connection errors and timeouts are retried by
  tenacity with exponential backoff and jitter, within a total budget (``retry_budget_s``); the client
  library's own urllib3 retries are switched off so there is exactly one retry layer at this boundary;
* 409 Conflict is never retried blindly: node and object patches carry their ``resourceVersion`` as a
  precondition, so a concurrent writer makes the patch fail, and the mutation re-reads and re-decides
  (bounded by ``conflict_attempts``);
* 404 becomes ``NotFound``, which a caller can act on (the node is gone, the pod is already evicted).

Error vocabulary (what may leave this module), subclasses of ``remediator.errors``, so ``bus.settle``
knows what each means for the message without glue in between:

* ``KubeTemporaryError`` (a ``TemporaryError``) — worth trying again later: the retry budget ran out on
  5xx/429/connection errors. Carries ``status`` and ``retry_after`` (seconds, when the server said), which
  is also its ``delay``: the message is nakked for as long as the API server asked. The adapter has
  already retried; the caller naks rather than looping.
* ``KubeConflict`` (a ``KubeTemporaryError`` and a ``Conflict``) — conflicting writers kept winning.
* ``KubePermanentError`` (a ``PermanentError``) — retrying will not help (400, 401, 403, 422, an
  unsupported job kind …). Inside a playbook step the step fails and its ``on_failure`` decides.
* ``NotFound`` — a ``KubePermanentError`` for 404, naming the missing object.
* ``DrainTimeout`` — a ``KubePermanentError``: a drain or per-GPU eviction did not finish within its
  timeout (PodDisruptionBudgets kept refusing, or evicted pods did not terminate). The step fails and the
  playbook escalates; ``before``/``after`` carry the pods left and those already evicted. Not retried
  here: the drain itself is idempotent, so running it again continues.

Mutations are idempotent (check before act) and return ``Change(changed, before, after, detail)`` for
the audit trail.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import functools
import hashlib
import json
import logging
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from tenacity import RetryCallState, RetryError, Retrying, retry_if_exception

from remediator.adapters.nodecache import NodeCache, Transform
from remediator.adapters.pool_index import PoolIndex
from remediator.adapters.ratelimit import LanedLimiter, LimiterClosed, current_lane, lane
from remediator.contracts import JOB_LABELS, OPT_OUT_LABEL, POOL_LABEL, Change, JobRef
from remediator.errors import Conflict, PermanentError, RemediatorError, TemporaryError
from remediator.pools import PoolView

if TYPE_CHECKING:
    from remediator.contracts import GpuRef
    from remediator.settings import Settings

__all__ = [
    "CORDONED_BY_US_ANNOTATION",
    "ESCALATED_ANNOTATION",
    "RESTARTED_AT_ANNOTATION",
    "RESTART_ID_ANNOTATION",
    "AsyncKube",
    "DrainTimeout",
    "KubeAdapter",
    "KubeConflict",
    "KubeError",
    "KubePermanentError",
    "KubeTemporaryError",
    "NotFound",
]

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")

# While the node cache is not synced, how long one list of a pool serves the budget guard of every run
POOL_LIST_TTL_S: Final = 2.0
# How often the client library's credential hook runs at most (``_ThrottledHook``): both loaders refresh a
# token well before it expires (kubeconfig: 5 minutes before its expiry; in-cluster: the file re-read each
# minute), so a second between runs changes no token that is sent
CREDENTIAL_HOOK_EVERY_S: Final = 1.0
# The prefix of the tokens ``wait_node_change`` hands out while it waits on the node cache (a resourceVersion
# otherwise)
_CACHE_TOKEN: Final = "cache:"

# --- names on the wire ------------------------------------------------------------------------------

RESTARTED_AT_ANNOTATION: Final = "gpu-remediator.io/restarted-at"
RESTART_ID_ANNOTATION: Final = "gpu-remediator.io/restart-id"
# UIDs of the pods a restart deletes, written before deleting: a restart interrupted half way is finished
# by the next call with the same restart id, and pods created since are never touched.
RESTART_POD_UIDS_ANNOTATION: Final = "gpu-remediator.io/restart-pod-uids"
ESCALATED_ANNOTATION: Final = "gpu-remediator.io/escalated"
# Set by ``cordon`` when it cordons, so ``uncordon(only_if_ours=True)`` never undoes someone else's cordon.
CORDONED_BY_US_ANNOTATION: Final = "gpu-remediator.io/cordoned-at"
MIRROR_POD_ANNOTATION: Final = "kubernetes.io/config.mirror"
KUBEFLOW_JOB_LABEL: Final = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA_INDEX_LABEL: Final = "training.kubeflow.org/replica-index"
BATCH_JOB_LABELS: Final = ("batch.kubernetes.io/job-name", "job-name")
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
JOBSET_API: Final = "jobset.x-k8s.io/v1alpha2"
GPU_RESOURCE: Final = "nvidia.com/gpu"
DEFAULT_POOL: Final = "default"
EVENT_NAMESPACE: Final = "default"  # where Kubernetes keeps events about cluster-scoped objects (Nodes)
COMPONENT: Final = "gpu-remediator"
TAINT_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")

MERGE_PATCH: Final = "application/merge-patch+json"

# GPU withdrawal (``withdraw_gpu``): DRA's API group and the versions looked for, newest first; the label on
# the DeviceTaintRules we create (restore deletes only those); the node annotation listing the GPUs withdrawn
# by a node taint (device-plugin fallback: the node is "partially withdrawn").
DRA_GROUP: Final = "resource.k8s.io"
DRA_VERSIONS: Final = ("v1", "v1beta2", "v1alpha3")
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
WITHDRAWN_GPUS_ANNOTATION: Final = "gpu-remediator.io/withdrawn-gpus"
WITHDRAWN_NODE_ANNOTATION: Final = "gpu-remediator.io/node"
WITHDRAWN_GPU_ANNOTATION: Final = "gpu-remediator.io/gpu"

# Controllers restart_job knows how to reach: kind -> (API group/version, plural).
_CONTROLLERS: Final[dict[str, tuple[str, str]]] = {
    "PyTorchJob": ("kubeflow.org/v1", "pytorchjobs"),
    "Job": ("batch/v1", "jobs"),
    "JobSet": (JOBSET_API, "jobsets"),
    "StatefulSet": ("apps/v1", "statefulsets"),
    "Deployment": ("apps/v1", "deployments"),
    "ReplicaSet": ("apps/v1", "replicasets"),
}

# --- error vocabulary -------------------------------------------------------------------------------


class KubeError(RemediatorError):
    """Base of everything this adapter raises."""


class KubeTemporaryError(KubeError, TemporaryError):
    """The API could not do it now; the adapter's own retries are spent. Try again later.

    ``status`` is the HTTP status of the last answer (``None`` for a connection error or timeout);
    ``retry_after`` is what the server asked for, in seconds, when it said, and is also the error's
    ``delay``, so ``bus.settle`` naks the message for as long as the API server asked.
    """

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, delay=retry_after)
        self.status = status
        self.retry_after = retry_after


class KubeConflict(KubeTemporaryError, Conflict):
    """409, again and again: concurrent writers kept winning the ``resourceVersion`` precondition."""


class KubePermanentError(KubeError, PermanentError):
    """Trying again will not help: the request is wrong, forbidden or unsupported."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubePermanentError):
    """404: the object named is not there (``kind``, ``name``, ``namespace`` say which)."""

    def __init__(self, message: str, *, kind: str = "", name: str = "", namespace: str | None = None) -> None:
        super().__init__(message, status=404)
        self.kind = kind
        self.name = name
        self.namespace = namespace


class DrainTimeout(KubePermanentError):
    """A drain (or per-GPU eviction) did not finish in time: the step failed, and the playbook's
    ``on_failure`` (escalate) decides what follows; redelivering the message would not make the
    PodDisruptionBudgets relent (the drain is idempotent, so a later run continues where this one stopped).

    ``pods_left`` lists what still stands between the node and empty, each ``{name, namespace, uid, owner,
    reason}`` with ``reason`` ``"blocked by PodDisruptionBudget"`` or ``"still terminating"``; ``evicted``
    lists the pods evicted before the time ran out. ``before``/``after`` say the same for the step record.
    """

    def __init__(
        self, node: str, timeout_s: float, pods_left: list[dict[str, Any]], evicted: list[dict[str, Any]]
    ) -> None:
        names = ", ".join(f"{p['namespace']}/{p['name']}" for p in pods_left[:10])
        more = f" and {len(pods_left) - 10} more" if len(pods_left) > 10 else ""
        super().__init__(
            f"drain of {node} did not finish within {timeout_s:g}s; {len(pods_left)} pods left: {names}{more}"
        )
        self.node = node
        self.timeout_s = timeout_s
        self.pods_left = pods_left
        self.evicted = evicted
        self.before: dict[str, Any] = {}
        self.after: dict[str, Any] = {"pods_left": pods_left, "evicted": evicted}


class _Conflict(KubeConflict):
    """One 409: our precondition lost to a concurrent writer (or the object already exists). Internal: the
    mutation re-reads and re-decides; only ``KubeConflict`` (writers kept winning) leaves the adapter."""


# --- small pure helpers -----------------------------------------------------------------------------


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(_meta(obj).get("annotations") or {})


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(_meta(obj).get("labels") or {})


def _taint_view(t: Mapping[str, Any]) -> dict[str, str]:
    return {"key": str(t.get("key", "")), "value": str(t.get("value") or ""), "effect": str(t.get("effect", ""))}


def _raw_taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(t) for t in (node.get("spec") or {}).get("taints") or []]


# What the adapter reads of a Node: the node cache keeps only this (client-go's informer transform), so a
# 100,000-node cache does not hold every node's image list (the kubelet reports up to 50 images, often half a
# node's JSON) and managedFields. Nothing here is written back: patches are merge patches of the fields they
# change, with the resourceVersion as precondition.
_NODE_FIELDS: dict[str, tuple[str, ...]] = {
    "metadata": ("name", "uid", "resourceVersion", "labels", "annotations", "creationTimestamp"),
    "spec": ("unschedulable", "taints", "providerID"),
    "status": ("conditions", "capacity", "allocatable", "nodeInfo"),  # conditions: type, status; nodeInfo: bootID
}


def slim_node(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` (a Node) with only the fields the adapter reads (``_NODE_FIELDS``), ``kind`` and
    ``apiVersion``; the node cache stores this."""
    out: dict[str, Any] = {k: raw[k] for k in ("apiVersion", "kind") if k in raw}
    for part, keys in _NODE_FIELDS.items():
        src = raw.get(part)
        if isinstance(src, Mapping):
            out[part] = {k: src[k] for k in keys if k in src}
    status = out.get("status")
    if status:  # of a condition its type and status are read, of nodeInfo the boot id
        if isinstance(status.get("conditions"), list):
            status["conditions"] = [{"type": c.get("type"), "status": c.get("status")}
                                    for c in status["conditions"] if isinstance(c, Mapping)]
        if isinstance(status.get("nodeInfo"), Mapping):
            status["nodeInfo"] = {k: v for k, v in status["nodeInfo"].items() if k == "bootID"}
    return out


def _unschedulable(node: Mapping[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def _quantity_to_int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def _controller_owner(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict)]
    for o in owners:
        if o.get("controller"):
            return o
    return owners[0] if owners else None


def _label_selector(selector: Mapping[str, Any] | None) -> str:
    """A ``LabelSelector`` object as the query-string form (``a=b,c in (d,e),!f``)."""
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def _status_message(data: bytes) -> str:
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return data[:200].decode("utf-8", "replace")
    if isinstance(body, dict):
        return str(body.get("message") or body.get("reason") or "")[:500]
    return ""


def _brief(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a pod summary that goes into audit records."""
    owner = pod.get("owner")
    return {
        "name": pod["name"],
        "namespace": pod["namespace"],
        "uid": pod.get("uid"),
        "owner": f"{owner['kind']}/{owner['name']}" if owner else None,
        "emptydir": bool(pod.get("emptydir")),
    }


def _label_value(text: str) -> str:
    """``text`` as a valid label (and taint) value: at most 63 of ``[A-Za-z0-9._-]``, alphanumeric ends."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63].strip("-._")


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _wall_clock() -> datetime:
    return datetime.now(UTC)


class _ThrottledHook:
    """The client library's ``refresh_api_key_hook`` run at most once per ``every_s``, one thread at a time.

    The library calls the hook before every request, and both loaders' hooks re-apply the whole
    configuration each time, the host included, whose setter re-reads the proxy settings from every
    environment variable: about a fifth of a request's CPU in a profile of ``GET node``, more in a pod with
    many service variables. The hook refreshes the token only when it is due, minutes before it expires, so
    skipping its runs within ``every_s`` of the last one sends no stale token. Each run installs a new hook
    (the loaders re-assign it); this one takes that as the hook it runs next and stays in place.
    """

    def __init__(self, hook: Callable[[Any], None], every_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hook = hook
        self.every_s = every_s
        self.runs = 0
        self._clock = clock
        self._last = float("-inf")
        self._lock = threading.Lock()

    def __call__(self, configuration: Any) -> None:
        with self._lock:
            now = self._clock()
            if now - self._last < self.every_s:
                return
            try:
                self.hook(configuration)
            finally:
                replaced = configuration.refresh_api_key_hook
                if replaced is not self:
                    if replaced is not None:
                        self.hook = replaced
                    configuration.refresh_api_key_hook = self
            self._last = now
            self.runs += 1


# --- the adapter ------------------------------------------------------------------------------------


class KubeAdapter:
    """Synchronous, thread-safe access to the Kubernetes API for the remediation steps.

    ``kubeconfig`` names a kubeconfig file; ``None`` tries the in-cluster service account, then the default
    kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``). ``clock``/``sleep`` (monotonic seconds),
    ``wall_clock`` (UTC stamps written into annotations and events) and ``rng`` (jitter) are injectable.
    """

    def __init__(
        self,
        kubeconfig: str | None = None,
        *,
        qps: float = 20.0,
        burst: int = 40,
        retry_budget_s: float = 60.0,
        taint_key: str = "gpu-remediator/quarantine",
        drain_timeout_s: float = 300.0,
        drain_grace_period_s: int | None = 30,
        conflict_attempts: int = 5,
        request_timeout_s: tuple[float, float] = (5.0, 30.0),
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 10.0,
        poll_interval_s: float = 1.0,
        page_size: int = 500,
        instance: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall_clock: Callable[[], datetime] = _wall_clock,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if retry_budget_s <= 0:
            raise ValueError("retry_budget_s must be positive")
        if conflict_attempts < 1:
            raise ValueError("conflict_attempts must be at least 1")
        self._api = self._load_client(kubeconfig, clock)
        self.limiter = LanedLimiter(qps, burst, clock=clock, sleep=sleep)
        self.node_cache: NodeCache | None = None  # start_node_cache: node reads from a list-then-watch
        self._retry_budget_s = float(retry_budget_s)
        self.taint_key = taint_key
        self._drain_timeout_s = float(drain_timeout_s)
        self._drain_grace_period_s = drain_grace_period_s
        self._conflict_attempts = conflict_attempts
        self._request_timeout = request_timeout_s
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._poll_interval_s = poll_interval_s
        self._page_size = page_size
        self._instance = instance or socket.gethostname()
        self._clock = clock
        self._sleep = sleep
        self._closed = threading.Event()  # close(): every wait of a worker thread ends, and no retry follows
        self._wall_clock = wall_clock
        self._rng = rng

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> KubeAdapter:
        """An adapter configured from ``Settings`` (kubeconfig, QPS/burst, retry budget, taint key, drain)."""
        kwargs: dict[str, Any] = {
            "qps": settings.kube_qps,
            "burst": settings.kube_burst,
            "retry_budget_s": settings.kube_retry_budget_s,
            "taint_key": settings.taint_key,
            "drain_timeout_s": settings.drain_timeout_s,
            "drain_grace_period_s": settings.drain_grace_period_s,
            "instance": settings.replica_id or None,
        }
        kwargs.update(overrides)
        adapter = cls(settings.kubeconfig, **kwargs)
        adapter.gpu_allocation = settings.gpu_allocation
        adapter.dra_driver = settings.dra_driver
        adapter.gpu_withdrawn_taint_key = settings.gpu_withdrawn_taint_key
        return adapter

    @staticmethod
    def _load_client(kubeconfig: str | None, clock: Callable[[], float] = time.monotonic) -> Any:
        cfg = k8s_client.Configuration()
        if kubeconfig is None:
            try:
                k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            except ConfigException:
                k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                    client_configuration=cfg, persist_config=False
                )
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=cfg, persist_config=False
            )
        # One retry layer per boundary (STYLE.md 4): ours, with a budget. urllib3's own retries stay off.
        cfg.retries = False
        if cfg.refresh_api_key_hook is not None:
            cfg.refresh_api_key_hook = _ThrottledHook(cfg.refresh_api_key_hook, CREDENTIAL_HOOK_EVERY_S, clock)
        return k8s_client.ApiClient(configuration=cfg)

    def close(self) -> None:
        """Stop the node cache, end every wait of a call in flight (retry backoffs, drain polls, the rate
        limit's queue: each raises ``KubeTemporaryError``, and no retry follows), and release the connection
        pool. Without it, a call retrying against an API server that is away held its worker thread, and
        the exit of its process, for up to ``retry_budget_s`` (60 s) after the stop."""
        self._closed.set()
        self.limiter.close()
        if self.node_cache is not None:
            self.node_cache.stop(timeout_s=0.0)
        self._api.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _token(self, lane_name: str) -> None:
        """One token of the rate limit in ``lane_name``; ``KubeTemporaryError`` once the adapter is closed."""
        try:
            self.limiter.acquire(lane_name)
        except LimiterClosed as e:
            raise KubeTemporaryError(str(e)) from e

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (the injected ``sleep``; the real one ends early when the adapter is closed);
        ``KubeTemporaryError`` when the adapter is closed."""
        if self._sleep is time.sleep:
            self._closed.wait(seconds)
        elif not self._closed.is_set():
            self._sleep(seconds)
        if self._closed.is_set():
            raise KubeTemporaryError("the Kubernetes adapter was closed (stopping): the call was abandoned")

    def ping(self, timeout_s: float = 3.0) -> None:
        """One ``GET /version`` within ``timeout_s``, outside the rate limit and never retried (readiness:
        every authenticated identity may read it). Raises ``KubeError`` saying what went wrong."""
        m, url, hdrs, payload, _ = self._api.param_serialize(
            method="GET", resource_path="/version", header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        try:
            resp = self._api.call_api(m, url, header_params=hdrs, body=payload,
                                      _request_timeout=(timeout_s, timeout_s))
            resp.read()
        except ApiException as e:
            raise KubeTemporaryError(f"GET /version: {e.reason}") from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeTemporaryError(f"GET /version: {type(e).__name__}: {e}") from e
        if not 200 <= int(resp.status) < 300:
            raise KubeTemporaryError(f"GET /version: {resp.status}", status=int(resp.status))

    def __enter__(self) -> KubeAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the one request path ------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        kind: str = "",
        name: str = "",
        namespace: str | None = None,
        no_retry: frozenset[int] = frozenset(),
    ) -> dict[str, Any]:
        """Send one API request under the rate limit and the retry policy; return the JSON body.

        ``no_retry`` lists statuses the caller handles itself (the drain handles PDB 429s on its own
        clock); 409 is never retried here.
        """
        budget = self._retry_budget_s
        start = self._clock()
        what = f"{kind or 'object'} {namespace + '/' if namespace else ''}{name}".strip()

        request_lane = current_lane(method)

        def attempt() -> dict[str, Any]:
            self._token(request_lane)
            headers = {"Accept": "application/json"}
            if body is not None:
                headers["Content-Type"] = content_type
            m, url, hdrs, payload, _ = self._api.param_serialize(
                method=method,
                resource_path=path,
                query_params=list(query.items()) if query else None,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            try:
                resp = self._api.call_api(
                    m, url, header_params=hdrs, body=payload, _request_timeout=self._request_timeout
                )
                data: bytes = resp.read() or b""
            except ApiException as e:  # the client wraps TLS failures as status 0
                raise KubeTemporaryError(f"{method} {path}: {e.reason}") from e
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise KubeTemporaryError(f"{method} {path}: {type(e).__name__}: {e}") from e
            status = int(resp.status)
            if 200 <= status < 300:
                if not data:
                    return {}
                try:
                    parsed = json.loads(data)
                except ValueError as e:
                    raise KubeTemporaryError(f"{method} {path}: answer is not JSON", status=status) from e
                return parsed if isinstance(parsed, dict) else {"items": parsed}
            message = f"{method} {path}: {status} {_status_message(data)}".rstrip()
            if status == 404:
                raise NotFound(f"{what} not found ({message})", kind=kind, name=name, namespace=namespace)
            if status == 409:
                raise _Conflict(message, status=409)
            if status in (408, 429) or (status >= 500 and status != 501):
                raise KubeTemporaryError(
                    message, status=status, retry_after=self._retry_after(resp.headers, data)
                )
            raise KubePermanentError(message, status=status)

        def retryable(exc: BaseException) -> bool:
            return (
                isinstance(exc, KubeTemporaryError)
                and not isinstance(exc, _Conflict)
                and (exc.status is None or exc.status not in no_retry)
            )

        def stop(state: RetryCallState) -> bool:
            return self._closed.is_set() or (self._clock() - start) + state.upcoming_sleep > budget

        retrying = Retrying(
            retry=retry_if_exception(retryable),
            stop=stop,
            wait=self._wait,
            sleep=self._pause,
            reraise=False,
        )
        try:
            return retrying(attempt)
        except RetryError as e:
            last = e.last_attempt.exception()
            assert isinstance(last, KubeTemporaryError)
            raise KubeTemporaryError(
                f"{last} (gave up after {e.last_attempt.attempt_number} attempts, "
                f"{self._clock() - start:.1f}s of a {budget:g}s budget)",
                status=last.status,
                retry_after=last.retry_after,
            ) from last

    def _backoff(self, attempt: int, base: float | None = None, cap: float | None = None) -> float:
        base = self._backoff_base_s if base is None else base
        cap = self._backoff_max_s if cap is None else cap
        ceiling: float = min(cap, base * (2 ** max(0, attempt - 1)))
        return ceiling * (0.5 + 0.5 * self._rng())  # "equal jitter": never zero, never above the ceiling

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, KubeTemporaryError) and exc.retry_after is not None:
            return exc.retry_after + min(1.0, 0.1 * exc.retry_after) * self._rng()
        return self._backoff(state.attempt_number)

    def _retry_after(self, headers: Any, data: bytes) -> float | None:
        value = headers.get("Retry-After") if headers is not None else None
        if value:
            try:
                return max(0.0, float(value))
            except ValueError:
                pass
            try:
                when = parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                return max(0.0, (when - self._wall_clock()).total_seconds())
        try:
            details = json.loads(data).get("details") or {}
            seconds = details.get("retryAfterSeconds")
        except (ValueError, AttributeError, UnicodeDecodeError):
            return None
        return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None

    def _list(self, path: str, query: Mapping[str, str | int] | None = None, **what: Any) -> list[dict[str, Any]]:
        """All items of a list call, following ``continue`` tokens."""
        items: list[dict[str, Any]] = []
        params: dict[str, str | int] = dict(query or {})
        params.setdefault("limit", self._page_size)
        while True:
            page = self._request("GET", path, query=params, **what)
            items.extend(i for i in page.get("items") or [] if isinstance(i, dict))
            token = _meta(page).get("continue")
            if not token:
                return items
            params["continue"] = token

    # --- identity: TokenReview (the agents' ServiceAccount tokens) --------------------------------------

    def review_token(self, token: str, audiences: Sequence[str]) -> dict[str, Any]:
        """The ``status`` of an authentication.k8s.io/v1 TokenReview of ``token`` for ``audiences``
        (``authenticated``, ``user`` with ``extra``, ``error``). The token is never logged."""
        body = {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                "spec": {"token": token, "audiences": list(audiences)}}
        answer = self._request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body, kind="TokenReview")
        status = answer.get("status")
        return dict(status) if isinstance(status, dict) else {}

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """One pod as the API returns it (``NotFound`` when there is none)."""
        return self._request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}", kind="Pod", name=name,
                             namespace=namespace)

    # --- nodes ---------------------------------------------------------------------------------------

    def _raw_node(self, name: str, *, live: bool = False) -> dict[str, Any]:
        """The node from the node cache when it is synced and holds it (a copy), else (and with ``live``)
        from the API server."""
        cache = self.node_cache
        if not live and cache is not None and cache.synced:
            held = cache.get(name)
            if held is not None:
                return copy.deepcopy(held)
        raw = self._request("GET", f"/api/v1/nodes/{name}", kind="Node", name=name)
        if cache is not None:
            cache.observe(raw)
        return raw

    # --- the node cache ------------------------------------------------------------------------------

    def start_node_cache(self, *, resync_s: float = 300.0, watch_timeout_s: float = 60.0) -> NodeCache:
        """Start serving node reads from memory (``remediator.adapters.nodecache``: list, then watch, with
        410-Gone relists and a full resync every ``resync_s``); idempotent. Mutations keep their
        ``resourceVersion`` precondition and re-read from the API server after a conflict."""
        if self.node_cache is None:
            index = PoolIndex(self._node_summary, self._is_gpu_node, self.taint_key)
            self.node_cache = NodeCache(self._node_snapshot, self._node_events, resync_s=resync_s,
                                        watch_timeout_s=watch_timeout_s, clock=self._clock,
                                        transform=slim_node, index=index).start()
        return self.node_cache

    def _node_snapshot(self, transform: Transform = dict) -> tuple[list[dict[str, Any]], str]:
        """Every node, through ``transform`` page by page, and the list's resourceVersion (one snapshot across
        pages): the node cache's lister."""
        items: list[dict[str, Any]] = []
        params: dict[str, str | int] = {"limit": self._page_size}
        rv = ""
        while True:
            page = self._request("GET", "/api/v1/nodes", query=params, kind="NodeList")
            # transformed (slimmed, for the cache) page by page: a 100,000-node list never sits in memory whole
            items.extend(transform(i) for i in page.get("items") or [] if isinstance(i, dict))
            rv = rv or str(_meta(page).get("resourceVersion") or "")
            token = _meta(page).get("continue")
            if not token:
                return items, rv
            params["continue"] = token

    def _node_events(self, resource_version: str, timeout_s: float) -> Iterator[dict[str, Any]]:
        """The events of one node watch from ``resource_version`` (bookmarks asked for), until the server
        ends it; a non-200 answer is one ``ERROR`` event, a broken stream ends it with ``KubeTemporaryError``."""
        self._token(current_lane("GET"))
        query = [("watch", "1"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", max(1, int(timeout_s)))]
        m, url, hdrs, payload, _ = self._api.param_serialize(
            method="GET", resource_path="/api/v1/nodes", query_params=query,
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        try:
            resp = self._api.call_api(m, url, header_params=hdrs, body=payload,
                                      _request_timeout=(self._request_timeout[0], timeout_s + 10.0))
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeTemporaryError(f"watch nodes: {e}") from e
        raw = resp.response
        try:
            if int(resp.status) != 200:
                yield {"type": "ERROR", "object": {"code": int(resp.status), "message": _status_message(raw.read())}}
                return
            buf = b""
            for chunk in raw.stream(65536):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        if isinstance(event, dict):
                            yield event
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise KubeTemporaryError(f"watch nodes: {type(e).__name__}: {e}") from e
        finally:
            raw.close()

    @staticmethod
    def _node_summary(raw: Mapping[str, Any]) -> dict[str, Any]:
        meta = _meta(raw)
        status = raw.get("status") or {}
        labels = _labels(raw)
        conditions = {
            str(c["type"]): str(c.get("status", "Unknown"))
            for c in status.get("conditions") or []
            if isinstance(c, dict) and "type" in c
        }
        capacity = status.get("capacity") or {}
        allocatable = status.get("allocatable") or {}
        return {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resource_version": meta.get("resourceVersion"),
            "labels": labels,
            "annotations": _annotations(raw),
            "taints": [_taint_view(t) for t in _raw_taints(raw)],
            "unschedulable": _unschedulable(raw),
            "pool": labels.get(POOL_LABEL) or DEFAULT_POOL,
            "opted_out": labels.get(OPT_OUT_LABEL, "").lower() == "true",
            "conditions": conditions,
            "ready": conditions.get("Ready") == "True",
            # With DRA there is no nvidia.com/gpu capacity: GPU Feature Discovery's count label says how
            # many GPUs the node has, and the GPUs we withdrew (our annotation) are the ones not allocatable.
            "gpus": _quantity_to_int(capacity.get(GPU_RESOURCE)) if GPU_RESOURCE in capacity
            else _quantity_to_int(labels.get("nvidia.com/gpu.count")),
            "gpus_allocatable": _quantity_to_int(allocatable.get(GPU_RESOURCE)) if GPU_RESOURCE in capacity
            else max(0, _quantity_to_int(labels.get("nvidia.com/gpu.count"))
                     - len(KubeAdapter._withdrawn(raw))),
            "boot_id": str((status.get("nodeInfo") or {}).get("bootID") or "") or None,
        }

    @staticmethod
    def _is_gpu_node(raw: Mapping[str, Any]) -> bool:
        status = raw.get("status") or {}
        labels = _labels(raw)
        return (
            _quantity_to_int((status.get("capacity") or {}).get(GPU_RESOURCE)) > 0
            or _quantity_to_int((status.get("allocatable") or {}).get(GPU_RESOURCE)) > 0
            or labels.get("nvidia.com/gpu.present", "").lower() == "true"
            or _quantity_to_int(labels.get("nvidia.com/gpu.count")) > 0
            or POOL_LABEL in labels
        )

    def get_node(self, name: str) -> dict[str, Any]:
        """A node summary: ``name, uid, resource_version, labels, annotations, taints [{key, value,
        effect}], unschedulable, pool, opted_out, conditions {type: status}, ready, gpus,
        gpus_allocatable, boot_id`` (``status.nodeInfo.bootID``, None when unset). Raises ``NotFound``."""
        return self._node_summary(self._raw_node(name))

    def find_node(self, name: str) -> dict[str, Any] | None:
        """The node summary of ``get_node``, or ``None`` when there is no node of that name."""
        try:
            return self.get_node(name)
        except NotFound:
            return None

    def cached_node(self, name: str) -> dict[str, Any] | None:
        """The summary of ``get_node`` from the node cache alone: None when the cache is not synced or does not
        hold the node (then only ``get_node`` can say). Memory only, never a request: safe on the event loop.
        The summary is built of copies, so the stored object needs none."""
        cache = self.node_cache
        if cache is None or not cache.synced:
            return None
        held = cache.get(name)
        return self._node_summary(held) if held is not None else None

    def list_gpu_nodes(self, pool: str | None = None) -> list[dict[str, Any]]:
        """Summaries of the GPU nodes (``nvidia.com/gpu`` capacity, the GPU operator's labels, or our pool
        label), optionally only those of one pool; nodes without a pool label are in ``"default"``."""
        cache = self.node_cache
        raws = cache.nodes() if cache is not None and cache.synced else self._list("/api/v1/nodes", kind="NodeList")
        nodes = [self._node_summary(n) for n in raws if self._is_gpu_node(n)]
        if pool is not None:
            nodes = [n for n in nodes if n["pool"] == pool]
        return sorted(nodes, key=lambda n: str(n["name"]))

    def cached_pool_view(self, pool: str) -> PoolView | None:
        """The pool as the node cache's index holds it (``remediator.adapters.pool_index``), None when the cache
        is not synced. Memory only, in time proportional to the pool's notable nodes: safe on the event loop."""
        cache = self.node_cache
        if cache is None or not cache.synced or not isinstance(cache.index, PoolIndex):
            return None
        return cache.index.view(pool)

    def pool_view(self, pool: str) -> PoolView:
        """The pool as the budget guard reads it: from the node cache's index, else from a list of the nodes."""
        cached = self.cached_pool_view(pool)
        return cached if cached is not None else PoolView.of(pool, self.list_gpu_nodes(pool), self.taint_key)

    def node_names(self) -> frozenset[str]:
        """The names of every node of the cluster: the node cache's when it is synced, else one list."""
        cache = self.node_cache
        if cache is not None and cache.synced:
            return cache.names()
        return frozenset(str(_meta(n).get("name")) for n in self._list("/api/v1/nodes", kind="NodeList"))

    def wait_node_change(self, resource_version: str | None, timeout_s: float,
                         names: Collection[str] | None = None) -> str | None:
        """Block until a node changes after ``resource_version`` or ``timeout_s`` passes; returns the token to
        wait from next. ``None`` in: the current one, at once. ``None`` out: the watch could not continue
        (410 Gone, an error event, a broken stream): start again from ``None``. Used by
        ``remediator.reconciler``, which re-reads the nodes it cares about after each change.

        With the node cache synced it waits on the cache (``NodeCache.wait_changed``: tokens ``cache:N``), for a
        change to one of ``names`` (any node: ``None``), and sends no request. Without it, one ``watch``
        request on nodes, ended at its first event on any node (``names`` cannot narrow it); a token of the
        other kind is answered at once with a current one of this kind."""
        cache = self.node_cache
        if cache is not None and cache.synced:
            if resource_version is None or not resource_version.startswith(_CACHE_TOKEN):
                return f"{_CACHE_TOKEN}{cache.generation}"
            after = int(resource_version.removeprefix(_CACHE_TOKEN))
            return f"{_CACHE_TOKEN}{cache.wait_changed(after, names, timeout_s)}"
        if resource_version is not None and resource_version.startswith(_CACHE_TOKEN):
            resource_version = None
        if resource_version is None:
            page = self._request("GET", "/api/v1/nodes", query={"limit": 1}, kind="NodeList")
            return str(_meta(page).get("resourceVersion") or "") or None
        self._token(current_lane("GET"))
        query = [("watch", "1"), ("resourceVersion", resource_version),
                 ("timeoutSeconds", max(1, int(timeout_s))), ("allowWatchBookmarks", "false")]
        m, url, hdrs, payload, _ = self._api.param_serialize(
            method="GET", resource_path="/api/v1/nodes", query_params=query,
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        try:
            resp = self._api.call_api(m, url, header_params=hdrs, body=payload,
                                      _request_timeout=(self._request_timeout[0], timeout_s + 5.0))
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeTemporaryError(f"watch nodes: {e}") from e
        raw = resp.response
        try:
            if int(resp.status) != 200:
                return None
            buf = b""
            for chunk in raw.stream(4096):
                buf += chunk
                if b"\n" in buf:
                    line = buf.split(b"\n", 1)[0]
                    event = json.loads(line)
                    if event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
                        return None
                    return str(_meta(event.get("object") or {}).get("resourceVersion") or "") or None
            return resource_version  # timed out with no change
        except (urllib3.exceptions.HTTPError, OSError, ValueError):
            return None
        finally:
            raw.close()

    def node_pool(self, name: str) -> str:
        """The node's pool (label ``gpu-remediator.io/pool``, else ``"default"``)."""
        return str(self.get_node(name)["pool"])

    def count_out_of_service(self, pool: str) -> tuple[int, int]:
        """``(out, total)`` GPU nodes of ``pool``; out = cordoned or carrying our taint key."""
        nodes = self.list_gpu_nodes(pool)
        out = sum(
            1 for n in nodes if n["unschedulable"] or any(t["key"] == self.taint_key for t in n["taints"])
        )
        return out, len(nodes)

    def _mutate_node(
        self,
        name: str,
        decide: Callable[[dict[str, Any]], tuple[dict[str, Any] | None, str]],
    ) -> tuple[dict[str, Any], dict[str, Any], bool, str]:
        """Read, decide, patch with a ``resourceVersion`` precondition; on 409 re-read and re-decide.

        ``decide`` returns a merge patch (or ``None``: nothing to do) and a detail line. Returns
        ``(before, after, changed, detail)`` as raw node objects.
        """
        for attempt in range(1, self._conflict_attempts + 1):
            raw = self._raw_node(name, live=attempt > 1)  # the cache, then after a conflict the API server
            patch, detail = decide(raw)
            if patch is None:
                return raw, raw, False, detail
            rv = _meta(raw).get("resourceVersion")
            if rv:
                patch.setdefault("metadata", {})["resourceVersion"] = rv
            try:
                after = self._request(
                    "PATCH", f"/api/v1/nodes/{name}", body=patch, content_type=MERGE_PATCH, kind="Node", name=name
                )
            except _Conflict:
                log.info("node %s changed under us (attempt %d); re-reading", name, attempt)
                continue
            if self.node_cache is not None:
                self.node_cache.observe(after)  # our own write is seen before its watch event arrives
            return raw, after, True, detail
        raise KubeConflict(
            f"node {name}: concurrent writers won {self._conflict_attempts} times in a row; try again later",
            status=409,
        )

    @staticmethod
    def _node_state(raw: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "taints": [_taint_view(t) for t in _raw_taints(raw)],
            "unschedulable": _unschedulable(raw),
            "cordoned_by_us": CORDONED_BY_US_ANNOTATION in _annotations(raw),
        }

    def taint(self, node: str, key: str, value: str, effect: str = "NoSchedule") -> Change:
        """Add the taint ``key=value:effect``, keeping every other taint.

        A taint with the same key and effect already there means nothing to do (``changed=False``), even
        with another value: it is then someone else's, and it is left as it is (``detail`` says so).
        """
        if effect not in TAINT_EFFECTS:
            raise KubePermanentError(f"unknown taint effect {effect!r}")

        def decide(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
            return self._taint_patch(node, raw, key, value, effect)

        before, after, changed, detail = self._mutate_node(node, decide)
        return Change(changed, self._node_state(before), self._node_state(after), detail)

    def _taint_patch(self, node: str, raw: Mapping[str, Any], key: str, value: str,
                     effect: str) -> tuple[dict[str, Any] | None, str]:
        taints = _raw_taints(raw)
        for t in taints:
            if t.get("key") == key and t.get("effect") == effect:
                have = str(t.get("value") or "")
                if have == value:
                    return None, f"{node} already has taint {key}={value}:{effect}"
                return None, f"{node} already has taint {key}:{effect} with value {have!r} (not ours); left"
        new: dict[str, Any] = {"key": key, "value": value, "effect": effect}
        if effect == "NoExecute":
            new["timeAdded"] = _iso(self._wall_clock())
        return {"spec": {"taints": [*taints, new]}}, f"tainted {node} with {key}={value}:{effect}"

    def _cordon_patch(self, node: str, raw: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
        if _unschedulable(raw):
            return None, f"{node} was already cordoned"
        patch = {
            "spec": {"unschedulable": True},
            "metadata": {"annotations": {CORDONED_BY_US_ANNOTATION: _iso(self._wall_clock())}},
        }
        return patch, f"cordoned {node}"

    def quarantine(self, node: str, key: str, value: str, effect: str = "NoSchedule") -> tuple[Change, Change]:
        """``taint`` and ``cordon`` in one request, in the limiter's ``quarantine`` lane (served before every
        queued drain and read): one read of the node and one merge PATCH carrying the taint list and
        ``spec.unschedulable`` with the node's ``resourceVersion`` as a precondition (a concurrent writer
        makes it fail with 409, and both are re-decided on a fresh read). Returns the two ``Change``s as
        ``taint`` and ``cordon`` would have (each ``changed`` only when its part was in the patch; a part
        already in place, or someone else's taint under our key, is left as those methods leave it)."""
        if effect not in TAINT_EFFECTS:
            raise KubePermanentError(f"unknown taint effect {effect!r}")
        parts: dict[str, tuple[bool, str]] = {}

        def decide(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
            taint, taint_detail = self._taint_patch(node, raw, key, value, effect)
            cordon, cordon_detail = self._cordon_patch(node, raw)
            parts["taint"] = (taint is not None, taint_detail)
            parts["cordon"] = (cordon is not None, cordon_detail)
            if taint is None and cordon is None:
                return None, f"{taint_detail}; {cordon_detail}"
            patch: dict[str, Any] = {"spec": {**(taint or {}).get("spec", {}), **(cordon or {}).get("spec", {})}}
            if cordon is not None:
                patch["metadata"] = dict(cordon["metadata"])
            return patch, f"{taint_detail}; {cordon_detail}"

        with lane("quarantine"):
            before, after, _changed, _detail = self._mutate_node(node, decide)
        b, a = self._node_state(before), self._node_state(after)
        return (Change(parts["taint"][0], b, a, parts["taint"][1]),
                Change(parts["cordon"][0], b, a, parts["cordon"][1]))

    def untaint(
        self, node: str, key: str, effect: str | None = "NoSchedule", *, only_if_value: str | None = None
    ) -> Change:
        """Remove the taint ``key:effect`` (any effect when ``effect`` is None).

        With ``only_if_value`` only a taint carrying that value is removed, so returning a node to service
        never removes a taint someone else set under the same key.
        """

        def matches(t: Mapping[str, Any]) -> bool:
            return t.get("key") == key and (effect is None or t.get("effect") == effect)

        def decide(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
            taints = _raw_taints(raw)
            hits = [t for t in taints if matches(t)]
            if not hits:
                return None, f"{node} has no taint {key}:{effect or '*'}"
            ours = [t for t in hits if only_if_value is None or str(t.get("value") or "") == only_if_value]
            if not ours:
                values = sorted({str(t.get("value") or "") for t in hits})
                return None, f"{node} taint {key} has value {values} not {only_if_value!r} (not ours); left"
            keep = [t for t in taints if not any(t is o for o in ours)]
            return {"spec": {"taints": keep}}, f"removed taint {key}:{effect or '*'} from {node}"

        before, after, changed, detail = self._mutate_node(node, decide)
        return Change(changed, self._node_state(before), self._node_state(after), detail)

    def cordon(self, node: str) -> Change:
        """Mark the node unschedulable. ``before["unschedulable"]`` records whether it already was; when we
        cordon, a ``gpu-remediator.io/cordoned-at`` annotation marks the cordon as ours."""

        def decide(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
            return self._cordon_patch(node, raw)

        before, after, changed, detail = self._mutate_node(node, decide)
        return Change(changed, self._node_state(before), self._node_state(after), detail)

    def uncordon(self, node: str, *, only_if_ours: bool = False) -> Change:
        """Make the node schedulable again. With ``only_if_ours`` a cordon we did not set is left alone."""

        def decide(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
            ours = CORDONED_BY_US_ANNOTATION in _annotations(raw)
            if not _unschedulable(raw):
                return None, f"{node} was not cordoned"
            if only_if_ours and not ours:
                return None, f"{node} was cordoned by someone else; left cordoned"
            patch: dict[str, Any] = {"spec": {"unschedulable": False}}
            if ours:
                patch["metadata"] = {"annotations": {CORDONED_BY_US_ANNOTATION: None}}
            return patch, f"uncordoned {node}"

        before, after, changed, detail = self._mutate_node(node, decide)
        return Change(changed, self._node_state(before), self._node_state(after), detail)

    def annotate(self, node: str, annotations: Mapping[str, str | None]) -> Change:
        """Set (or, for ``None``, remove) node annotations; ``before``/``after`` show only those keys."""

        def decide(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
            have = _annotations(raw)
            diff = {k: v for k, v in annotations.items() if have.get(k) != v}
            if not diff:
                return None, f"{node} annotations already as asked"
            return {"metadata": {"annotations": diff}}, f"annotated {node}: {', '.join(sorted(diff))}"

        before, after, changed, detail = self._mutate_node(node, decide)
        keys = list(annotations)
        return Change(
            changed,
            {"annotations": {k: _annotations(before).get(k) for k in keys}},
            {"annotations": {k: _annotations(after).get(k) for k in keys}},
            detail,
        )

    def label(self, node: str, labels: Mapping[str, str | None]) -> Change:
        """Set (or, for ``None``, remove) node labels; ``before``/``after`` show only those keys."""

        def decide(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
            have = _labels(raw)
            diff = {k: v for k, v in labels.items() if have.get(k) != v}
            if not diff:
                return None, f"{node} labels already as asked"
            return {"metadata": {"labels": diff}}, f"labelled {node}: " + ", ".join(
                f"{k}={'<removed>' if v is None else v}" for k, v in sorted(diff.items()))

        before, after, changed, detail = self._mutate_node(node, decide)
        keys = list(labels)
        return Change(
            changed,
            {"labels": {k: _labels(before).get(k) for k in keys}},
            {"labels": {k: _labels(after).get(k) for k in keys}},
            detail,
        )

    # --- pods ----------------------------------------------------------------------------------------

    @staticmethod
    def _pod_summary(raw: Mapping[str, Any]) -> dict[str, Any]:
        meta = _meta(raw)
        spec = raw.get("spec") or {}
        annotations = _annotations(raw)
        owner = _controller_owner(meta)
        owner_view = (
            {
                "kind": str(owner.get("kind", "")),
                "name": str(owner.get("name", "")),
                "api_version": str(owner.get("apiVersion", "")),
                "uid": owner.get("uid"),
            }
            if owner
            else None
        )
        return {
            "name": str(meta.get("name", "")),
            "namespace": str(meta.get("namespace", "")),
            "uid": meta.get("uid"),
            "node": spec.get("nodeName"),
            "phase": (raw.get("status") or {}).get("phase"),
            "labels": _labels(raw),
            "annotations": annotations,
            "owner": owner_view,
            "terminating": bool(meta.get("deletionTimestamp")),
            "daemonset": bool(owner_view and owner_view["kind"] == "DaemonSet"),
            "mirror": MIRROR_POD_ANNOTATION in annotations,
            "emptydir": any("emptyDir" in (v or {}) for v in spec.get("volumes") or []),
            "created": meta.get("creationTimestamp"),
        }

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        """Every pod bound to ``node``: ``name, namespace, uid, node, phase, labels, annotations, owner
        {kind, name, api_version, uid} | None, terminating, daemonset, mirror, emptydir,
        created``."""
        raw = self._list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"}, kind="PodList")
        # Field selectors are the server's job; checking again costs nothing and guards a lax server.
        pods = [self._pod_summary(p) for p in raw if (p.get("spec") or {}).get("nodeName") == node]
        return sorted(pods, key=lambda p: (p["namespace"], p["name"]))

    def job_of_pod_on_node(self, node: str, namespace: str, name: str) -> JobRef | None:
        """``job_of_pod`` of pod ``namespace/name`` when it is bound to ``node``, from one GET of that pod (not a
        list of the node's pods); None when there is no such pod on the node. A pod with no owner is
        ``JobRef(kind="Pod")``, as ``job_of_pod`` says. A node daemon's pod, never a job, says which it is:
        ``JobRef(kind="DaemonSet")`` naming its DaemonSet, ``JobRef(kind="Node")`` for a mirror pod."""
        try:
            raw = self.read_pod(namespace, name)
        except NotFound:
            return None
        if (raw.get("spec") or {}).get("nodeName") != node:
            return None
        summary = self._pod_summary(raw)
        owner = summary["owner"]
        if summary["daemonset"] and owner:
            return JobRef("DaemonSet", owner["name"], summary["namespace"], owner["api_version"] or "apps/v1",
                          owner.get("uid"))
        if summary["mirror"]:
            return JobRef("Node", node, summary["namespace"], "v1")
        return self.job_of_pod(summary)

    def daemon_pod_node(self, namespace: str, name: str) -> str | None:
        """The node pod ``namespace/name`` runs on when it is a DaemonSet's pod (a node daemon: dcgm-exporter),
        from one GET of the pod; None when there is no such pod, it is not a DaemonSet's, or it is not bound."""
        try:
            raw = self.read_pod(namespace, name)
        except NotFound:
            return None
        summary = self._pod_summary(raw)
        return str(summary["node"]) if summary["daemonset"] and summary["node"] else None

    def daemon_pods_at(self, ip: str) -> list[tuple[str, str, str]]:
        """``(namespace, name, node)`` of each bound, live DaemonSet pod whose pod IP is ``ip``, from one list
        of pods with the field selector ``status.podIP`` (which a real API server supports for pods). The
        exporter of an alert from a scrape without Kubernetes labels is known only by that address."""
        raw = self._list("/api/v1/pods", {"fieldSelector": f"status.podIP={ip}"}, kind="PodList")
        out = []
        for p in raw:
            if (p.get("status") or {}).get("podIP") != ip:  # the selector is the server's job; a lax one is not
                continue
            s = self._pod_summary(p)
            if s["daemonset"] and s["node"] and not s["terminating"] and s["phase"] not in ("Succeeded", "Failed"):
                out.append((str(s["namespace"]), str(s["name"]), str(s["node"])))
        return sorted(out)

    def pods_selecting(self, node: str, label_keys: Sequence[str]) -> list[dict[str, Any]]:
        """The pods on ``node`` whose ``spec.nodeSelector`` names one of ``label_keys`` (the GPU Operator's
        operand DaemonSets select nodes by ``nvidia.com/gpu.deploy.<operand>``, and their pods carry the
        template's selector): ``pods_on_node``'s summaries plus ``node_selector``."""
        keys = set(label_keys)
        raw = self._list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"}, kind="PodList")
        out = []
        for p in raw:
            spec = p.get("spec") or {}
            selector = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
            if spec.get("nodeName") == node and keys & set(selector):
                out.append({**self._pod_summary(p), "node_selector": selector})
        return sorted(out, key=lambda p: (p["namespace"], p["name"]))

    def job_of_pod(self, pod: Mapping[str, Any]) -> JobRef | None:
        """The controller whose gang a pod belongs to, or ``None`` for DaemonSet and mirror pods.

        Takes a summary from ``pods_on_node`` (or a raw pod object). Owner references win; the labels
        fill in when there is none, in ``contracts.JOB_LABELS`` order: ``training.kubeflow.org/job-name``
        (PyTorchJob), ``jobset.sigs.k8s.io/jobset-name`` (JobSet), ``batch.kubernetes.io/job-name`` /
        ``job-name`` (batch Job). A ReplicaSet owned by a Deployment resolves to the Deployment, a Job owned
        by a JobSet to the JobSet (one read each). A pod with no owner at all is ``JobRef(kind="Pod")``:
        itself, never a job guessed from its name.
        """
        summary = self._pod_summary(pod) if "metadata" in pod else dict(pod)
        if summary.get("mirror") or summary.get("daemonset"):
            return None
        ns, labels, owner = summary["namespace"], summary.get("labels") or {}, summary.get("owner")
        if owner:
            kind, name, api_version, uid = owner["kind"], owner["name"], owner["api_version"], owner.get("uid")
            if kind == "Node":  # a static pod reported through its mirror
                return None
            if kind == "ReplicaSet":
                try:
                    rs = self._request(
                        "GET", f"/apis/apps/v1/namespaces/{ns}/replicasets/{name}",
                        kind="ReplicaSet", name=name, namespace=ns,
                    )
                except NotFound:
                    return JobRef("ReplicaSet", name, ns, api_version or "apps/v1", uid)
                rs_owner = _controller_owner(_meta(rs))
                if rs_owner and rs_owner.get("kind") == "Deployment":
                    return JobRef("Deployment", str(rs_owner["name"]), ns, "apps/v1", rs_owner.get("uid"))
                return JobRef("ReplicaSet", name, ns, api_version or "apps/v1", uid)
            if kind == "Job" and labels.get(JOBSET_NAME_LABEL):
                # A JobSet's Jobs are one gang: the JobSet is what restarts (one read to confirm the owner).
                try:
                    job = self._request(
                        "GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}", kind="Job", name=name, namespace=ns,
                    )
                except NotFound:
                    return JobRef("Job", name, ns, api_version or "batch/v1", uid)
                job_owner = _controller_owner(_meta(job))
                if job_owner and job_owner.get("kind") == "JobSet":
                    return JobRef("JobSet", str(job_owner["name"]), ns, str(job_owner.get("apiVersion") or JOBSET_API),
                                  job_owner.get("uid"))
            return JobRef(kind, name, ns, api_version, uid)
        if labels.get(KUBEFLOW_JOB_LABEL):
            return JobRef("PyTorchJob", labels[KUBEFLOW_JOB_LABEL], ns, "kubeflow.org/v1")
        if labels.get(JOBSET_NAME_LABEL):
            return JobRef("JobSet", labels[JOBSET_NAME_LABEL], ns, JOBSET_API)
        for label in BATCH_JOB_LABELS:
            if labels.get(label):
                return JobRef("Job", labels[label], ns, "batch/v1")
        return JobRef("Pod", summary["name"], ns, "v1", summary.get("uid"))

    def find_job(
        self,
        node: str,
        *,
        name: str | None = None,
        namespace: str | None = None,
        pod_filter: Callable[[dict[str, Any]], bool] | None = None,
    ) -> JobRef | None:
        """The controller of a job that runs on ``node``: job discovery for ``restart_job``.

        With ``name`` (the job as ``contracts.resolve_job`` names it, in ``namespace`` when known): the
        controller of a pod on the node whose controller has that name, or whose job label
        (``contracts.JOB_LABELS``) says it; else, when no pod on the node belongs to it any more, the
        PyTorchJob, batch Job or JobSet of that name in ``namespace`` (``"default"`` when unknown), first
        found in that order. Without ``name``: the one job the node's workload pods (those ``pod_filter``
        accepts, e.g. the pods on one GPU) belong to. ``None`` when there is no such job, or when the node
        runs several and nothing says which. DaemonSet and mirror pods are never a job.
        """
        candidates = [p for p in self.pods_on_node(node) if not p["daemonset"] and not p["mirror"]]
        if name is None:
            if pod_filter is not None:
                candidates = [p for p in candidates if pod_filter(p)]
            jobs = {j.key: j for j in (self.job_of_pod(p) for p in candidates) if j is not None}
            return next(iter(jobs.values())) if len(jobs) == 1 else None
        for p in candidates:
            if namespace is not None and p["namespace"] != namespace:
                continue
            labelled = any(p["labels"].get(label) == name for label in JOB_LABELS)
            j = self.job_of_pod(p)
            if j is not None and (j.name == name or labelled):
                return j
        ns = namespace or "default"
        for kind in ("PyTorchJob", "Job", "JobSet"):
            api_version = _CONTROLLERS[kind][0]
            ref = JobRef(kind, name, ns, api_version)
            try:
                obj = self._request("GET", self._object_path(ref), kind=kind, name=name, namespace=ns)
            except NotFound:
                continue
            return JobRef(kind, name, ns, api_version, _meta(obj).get("uid"))
        return None

    # --- eviction and drain --------------------------------------------------------------------------

    def _evict(self, pod: Mapping[str, Any], grace_period_s: int | None) -> None:
        """POST the pod's ``eviction`` subresource (policy/v1 Eviction, as ``create_namespaced_pod_eviction``).

        The pod's UID is a precondition, so a replacement that took the same name is never evicted.
        """
        delete_options: dict[str, Any] = {}
        if pod.get("uid"):
            delete_options["preconditions"] = {"uid": pod["uid"]}
        if grace_period_s is not None:
            delete_options["gracePeriodSeconds"] = grace_period_s
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod["name"], "namespace": pod["namespace"]},
            "deleteOptions": delete_options,
        }
        self._request(
            "POST",
            f"/api/v1/namespaces/{pod['namespace']}/pods/{pod['name']}/eviction",
            body=body,
            kind="Pod",
            name=pod["name"],
            namespace=pod["namespace"],
            no_retry=frozenset({429}),
        )

    def drain(
        self,
        node: str,
        *,
        timeout_s: float | None = None,
        grace_period_s: int | None = None,
        pod_filter: Callable[[dict[str, Any]], bool] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Change:
        """Evict the pods of ``node`` through the Eviction API and wait until they are gone.

        Skipped (listed in ``after["skipped"]`` with a reason): DaemonSet pods, mirror pods, finished pods
        (Succeeded/Failed), pods ``pod_filter`` rejects, and pods already terminating, which are not evicted
        again but are waited for like the evicted ones (so a drain run again after a ``DrainTimeout`` goes
        on waiting instead of calling a node with terminating pods drained). A
        PodDisruptionBudget refusal (429) is retried with jittered exponential backoff, honouring
        ``Retry-After``, until ``timeout_s`` (default: the adapter's drain timeout), which bounds the whole
        drain including the wait for pods to terminate; then ``DrainTimeout`` names the pods left.
        ``grace_period_s`` overrides the pods' termination grace period (default: the adapter's
        ``drain_grace_period_s``; an adapter built with ``drain_grace_period_s=None`` leaves each pod its own).

        Pods without a controller and pods with ``emptyDir`` volumes are evicted too (``kubectl drain`` would
        need ``--force --delete-emptydir-data``): on a failing GPU node their scratch data is already at
        risk; the audit entry shows ``owner: None`` / ``emptydir: True`` for them.

        The drain does not cordon: cordon or taint the node first, or replacements may land on it again.
        Idempotent: once the node is empty of evictable pods, a drain evicts nothing (``changed=False``).
        ``after["evicted"]`` lists each evicted pod with its owner.
        """
        say = progress or (lambda _msg: None)
        timeout = self._drain_timeout_s if timeout_s is None else float(timeout_s)
        grace = self._drain_grace_period_s if grace_period_s is None else grace_period_s
        deadline = self._clock() + timeout

        pods = self.pods_on_node(node)
        targets: dict[str, dict[str, Any]] = {}
        terminating: dict[str, dict[str, Any]] = {}
        skipped: list[dict[str, Any]] = []
        for pod in pods:
            key = str(pod["uid"] or f"{pod['namespace']}/{pod['name']}")
            reason = None
            if pod["daemonset"]:
                reason = "DaemonSet pod"
            elif pod["mirror"]:
                reason = "mirror pod"
            elif pod["phase"] in ("Succeeded", "Failed"):
                reason = f"finished ({pod['phase']})"
            elif pod_filter is not None and not pod_filter(pod):
                reason = "not selected"
            elif pod["terminating"]:
                reason = "already terminating"
                terminating[key] = pod
            if reason:
                skipped.append({**_brief(pod), "reason": reason})
            else:
                targets[key] = pod
        before = {"node": node, "pods": [_brief(p) for p in pods]}
        if not targets and not terminating:
            say(f"{node}: nothing to evict")
            return Change(
                False, before, {"node": node, "evicted": [], "skipped": skipped, "gone": []},
                f"nothing to evict on {node}",
            )

        evicted: dict[str, dict[str, Any]] = {}
        gone: list[dict[str, Any]] = []
        pending = dict(targets)
        attempt = 0
        while pending:
            blocked: dict[str, KubeTemporaryError] = {}
            for key, pod in list(pending.items()):
                try:
                    self._evict(pod, grace)
                except (NotFound, _Conflict):
                    # Gone already, or replaced by a new pod under the same name: nothing left to evict.
                    gone.append(_brief(pod))
                    del pending[key]
                except KubeTemporaryError as e:
                    if e.status != 429:
                        raise
                    blocked[key] = e
                else:
                    say(f"evicted {pod['namespace']}/{pod['name']}")
                    evicted[key] = pod
                    del pending[key]
            if not pending:
                break
            attempt += 1
            hinted = [e.retry_after for e in blocked.values() if e.retry_after is not None]
            if hinted:
                delay = max(hinted) + min(1.0, 0.1 * max(hinted)) * self._rng()
            else:
                delay = self._backoff(attempt, base=max(self._backoff_base_s, 0.5))
            left = deadline - self._clock()
            if left <= 0:
                raise DrainTimeout(
                    node,
                    timeout,
                    [{**_brief(p), "reason": "blocked by PodDisruptionBudget"} for p in pending.values()],
                    [_brief(p) for p in evicted.values()],
                )
            names = ", ".join(f"{p['namespace']}/{p['name']}" for p in pending.values())
            say(f"{len(pending)} pods blocked by a PodDisruptionBudget ({names}); retrying in {min(delay, left):.1f}s")
            self._pause(min(delay, left))

        waiting = {**terminating, **evicted}
        while waiting:
            present = {str(p["uid"]) for p in self.pods_on_node(node) if p["uid"]}
            waiting = {k: p for k, p in waiting.items() if str(p["uid"]) in present}
            if not waiting:
                break
            left = deadline - self._clock()
            if left <= 0:
                raise DrainTimeout(
                    node,
                    timeout,
                    [{**_brief(p), "reason": "still terminating"} for p in waiting.values()],
                    [_brief(p) for p in evicted.values()],
                )
            say(f"waiting for {len(waiting)} pods to terminate")
            self._pause(min(self._poll_interval_s, left))

        after = {
            "node": node,
            "evicted": [_brief(p) for p in evicted.values()],
            "skipped": skipped,
            "gone": gone,
        }
        detail = f"evicted {len(evicted)} pods from {node}"
        if terminating:
            detail += f"; waited for {len(terminating)} pods already terminating"
        return Change(bool(evicted), before, after, detail)

    def evict_pods(
        self,
        node: str,
        pods: Iterable[Mapping[str, Any]],
        *,
        timeout_s: float | None = None,
        grace_period_s: int | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Change:
        """Evict exactly ``pods`` from ``node``: each ``{namespace, name, uid}``, the holders of a GPU the node
        agent named. A pod is matched by UID (by name where no UID is given): a pod of that name with another
        UID is a replacement and is not touched. Holders no longer on the node are listed in
        ``after["not_found"]``. Same rules, timeout and result as ``drain``; pods on the node's other GPUs
        keep running."""
        wanted: dict[tuple[str, str], str | None] = {}
        for p in pods:
            uid = p.get("uid")
            wanted[(str(p["namespace"]), str(p["name"]))] = str(uid) if uid else None

        def selected(pod: Mapping[str, Any]) -> bool:
            key = (pod["namespace"], pod["name"])
            return key in wanted and wanted[key] in (None, pod["uid"])

        change = self.drain(node, timeout_s=timeout_s, grace_period_s=grace_period_s, pod_filter=selected,
                            progress=progress)
        present = {(b["namespace"], b["name"]) for b in change.before.get("pods", []) if selected(b)}
        not_found = [{"namespace": ns, "name": name, "uid": uid} for (ns, name), uid in sorted(wanted.items())
                     if (ns, name) not in present]
        return Change(change.changed, change.before, {**change.after, "not_found": not_found}, change.detail)

    # --- jobs ----------------------------------------------------------------------------------------

    @staticmethod
    def _object_path(job: JobRef) -> str:
        group_version, plural = _CONTROLLERS[job.kind]
        return f"/apis/{group_version}/namespaces/{job.namespace}/{plural}/{job.name}"

    def _job_pods(self, job: JobRef, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The pods of a controller object, selected the way its controller selects them."""
        uid = _meta(obj).get("uid")
        selector = self._selector(job, obj)
        raw = self._list(
            f"/api/v1/namespaces/{job.namespace}/pods", {"labelSelector": selector}, kind="PodList"
        )
        pods = [self._pod_summary(p) for p in raw]
        if job.kind not in ("Deployment", "JobSet") and uid:
            # (A Deployment's and a JobSet's pods are owned by their ReplicaSets and Jobs, not by them.)
            # A pod controlled by another object (an earlier job of the same name) is not in this gang.
            pods = [p for p in pods if not p["owner"] or not p["owner"].get("uid") or p["owner"]["uid"] == uid]
        return sorted(pods, key=lambda p: (p["labels"].get(KUBEFLOW_REPLICA_INDEX_LABEL, ""), p["name"]))

    def _delete_pod(self, pod: Mapping[str, Any], grace_period_s: int | None) -> bool:
        """Delete one pod, only if it is still the same pod (UID precondition). True when we deleted it."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if pod.get("uid"):
            body["preconditions"] = {"uid": pod["uid"]}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        try:
            self._request(
                "DELETE",
                f"/api/v1/namespaces/{pod['namespace']}/pods/{pod['name']}",
                body=body,
                kind="Pod",
                name=str(pod["name"]),
                namespace=str(pod["namespace"]),
            )
        except (NotFound, _Conflict):
            return False
        return True

    def _selector(self, job: JobRef, obj: Mapping[str, Any]) -> str:
        """The label selector that finds the pods of a controller object, as its controller would."""
        spec = obj.get("spec") or {}
        if job.kind == "PyTorchJob":
            return f"{KUBEFLOW_JOB_LABEL}={job.name}"
        if job.kind == "JobSet":
            return f"{JOBSET_NAME_LABEL}={job.name}"
        if job.kind == "Job":
            return _label_selector(spec.get("selector")) or f"job-name={job.name}"
        selector = _label_selector(spec.get("selector"))
        if not selector:
            raise KubePermanentError(f"{job.key} has no pod selector")
        return selector

    def _delete_gang(
        self, job: JobRef, obj: Mapping[str, Any], pods: list[dict[str, Any]], grace_period_s: int | None
    ) -> list[dict[str, Any]]:
        """Delete every pod of the gang in one ``deletecollection`` by the controller's selector, so the
        controller sees the whole gang go at once (one restart, not one per rank). Returns what went."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        result = self._request(
            "DELETE",
            f"/api/v1/namespaces/{job.namespace}/pods",
            query={"labelSelector": self._selector(job, obj)},
            body=body,
            kind="PodList",
            namespace=job.namespace,
        )
        gone = {str(_meta(p).get("uid")) for p in result.get("items") or [] if isinstance(p, dict)}
        deleted = [_brief(p) for p in pods if str(p["uid"]) in gone]
        # A pod the collection delete did not reach (a label edited since we listed it) goes one by one.
        deleted += [_brief(p) for p in pods if str(p["uid"]) not in gone and self._delete_pod(p, grace_period_s)]
        return deleted

    def restart_job(
        self, job: JobRef, *, restart_id: str, grace_period_s: int | None = None
    ) -> Change:
        """Restart the whole gang of ``job``: delete every pod of it at once (one ``deletecollection`` by the
        controller's selector) so its controller recreates them all, not one rank.

        Supported: ``PyTorchJob`` (pods labelled ``training.kubeflow.org/job-name``), batch ``Job`` (its
        selector: ``controller-uid``, else ``job-name``), ``JobSet`` (pods labelled
        ``jobset.sigs.k8s.io/jobset-name``), ``StatefulSet``, ``Deployment``, ``ReplicaSet``.
        A bare pod (``kind="Pod"``) has no controller to recreate it: ``KubePermanentError``.

        Idempotent per ``restart_id``: before deleting anything the job object is annotated with
        ``gpu-remediator.io/restart-id``, ``…/restarted-at`` and the UIDs about to be deleted. A call with
        the same id deletes only pods of that list still standing (finishing an interrupted restart) and
        otherwise does nothing (``changed=False``); pods created since are never touched.
        """
        if job.kind not in _CONTROLLERS:
            raise KubePermanentError(
                f"cannot restart {job.key}: a {job.kind} has no controller here that would recreate its pods"
            )
        grace = self._drain_grace_period_s if grace_period_s is None else grace_period_s
        path = self._object_path(job)
        for attempt in range(1, self._conflict_attempts + 1):
            obj = self._request("GET", path, kind=job.kind, name=job.name, namespace=job.namespace)
            annotations = _annotations(obj)
            pods = [p for p in self._job_pods(job, obj) if not p["terminating"]]
            pods_view = [_brief(p) for p in pods]
            if annotations.get(RESTART_ID_ANNOTATION) == restart_id:
                planned = set(filter(None, annotations.get(RESTART_POD_UIDS_ANNOTATION, "").split(",")))
                leftovers = [p for p in pods if p["uid"] in planned]
                when = annotations.get(RESTARTED_AT_ANNOTATION, "?")
                if not leftovers:
                    return Change(
                        False,
                        {"job": job.key, "pods": pods_view},
                        {"job": job.key, "pods": pods_view, "restart_id": restart_id, "restarted_at": when},
                        f"{job.key} already restarted for {restart_id} at {when}",
                    )
                deleted = [_brief(p) for p in leftovers if self._delete_pod(p, grace)]
                return Change(
                    bool(deleted),
                    {"job": job.key, "pods": pods_view},
                    {"job": job.key, "deleted": deleted, "restart_id": restart_id, "restarted_at": when},
                    f"finished the interrupted restart {restart_id} of {job.key}: deleted {len(deleted)} pods",
                )
            now = _iso(self._wall_clock())
            patch: dict[str, Any] = {
                "metadata": {
                    "annotations": {
                        RESTART_ID_ANNOTATION: restart_id,
                        RESTARTED_AT_ANNOTATION: now,
                        RESTART_POD_UIDS_ANNOTATION: ",".join(str(p["uid"]) for p in pods if p["uid"]),
                    }
                }
            }
            rv = _meta(obj).get("resourceVersion")
            if rv:
                patch["metadata"]["resourceVersion"] = rv
            try:
                self._request(
                    "PATCH", path, body=patch, content_type=MERGE_PATCH,
                    kind=job.kind, name=job.name, namespace=job.namespace,
                )
            except _Conflict:
                log.info("%s changed under us (attempt %d); re-reading", job.key, attempt)
                continue
            deleted = self._delete_gang(job, obj, pods, grace)
            return Change(
                True,
                {"job": job.key, "pods": pods_view},
                {"job": job.key, "deleted": deleted, "restart_id": restart_id, "restarted_at": now},
                f"restarted {job.key}: deleted {len(deleted)} of {len(pods)} pods for its controller to recreate",
            )
        raise KubeConflict(
            f"{job.key}: concurrent writers won {self._conflict_attempts} times in a row; try again later",
            status=409,
        )

    def job_pods(self, job: JobRef) -> list[dict[str, Any]]:
        """The current pods of ``job`` (summaries as ``pods_on_node`` returns), terminating ones included."""
        if job.kind == "Pod":
            raw = self._request(
                "GET", f"/api/v1/namespaces/{job.namespace}/pods/{job.name}",
                kind="Pod", name=job.name, namespace=job.namespace,
            )
            return [self._pod_summary(raw)]
        if job.kind not in _CONTROLLERS:
            raise KubePermanentError(f"cannot list the pods of {job.key}: unsupported kind")
        obj = self._request("GET", self._object_path(job), kind=job.kind, name=job.name, namespace=job.namespace)
        return self._job_pods(job, obj)

    # --- reboot Jobs ---------------------------------------------------------------------------------

    def create_job(self, namespace: str, manifest: Mapping[str, Any]) -> Change:
        """Create a batch/v1 Job; one that already exists under that name is left as it is (unchanged)."""
        name = str(_meta(manifest).get("name") or "")
        try:
            created = self._request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", body=dict(manifest),
                                    kind="Job", name=name, namespace=namespace)
        except _Conflict:
            return Change(False, {"job": f"{namespace}/{name}"}, {"job": f"{namespace}/{name}", "created": False},
                          f"Job {namespace}/{name} already exists")
        return Change(True, {}, {"job": f"{namespace}/{name}", "uid": _meta(created).get("uid"), "created": True},
                      f"created Job {namespace}/{name}")

    def delete_job(self, namespace: str, name: str) -> Change:
        """Delete a batch/v1 Job and its pods (background propagation); a Job already gone is unchanged."""
        try:
            self._request("DELETE", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
                          body={"propagationPolicy": "Background"}, kind="Job", name=name, namespace=namespace)
        except NotFound:
            return Change(False, {"job": f"{namespace}/{name}"}, {"deleted": False}, f"Job {namespace}/{name} is gone")
        return Change(True, {"job": f"{namespace}/{name}"}, {"deleted": True}, f"deleted Job {namespace}/{name}")

    # --- events and escalation -----------------------------------------------------------------------

    def create_event(
        self, node: str, reason: str, message: str, type: str = "Warning", *, key: str | None = None
    ) -> Change:
        """Record a core/v1 Event about the Node (namespace ``default``, involvedObject kind Node).

        With ``key`` the event name is derived from it, so repeating the call with the same key creates
        nothing (``changed=False``); without, each call records a new event.
        """
        if type not in ("Normal", "Warning"):
            raise KubePermanentError(f"event type must be Normal or Warning, not {type!r}")
        raw_node = self._raw_node(node)
        now = _iso(self._wall_clock())
        metadata: dict[str, Any] = {"namespace": EVENT_NAMESPACE}
        if key is not None:
            metadata["name"] = f"{node}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        else:
            metadata["generateName"] = f"{node}."
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": metadata,
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node,
                "uid": _meta(raw_node).get("uid") or node,
            },
            "reason": reason,
            "message": message[:1024],
            "type": type,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        view = {"reason": reason, "message": message[:1024], "type": type, "node": node}
        try:
            created = self._request(
                "POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body=event, kind="Event", name=node
            )
        except _Conflict:
            return Change(False, {}, {"event": {**view, "name": metadata["name"]}}, "event already recorded")
        return Change(
            True, {}, {"event": {**view, "name": _meta(created).get("name")}}, f"event {reason} on {node}"
        )

    def escalate(self, node: str, reason: str, incident: str) -> Change:
        """Mark ``node`` for a person: annotation ``gpu-remediator.io/escalated`` (JSON: incident, reason,
        at) and a Warning Event. Idempotent per incident."""
        current = self.get_node(node)["annotations"].get(ESCALATED_ANNOTATION)
        try:
            marked = json.loads(current) if current else None
        except ValueError:
            marked = None
        if isinstance(marked, dict) and marked.get("incident") == incident:
            annotation = Change(False, {"annotations": {ESCALATED_ANNOTATION: current}},
                                    {"annotations": {ESCALATED_ANNOTATION: current}}, "already escalated")
        else:
            value = json.dumps(
                {"incident": incident, "reason": reason, "at": _iso(self._wall_clock())}, sort_keys=True
            )
            annotation = self.annotate(node, {ESCALATED_ANNOTATION: value})
        event = self.create_event(node, "GpuRemediationEscalated", f"incident {incident}: {reason}",
                                  key=f"escalate|{incident}")
        changed = annotation.changed or event.changed
        return Change(
            changed,
            annotation.before,
            {**annotation.after, **event.after},
            f"escalated {node} for incident {incident}" if changed else f"{node} already escalated for {incident}",
        )

    # --- GPU withdrawal: a DRA device taint, or the device plugin's node-taint fallback ---------------
    #
    # ``withdraw_gpu`` keeps the scheduler off one GPU; ``restore_gpu`` undoes only what it did. How depends
    # on how the cluster hands out GPUs (``gpu_allocation_mode``): with DRA (NVIDIA's driver publishes
    # ResourceSlices) a DeviceTaintRule selects exactly that device; with the device plugin
    # (``nvidia.com/gpu``) Kubernetes has no per-device scheduling control, so the node gets our NoSchedule
    # taint (no new pod lands there, running pods keep running) and is recorded as partially withdrawn.

    gpu_allocation: str = "auto"            # REMEDIATOR_GPU_ALLOCATION: auto | dra | device-plugin
    dra_driver: str = "gpu.nvidia.com"       # REMEDIATOR_DRA_DRIVER
    gpu_withdrawn_taint_key: str = "gpu-remediator/gpu-withdrawn"  # REMEDIATOR_GPU_WITHDRAWN_TAINT_KEY
    _detected_mode: str | None = None
    _dra_versions: dict[str, str | None] | None = None

    def _dra_version(self, plural: str) -> str | None:
        """The ``resource.k8s.io`` version that serves ``plural`` (v1, else v1beta2, else v1alpha3), by
        discovery, read once; None when none does."""
        if self._dra_versions is None:
            served: dict[str, str | None] = {}
            for version in DRA_VERSIONS:
                try:
                    doc = self._request("GET", f"/apis/{DRA_GROUP}/{version}", kind="APIResourceList",
                                        name=f"{DRA_GROUP}/{version}")
                except NotFound:
                    continue
                for r in doc.get("resources") or []:
                    name = str(r.get("name", "")) if isinstance(r, dict) else ""
                    if name and "/" not in name and name not in served:
                        served[name] = version
            self._dra_versions = served
        return self._dra_versions.get(plural)

    def gpu_allocation_mode(self) -> str:
        """``dra`` or ``device-plugin``: the setting, or with ``auto`` what the cluster shows (``dra`` when
        ``resource.k8s.io`` serves ResourceSlices and one of them is the DRA driver's). Read once."""
        if self.gpu_allocation in ("dra", "device-plugin"):
            return self.gpu_allocation
        if self._detected_mode is None:
            version = self._dra_version("resourceslices")
            mode = "device-plugin"
            if version is not None:
                page = self._request("GET", f"/apis/{DRA_GROUP}/{version}/resourceslices",
                                     query={"fieldSelector": f"spec.driver={self.dra_driver}", "limit": 1},
                                     kind="ResourceSliceList")
                if page.get("items"):
                    mode = "dra"
            self._detected_mode = mode
            log.info("GPU allocation: %s (REMEDIATOR_GPU_ALLOCATION=auto)", mode)
        return self._detected_mode

    def find_gpu_device(self, node: str, gpu: GpuRef) -> dict[str, str] | None:
        """The DRA device of ``gpu`` on ``node`` (``{driver, pool, device, slice}``): in a ResourceSlice of
        the driver on that node, the device whose ``uuid`` attribute is the GPU's UUID, else whose
        ``pcieBusID`` is its PCI bus id, else whose ``index`` (or ``minor``, which NVIDIA's driver names
        the device by: ``gpu-<minor>``) is its index. None when the node publishes no such device."""
        version = self._dra_version("resourceslices")
        if version is None:
            return None
        slices = self._list(f"/apis/{DRA_GROUP}/{version}/resourceslices",
                            {"fieldSelector": f"spec.nodeName={node},spec.driver={self.dra_driver}"},
                            kind="ResourceSliceList")
        candidates: list[tuple[int, dict[str, str]]] = []
        for s in slices:
            spec = s.get("spec") or {}
            if spec.get("driver") != self.dra_driver or spec.get("nodeName") != node:
                continue
            pool = str((spec.get("pool") or {}).get("name", ""))
            for d in spec.get("devices") or []:
                attrs = d.get("attributes") or {}

                def attr(name: str, attrs: Mapping[str, Any] = attrs) -> Any:
                    v = attrs.get(name) or attrs.get(f"{self.dra_driver}/{name}") or {}
                    return v.get("string", v.get("int")) if isinstance(v, dict) else None

                found = {"driver": self.dra_driver, "pool": pool, "device": str(d.get("name", "")),
                         "slice": str(_meta(s).get("name", ""))}
                pci = attr("pcieBusID")
                if gpu.uuid and attr("uuid") == gpu.uuid:
                    candidates.append((0, found))
                elif gpu.pci_bus_id and isinstance(pci, str) and pci.lower() == gpu.pci_bus_id.lower():
                    candidates.append((1, found))
                elif gpu.index is not None and not gpu.uuid and not gpu.pci_bus_id and (
                        attr("index") == gpu.index or (attr("index") is None and attr("minor") == gpu.index)):
                    candidates.append((2, found))
        return min(candidates, key=lambda c: c[0])[1] if candidates else None

    @staticmethod
    def device_taint_rule_name(pool: str, device: str) -> str:
        """Our DeviceTaintRule's name for one device: deterministic, so creating it twice is a no-op."""
        base = re.sub(r"[^a-z0-9.-]+", "-", f"gpu-remediator-{pool}-{device}".lower()).strip("-.")
        if len(base) > 200:
            base = f"{base[:189]}-{hashlib.sha256(base.encode()).hexdigest()[:10]}"
        return base

    @staticmethod
    def _withdrawn(raw: Mapping[str, Any]) -> list[str]:
        try:
            value = json.loads(_annotations(raw).get(WITHDRAWN_GPUS_ANNOTATION) or "[]")
        except ValueError:
            return []
        return [str(v) for v in value] if isinstance(value, list) else []

    def withdraw_gpu(self, node: str, gpu: GpuRef, *, effect: str = "NoSchedule", value: str = "") -> Change:
        """Keep the scheduler off ``gpu`` of ``node`` (see the section comment). ``effect`` NoExecute (DRA
        only) also has the control plane evict the pods using the device. Idempotent."""
        if effect not in ("NoSchedule", "NoExecute"):
            raise KubePermanentError(f"withdraw_gpu: effect must be NoSchedule or NoExecute, not {effect!r}")
        if self.gpu_allocation_mode() == "dra":
            return self._with_record(node, gpu, self._taint_device(node, gpu, effect, value), withdrawn=True)
        return self._withdraw_on_node(node, gpu, value)

    def restore_gpu(self, node: str, gpu: GpuRef) -> Change:
        """Undo ``withdraw_gpu``: delete our DeviceTaintRule for the device (never one we did not create), or
        take the GPU off the node's withdrawn list and remove our node taint with the last one."""
        if self.gpu_allocation_mode() == "dra":
            return self._with_record(node, gpu, self._untaint_device(node, gpu), withdrawn=False)
        return self._restore_on_node(node, gpu)

    def _with_record(self, node: str, gpu: GpuRef, c: Change, *, withdrawn: bool) -> Change:
        """DRA: keep the node's ``gpu-remediator.io/withdrawn-gpus`` list (our record of what is out, which the
        node summary's ``gpus_allocatable`` reads, there being no device-plugin allocatable) in step with our
        DeviceTaintRules; a rule that is not ours changes nothing."""
        if c.after.get("ours") is False:
            return c

        def decide(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
            have = self._withdrawn(raw)
            want = sorted({*have, gpu.key}) if withdrawn else [k for k in have if k != gpu.key]
            if want == have:
                return None, ""
            return {"metadata": {"annotations": {WITHDRAWN_GPUS_ANNOTATION: json.dumps(want) if want else None}}}, ""

        _, after, changed, _ = self._mutate_node(node, decide)
        return Change(c.changed or changed, c.before, {**c.after, "withdrawn_gpus": self._withdrawn(after)}, c.detail)

    def _device_or_fail(self, node: str, gpu: GpuRef) -> dict[str, str]:
        dev = self.find_gpu_device(node, gpu)
        if dev is None:
            raise KubePermanentError(
                f"no {self.dra_driver} DRA device for GPU {gpu.key} in the ResourceSlices of {node}: check the "
                f"DRA driver runs there, or set REMEDIATOR_GPU_ALLOCATION=device-plugin")
        return dev

    def _taint_device(self, node: str, gpu: GpuRef, effect: str, value: str) -> Change:
        dev = self._device_or_fail(node, gpu)
        version = self._dra_version("devicetaintrules")
        if version is None:
            raise KubePermanentError(
                f"{DRA_GROUP} serves no DeviceTaintRule (v1, v1beta2 or v1alpha3): enable the DRADeviceTaints "
                "feature and its API, or set REMEDIATOR_GPU_ALLOCATION=device-plugin")
        name = self.device_taint_rule_name(dev["pool"], dev["device"])
        selector = {k: dev[k] for k in ("driver", "pool", "device")}
        taint = {"key": self.gpu_withdrawn_taint_key, "value": _label_value(value), "effect": effect}
        summary = {"mode": "dra", "rule": name, "device": selector, "effect": effect}
        body = {"apiVersion": f"{DRA_GROUP}/{version}", "kind": "DeviceTaintRule",
                "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: COMPONENT},
                             "annotations": {WITHDRAWN_NODE_ANNOTATION: node, WITHDRAWN_GPU_ANNOTATION: gpu.key}},
                "spec": {"deviceSelector": selector, "taint": taint}}
        try:
            self._request("POST", f"/apis/{DRA_GROUP}/{version}/devicetaintrules", body=body,
                          kind="DeviceTaintRule", name=name)
            return Change(True, {"mode": "dra", "rule": None, "device": selector},
                          {**summary, "changed_by_us": True},
                          f"DeviceTaintRule {name}: {self.gpu_withdrawn_taint_key}:{effect} on {dev['driver']}/"
                          f"{dev['pool']}/{dev['device']} (GPU {gpu.key}); the node stays schedulable")
        except _Conflict:
            pass  # it exists: ours from an earlier try, or someone else's with that name
        have = self._request("GET", f"/apis/{DRA_GROUP}/{version}/devicetaintrules/{name}",
                             kind="DeviceTaintRule", name=name)
        ours = _labels(have).get(MANAGED_BY_LABEL) == COMPONENT
        have_taint = (have.get("spec") or {}).get("taint") or {}
        if not ours:
            return Change(False, {"mode": "dra", "rule": name, "ours": False}, {**summary, "ours": False},
                          f"DeviceTaintRule {name} exists and is not ours; left as it is")
        if have_taint.get("effect") == effect:
            return Change(False, {**summary}, {**summary},
                          f"DeviceTaintRule {name} already withdraws GPU {gpu.key} ({effect})")
        patched = {"spec": {"taint": {**have_taint, "effect": effect, "timeAdded": None}},
                   "metadata": {"resourceVersion": _meta(have).get("resourceVersion")}}
        self._request("PATCH", f"/apis/{DRA_GROUP}/{version}/devicetaintrules/{name}", body=patched,
                      content_type=MERGE_PATCH, kind="DeviceTaintRule", name=name)
        return Change(True, {**summary, "effect": have_taint.get("effect")}, {**summary, "changed_by_us": True},
                      f"DeviceTaintRule {name}: effect {have_taint.get('effect')} -> {effect}")

    def _untaint_device(self, node: str, gpu: GpuRef) -> Change:
        version = self._dra_version("devicetaintrules")
        dev = self.find_gpu_device(node, gpu)
        if version is None or dev is None:
            return Change(False, {"mode": "dra", "rule": None}, {"mode": "dra", "rule": None},
                          f"no DeviceTaintRule to remove for GPU {gpu.key} of {node}")
        name = self.device_taint_rule_name(dev["pool"], dev["device"])
        path = f"/apis/{DRA_GROUP}/{version}/devicetaintrules/{name}"
        try:
            have = self._request("GET", path, kind="DeviceTaintRule", name=name)
        except NotFound:
            return Change(False, {"mode": "dra", "rule": None}, {"mode": "dra", "rule": None},
                          f"DeviceTaintRule {name} is already gone")
        if _labels(have).get(MANAGED_BY_LABEL) != COMPONENT:
            return Change(False, {"mode": "dra", "rule": name, "ours": False},
                          {"mode": "dra", "rule": name, "ours": False},
                          f"DeviceTaintRule {name} is not ours; left as it is")
        with contextlib.suppress(NotFound):
            self._request("DELETE", path, body={"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {
                "uid": _meta(have).get("uid")}}, kind="DeviceTaintRule", name=name)
        return Change(True, {"mode": "dra", "rule": name}, {"mode": "dra", "rule": None},
                      f"deleted DeviceTaintRule {name}: GPU {gpu.key} of {node} is schedulable again")

    def _node_withdrawal_state(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        status = raw.get("status") or {}
        capacity = _quantity_to_int((status.get("capacity") or {}).get(GPU_RESOURCE))
        allocatable = _quantity_to_int((status.get("allocatable") or {}).get(GPU_RESOURCE))
        taint = next((_taint_view(t) for t in _raw_taints(raw) if t.get("key") == self.gpu_withdrawn_taint_key
                      and t.get("effect") == "NoSchedule"), None)
        return {"mode": "device-plugin", "taint": taint, "withdrawn_gpus": self._withdrawn(raw),
                # evidence: the device plugin's own view (a GPU it found unhealthy leaves allocatable)
                "device_plugin": {"capacity": capacity, "allocatable": allocatable,
                                  "unhealthy": max(0, capacity - allocatable)}}

    def _withdraw_on_node(self, node: str, gpu: GpuRef, value: str) -> Change:
        def decide(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
            withdrawn = self._withdrawn(raw)
            taints = _raw_taints(raw)
            has_taint = any(t.get("key") == self.gpu_withdrawn_taint_key and t.get("effect") == "NoSchedule"
                            for t in taints)
            if gpu.key in withdrawn and has_taint:
                return None, f"{node} already partially withdrawn for GPU {gpu.key}"
            patch: dict[str, Any] = {"metadata": {"annotations": {
                WITHDRAWN_GPUS_ANNOTATION: json.dumps(sorted({*withdrawn, gpu.key}))}}}
            if not has_taint:
                patch["spec"] = {"taints": [*taints, {"key": self.gpu_withdrawn_taint_key,
                                                      "value": _label_value(value), "effect": "NoSchedule"}]}
            return patch, (f"device plugin: no per-device scheduling control exists, so {node} carries "
                           f"{self.gpu_withdrawn_taint_key}:NoSchedule (no new pod lands on it; running pods on "
                           f"its healthy GPUs keep running) and is partially withdrawn (GPU {gpu.key})")

        before, after, changed, detail = self._mutate_node(node, decide)
        b, a = self._node_withdrawal_state(before), self._node_withdrawal_state(after)
        a["changed_by_us"] = changed and b["taint"] is None
        unhealthy = a["device_plugin"]["unhealthy"]
        if unhealthy:
            detail += f"; the device plugin already reports {unhealthy} GPU(s) unhealthy (allocatable below capacity)"
        return Change(changed, b, a, detail)

    def _restore_on_node(self, node: str, gpu: GpuRef) -> Change:
        def decide(raw: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
            withdrawn = self._withdrawn(raw)
            if gpu.key not in withdrawn:
                return None, f"GPU {gpu.key} of {node} was not withdrawn by us"
            left = [k for k in withdrawn if k != gpu.key]
            patch: dict[str, Any] = {"metadata": {"annotations": {
                WITHDRAWN_GPUS_ANNOTATION: json.dumps(left) if left else None}}}
            if left:
                return patch, f"GPU {gpu.key} of {node} restored; {node} stays partially withdrawn ({left})"
            patch["spec"] = {"taints": [t for t in _raw_taints(raw) if t.get("key") != self.gpu_withdrawn_taint_key]}
            return patch, f"GPU {gpu.key} of {node} restored; removed {self.gpu_withdrawn_taint_key} from {node}"

        before, after, changed, detail = self._mutate_node(node, decide)
        return Change(changed, self._node_withdrawal_state(before), self._node_withdrawal_state(after), detail)


# --- the async port ---------------------------------------------------------------------------------


class AsyncKube:
    """The Kubernetes port of the async service: ``KubeAdapter``'s calls, awaited.

    Where it sits: between the executor and its step library above (they ``await`` it, typed against the
    ``playbooks.ports.KubePort`` protocol, and never see a thread) and the synchronous ``KubeAdapter`` below.
    Each call hops once onto this port's own bounded thread pool (``max_workers`` at once; more wait their
    turn), where the adapter does its rate-limited, retried requests, so a drain waiting on
    PodDisruptionBudgets never takes a thread of the event loop's default executor. Errors are the adapter's
    (``KubeTemporaryError`` and the rest), raised at the ``await``.
    """

    def __init__(self, adapter: KubeAdapter, *, max_workers: int = 8) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.sync = adapter
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kube")
        self._pool_locks: dict[str, asyncio.Lock] = {}
        self._pool_lists: dict[str, tuple[float, PoolView]] = {}  # pool_view while the node cache is not synced

    @classmethod
    def from_settings(cls, settings: Settings, *, max_workers: int | None = None, **overrides: Any) -> AsyncKube:
        """A port over ``KubeAdapter.from_settings(settings, **overrides)``, with a thread for each run the
        executor may have going at once (``executor_concurrency``) and a few for the guards' reads."""
        workers = settings.executor_concurrency + 4 if max_workers is None else max_workers
        return cls(KubeAdapter.from_settings(settings, **overrides), max_workers=workers)

    @property
    def taint_key(self) -> str:
        return self.sync.taint_key

    async def start(self, *, wait_s: float = 30.0) -> bool:
        """Start the adapter's node cache (``KubeAdapter.start_node_cache``) and wait up to ``wait_s`` for its
        first list; True when it is synced (until then, and whenever it is not, reads go to the API server)."""
        cache = self.sync.start_node_cache()
        return await asyncio.to_thread(cache.wait_synced, wait_s)

    async def _call(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        # The caller's context variables (the current trace span among them) travel with the call, as
        # with asyncio.to_thread.
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, functools.partial(context.run, fn, *args, **kwargs))
        except RuntimeError as e:
            if not self.sync.closed:
                raise
            raise KubeTemporaryError("the Kubernetes adapter was closed (stopping): the call was not sent") from e

    async def ping(self, timeout_s: float = 3.0) -> None:
        """``KubeAdapter.ping`` on a thread of its own, so a pool busy with drains never delays it."""
        await asyncio.to_thread(self.sync.ping, timeout_s)

    def close(self) -> None:
        """Stop the worker threads and release the adapter's connection pool."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.sync.close()

    # --- identity

    async def review_token(self, token: str, audiences: Sequence[str]) -> dict[str, Any]:
        return await self._call(self.sync.review_token, token, audiences)

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._call(self.sync.read_pod, namespace, name)

    # --- nodes

    async def get_node(self, name: str) -> dict[str, Any]:
        cached = self.sync.cached_node(name)  # from memory without a thread hop, when the cache holds it
        return cached if cached is not None else await self._call(self.sync.get_node, name)

    async def find_node(self, name: str) -> dict[str, Any] | None:
        cached = self.sync.cached_node(name)
        return cached if cached is not None else await self._call(self.sync.find_node, name)

    async def list_gpu_nodes(self, pool: str | None = None) -> list[dict[str, Any]]:
        return await self._call(self.sync.list_gpu_nodes, pool)

    async def pool_view(self, pool: str) -> PoolView:
        """``KubeAdapter.pool_view``: from the node cache's index without a thread hop; while the cache is not
        synced, one list per pool serves every run that asks within ``POOL_LIST_TTL_S``."""
        cached = self.sync.cached_pool_view(pool)
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        async with self._pool_locks.setdefault(pool, asyncio.Lock()):
            listed = self._pool_lists.get(pool)
            if listed is None or loop.time() - listed[0] >= POOL_LIST_TTL_S:
                listed = self._pool_lists[pool] = (loop.time(), await self._call(self.sync.pool_view, pool))
            return listed[1]

    async def node_names(self) -> frozenset[str]:
        cache = self.sync.node_cache
        if cache is not None and cache.synced:  # memory only: no thread hop
            return cache.names()
        return await self._call(self.sync.node_names)

    async def wait_node_change(self, resource_version: str | None, timeout_s: float,
                               names: Collection[str] | None = None) -> str | None:
        """``KubeAdapter.wait_node_change`` on a daemon thread of its own (a watch, or a wait on the node
        cache, holds it for up to ``timeout_s``): the port's pool stays free for the steps, and a process that
        stops never waits for a watch to time out."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str | None] = loop.create_future()

        def settle(value: str | None, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(value)

        def work() -> None:
            try:
                value, error = self.sync.wait_node_change(resource_version, timeout_s, names), None
            except Exception as e:
                value, error = None, e
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits for this watch any more
                loop.call_soon_threadsafe(settle, value, error)

        threading.Thread(target=work, name="kube-watch", daemon=True).start()
        return await fut

    async def taint(self, node: str, key: str, value: str, effect: str = "NoSchedule") -> Change:
        return await self._call(self.sync.taint, node, key, value, effect)

    async def untaint(
        self, node: str, key: str, effect: str | None = "NoSchedule", *, only_if_value: str | None = None
    ) -> Change:
        return await self._call(self.sync.untaint, node, key, effect, only_if_value=only_if_value)

    async def cordon(self, node: str) -> Change:
        return await self._call(self.sync.cordon, node)

    async def quarantine(self, node: str, key: str, value: str, effect: str = "NoSchedule") -> tuple[Change, Change]:
        """``KubeAdapter.quarantine``: taint and cordon in one request, in the limiter's priority lane."""
        return await self._call(self.sync.quarantine, node, key, value, effect)

    async def uncordon(self, node: str, *, only_if_ours: bool = False) -> Change:
        return await self._call(self.sync.uncordon, node, only_if_ours=only_if_ours)

    async def annotate(self, node: str, annotations: Mapping[str, str | None]) -> Change:
        return await self._call(self.sync.annotate, node, annotations)

    # --- GPU withdrawal (DRA device taints, or the device-plugin node-taint fallback)

    async def gpu_allocation_mode(self) -> str:
        return await self._call(self.sync.gpu_allocation_mode)

    async def withdraw_gpu(self, node: str, gpu: GpuRef, *, effect: str = "NoSchedule", value: str = "") -> Change:
        return await self._call(self.sync.withdraw_gpu, node, gpu, effect=effect, value=value)

    async def restore_gpu(self, node: str, gpu: GpuRef) -> Change:
        return await self._call(self.sync.restore_gpu, node, gpu)

    # --- pods and jobs

    async def label(self, node: str, labels: Mapping[str, str | None]) -> Change:
        return await self._call(self.sync.label, node, labels)

    async def pods_selecting(self, node: str, label_keys: Sequence[str]) -> list[dict[str, Any]]:
        return await self._call(self.sync.pods_selecting, node, label_keys)

    async def create_job(self, namespace: str, manifest: Mapping[str, Any]) -> Change:
        return await self._call(self.sync.create_job, namespace, manifest)

    async def delete_job(self, namespace: str, name: str) -> Change:
        return await self._call(self.sync.delete_job, namespace, name)

    async def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return await self._call(self.sync.pods_on_node, node)

    async def drain(self, node: str, *, timeout_s: float | None = None, grace_period_s: int | None = None) -> Change:
        return await self._call(self.sync.drain, node, timeout_s=timeout_s, grace_period_s=grace_period_s)

    async def evict_pods(
        self,
        node: str,
        pods: Iterable[Mapping[str, Any]],
        *,
        timeout_s: float | None = None,
        grace_period_s: int | None = None,
    ) -> Change:
        return await self._call(
            self.sync.evict_pods, node, list(pods), timeout_s=timeout_s, grace_period_s=grace_period_s
        )

    async def find_job(
        self,
        node: str,
        *,
        name: str | None = None,
        namespace: str | None = None,
        pod_filter: Callable[[dict[str, Any]], bool] | None = None,
    ) -> JobRef | None:
        return await self._call(self.sync.find_job, node, name=name, namespace=namespace, pod_filter=pod_filter)

    async def job_of_pod_on_node(self, node: str, namespace: str, name: str) -> JobRef | None:
        return await self._call(self.sync.job_of_pod_on_node, node, namespace, name)

    async def daemon_pod_node(self, namespace: str, name: str) -> str | None:
        return await self._call(self.sync.daemon_pod_node, namespace, name)

    async def daemon_pods_at(self, ip: str) -> list[tuple[str, str, str]]:
        return await self._call(self.sync.daemon_pods_at, ip)

    async def job_pods(self, job: JobRef) -> list[dict[str, Any]]:
        return await self._call(self.sync.job_pods, job)

    async def restart_job(self, job: JobRef, *, restart_id: str, grace_period_s: int | None = None) -> Change:
        return await self._call(self.sync.restart_job, job, restart_id=restart_id, grace_period_s=grace_period_s)

    # --- events and escalation

    async def create_event(
        self, node: str, reason: str, message: str, type: str = "Warning", *, key: str | None = None
    ) -> Change:
        return await self._call(self.sync.create_event, node, reason, message, type, key=key)

    async def escalate(self, node: str, reason: str, incident: str) -> Change:
        return await self._call(self.sync.escalate, node, reason, incident)
