"""The simulator's apps/v1 workloads, eviction preconditions and graceful deletion, seen through the real
clients: ``kubectl`` (v1.32) and the official Python client.

Where it sits: integration ring for chaos/sim, beside ``test_kube_sim.py``. Seeded cluster
(``seed_cluster(4)``): every node runs one training pod on GPUs 0-3, so each has four GPUs free for the
workloads a test adds with ``ClusterState.add_deployment`` / ``add_statefulset``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from chaos.sim import ClusterState, KubeApiServer, seed_cluster

pytestmark = pytest.mark.timeout(120)

NS = "serving"


class ManualClock:
    """The state's clock, moved by the test (graceful deletion runs on it)."""

    def __init__(self) -> None:
        self._now = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)


@dataclass
class Sim:
    state: ClusterState
    kubeconfig: Path
    tmp: Path
    clock: ManualClock


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Sim]:
    clock = ManualClock()
    state = seed_cluster(4, clock=clock)
    with KubeApiServer(state) as server:
        yield Sim(state, server.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path, clock)


@pytest.fixture
def api(sim: Sim) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(sim.kubeconfig))
    yield api_client
    api_client.close()


def kubectl(sim: Sim, *args: str) -> str:
    binary = shutil.which("kubectl") or "/usr/bin/kubectl"
    if not Path(binary).exists():
        pytest.fail("kubectl is not installed: these tests need a real kubectl (v1.32)")
    env = {**os.environ, "HOME": str(sim.tmp), "KUBECONFIG": str(sim.kubeconfig)}
    proc = subprocess.run([binary, "--kubeconfig", str(sim.kubeconfig), "--cache-dir", str(sim.tmp / "kcache"),
                           "--request-timeout=30s", *args],
                          capture_output=True, text=True, timeout=90, env=env, check=False)
    assert proc.returncode == 0, f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def pods_by_name(state: ClusterState, namespace: str = NS) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in state.list_pods(namespace)}


def deployment_body(name: str, labels: dict[str, str], template_labels: dict[str, str] | None = None) -> Any:
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=template_labels if template_labels is not None else labels),
                spec=client.V1PodSpec(containers=[client.V1Container(
                    name="srv", image="nginx:1.27",
                    resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"},
                                                            requests={"nvidia.com/gpu": "1"}))]))))


# --- discovery and listing -------------------------------------------------------------------------


def test_discovery_serves_deployments_replicasets_and_statefulsets(sim: Sim, api: client.ApiClient) -> None:
    resources = {r.name: r for r in client.AppsV1Api(api).get_api_resources().resources}
    assert {"daemonsets", "deployments", "replicasets", "statefulsets"} <= set(resources)
    assert resources["deployments"].short_names == ["deploy"]
    assert resources["statefulsets"].short_names == ["sts"]
    assert resources["replicasets"].short_names == ["rs"]
    assert resources["deployments"].kind == "Deployment" and resources["deployments"].namespaced
    assert {"deployments/status", "replicasets/status", "statefulsets/status"} <= set(resources)

    rows = [line.split() for line in kubectl(sim, "api-resources", "--api-group=apps").splitlines()[1:]]
    assert {r[0]: r[1] for r in rows if len(r) == 5} == {"daemonsets": "ds", "deployments": "deploy",
                                                          "replicasets": "rs", "statefulsets": "sts"}
    # nothing seeded by default: the existing layout is unchanged
    assert sim.state.list_objects("deployments") == []
    assert sim.state.list_objects("statefulsets") == []


def test_kubectl_gets_deployments_statefulsets_and_replicasets_in_all_namespaces(sim: Sim) -> None:
    sim.state.add_deployment(NS, "web", replicas=3, gpus_per_pod=1)
    sim.state.add_statefulset("inference", "kv", replicas=2)
    rs_name = sim.state.list_objects("replicasets", NS)[0]["metadata"]["name"]

    out = kubectl(sim, "get", "deploy,sts,rs", "-A")
    rows = {line.split()[1]: line.split() for line in out.splitlines()
            if line.strip() and not line.startswith("NAMESPACE")}
    assert rows["deployment.apps/web"] == [NS, "deployment.apps/web", "3/3", "3", "3", "0s"]
    assert rows["statefulset.apps/kv"] == ["inference", "statefulset.apps/kv", "2/2", "0s"]
    assert rows[f"replicaset.apps/{rs_name}"] == [NS, f"replicaset.apps/{rs_name}", "3", "3", "3", "0s"]
    headers = [line.split() for line in out.splitlines() if line.startswith("NAMESPACE")]
    assert ["NAMESPACE", "NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"] in headers
    assert ["NAMESPACE", "NAME", "DESIRED", "CURRENT", "READY", "AGE"] in headers

    wide = kubectl(sim, "get", "rs", "-n", NS, "-o", "wide")
    assert f"app=web,pod-template-hash={rs_name.rsplit('-', 1)[1]}" in wide
    assert sim.state.count("list", "statefulsets") >= 1


