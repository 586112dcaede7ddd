"""The Kubernetes API simulator against the real clients: ``kubectl`` (v1.32) and the official Python client.

Where it sits: integration ring for chaos/sim. What the service's kube adapter and the drills rely on is
checked with the same binaries and library they use, over HTTP, never by calling the state directly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from chaos.sim import (
    KUBEFLOW_JOB_NAME_LABEL,
    ClusterState,
    KubeApiServer,
    seed_cluster,
)
from remediator.contracts import POOL_LABEL

pytestmark = pytest.mark.timeout(120)


@dataclass
class Sim:
    state: ClusterState
    server: KubeApiServer
    kubeconfig: Path
    tmp: Path


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Sim]:
    state = seed_cluster(6)
    with KubeApiServer(state) as server:
        yield Sim(state, server, server.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)


def _kubectl_binary() -> str:
    found = shutil.which("kubectl") or ("/usr/bin/kubectl" if Path("/usr/bin/kubectl").exists() else None)
    if found is None:
        pytest.fail("kubectl is not installed: these tests need a real kubectl (v1.32) on PATH")
    return found


def kubectl(sim: Sim, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(sim.tmp), "KUBECONFIG": str(sim.kubeconfig)}
    cmd = [_kubectl_binary(), "--kubeconfig", str(sim.kubeconfig), "--cache-dir", str(sim.tmp / "kcache"),
           "--request-timeout=30s", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"kubectl failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _training_pod(state: ClusterState, node: str) -> dict[str, object]:
    pods = [p for p in state.pods_on(node) if p["metadata"]["namespace"] == "training"]
    assert pods, f"no training pod on {node}"
    return pods[0]


# --- kubectl ---------------------------------------------------------------------------------------


def test_kubectl_get_nodes_prints_the_table(sim: Sim) -> None:
    out = _ok(kubectl(sim, "get", "nodes"))
    lines = out.strip().splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert sorted(rows) == sorted(f"gpu-node-{i}" for i in range(6))
    assert all(r[1] == "Ready" and r[4] == "v1.36.0" for r in rows.values())
    # kubectl got by without OpenAPI: a 404 there is what it tolerates
    counts = sim.state.request_counts()
    assert counts.get("list nodes", 0) >= 1

    as_json = json.loads(_ok(kubectl(sim, "get", "nodes", "-o", "json")))
    assert len(as_json["items"]) == 6
    assert as_json["items"][0]["metadata"]["labels"][POOL_LABEL] == "pool-a"

    pods = _ok(kubectl(sim, "get", "pods", "-A", "-o", "wide"))
    assert "pytorch-0-master-0" in pods and "nvidia-dcgm-exporter-" in pods and "gpu-node-0" in pods


def test_kubectl_cordon_and_uncordon(sim: Sim) -> None:
    assert "node/gpu-node-3 cordoned" in _ok(kubectl(sim, "cordon", "gpu-node-3"))
    assert sim.state.is_cordoned("gpu-node-3")
    row = next(line for line in _ok(kubectl(sim, "get", "nodes")).splitlines() if line.startswith("gpu-node-3 "))
    assert row.split()[1] == "Ready,SchedulingDisabled"
    assert "node/gpu-node-3 uncordoned" in _ok(kubectl(sim, "uncordon", "gpu-node-3"))
    assert not sim.state.is_cordoned("gpu-node-3")
    assert sim.state.count("patch", "nodes") == 2


def test_kubectl_taint_and_remove_taint(sim: Sim) -> None:
    _ok(kubectl(sim, "taint", "nodes", "gpu-node-2", "gpu-remediator.io/quarantine=xid79:NoSchedule"))
    assert sim.state.taints("gpu-node-2") == [
        {"key": "gpu-remediator.io/quarantine", "value": "xid79", "effect": "NoSchedule"}]
    _ok(kubectl(sim, "taint", "nodes", "gpu-node-2", "other=x:PreferNoSchedule"))
    assert len(sim.state.taints("gpu-node-2")) == 2
    _ok(kubectl(sim, "taint", "nodes", "gpu-node-2", "gpu-remediator.io/quarantine-"))
    assert sim.state.taints("gpu-node-2") == [{"key": "other", "value": "x", "effect": "PreferNoSchedule"}]
    _ok(kubectl(sim, "taint", "nodes", "gpu-node-2", "other-"))
    assert sim.state.taints("gpu-node-2") == []


def test_kubectl_drain_evicts_training_pods_and_keeps_daemonsets(sim: Sim) -> None:
    state = sim.state
    before = _training_pod(state, "gpu-node-0")
    assert before["metadata"]["name"] == "pytorch-0-master-0"

    # the PyTorchJob pod mounts an emptyDir: without the flag kubectl refuses, and nothing is evicted
    refused = kubectl(sim, "drain", "gpu-node-0", "--ignore-daemonsets", "--timeout=60s")
    assert refused.returncode != 0 and "delete-emptydir-data" in refused.stderr
    assert state.count("create", "pods/eviction") == 0

    _ok(kubectl(sim, "drain", "gpu-node-0", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s"))
    assert state.is_cordoned("gpu-node-0")
    left = state.pods_on("gpu-node-0")
    assert sorted(p["metadata"]["namespace"] for p in left) == ["gpu-operator", "gpu-remediator"]
    assert all(p["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet" for p in left)
    assert state.count("create", "pods/eviction") == 1
    assert state.count("get", "daemonsets") >= 2  # kubectl checked each DaemonSet pod's owner

    # the job controller recreated rank 0 on another node with free GPUs
    again = state.pod("training", "pytorch-0-master-0")
    assert again["metadata"]["uid"] != before["metadata"]["uid"]
    assert again["status"]["phase"] == "Running"
    assert again["spec"]["nodeName"] not in ("gpu-node-0", "", None)
    assert len(state.gpu_indices_of("training", "pytorch-0-master-0")) == 4
    assert "gpu-remediator.io/gpu-indices" not in (again["metadata"].get("annotations") or {})
    assert state.job_restarts("PyTorchJob", "training", "pytorch-0") == 1


def test_kubectl_drain_waits_on_a_blocking_pdb(sim: Sim) -> None:
    state = sim.state
    pod = _training_pod(state, "gpu-node-2")
    state.block_pdb("training", "train-2-pdb")
    proc = kubectl(sim, "drain", "gpu-node-2", "--ignore-daemonsets", "--timeout=3s")
    assert proc.returncode != 0
    assert "disruption budget" in proc.stderr
    assert state.pod("training", pod["metadata"]["name"])["metadata"]["uid"] == pod["metadata"]["uid"]
    assert state.count("create", "pods/eviction") >= 1


def test_kubectl_apply_creates_and_updates(sim: Sim) -> None:
    manifest = sim.tmp / "lease.yaml"
    for holder, verb in (("a", "created"), ("b", "configured")):
        manifest.write_text("apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: drill\n"
                            f"  namespace: gpu-remediator\nspec:\n  holderIdentity: {holder}\n")
        assert f"lease.coordination.k8s.io/drill {verb}" in _ok(kubectl(sim, "apply", "-f", str(manifest)))
        assert sim.state.get("leases", "drill", "gpu-remediator")["spec"]["holderIdentity"] == holder
    assert sim.state.count("get", "/openapi/v3") >= 1  # kubectl learnt that the server validates fields


# --- the official Python client --------------------------------------------------------------------


@pytest.fixture
def api(sim: Sim) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(sim.kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


def test_client_lists_and_patches_nodes(sim: Sim, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    nodes = v1.list_node()
    assert [n.metadata.name for n in nodes.items] == [f"gpu-node-{i}" for i in range(6)]
    node = nodes.items[1]
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    assert node.metadata.labels["nvidia.com/gpu.present"] == "true"
    assert node.metadata.uid and node.metadata.creation_timestamp is not None

    patched = v1.patch_node("gpu-node-1", {"spec": {"unschedulable": True,
                                                    "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]},
                                           "metadata": {"labels": {"remediated": "yes"}}})
    assert patched.spec.unschedulable is True
    assert int(patched.metadata.resource_version) > int(node.metadata.resource_version)
    assert sim.state.taints("gpu-node-1")[0]["key"] == "k"
    assert sim.state.node("gpu-node-1")["metadata"]["labels"]["remediated"] == "yes"

    merged = v1.patch_node("gpu-node-1", {"metadata": {"labels": {"remediated": None}}},
                           _content_type="application/merge-patch+json")
    assert "remediated" not in merged.metadata.labels
    jp = v1.patch_node("gpu-node-1", [{"op": "test", "path": "/spec/unschedulable", "value": True},
                                      {"op": "remove", "path": "/spec/unschedulable"}])
    assert not jp.spec.unschedulable

    stale = v1.read_node("gpu-node-1")
    v1.patch_node("gpu-node-1", {"metadata": {"annotations": {"touched": "1"}}})
    stale.metadata.labels["x"] = "y"
    with pytest.raises(ApiException) as conflict:
        v1.replace_node("gpu-node-1", stale)
    assert conflict.value.status == 409
    assert json.loads(conflict.value.body)["reason"] == "Conflict"

    with pytest.raises(ApiException) as missing:
        v1.read_node("gpu-node-99")
    assert missing.value.status == 404
    assert json.loads(missing.value.body)["kind"] == "Status"


def test_client_lists_pods_by_node_and_label(sim: Sim, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    on_node = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-1").items
    assert sorted(p.metadata.namespace for p in on_node) == ["gpu-operator", "gpu-remediator", "training"]
    worker = next(p for p in on_node if p.metadata.namespace == "training")
    assert worker.metadata.labels[KUBEFLOW_JOB_NAME_LABEL] == "pytorch-0"
    assert worker.metadata.labels["training.kubeflow.org/replica-type"] == "worker"
    assert sim.state.gpu_indices_of("training", worker.metadata.name) == [0, 1, 2, 3]
    assert not worker.metadata.annotations  # the device allocation is the kubelet's, not on the pod
    assert worker.metadata.owner_references[0].controller is True
    ranks = v1.list_namespaced_pod("training", label_selector=f"{KUBEFLOW_JOB_NAME_LABEL}=pytorch-0").items
    assert sorted(p.metadata.name for p in ranks) == ["pytorch-0-master-0", "pytorch-0-worker-0"]
    page = v1.list_pod_for_all_namespaces(limit=5)
    assert len(page.items) == 5 and page.metadata._continue
    rest = v1.list_pod_for_all_namespaces(limit=100, _continue=page.metadata._continue)
    assert len(page.items) + len(rest.items) == len(sim.state.list_pods())
    with pytest.raises(ApiException) as bad:
        v1.list_pod_for_all_namespaces(field_selector="spec.gpu=3")
    assert bad.value.status == 400


def test_client_eviction_honours_pod_disruption_budgets(sim: Sim, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    state = sim.state
    pod = _training_pod(state, "gpu-node-2")
    name = str(pod["metadata"]["name"])
    v1.create_namespaced_pod_eviction(name, "training", client.V1Eviction(
        metadata=client.V1ObjectMeta(name=name, namespace="training")))
    with pytest.raises(ApiException) as gone:
        v1.read_namespaced_pod(name, "training")
    assert gone.value.status == 404
    replacement = state.job_pods("Job", "training", "train-2")
    assert len(replacement) == 1 and replacement[0]["status"]["phase"] == "Running"

    blocked_pod = _training_pod(state, "gpu-node-3")
    state.block_pdb("training", "train-3-pdb")
    pdb = client.PolicyV1Api(api).read_namespaced_pod_disruption_budget("train-3-pdb", "training")
    assert pdb.status.disruptions_allowed == 0
    with pytest.raises(ApiException) as refused:
        v1.create_namespaced_pod_eviction(blocked_pod["metadata"]["name"], "training", client.V1Eviction(
            metadata=client.V1ObjectMeta(name=blocked_pod["metadata"]["name"], namespace="training")))
    assert refused.value.status == 429
    body = json.loads(refused.value.body)
    assert body["reason"] == "TooManyRequests"
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert state.pod("training", str(blocked_pod["metadata"]["name"]))["status"]["phase"] == "Running"


def test_client_reads_daemonsets_jobs_and_patches_a_pytorchjob(sim: Sim, api: client.ApiClient) -> None:
    ds = client.AppsV1Api(api).read_namespaced_daemon_set("nvidia-dcgm-exporter", "gpu-operator")
    assert ds.status.desired_number_scheduled == 6 and ds.status.number_ready == 6
    jobs = client.BatchV1Api(api).list_namespaced_job("training").items
    assert {j.metadata.name for j in jobs} >= {"train-2", "train-3"}

    co = client.CustomObjectsApi(api)
    ptj = co.get_namespaced_custom_object("kubeflow.org", "v1", "training", "pytorchjobs", "pytorch-0")
    assert ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert ptj["status"]["conditions"][-1]["type"] == "Running"
    out = co.patch_namespaced_custom_object("kubeflow.org", "v1", "training", "pytorchjobs", "pytorch-0",
                                            {"metadata": {"annotations": {"gpu-remediator.io/restart": "1"}}})
    assert out["metadata"]["annotations"]["gpu-remediator.io/restart"] == "1"
    assert int(out["metadata"]["resourceVersion"]) > int(ptj["metadata"]["resourceVersion"])
    listed = co.list_namespaced_custom_object("kubeflow.org", "v1", "training", "pytorchjobs")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["pytorch-0", "pytorch-1"]


def test_client_gang_restart_by_deleting_pods(sim: Sim, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    state = sim.state
    old = {p["metadata"]["name"]: p["metadata"]["uid"] for p in state.job_pods("PyTorchJob", "training", "pytorch-0")}
    v1.delete_collection_namespaced_pod("training", label_selector=f"{KUBEFLOW_JOB_NAME_LABEL}=pytorch-0")
    new = state.job_pods("PyTorchJob", "training", "pytorch-0")
    assert sorted(p["metadata"]["name"] for p in new) == sorted(old)
    assert all(p["metadata"]["uid"] != old[p["metadata"]["name"]] for p in new)
    assert all(p["status"]["phase"] == "Running" for p in new)
    assert state.job_restarts("PyTorchJob", "training", "pytorch-0") == 1


def test_client_sees_injected_errors(sim: Sim, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    sim.state.inject_error(503, method="GET", path=r"^/api/v1/nodes$", count=1)
    with pytest.raises(ApiException) as unavailable:
        v1.list_node()
    assert unavailable.value.status == 503
    assert json.loads(unavailable.value.body)["reason"] == "ServiceUnavailable"
    assert len(v1.list_node().items) == 6  # the fault was for one request only

    sim.state.inject_error(429, method="PATCH", path=r"/nodes/gpu-node-4$", count=1, retry_after=3)
    with pytest.raises(ApiException) as throttled:
        v1.patch_node("gpu-node-4", {"spec": {"unschedulable": True}})
    assert throttled.value.status == 429
    assert throttled.value.headers["Retry-After"] == "3"
    assert not sim.state.is_cordoned("gpu-node-4")

    sim.state.add_latency(0.3, method="GET", path=r"^/api/v1/nodes/gpu-node-5$", count=1)
    started = time.monotonic()
    v1.read_node("gpu-node-5")
    assert time.monotonic() - started >= 0.3
    assert sim.state.count("list", "nodes") == 2 and sim.state.count("patch", "nodes") == 1


def test_client_watch_streams_node_changes(sim: Sim, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    rv = v1.list_node().metadata.resource_version

    def cordon_later() -> None:
        time.sleep(0.3)
        sim.state.patch("nodes", "gpu-node-5", {"spec": {"unschedulable": True}})

    worker = threading.Thread(target=cordon_later)
    worker.start()
    seen = []
    for event in watch.Watch().stream(v1.list_node, resource_version=rv, timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.name, event["object"].spec.unschedulable))
        break  # the first change after the listed resourceVersion is the one we made
    worker.join()
    assert seen == [("MODIFIED", "gpu-node-5", True)]


def test_client_events_and_leases(sim: Sim, api: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_event("default", client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="gpu-node-1."),
        involved_object=client.V1ObjectReference(kind="Node", name="gpu-node-1"),
        reason="GpuQuarantined", message="GPU 3 isolated", type="Warning"))
    events = v1.list_namespaced_event("default", field_selector="involvedObject.name=gpu-node-1").items
    assert [e.reason for e in events] == ["GpuQuarantined"]
    assert sim.state.events("default")[0]["message"] == "GPU 3 isolated"

    leases = client.CoordinationV1Api(api)
    lease = leases.create_namespaced_lease("gpu-remediator", client.V1Lease(
        metadata=client.V1ObjectMeta(name="remediator-leader"), spec=client.V1LeaseSpec(holder_identity="a")))
    lease.spec.holder_identity = "b"
    updated = leases.replace_namespaced_lease("remediator-leader", "gpu-remediator", lease)
    assert updated.spec.holder_identity == "b"
    with pytest.raises(ApiException) as stale:
        leases.replace_namespaced_lease("remediator-leader", "gpu-remediator", lease)
    assert stale.value.status == 409
    with pytest.raises(ApiException) as exists:
        leases.create_namespaced_lease("gpu-remediator", client.V1Lease(
            metadata=client.V1ObjectMeta(name="remediator-leader")))
    assert exists.value.status == 409 and json.loads(exists.value.body)["reason"] == "AlreadyExists"


def test_client_storm_of_cordons_and_taints(tmp_path: Path) -> None:
    """The storm benchmark's shape at 1/5 scale: many connections, half the nodes cordoned and tainted."""
    state = seed_cluster(300)
    with KubeApiServer(state) as server:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(server.write_kubeconfig(tmp_path / "kc")),
                                client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        v1 = client.CoreV1Api(client.ApiClient(cfg))
        taint = {"key": "gpu-remediator.io/quarantine", "value": "storm", "effect": "NoSchedule"}

        def quarantine(i: int) -> None:
            v1.patch_node(f"gpu-node-{i}", {"spec": {"unschedulable": True, "taints": [taint]}})
            v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName=gpu-node-{i}")

        started = time.monotonic()
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(quarantine, range(150)))
        elapsed = time.monotonic() - started
    assert elapsed < 30, f"150 cordon+taint PATCHes took {elapsed:.1f}s"
    assert state.count("patch", "nodes") == 150 and state.count("list", "pods") == 150
    assert [n for n in state.node_names() if state.is_cordoned(n)] == [f"gpu-node-{i}" for i in range(150)]
    assert all(state.taints(f"gpu-node-{i}") == [taint] for i in range(150))
    assert not any(state.is_cordoned(f"gpu-node-{i}") for i in range(150, 300))


