"""Owner resolution: the job of the pod an event names, from the pod's owner references, once per pod.

Where it sits: in the service, between a delivery on FAULTS and the handlers. An alert (ingest) or a
container log (the agent) names the pod a fault was seen in (``FaultEvent.origin``: namespace, pod), never
its job: neither knows the pod's owner. Dispatch hands each event to ``OwnerResolver`` before it asks the
registry which handlers to call, and the resolver fills ``origin.job`` from the Kubernetes adapter's job
discovery (``job_of_pod_on_node``, one GET of the pod when the event names its namespace, else ``find_job``
over the node's pods: owner references first, then the Kubeflow, JobSet and batch labels), so
``contracts.resolve_job`` sees the owner reference first, as its precedence says. A bare pod (nothing owns
it) has no job: a pod's name is never taken for one. An alert that names a node daemon's pod (a DaemonSet's
or a mirror pod) names no workload: under the kube-prometheus ServiceMonitor an alert's ``pod``/``namespace``
are the scrape target's, dcgm-exporter's own, and the workload's come as ``exported_pod`` only when the GPU
has one (reference/gpu-faults.md §2.6). Such an event's origin loses the pod, namespace, UID and container.
The agent's events keep theirs: a container log is that pod's, whatever owns it.

**An alert placed on its exporter's pod.** dcgm-exporter names the host from ``NODE_NAME`` when its pod has
it (the GPU Operator and the exporter's Helm chart set it from ``spec.nodeName``), else from the container's
hostname, which for a pod without ``hostNetwork`` is the pod's name (the kubelet cuts it to 63 characters
and trims a trailing ``-``/``.``: ``truncatePodHostnameIfNeeded``). Such an alert's ``Hostname`` names
no node, and every guard would refuse it (``opt_out``: the node does not exist). When an alert's node is
the hostname of the scrape target's pod (``scrape_pod``/``scrape_namespace``, else ``pod``/``namespace``:
``ingest.alerts.event_labels``) and that pod is a DaemonSet's, the event is placed on the node the pod runs
on, and the label ``node_from_pod`` says so (``namespace/pod``); the alert's own labels stay as they came.
One GET of the pod, cached as the owners are.

A scrape without Kubernetes labels (a static target, or service discovery with no relabelling) names no pod:
the alert has only ``instance``, the exporter's address. When that address is an IP and the alert's node is
no node of the cluster, the exporter is the DaemonSet pod with that pod IP (one list of pods with the field
selector ``status.podIP``) whose hostname is the alert's node; the event is placed on that pod's node, with
``node_from_pod`` as above. An exporter on the host network has the node's address and the node's hostname,
so its alerts name their node and are never moved. Cached per (address, hostname): a pod that is recreated
has another name, so an answer never outlives the pod it came from.

Best effort, cached: an event whose origin already names a job, or names no pod, passes unchanged; an answer
is kept per (node, namespace, pod) for ``ttl_s`` (a pod's owner does not change while it lives), a pod not
found for ``miss_ttl_s``. A lookup that fails or takes longer than ``timeout_s`` is logged, not cached, and
the event goes on without a job; for ``backoff_s`` after that no lookup is tried, so a slow or absent API
server neither holds up a hardware fault nor fills the adapter's threads, which the executor's steps need.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from remediator.contracts import FaultEvent, JobRef

log = logging.getLogger(__name__)

__all__ = ["NODE_DAEMON_KINDS", "JobFinder", "OwnerResolver", "instance_ip", "pod_hostname"]

_K = TypeVar("_K")
_A = TypeVar("_A")

# What ``job_of_pod_on_node`` answers for a node daemon's pod (a DaemonSet's, a mirror pod): never a job.
NODE_DAEMON_KINDS = frozenset({"DaemonSet", "Node"})


class JobFinder(Protocol):
    """The part of the Kubernetes port owner resolution uses (``remediator.adapters.kube.AsyncKube``)."""

    async def find_job(self, node: str, *, name: str | None = None, namespace: str | None = None,
                       pod_filter: Callable[[dict[str, Any]], bool] | None = None) -> JobRef | None: ...

    async def job_of_pod_on_node(self, node: str, namespace: str, name: str) -> JobRef | None: ...

    async def daemon_pod_node(self, namespace: str, name: str) -> str | None: ...

    async def daemon_pods_at(self, ip: str) -> list[tuple[str, str, str]]: ...

    async def find_node(self, name: str) -> dict[str, Any] | None: ...


def pod_hostname(pod: str) -> str:
    """The hostname a pod without ``hostNetwork`` gets: its name, cut to 63 characters with a trailing ``-``
    or ``.`` trimmed (the kubelet's ``truncatePodHostnameIfNeeded``)."""
    return pod if len(pod) <= 63 else pod[:63].rstrip("-.")


def instance_ip(instance: str | None) -> str | None:
    """The IP address of a Prometheus ``instance`` label (``10.0.3.7:9400``, ``[fd00::7]:9400``, a bare
    address), in its canonical text, or None when the instance is a name or not an address at all."""
    if not instance or len(instance) > 64:
        return None
    host = instance
    if host.startswith("["):  # [v6]:port
        host, closed, _ = host[1:].partition("]")
        if not closed:
            return None
    elif host.count(":") == 1:  # v4:port; a bare v6 address has more than one colon
        host = host.partition(":")[0]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


class OwnerResolver:
    """``await resolver(event)``: ``event`` with ``origin.job`` set from its pod's owner, when there is one."""

    def __init__(self, kube: JobFinder, *, ttl_s: float = 3600.0, miss_ttl_s: float = 30.0, size: int = 4096,
                 timeout_s: float = 2.0, backoff_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._kube = kube
        self._ttl_s = ttl_s
        self._miss_ttl_s = miss_ttl_s
        self._size = size
        self._timeout_s = timeout_s
        self._backoff_s = backoff_s
        self._clock = clock
        self._quiet_until = float("-inf")
        self._known: OrderedDict[tuple[str, str, str], tuple[JobRef | None, float]] = OrderedDict()
        self._hosts: OrderedDict[tuple[str, str], tuple[str | None, float]] = OrderedDict()
        self._at: OrderedDict[tuple[str, str], tuple[tuple[str, str] | None, float]] = OrderedDict()
        self.lookups = 0

    async def __call__(self, event: FaultEvent) -> FaultEvent:
        if event.source == "alertmanager":
            event = await self._placed(event)
        origin = event.origin
        if origin.job or not origin.pod:
            return event
        job, daemon = await self.owner_of(event.node, origin.namespace, origin.pod)
        if daemon and event.source == "alertmanager":
            # The pod an alert names is a node daemon's: the scrape target's own (dcgm-exporter's, whose pod
            # labels a ServiceMonitor puts in pod/namespace when the GPU has no workload to name in
            # exported_pod). It is no workload's, so the event names none.
            return event.model_copy(update={"origin": origin.model_copy(
                update={"pod": None, "namespace": None, "pod_uid": None, "container": None})})
        if job is None:
            return event
        return event.model_copy(update={"origin": origin.model_copy(update={"job": job})})

    async def _placed(self, event: FaultEvent) -> FaultEvent:
        """``event`` on the node of the exporter pod whose hostname it names (see "An alert placed on its
        exporter's pod" above): the pod its labels name, else the DaemonSet pod at its ``instance`` address;
        unchanged when its node is not such a pod's hostname or the pod is unknown."""
        labels = event.labels
        pod = labels.get("scrape_pod") or labels.get("pod")
        namespace = labels.get("scrape_namespace") or labels.get("namespace")
        if pod and namespace:
            if event.node != pod_hostname(pod):
                return event
            node = await self.node_of(namespace, pod)
            where = f"{namespace}/{pod}"
        else:
            ip = instance_ip(labels.get("instance"))
            found = await self.node_at(ip, event.node) if ip is not None else None
            if found is None:
                return event
            node, where = found
        if node is None or node == event.node:
            return event
        log.info("alert %s names %s, the hostname of pod %s: placed on its node %s",
                 event.origin.fingerprint or event.id, event.node, where, node)
        return event.model_copy(update={"node": node, "labels": {**labels, "node_from_pod": where}})

    async def node_at(self, ip: str, hostname: str) -> tuple[str, str] | None:
        """``(node, "namespace/pod")`` of the DaemonSet pod with pod IP ``ip`` whose hostname is ``hostname``,
        when ``hostname`` is no node (None: it is one, no such pod, or the API did not answer)."""

        async def lookup() -> tuple[str, str] | None:
            if await self._kube.find_node(hostname) is not None:
                return None  # the alert names its node (an exporter on the host network has its address)
            hits = [(node, f"{ns}/{name}") for ns, name, node in await self._kube.daemon_pods_at(ip)
                    if pod_hostname(name) == hostname]
            return hits[0] if len(hits) == 1 else None

        return await self._asked(self._at, (ip, hostname), lookup, f"exporter pod at {ip}")

    async def node_of(self, namespace: str, pod: str) -> str | None:
        """The node DaemonSet pod ``namespace/pod`` runs on (None: not such a pod, or the API did not answer)."""
        return await self._asked(self._hosts, (namespace, pod), lambda: self._kube.daemon_pod_node(namespace, pod),
                                 f"node of pod {namespace}/{pod}")

    async def owner_of(self, node: str, namespace: str | None, pod: str) -> tuple[str | None, bool]:
        """The name of the controller of ``namespace/pod`` on ``node`` (None: a bare pod, a node daemon's, not
        found, or the API did not answer), and whether the pod is a node daemon's (a DaemonSet's or a mirror
        pod; known only when the namespace is)."""

        def the_pod(p: dict[str, Any]) -> bool:
            return bool(p.get("name") == pod and (namespace is None or p.get("namespace") == namespace))

        def lookup() -> Awaitable[JobRef | None]:
            # A named namespace is one GET of the pod; without one, the node's pods are listed and searched.
            return self._kube.job_of_pod_on_node(node, namespace, pod) if namespace \
                else self._kube.find_job(node, pod_filter=the_pod)

        ref = await self._asked(self._known, (node, namespace or "", pod), lookup,
                                f"owner of pod {namespace or '?'}/{pod} on {node}")
        daemon = ref is not None and ref.kind in NODE_DAEMON_KINDS
        job = ref.name if ref is not None and ref.kind != "Pod" and not daemon else None
        return job, daemon

    async def _asked(self, cache: OrderedDict[_K, tuple[_A | None, float]], key: _K,
                     ask: Callable[[], Awaitable[_A | None]], what: str) -> _A | None:
        """``ask()``'s answer for ``key``, kept in ``cache`` for ``ttl_s`` (None, a miss, for ``miss_ttl_s``;
        the least recently used dropped past ``size``). None without asking while the lookups back off; a
        lookup that fails or takes longer than ``timeout_s`` is logged, not kept, and starts the backoff."""
        now = self._clock()
        cached = cache.get(key)
        if cached is not None and cached[1] > now:
            cache.move_to_end(key)
            return cached[0]
        if now < self._quiet_until:
            return None
        self.lookups += 1
        try:
            answer = await asyncio.wait_for(ask(), self._timeout_s)
        except Exception as exc:  # best effort: the event goes on as it is; ask again after the backoff
            self._quiet_until = now + self._backoff_s
            log.warning("%s not resolved (%s); no lookups for %g s", what, exc or type(exc).__name__,
                        self._backoff_s)
            return None
        cache[key] = (answer, now + (self._ttl_s if answer is not None else self._miss_ttl_s))
        cache.move_to_end(key)
        while len(cache) > self._size:
            cache.popitem(last=False)
        return answer