# --- controllers -----------------------------------------------------------------------------------


def test_a_deployment_owns_one_replicaset_that_owns_its_pods(sim: Sim, api: client.ApiClient) -> None:
    dep = sim.state.add_deployment(NS, "web", replicas=3, gpus_per_pod=1)
    apps = client.AppsV1Api(api)

    rss = apps.list_namespaced_replica_set(NS).items
    assert len(rss) == 1
    rs = rss[0]
    owner = rs.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.uid, owner.controller) == ("Deployment", "web", dep["metadata"]["uid"], True)
    pod_hash = rs.metadata.labels["pod-template-hash"]
    assert rs.metadata.name == f"web-{pod_hash}"
    assert rs.spec.replicas == 3 and rs.spec.selector.match_labels == {"app": "web", "pod-template-hash": pod_hash}
    assert rs.status.replicas == 3 and rs.status.ready_replicas == 3

    pods = client.CoreV1Api(api).list_namespaced_pod(NS).items
    assert len(pods) == 3
    for pod in pods:
        ref = pod.metadata.owner_references[0]
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("ReplicaSet", rs.metadata.name, rs.metadata.uid, True)
        assert pod.metadata.name.startswith(f"{rs.metadata.name}-")
        assert pod.metadata.labels == {"app": "web", "pod-template-hash": pod_hash}
        assert pod.status.phase == "Running" and pod.spec.node_name
        assert sim.state.gpu_indices_of(NS, pod.metadata.name) == [4]  # GPUs 0-3 hold the training pod

    status = apps.read_namespaced_deployment("web", NS).status
    assert (status.replicas, status.ready_replicas, status.available_replicas, status.updated_replicas) == (3, 3, 3, 3)
    assert {c.type: c.status for c in status.conditions} == {"Available": "True", "Progressing": "True"}

    # a lost pod is replaced under a fresh name, in the same ReplicaSet
    victim = pods[0].metadata.name
    sim.state.delete("pods", victim, NS)
    after = pods_by_name(sim.state)
    assert victim not in after and len(after) == 3
    assert len(sim.state.list_objects("replicasets", NS)) == 1
    assert sim.state.job_restarts("ReplicaSet", NS, rs.metadata.name) == 1
    assert len(sim.state.job_pods("Deployment", NS, "web")) == 3


