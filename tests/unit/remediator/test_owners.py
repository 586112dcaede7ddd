"""Owner resolution: an event's pod named by its owner's job, once per pod; a bare pod is no job."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from handlers import default_registry
from handlers.base import History
from remediator.contracts import AlertmanagerAlert, FaultEvent, JobRef, Origin, resolve_job
from remediator.ingest.alerts import alert_to_event
from remediator.owners import OwnerResolver, instance_ip, pod_hostname
from tests.unit.handlers.helpers import T0, at, ev

PODS = {
    ("node-1", "gpu-operator", "nvidia-dcgm-exporter-x7k2p"): JobRef("DaemonSet", "nvidia-dcgm-exporter",
                                                                    "gpu-operator", "apps/v1"),
    ("node-1", "ml", "train-a-0"): JobRef("PyTorchJob", "train-a", "ml", "kubeflow.org/v1"),
    ("node-1", "ml", "train-b-0"): JobRef("PyTorchJob", "train-b", "ml", "kubeflow.org/v1"),
    ("node-1", "ml", "train-c-0"): JobRef("Job", "train-c", "ml", "batch/v1"),
    ("node-1", "ml", "scratch"): JobRef("Pod", "scratch", "ml", "v1"),
}

NODES = {"node-1"}
POD_IPS = {"nvidia-dcgm-exporter-x7k2p": "10.64.0.7", "train-a-0": "10.64.0.8"}


class FakeKube:
    """The adapter's job discovery over ``PODS``: ``find_job`` for the one pod ``pod_filter`` keeps (a list of
    the node's pods), ``job_of_pod_on_node`` for one named pod (a GET); ``used`` says which answered."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail
        self.used: list[str] = []

    async def find_job(self, node: str, *, name: str | None = None, namespace: str | None = None,
                       pod_filter: Callable[[dict[str, Any]], bool] | None = None) -> JobRef | None:
        self.calls += 1
        self.used.append("find_job")
        if self.fail:
            raise ConnectionError("API server unreachable")
        assert name is None and pod_filter is not None
        hits = [ref for (n, ns, pod), ref in PODS.items() if n == node and pod_filter({"name": pod, "namespace": ns})]
        return hits[0] if len(hits) == 1 else None

    async def job_of_pod_on_node(self, node: str, namespace: str, name: str) -> JobRef | None:
        self.calls += 1
        self.used.append("job_of_pod_on_node")
        if self.fail:
            raise ConnectionError("API server unreachable")
        return PODS.get((node, namespace, name))

    async def daemon_pod_node(self, namespace: str, name: str) -> str | None:
        self.calls += 1
        self.used.append("daemon_pod_node")
        if self.fail:
            raise ConnectionError("API server unreachable")
        return next((n for (n, ns, pod), ref in PODS.items()
                     if (ns, pod) == (namespace, name) and ref.kind == "DaemonSet"), None)

    async def daemon_pods_at(self, ip: str) -> list[tuple[str, str, str]]:
        self.calls += 1
        self.used.append("daemon_pods_at")
        if self.fail:
            raise ConnectionError("API server unreachable")
        return sorted((ns, pod, n) for (n, ns, pod), ref in PODS.items()
                      if POD_IPS.get(pod) == ip and ref.kind == "DaemonSet")

    async def find_node(self, name: str) -> dict[str, Any] | None:
        self.used.append("find_node")
        return {"name": name} if name in NODES else None


def pod_event(pod: str, **kw: Any):  # type: ignore[no-untyped-def]
    return ev("xid", 13, origin=Origin(pod=pod, namespace="ml"), **kw)


async def test_the_pods_owner_becomes_the_events_job_once_per_pod() -> None:
    kube = FakeKube()
    resolve = OwnerResolver(kube)
    e = await resolve(pod_event("train-a-0"))
    assert e.origin.job == "train-a" and e.origin.pod == "train-a-0"
    assert resolve_job(e.origin, e.labels) == "train-a"
    assert (await resolve(pod_event("train-a-0"))).origin.job == "train-a"
    assert kube.calls == 1  # cached
    assert kube.used == ["job_of_pod_on_node"]  # the event names the namespace: one GET of the pod


async def test_a_pod_without_a_namespace_is_searched_among_the_nodes_pods() -> None:
    kube = FakeKube()
    e = await OwnerResolver(kube)(ev("xid", 13, origin=Origin(pod="train-b-0")))
    assert e.origin.job == "train-b" and kube.used == ["find_job"]


@pytest.mark.parametrize("event", [
    pytest.param(pod_event("scratch"), id="bare-pod-is-no-job"),
    pytest.param(pod_event("gone"), id="pod-not-on-the-node"),
    pytest.param(ev("xid", 13), id="no-pod"),
])
async def test_no_owner_no_job(event: Any) -> None:
    out = await OwnerResolver(FakeKube())(event)
    assert out == event and out.origin.job is None


async def test_a_job_already_known_is_never_looked_up() -> None:
    kube = FakeKube()
    e = ev("xid", 13, origin=Origin(pod="train-a-0", namespace="ml", job="from-ingest"))
    assert await OwnerResolver(kube)(e) is e and kube.calls == 0


