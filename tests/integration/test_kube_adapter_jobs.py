"""Job discovery (``find_job``) and the async port (``AsyncKube``) against the simulated API server, over real
HTTP with the official client.

Seeded cluster (``seed_cluster(nodes=4)``): PyTorchJob ``pytorch-0`` with its master on gpu-node-0 and its
worker on gpu-node-1, single-pod Jobs ``train-2`` and ``train-3`` on nodes 2 and 3, DaemonSet pods on every
node.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.sim import TRAINING_NAMESPACE, ClusterState, KubeApiServer, seed_cluster
from remediator.adapters.kube import AsyncKube, KubeAdapter
from remediator.contracts import Change, JobRef

NS = TRAINING_NAMESPACE

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cluster() -> ClusterState:
    return seed_cluster(nodes=4)


@pytest.fixture
def kubeconfig(cluster: ClusterState, tmp_path: Path) -> Iterator[Path]:
    with KubeApiServer(cluster) as srv:
        yield srv.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def kube(kubeconfig: Path) -> Iterator[KubeAdapter]:
    with KubeAdapter(str(kubeconfig), retry_budget_s=5.0, backoff_base_s=0.05, drain_grace_period_s=0) as adapter:
        yield adapter


def uid_of(cluster: ClusterState, plural: str, name: str) -> str:
    return str(cluster.get(plural, name, NS)["metadata"]["uid"])


# --- find_job ----------------------------------------------------------------------------------------


def test_find_job_by_name_through_the_owner_references_of_the_pods_on_the_node(
    kube: KubeAdapter, cluster: ClusterState
) -> None:
    expected = JobRef("PyTorchJob", "pytorch-0", NS, "kubeflow.org/v1", uid_of(cluster, "pytorchjobs", "pytorch-0"))
    assert kube.find_job("gpu-node-0", name="pytorch-0") == expected
    assert kube.find_job("gpu-node-1", name="pytorch-0", namespace=NS) == expected
    assert kube.find_job("gpu-node-2", name="train-2", namespace=NS) == JobRef(
        "Job", "train-2", NS, "batch/v1", uid_of(cluster, "jobs", "train-2"))


def test_find_job_without_a_name_is_the_one_job_on_the_node(kube: KubeAdapter, cluster: ClusterState) -> None:
    job = kube.find_job("gpu-node-3")
    assert job is not None and (job.kind, job.name, job.namespace) == ("Job", "train-3", NS)
    assert kube.find_job("gpu-node-3", pod_filter=lambda _pod: False) is None  # no workload pod selected


def test_find_job_by_name_falls_back_to_the_gang_kinds_when_no_pod_of_it_is_on_the_node(
    kube: KubeAdapter, cluster: ClusterState
) -> None:
    assert kube.find_job("gpu-node-3", name="pytorch-0", namespace=NS) == JobRef(
        "PyTorchJob", "pytorch-0", NS, "kubeflow.org/v1", uid_of(cluster, "pytorchjobs", "pytorch-0"))
    assert kube.find_job("gpu-node-3", name="train-2", namespace=NS) == JobRef(
        "Job", "train-2", NS, "batch/v1", uid_of(cluster, "jobs", "train-2"))
    assert kube.find_job("gpu-node-0", name="no-such-job", namespace=NS) is None
    assert kube.find_job("gpu-node-0", name="pytorch-0", namespace="elsewhere") is None  # namespace is kept


def test_find_job_resolves_a_deployment_pod_through_its_replicaset(kube: KubeAdapter, cluster: ClusterState) -> None:
    cluster.add_deployment("serving", "web", replicas=1)
    pod = cluster.job_pods("Deployment", "serving", "web")[0]
    node = pod["spec"]["nodeName"]
    job = kube.find_job(node, name="web", namespace="serving")
    assert job == JobRef("Deployment", "web", "serving", "apps/v1",
                         cluster.get("deployments", "web", "serving")["metadata"]["uid"])


def test_a_job_of_a_jobset_resolves_to_the_jobset(kube: KubeAdapter, cluster: ClusterState) -> None:
    jobset_uid = "0b9d5c3e-0000-4000-8000-00000000js01"
    job = cluster.create("jobs", {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "llm-workers-0", "namespace": NS,
                     "labels": {"jobset.sigs.k8s.io/jobset-name": "llm"},
                     "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "llm",
                                          "uid": jobset_uid, "controller": True}]},
        "spec": {"suspend": True, "template": {"spec": {"containers": [{"name": "w", "image": "x"}],
                                                        "restartPolicy": "Never"}}},
    }, NS)
    cluster.create("pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "llm-workers-0-0", "namespace": NS,
                     "labels": {"jobset.sigs.k8s.io/jobset-name": "llm",
                                "batch.kubernetes.io/job-name": "llm-workers-0"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "llm-workers-0",
                                          "uid": job["metadata"]["uid"], "controller": True}]},
        "spec": {"nodeName": "gpu-node-3", "containers": [{"name": "w", "image": "x"}]},
    }, NS)
    expected = JobRef("JobSet", "llm", NS, "jobset.x-k8s.io/v1alpha2", jobset_uid)
    assert kube.find_job("gpu-node-3", name="llm", namespace=NS) == expected
    assert kube.find_job("gpu-node-3", pod_filter=lambda p: p["name"].startswith("llm")) == expected


def test_the_job_of_one_named_pod_is_one_get_of_that_pod(kube: KubeAdapter, cluster: ClusterState) -> None:
    """Owner resolution's lookup: the pod by namespace and name, its controller when it runs on that node."""
    train = next(p["metadata"]["name"] for p in cluster.list_pods(NS) if p["spec"].get("nodeName") == "gpu-node-2")
    exporter = next(p["metadata"] for p in cluster.list_pods("gpu-operator")
                    if p["spec"].get("nodeName") == "gpu-node-2")
    cluster.create("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "scratch", "namespace": NS},
                            "spec": {"nodeName": "gpu-node-2", "containers": [{"name": "s", "image": "x"}]}}, NS)
    cluster.reset_counters()
    assert kube.job_of_pod_on_node("gpu-node-2", NS, train) == JobRef(
        "Job", "train-2", NS, "batch/v1", uid_of(cluster, "jobs", "train-2"))
    assert cluster.request_counts() == {"get pods": 1}  # one GET, no list of the node's pods
    assert kube.job_of_pod_on_node("gpu-node-3", NS, train) is None  # the pod runs elsewhere
    assert kube.job_of_pod_on_node("gpu-node-2", NS, "no-such-pod") is None
    daemon = kube.job_of_pod_on_node("gpu-node-2", exporter["namespace"], exporter["name"])
    assert daemon is not None and (daemon.kind, daemon.name) == ("DaemonSet", "nvidia-dcgm-exporter")  # no job
    bare = kube.job_of_pod_on_node("gpu-node-2", NS, "scratch")
    assert bare is not None and (bare.kind, bare.name) == ("Pod", "scratch")  # itself, never a guessed job