def test_the_official_client_creates_scales_and_deletes_workloads(sim: Sim, api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    created = apps.create_namespaced_deployment("default", deployment_body("api", {"app": "api"}))
    assert created.spec.replicas == 2 and created.spec.strategy.type == "RollingUpdate"
    assert created.status.ready_replicas == 2  # the controllers ran before the answer
    assert {d.metadata.name for d in apps.list_deployment_for_all_namespaces().items} == {"api"}
    assert len(apps.list_replica_set_for_all_namespaces().items) == 1

    apps.patch_namespaced_deployment("api", "default", {"spec": {"replicas": 4}})
    assert len(sim.state.list_pods("default", label_selector="app=api")) == 4
    assert apps.read_namespaced_deployment("api", "default").status.available_replicas == 4

    sim.state.add_statefulset(NS, "db", replicas=2)
    assert [s.metadata.name for s in apps.list_namespaced_stateful_set(NS).items] == ["db"]
    apps.patch_namespaced_stateful_set("db", NS, {"spec": {"replicas": 4}})
    assert sorted(pods_by_name(sim.state)) == ["db-0", "db-1", "db-2", "db-3"]
    apps.patch_namespaced_stateful_set("db", NS, {"spec": {"replicas": 1}})
    assert sorted(pods_by_name(sim.state)) == ["db-0"]  # the highest ordinals go
    assert apps.read_namespaced_stateful_set("db", NS).status.replicas == 1

    apps.delete_namespaced_deployment("api", "default")
    assert sim.state.list_objects("replicasets") == []
    assert sim.state.list_pods("default") == []
    apps.delete_namespaced_stateful_set("db", NS)
    assert sim.state.list_pods(NS) == []


def test_a_workload_whose_selector_misses_its_template_is_invalid(sim: Sim, api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    with pytest.raises(ApiException) as err:
        apps.create_namespaced_deployment("default", deployment_body("bad", {"app": "x"}, {"app": "y"}))
    assert err.value.status == 422
    assert "`selector` does not match template `labels`" in str(err.value.body)
    assert sim.state.list_objects("deployments") == []


def test_a_deleted_statefulset_pod_comes_back_under_the_same_name(sim: Sim, api: client.ApiClient) -> None:
    sts = sim.state.add_statefulset(NS, "db", replicas=3, gpus_per_pod=2)
    pods = pods_by_name(sim.state)
    assert sorted(pods) == ["db-0", "db-1", "db-2"]
    for i in range(3):
        pod = pods[f"db-{i}"]
        assert pod["metadata"]["ownerReferences"][0]["uid"] == sts["metadata"]["uid"]
        assert pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == f"db-{i}"
        assert pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == str(i)
        assert pod["spec"]["hostname"] == f"db-{i}" and pod["spec"]["subdomain"] == "db"

    assert 'pod "db-1" deleted' in kubectl(sim, "delete", "pod", "db-1", "-n", NS)
    client.CoreV1Api(api).delete_namespaced_pod("db-2", NS)

    after = pods_by_name(sim.state)
    assert sorted(after) == ["db-0", "db-1", "db-2"]
    assert after["db-0"]["metadata"]["uid"] == pods["db-0"]["metadata"]["uid"]
    for name in ("db-1", "db-2"):
        assert after[name]["metadata"]["uid"] != pods[name]["metadata"]["uid"]
        assert after[name]["status"]["phase"] == "Running" and after[name]["spec"]["nodeName"]
    assert sim.state.job_restarts("StatefulSet", NS, "db") == 2
    assert client.AppsV1Api(api).read_namespaced_stateful_set("db", NS).status.ready_replicas == 3


def test_workload_pods_wait_for_free_gpus(tmp_path: Path) -> None:
    # two nodes, each with the PyTorchJob's rank on GPUs 0-3: room for two 4-GPU pods only
    state = seed_cluster(2)
    state.add_statefulset(NS, "big", replicas=3, gpus_per_pod=4)
    pods = pods_by_name(state)
    bound = sorted(p["spec"]["nodeName"] for p in pods.values() if p["spec"].get("nodeName"))
    assert bound == ["gpu-node-0", "gpu-node-1"]
    pending = [p for p in pods.values() if not p["spec"].get("nodeName")]
    assert len(pending) == 1
    assert pending[0]["status"]["conditions"][0]["reason"] == "Unschedulable"
    assert all(state.gpu_indices_of(NS, p["metadata"]["name"]) == [4, 5, 6, 7]
               for p in pods.values() if p["spec"].get("nodeName"))

    state.delete("pytorchjobs", "pytorch-0", "training")  # frees GPUs 0-3 on both nodes
    pod = state.pod(NS, pending[0]["metadata"]["name"])
    assert pod["status"]["phase"] == "Running"
    assert state.gpu_indices_of(NS, pod["metadata"]["name"]) == [0, 1, 2, 3]


# --- eviction preconditions ------------------------------------------------------------------------


def _eviction(name: str, uid: str | None, grace: int | None = None) -> Any:
    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid) if uid else None,
                                     grace_period_seconds=grace)
    return client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=NS), delete_options=options)


def test_eviction_with_another_pods_uid_is_a_conflict(sim: Sim, api: client.ApiClient) -> None:
    sim.state.add_statefulset(NS, "db", replicas=1)
    core = client.CoreV1Api(api)
    old_uid = sim.state.pod(NS, "db-0")["metadata"]["uid"]
    sim.state.delete("pods", "db-0", NS)  # the StatefulSet brings db-0 back: same name, new UID
    new_uid = sim.state.pod(NS, "db-0")["metadata"]["uid"]
    assert new_uid != old_uid

    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_eviction("db-0", NS, _eviction("db-0", old_uid))
    assert err.value.status == 409
    assert f"UID in precondition: {old_uid}" in str(err.value.body)
    assert sim.state.pod(NS, "db-0")["metadata"]["uid"] == new_uid  # untouched

    core.create_namespaced_pod_eviction("db-0", NS, _eviction("db-0", new_uid))
    assert sim.state.pod(NS, "db-0")["metadata"]["uid"] not in (old_uid, new_uid)
    assert sim.state.count("create", "pods/eviction") == 2


# --- graceful deletion -----------------------------------------------------------------------------


