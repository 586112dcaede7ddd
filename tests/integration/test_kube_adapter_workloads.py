"""The Kubernetes adapter on apps/v1 workloads and graceful termination, against the simulated API server.

Where it sits: integration ring for remediator/adapters/kube.py, beside ``test_kube_adapter.py``. Cluster:
``seed_cluster(nodes=4)`` (a training pod on GPUs 0-3 of every node) plus, in namespace ``serving``, a
Deployment ``web`` and a StatefulSet ``db`` of two 1-GPU pods each. One manual clock drives both the
simulator (graceful deletion deadlines) and the adapter (``clock``/``sleep``), so waiting for a grace period
takes no wall time and the drain's timeout is exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chaos.sim import ClusterState, KubeApiServer, seed_cluster
from remediator.adapters.kube import (
    RESTART_ID_ANNOTATION,
    DrainTimeout,
    KubeAdapter,
)
from remediator.contracts import JobRef

NS = "serving"

pytestmark = pytest.mark.timeout(60)


class ManualClock:
    """Simulated time for both sides: ``now`` (the cluster's UTC clock), ``monotonic`` and ``sleep`` (the
    adapter's), all moved by ``sleep``/``advance``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._elapsed = 0.0
        self._start = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        with self._lock:
            return self._start + timedelta(seconds=self._elapsed)

    def monotonic(self) -> float:
        with self._lock:
            return self._elapsed

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._elapsed += max(0.0, seconds)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def cluster(clock: ManualClock) -> ClusterState:
    state = seed_cluster(nodes=4, clock=clock.now)
    state.add_deployment(NS, "web", replicas=2, gpus_per_pod=1)
    state.add_statefulset(NS, "db", replicas=2, gpus_per_pod=1)
    return state


@pytest.fixture
def make_adapter(
    cluster: ClusterState, clock: ManualClock, tmp_path: Path
) -> Iterator[Callable[..., KubeAdapter]]:
    made: list[KubeAdapter] = []
    with KubeApiServer(cluster) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")

        def make(**overrides: Any) -> KubeAdapter:
            kwargs: dict[str, Any] = {
                "retry_budget_s": 10.0,
                "backoff_base_s": 0.05,
                "backoff_max_s": 0.5,
                "poll_interval_s": 1.0,
                "drain_grace_period_s": 0,
                "clock": clock.monotonic,
                "sleep": clock.sleep,
                "wall_clock": clock.now,
            }
            kwargs.update(overrides)
            adapter = KubeAdapter(str(kubeconfig), **kwargs)
            made.append(adapter)
            return adapter

        yield make
        for adapter in made:
            adapter.close()


@pytest.fixture
def kube(make_adapter: Callable[..., KubeAdapter]) -> KubeAdapter:
    return make_adapter()


def uids(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def summary_of(kube: KubeAdapter, cluster: ClusterState, name: str) -> dict[str, Any]:
    node = cluster.pod(NS, name)["spec"]["nodeName"]
    return next(p for p in kube.pods_on_node(node) if p["name"] == name)


def workload_pods_on(kube: KubeAdapter, node: str) -> list[dict[str, Any]]:
    return [p for p in kube.pods_on_node(node) if not p["daemonset"]]


# --- job_of_pod --------------------------------------------------------------------------------------


def test_job_of_pod_resolves_a_deployment_pod_through_its_replicaset(kube: KubeAdapter, cluster: ClusterState) -> None:
    pod = cluster.job_pods("Deployment", NS, "web")[0]
    summary = summary_of(kube, cluster, pod["metadata"]["name"])
    assert summary["owner"]["kind"] == "ReplicaSet"
    reads_before = cluster.count("get", "replicasets")

    job = kube.job_of_pod(summary)

    deployment = cluster.get("deployments", "web", NS)
    assert job == JobRef("Deployment", "web", NS, "apps/v1", deployment["metadata"]["uid"])
    assert cluster.count("get", "replicasets") == reads_before + 1  # one read of the ReplicaSet
    assert kube.job_of_pod(pod) == job  # a raw pod object resolves the same way


def test_job_of_pod_names_the_statefulset_of_its_pod(kube: KubeAdapter, cluster: ClusterState) -> None:
    job = kube.job_of_pod(summary_of(kube, cluster, "db-1"))
    sts = cluster.get("statefulsets", "db", NS)
    assert job == JobRef("StatefulSet", "db", NS, "apps/v1", sts["metadata"]["uid"])
    assert [p["name"] for p in kube.job_pods(job)] == ["db-0", "db-1"]


# --- restart_job -------------------------------------------------------------------------------------


def test_restart_job_restarts_every_pod_of_a_deployment_once_per_restart_id(
    kube: KubeAdapter, cluster: ClusterState
) -> None:
    before = uids(cluster.job_pods("Deployment", NS, "web"))
    rs_before = [rs["metadata"]["name"] for rs in cluster.list_objects("replicasets", NS)]
    generation = cluster.get("deployments", "web", NS)["metadata"]["generation"]
    job = kube.job_of_pod(summary_of(kube, cluster, next(iter(before))))
    assert job is not None and job.kind == "Deployment"

    change = kube.restart_job(job, restart_id="inc-3/step-2")

    assert change.changed
    assert {p["uid"] for p in change.after["deleted"]} == set(before.values())
    after = uids(cluster.job_pods("Deployment", NS, "web"))
    assert len(after) == 2 and not set(after.values()) & set(before.values())
    assert all(p["spec"].get("nodeName") for p in cluster.job_pods("Deployment", NS, "web"))
    # the same ReplicaSet recreated them: a restart, not a rollout
    assert [rs["metadata"]["name"] for rs in cluster.list_objects("replicasets", NS)] == rs_before
    deployment = cluster.get("deployments", "web", NS)
    assert deployment["metadata"]["generation"] == generation
    assert deployment["metadata"]["annotations"][RESTART_ID_ANNOTATION] == "inc-3/step-2"
    assert cluster.count("deletecollection", "pods") == 1

    again = kube.restart_job(job, restart_id="inc-3/step-2")

    assert not again.changed
    assert uids(cluster.job_pods("Deployment", NS, "web")) == after
    assert cluster.count("deletecollection", "pods") == 1


def test_restart_job_restarts_a_statefulset_under_the_same_names(kube: KubeAdapter, cluster: ClusterState) -> None:
    before = uids(cluster.job_pods("StatefulSet", NS, "db"))
    job = kube.job_of_pod(summary_of(kube, cluster, "db-0"))
    assert job is not None

    change = kube.restart_job(job, restart_id="inc-4/step-2")

    assert change.changed
    assert sorted(p["name"] for p in change.after["deleted"]) == ["db-0", "db-1"]
    after = uids(cluster.job_pods("StatefulSet", NS, "db"))
    assert sorted(after) == ["db-0", "db-1"]
    assert all(after[name] != uid for name, uid in before.items())
    assert cluster.job_restarts("StatefulSet", NS, "db") == 1  # the whole set went at once

    again = kube.restart_job(job, restart_id="inc-4/step-2")
    assert not again.changed
    assert uids(cluster.job_pods("StatefulSet", NS, "db")) == after

    third = kube.restart_job(job, restart_id="inc-5/step-2")  # a new incident restarts again
    assert third.changed
    assert not set(uids(cluster.job_pods("StatefulSet", NS, "db")).values()) & set(after.values())


def test_restart_job_with_graceful_deletion_waits_for_nothing_and_stays_idempotent(
    kube: KubeAdapter, cluster: ClusterState, clock: ManualClock
) -> None:
    cluster.graceful_deletion = True
    before = uids(cluster.job_pods("StatefulSet", NS, "db"))
    job = JobRef("StatefulSet", "db", NS, "apps/v1")

    change = kube.restart_job(job, restart_id="inc-6/step-1", grace_period_s=15)

    assert change.changed and len(change.after["deleted"]) == 2
    # both pods are terminating under their names; the StatefulSet waits for the names to be free
    assert set(cluster.terminating_pods()) == {f"{NS}/db-0", f"{NS}/db-1"}
    assert cluster.job_pods("StatefulSet", NS, "db") == []
    assert not kube.restart_job(job, restart_id="inc-6/step-1").changed
    assert cluster.count("delete", "pods") == 0  # the repeat deleted nothing one by one either

    clock.advance(16)
    cluster.tick()
    after = uids(cluster.job_pods("StatefulSet", NS, "db"))
    assert sorted(after) == ["db-0", "db-1"] and not set(after.values()) & set(before.values())
    assert not kube.restart_job(job, restart_id="inc-6/step-1").changed


# --- drain with graceful termination -----------------------------------------------------------------


def test_drain_waits_for_evicted_pods_to_terminate(
    kube: KubeAdapter, cluster: ClusterState, clock: ManualClock
) -> None:
    cluster.graceful_deletion = True
    node = cluster.pod(NS, "db-0")["spec"]["nodeName"]
    kube.cordon(node)
    evictable = {p["name"] for p in workload_pods_on(kube, node)}
    assert "db-0" in evictable and len(evictable) >= 2
    seen_terminating: list[set[str]] = []

    def progress(message: str) -> None:
        if message.startswith("waiting for"):
            seen_terminating.append({p["name"] for p in workload_pods_on(kube, node) if p["terminating"]})

    change = kube.drain(node, timeout_s=60, grace_period_s=5, progress=progress)

    assert change.changed
    assert {p["name"] for p in change.after["evicted"]} == evictable
    assert seen_terminating and seen_terminating[0] == evictable  # listed while their grace period ran
    assert 5 <= clock.monotonic() < 10
    assert workload_pods_on(kube, node) == []
    assert cluster.pod(NS, "db-0")["spec"]["nodeName"] != node  # recreated elsewhere once gone


def test_drain_names_pods_still_terminating_when_it_times_out(
    kube: KubeAdapter, cluster: ClusterState, clock: ManualClock
) -> None:
    cluster.graceful_deletion = True
    node = cluster.pod(NS, "db-1")["spec"]["nodeName"]
    kube.cordon(node)
    evictable = {p["name"] for p in workload_pods_on(kube, node)}

    with pytest.raises(DrainTimeout) as err:
        kube.drain(node, timeout_s=10, grace_period_s=120)

    assert {p["name"] for p in err.value.pods_left} == evictable
    assert {p["reason"] for p in err.value.pods_left} == {"still terminating"}
    assert {p["name"] for p in err.value.evicted} == evictable
    assert 10 <= clock.monotonic() < 12
    assert {p["name"] for p in workload_pods_on(kube, node) if p["terminating"]} == evictable


def test_a_drain_run_again_keeps_waiting_for_pods_still_terminating(
    kube: KubeAdapter, cluster: ClusterState, clock: ManualClock
) -> None:
    cluster.graceful_deletion = True
    node = cluster.pod(NS, "db-0")["spec"]["nodeName"]
    kube.cordon(node)
    with pytest.raises(DrainTimeout) as first:
        kube.drain(node, timeout_s=10, grace_period_s=30)
    left = {p["name"] for p in first.value.pods_left}

    # the retry evicts nothing new, but the node is not empty until the terminating pods are gone
    again = kube.drain(node, timeout_s=60)

    assert not again.changed
    assert {p["name"] for p in again.after["skipped"] if p["reason"] == "already terminating"} == left
    assert workload_pods_on(kube, node) == []
    assert 30 <= clock.monotonic() < 35


def test_pods_someone_else_is_deleting_are_waited_for_within_the_timeout(
    kube: KubeAdapter, cluster: ClusterState, clock: ManualClock
) -> None:
    cluster.graceful_deletion = True
    node = cluster.pod(NS, "db-1")["spec"]["nodeName"]
    kube.cordon(node)
    names = {p["name"] for p in workload_pods_on(kube, node)}
    for pod in workload_pods_on(kube, node):
        cluster.delete("pods", pod["name"], pod["namespace"], grace_period=300)

    with pytest.raises(DrainTimeout) as err:
        kube.drain(node, timeout_s=5)

    assert {p["name"] for p in err.value.pods_left} == names
    assert {p["reason"] for p in err.value.pods_left} == {"still terminating"}
    assert err.value.evicted == []
    assert cluster.count("create", "pods/eviction") == 0
    assert 5 <= clock.monotonic() < 7