# --- remediator sim --------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_remediator_sim_serves_until_signalled(tmp_path: Path, stop_signal: signal.Signals) -> None:
    kubeconfig = tmp_path / "sim.kubeconfig"
    cmd = [sys.executable, "-c", "from remediator.cli import main; main()", "sim", "--nodes", "3", "--port", "0",
           "--kubeconfig-out", str(kubeconfig), "--json"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            line = proc.stdout.readline()
            assert line, "remediator sim printed nothing on stdout"
            info = json.loads(line)
            assert info["nodes"] == 3 and Path(info["kubeconfig"]) == kubeconfig and kubeconfig.is_file()
            with urllib.request.urlopen(info["url"] + "/api/v1/nodes", timeout=10) as resp:
                names = [n["metadata"]["name"] for n in json.load(resp)["items"]]
            assert names == ["gpu-node-0", "gpu-node-1", "gpu-node-2"]
            # the simulated GPU nodes mirror the cluster: each knows its pods and their GPU processes
            from chaos.sim.gpu_node import SimGpuNode

            gpu_node = SimGpuNode.attach(Path(info["gpu_state"]) / "gpu-node-1" / "sim")
            assert gpu_node.name == "gpu-node-1" and gpu_node.gpu_count() == 8
            assert any(gpu_node.gpu_state(i)["processes"] for i in range(8))
            proc.send_signal(stop_signal)
            assert proc.wait(timeout=20) == 0
            assert "Kubernetes API at " + info["url"] in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