# --- the async port ----------------------------------------------------------------------------------


class CountingKube(KubeAdapter):
    """Records the threads its reads ran on and how many ran at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads: set[str] = set()
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def get_node(self, name: str) -> dict[str, Any]:
        with self._lock:
            self.threads.add(threading.current_thread().name)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.05)
            return super().get_node(name)
        finally:
            with self._lock:
                self.running -= 1


async def test_the_async_port_hops_once_onto_its_own_bounded_pool(kubeconfig: Path) -> None:
    sync = CountingKube(str(kubeconfig))
    port = AsyncKube(sync, max_workers=2)
    try:
        nodes = await asyncio.gather(*(port.get_node(f"gpu-node-{i % 4}") for i in range(8)))
    finally:
        port.close()
    assert [n["name"] for n in nodes] == [f"gpu-node-{i % 4}" for i in range(8)]
    assert sync.most == 2  # never more than the pool's bound, and the calls did overlap
    assert sync.threads and all(t.startswith("kube") for t in sync.threads)
    assert threading.current_thread().name not in sync.threads


CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="")


class ContextKube(KubeAdapter):
    def get_node(self, name: str) -> dict[str, Any]:
        return {**super().get_node(name), "caller": CALLER.get()}


async def test_the_callers_context_travels_into_the_ports_thread(kubeconfig: Path) -> None:
    port = AsyncKube(ContextKube(str(kubeconfig)))
    try:
        CALLER.set("step drain")  # as a current trace span would be
        node = await port.get_node("gpu-node-0")
    finally:
        port.close()
    assert node["caller"] == "step drain"


async def test_the_async_port_finds_and_restarts_a_job_and_reports_a_change(
    kubeconfig: Path, cluster: ClusterState
) -> None:
    port = AsyncKube(KubeAdapter(str(kubeconfig), drain_grace_period_s=0))
    try:
        assert await port.find_node("no-such-node") is None
        job = await port.find_job("gpu-node-0", name="pytorch-0", namespace=NS)
        assert job is not None
        change = await port.restart_job(job, restart_id="inc-1|restart")
        again = await port.restart_job(job, restart_id="inc-1|restart")
    finally:
        port.close()
    assert isinstance(change, Change) and change.changed
    assert {p["name"] for p in change.after["deleted"]} == {"pytorch-0-master-0", "pytorch-0-worker-0"}
    assert not again.changed