def test_graceful_deletion_keeps_an_evicted_pod_terminating_for_its_grace_period(
    sim: Sim, api: client.ApiClient
) -> None:
    state = sim.state
    assert state.graceful_deletion is False
    state.graceful_deletion = True
    core = client.CoreV1Api(api)
    victim = next(p for p in state.pods_on("gpu-node-2") if p["metadata"]["namespace"] == "training")
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]

    core.create_namespaced_pod_eviction(name, "training", client.V1Eviction(
        metadata=client.V1ObjectMeta(name=name, namespace="training"),
        delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid),
                                              grace_period_seconds=20)))

    listed = {p.metadata.name: p for p in core.list_namespaced_pod("training").items}
    assert listed[name].metadata.deletion_timestamp == datetime(2025, 6, 1, 12, 0, 20, tzinfo=UTC)
    assert listed[name].metadata.deletion_grace_period_seconds == 20
    row = next(line.split() for line in kubectl(sim, "get", "pods", "-n", "training").splitlines()
               if line.startswith(f"{name} "))
    assert row[2] == "Terminating"
    # the Job replaced it at once; the terminating pod still holds its GPUs
    job = victim["metadata"]["ownerReferences"][0]["name"]
    live = state.job_pods("Job", "training", job)
    assert len(live) == 1 and live[0]["metadata"]["uid"] != uid
    assert state.gpus_in_use("gpu-node-2")[0] == f"training/{name}"

    sim.clock.advance(19)
    assert name in {p.metadata.name for p in core.list_namespaced_pod("training").items}
    sim.clock.advance(2)
    assert name not in {p.metadata.name for p in core.list_namespaced_pod("training").items}
    assert state.terminating_pods() == {}
    assert 0 not in state.gpus_in_use("gpu-node-2")


def test_graceful_deletion_of_a_statefulset_pod_recreates_it_once_it_is_gone(
    sim: Sim, api: client.ApiClient
) -> None:
    sim.state.graceful_deletion = True
    sim.state.add_statefulset(NS, "db", replicas=2)
    core = client.CoreV1Api(api)
    uid = sim.state.pod(NS, "db-0")["metadata"]["uid"]

    core.delete_namespaced_pod("db-0", NS)  # no grace period given: the pod's own 30 s

    pod = sim.state.pod(NS, "db-0")
    assert pod["metadata"]["uid"] == uid and pod["metadata"]["deletionGracePeriodSeconds"] == 30
    assert sim.state.terminating_pods() == {f"{NS}/db-0": datetime(2025, 6, 1, 12, 0, 30, tzinfo=UTC)}
    assert [p["metadata"]["name"] for p in sim.state.job_pods("StatefulSet", NS, "db")] == ["db-1"]

    sim.clock.advance(31)
    sim.state.tick()
    pod = sim.state.pod(NS, "db-0")
    assert pod["metadata"]["uid"] != uid and "deletionTimestamp" not in pod["metadata"]
    assert pod["status"]["phase"] == "Running"

    core.delete_namespaced_pod("db-1", NS, grace_period_seconds=0)  # 0 means at once
    assert "deletionTimestamp" not in sim.state.pod(NS, "db-1")["metadata"]
    assert sim.state.terminating_pods() == {}


def test_a_terminating_pod_is_not_healthy_for_its_disruption_budget(sim: Sim, api: client.ApiClient) -> None:
    sim.state.graceful_deletion = True
    core = client.CoreV1Api(api)
    master, worker = "pytorch-0-master-0", "pytorch-0-worker-0"  # PDB minAvailable 1 of 2
    core.create_namespaced_pod_eviction(master, "training", client.V1Eviction(
        metadata=client.V1ObjectMeta(name=master, namespace="training")))
    assert sim.state.pod("training", master)["metadata"]["deletionTimestamp"]

    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_eviction(worker, "training", client.V1Eviction(
            metadata=client.V1ObjectMeta(name=worker, namespace="training")))
    assert err.value.status == 429
    # evicting the terminating pod again skips the budget and keeps its deadline
    core.create_namespaced_pod_eviction(master, "training", client.V1Eviction(
        metadata=client.V1ObjectMeta(name=master, namespace="training")))
    assert sim.state.terminating_pods() == {f"training/{master}": datetime(2025, 6, 1, 12, 0, 30, tzinfo=UTC)}


def test_deletion_stays_immediate_by_default(sim: Sim, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod_eviction("pytorch-0-master-0", "training", client.V1Eviction(
        metadata=client.V1ObjectMeta(name="pytorch-0-master-0", namespace="training")))
    pod = sim.state.pod("training", "pytorch-0-master-0")  # recreated under the same name at once
    assert "deletionTimestamp" not in pod["metadata"]
    assert sim.state.terminating_pods() == {}


# --- waiting -----------------------------------------------------------------------------------------


def test_wait_for_wakes_when_a_request_is_served(sim: Sim, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)

    def list_nodes_soon() -> None:
        time.sleep(0.2)
        core.list_node()

    thread = threading.Thread(target=list_nodes_soon)
    started = time.monotonic()
    thread.start()
    try:
        # a list changes no object: only the request counter can wake this waiter
        assert sim.state.wait_for(lambda s: s.count("list", "nodes") >= 1, timeout=20)
    finally:
        thread.join()
    assert time.monotonic() - started < 10