async def test_a_failed_lookup_lets_the_event_through_and_is_asked_again_after_the_backoff() -> None:
    now = [0.0]
    kube = FakeKube(fail=True)
    resolve = OwnerResolver(kube, backoff_s=10, clock=lambda: now[0])
    e = pod_event("train-a-0")
    assert await resolve(e) == e
    kube.fail = False
    assert (await resolve(pod_event("train-b-0"))).origin.job is None
    assert kube.calls == 1  # within the backoff: no lookup at all
    now[0] = 11
    assert (await resolve(e)).origin.job == "train-a"
    assert kube.calls == 2


async def test_a_slow_api_server_does_not_hold_the_event() -> None:
    class Slow(FakeKube):
        async def job_of_pod_on_node(self, node: str, namespace: str, name: str) -> JobRef | None:
            self.calls += 1
            await asyncio.sleep(10)
            raise AssertionError("not reached")

    e = pod_event("train-a-0")
    started = asyncio.get_running_loop().time()
    assert await OwnerResolver(Slow(), timeout_s=0.05)(e) == e
    assert asyncio.get_running_loop().time() - started < 1


async def test_a_miss_is_forgotten_after_its_ttl() -> None:
    now = [0.0]
    kube = FakeKube()
    resolve = OwnerResolver(kube, miss_ttl_s=30, clock=lambda: now[0])
    await resolve(pod_event("gone"))
    await resolve(pod_event("gone"))
    assert kube.calls == 1
    now[0] = 31
    await resolve(pod_event("gone"))
    assert kube.calls == 2


async def test_three_jobs_pods_on_one_gpu_point_at_the_hardware_once_owners_are_known() -> None:
    """The demo's Xid 13 in three jobs' pods: alerts name pods only; with their owners resolved they are three
    jobs, so the third is ``app-xid-hardware-suspect`` (without, a pod name is no job and nothing counts)."""
    spec = default_registry().specs["xid"]
    resolve = OwnerResolver(FakeKube())
    h, verdicts = History(), []
    for i, pod in enumerate(("train-a-0", "train-b-0", "train-c-0")):
        v = spec.decide(await resolve(pod_event(pod)), h, at(hours=i), spec.policy)
        verdicts.append(v)
        h = v.history
    d = verdicts[-1].decision
    assert d is not None and d.playbook == "app-xid-hardware-suspect"
    h = History()
    for i, pod in enumerate(("train-a-0", "train-b-0", "train-c-0")):
        v = spec.decide(pod_event(pod), h, at(hours=i), spec.policy)
        h = v.history
        assert v.decision is None


async def test_an_alert_naming_a_node_daemons_pod_names_no_workload() -> None:
    """Under a ServiceMonitor an alert for a GPU with no workload carries the exporter's own pod as ``pod``."""
    kube = FakeKube()
    exporter = Origin(fingerprint="fp-1", pod="nvidia-dcgm-exporter-x7k2p", namespace="gpu-operator",
                      container="nvidia-dcgm-exporter")
    alert = ev("xid", 79, origin=exporter).model_copy(update={"source": "alertmanager"})
    out = await OwnerResolver(kube)(alert)
    assert out.origin == Origin(fingerprint="fp-1")  # the fingerprint stays; no pod, no job
    agent = ev("xid", 79, origin=exporter)  # a container log of that pod: the agent saw it there
    assert (await OwnerResolver(kube)(agent)).origin == exporter


EXPORTER = "nvidia-dcgm-exporter-x7k2p"  # on node-1 (PODS)


def xid79_alert(fingerprint: str, **labels: str) -> FaultEvent:
    """A firing Xid 79 alert with ``labels``, through ingest's real mapping."""
    got = alert_to_event(AlertmanagerAlert.model_validate({
        "status": "firing", "startsAt": "2024-05-01T03:12:00Z", "fingerprint": fingerprint,
        "labels": {"alertname": "GPUXidError", "xid": "79", "gpu": "0", **labels}}), T0)
    assert got is not None
    return got


def exporter_alert(hostname: str = EXPORTER, **labels: str) -> FaultEvent:
    """An alert from a dcgm-exporter run without ``NODE_NAME``: its ``Hostname`` is its pod's hostname, and
    the ServiceMonitor put that pod in ``pod``/``namespace``."""
    return xid79_alert("fp-9", **{"Hostname": hostname, "pod": EXPORTER, "namespace": "gpu-operator", **labels})


async def test_an_alert_named_after_its_exporters_pod_is_placed_on_the_pods_node() -> None:
    kube = FakeKube()
    resolve = OwnerResolver(kube)
    out = await resolve(exporter_alert())
    assert out.node == "node-1"
    assert out.labels["node_from_pod"] == f"gpu-operator/{EXPORTER}" and out.labels["Hostname"] == EXPORTER
    assert out.origin.pod is None  # then the exporter's own pod names no workload, as before
    assert (await resolve(exporter_alert())).node == "node-1"
    assert kube.used.count("daemon_pod_node") == 1  # once per pod


async def test_with_a_workload_the_exporters_pod_is_the_scrape_pod_and_the_job_is_still_found() -> None:
    kube = FakeKube()
    out = await OwnerResolver(kube)(exporter_alert(exported_pod="train-a-0", exported_namespace="ml"))
    assert out.node == "node-1" and out.labels["scrape_pod"] == EXPORTER
    assert out.labels["scrape_namespace"] == "gpu-operator"
    assert (out.origin.pod, out.origin.job) == ("train-a-0", "train-a")


@pytest.mark.parametrize("event", [
    pytest.param(exporter_alert(hostname="node-1"), id="hostname-is-the-node"),
    pytest.param(exporter_alert(hostname="train-a-0", pod="train-a-0", namespace="ml"), id="not-a-daemons-pod"),
    pytest.param(ev("xid", 79, node=EXPORTER, labels={"pod": EXPORTER, "namespace": "gpu-operator"}),
                 id="an-agents-event"),
])
async def test_only_an_alert_named_after_a_daemonset_pods_hostname_moves(event: FaultEvent) -> None:
    kube = FakeKube()
    assert (await OwnerResolver(kube)(event)).node == event.node


async def test_a_pods_hostname_is_its_name_cut_as_the_kubelet_cuts_it() -> None:
    assert pod_hostname("nvidia-dcgm-exporter-x7k2p") == "nvidia-dcgm-exporter-x7k2p"
    long = "a" * 61 + "-.bcd"
    assert pod_hostname(long) == "a" * 61
    assert len(pod_hostname("b" * 80)) == 63


async def test_an_unanswered_pod_lookup_leaves_the_alert_where_it_was() -> None:
    out = await OwnerResolver(FakeKube(fail=True))(exporter_alert())
    assert out.node == EXPORTER and "node_from_pod" not in out.labels


async def test_an_alert_that_names_its_node_costs_no_pod_lookup() -> None:
    kube = FakeKube()
    await OwnerResolver(kube)(exporter_alert(hostname="node-1"))
    assert "daemon_pod_node" not in kube.used


def static_scrape_alert(instance: str = "10.64.0.7:9400", hostname: str = EXPORTER) -> FaultEvent:
    """An alert from a scrape with no Kubernetes labels: only ``instance``, the exporter's address, says where
    it came from; its ``Hostname`` is its pod's hostname (no ``NODE_NAME``)."""
    return xid79_alert("fp-10", Hostname=hostname, instance=instance, job="dcgm-static")


async def test_an_alert_from_a_static_scrape_is_placed_on_the_node_of_the_exporter_pod_at_its_address() -> None:
    kube = FakeKube()
    resolve = OwnerResolver(kube)
    out = await resolve(static_scrape_alert())
    assert out.node == "node-1" and out.labels["node_from_pod"] == f"gpu-operator/{EXPORTER}"
    assert out.labels["Hostname"] == EXPORTER and out.labels["instance"] == "10.64.0.7:9400"
    assert (await resolve(static_scrape_alert())).node == "node-1"
    assert kube.used.count("daemon_pods_at") == 1  # once per (address, hostname)


@pytest.mark.parametrize(("instance", "hostname"), [
    pytest.param("10.64.0.7:9400", "node-1", id="hostname-is-a-node"),
    pytest.param("10.64.0.8:9400", EXPORTER, id="the-pod-at-the-address-is-no-daemons"),
    pytest.param("10.64.0.9:9400", EXPORTER, id="no-pod-at-the-address"),
    pytest.param("10.64.0.7:9400", "nvidia-dcgm-exporter-other", id="another-pods-hostname"),
    pytest.param("dcgm.gpu-operator.svc:9400", EXPORTER, id="instance-is-a-name"),
])
async def test_a_static_scrape_alert_moves_only_to_the_daemonset_pod_its_address_and_hostname_name(
        instance: str, hostname: str) -> None:
    event = static_scrape_alert(instance, hostname)
    kube = FakeKube()
    out = await OwnerResolver(kube)(event)
    assert out.node == event.node and "node_from_pod" not in out.labels
    if hostname == "node-1" or not instance[0].isdigit():
        assert "daemon_pods_at" not in kube.used  # a node, or no address: no list of pods


async def test_an_unanswered_address_lookup_leaves_the_alert_where_it_was() -> None:
    out = await OwnerResolver(FakeKube(fail=True))(static_scrape_alert())
    assert out.node == EXPORTER and "node_from_pod" not in out.labels


@pytest.mark.parametrize(("instance", "ip"), [
    ("10.64.0.7:9400", "10.64.0.7"), ("10.64.0.7", "10.64.0.7"), ("[fd00:0::7]:9400", "fd00::7"),
    ("fd00::7", "fd00::7"), ("gpu-node-3:9400", None), ("", None), (None, None), ("10.64.0.300:9400", None),
    ("[fd00::7", None), ("1" * 80, None),
])
def test_an_instance_is_an_address_only_when_its_host_is_an_ip(instance: str | None, ip: str | None) -> None:
    assert instance_ip(instance) == ip
