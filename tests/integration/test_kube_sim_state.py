"""The simulated cluster's semantics: seeding, controllers, scheduler, patches, selectors, watch, chaos hooks.

Where it sits: integration ring for chaos/sim. These tests drive ``ClusterState`` directly (and the HTTP
layer with the standard library where the wire format is the point); the clients' view is in
``test_kube_sim.py``.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chaos.sim import (
    RESTARTS_ANNOTATION,
    ApiError,
    ClusterState,
    KubeApiServer,
    seed_cluster,
)
from chaos.sim.kube_api import human_duration, route
from chaos.sim.kube_select import FieldSelector, LabelSelector, SelectorError
from remediator.contracts import POOL_LABEL

pytestmark = pytest.mark.timeout(60)

SMP = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def _training(state: ClusterState, node: str) -> dict[str, Any]:
    return next(p for p in state.pods_on(node) if p["metadata"]["namespace"] == "training")


def _isolate_all_but(state: ClusterState, keep: str) -> None:
    for name in state.node_names():
        if name != keep:
            state.patch("nodes", name, {"spec": {"unschedulable": True}})


# --- seeding ---------------------------------------------------------------------------------------


def test_seed_lays_out_pools_jobs_daemonsets_and_pdbs() -> None:
    state = seed_cluster(9, pools=2)
    names = state.node_names()
    assert names == [f"gpu-node-{i}" for i in range(9)]
    pools = [state.node(n)["metadata"]["labels"][POOL_LABEL] for n in names]
    assert pools == ["pool-a"] * 5 + ["pool-b"] * 4
    assert state.jobs_on("gpu-node-0") == [("PyTorchJob", "training", "pytorch-0")]
    assert state.jobs_on("gpu-node-1") == [("PyTorchJob", "training", "pytorch-0")]
    assert state.jobs_on("gpu-node-2") == [("Job", "training", "train-2")]
    assert state.jobs_on("gpu-node-5") == [("PyTorchJob", "training", "pytorch-1")]
    assert state.jobs_on("gpu-node-8") == [("Job", "training", "train-8")]  # the leftover node
    for name in names:
        node = state.node(name)
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
        owners = sorted(str(p["metadata"]["ownerReferences"][0]["kind"]) for p in state.pods_on(name))
        assert owners[:2] == ["DaemonSet", "DaemonSet"] and owners[2] in ("Job", "PyTorchJob")
        assert state.gpus_in_use(name).keys() == {0, 1, 2, 3}

    master, worker = state.job_pods("PyTorchJob", "training", "pytorch-0")
    assert master["metadata"]["name"] == "pytorch-0-master-0"
    assert master["metadata"]["labels"]["training.kubeflow.org/replica-index"] == "0"
    assert worker["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker"
    env = {e["name"]: e["value"] for e in worker["spec"]["containers"][0]["env"]}
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == "pytorch-0-master-0"
    assert master["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    assert state.gpu_indices_of("training", "pytorch-0-master-0") == [0, 1, 2, 3]
    assert "annotations" not in master["metadata"]  # the allocation is the kubelet's, never on the pod
    job_pod = _training(state, "gpu-node-2")
    assert job_pod["metadata"]["labels"]["job-name"] == "train-2"
    assert state.pdb_for("training", job_pod["metadata"]["name"])["status"]["disruptionsAllowed"] == 1  # type: ignore[index]
    assert state.job_restarts("Job", "training", "train-2") == 0

    uids = {p["metadata"]["uid"] for p in state.list_pods()}
    assert len(uids) == len(state.list_pods())
    rvs = [int(n["metadata"]["resourceVersion"]) for n in state.list_nodes()]
    assert max(rvs) <= state.resource_version


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nodes": -1}, "nodes >= 0"),
    ({"nodes": 2, "gpus_per_pod": 9}, "gpus_per_pod"),
], ids=["negative-nodes", "pod-bigger-than-node"])
def test_seed_rejects_impossible_clusters(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        seed_cluster(**kwargs)


# --- controllers and scheduler ---------------------------------------------------------------------


def test_evicted_pod_is_replaced_on_the_only_open_node_then_waits_for_room() -> None:
    state = seed_cluster(4)
    _isolate_all_but(state, "gpu-node-3")
    first = _training(state, "gpu-node-2")
    state.evict("training", first["metadata"]["name"])
    replacement = state.job_pods("Job", "training", "train-2")[0]
    assert replacement["spec"]["nodeName"] == "gpu-node-3"
    assert state.gpu_indices_of("training", replacement["metadata"]["name"]) == [4, 5, 6, 7]
    assert state.job_restarts("Job", "training", "train-2") == 1
    assert state.get("jobs", "train-2", "training")["metadata"]["annotations"][RESTARTS_ANNOTATION] == "1"

    # gpu-node-3 is now full: the next replacement stays Pending and says why
    state.evict("training", _training(state, "gpu-node-1")["metadata"]["name"])
    pending = state.pending_pods()
    assert [p["metadata"]["name"] for p in pending] == ["pytorch-0-worker-0"]
    cond = pending[0]["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == ("PodScheduled", "False", "Unschedulable")

    # a taint the pod does not tolerate keeps it off a reopened node; removing the taint lets it in
    state.patch("nodes", "gpu-node-1", {"spec": {"unschedulable": False,
                                                 "taints": [{"key": "q", "value": "x", "effect": "NoSchedule"}]}})
    assert state.pending_pods() and state.pods_on("gpu-node-1")[-1]["metadata"]["namespace"] != "training"
    state.patch("nodes", "gpu-node-1", {"spec": {"taints": None}})
    assert state.pending_pods() == []
    assert state.pod("training", "pytorch-0-worker-0")["spec"]["nodeName"] == "gpu-node-1"


def test_tolerated_taints_and_not_ready_nodes() -> None:
    state = seed_cluster(2)
    state.patch("nodes", "gpu-node-0", {"spec": {"taints": [{"key": "node.kubernetes.io/not-ready",
                                                             "effect": "NoExecute"}]}})
    assert len(state.pods_on("gpu-node-0")) == 3  # every seeded pod tolerates not-ready:NoExecute
    state.set_node_ready("gpu-node-0", False)
    assert state.node("gpu-node-0")["status"]["conditions"][-1]["status"] == "False"
    state.patch("nodes", "gpu-node-1", {"spec": {"unschedulable": True}})
    state.evict("training", "pytorch-0-worker-0")
    assert state.pending_pods()[0]["metadata"]["name"] == "pytorch-0-worker-0"
    state.set_node_ready("gpu-node-0", True)
    assert state.pod("training", "pytorch-0-worker-0")["spec"]["nodeName"] == "gpu-node-0"


def _daemonset_counts(state: ClusterState, ns: str, name: str) -> dict[str, int]:
    """A DaemonSet's status counts as a pass over every node and pod would find them."""
    ds = state.get("daemonsets", name, ns)
    selector = ds["spec"]["template"]["spec"].get("nodeSelector") or {}
    desired = sum(1 for n in state.list_nodes()
                  if all((n["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items()))
    mine = [p for p in state.list_pods(ns)
            if any(r.get("uid") == ds["metadata"]["uid"] for r in p["metadata"].get("ownerReferences") or [])
            and not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") not in ("Succeeded", "Failed")]
    ready = sum(1 for p in mine if p["status"].get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or []))
    return {"desiredNumberScheduled": desired, "currentNumberScheduled": len(mine), "numberReady": ready}


def test_daemonset_status_counts_stay_equal_to_a_recount_as_nodes_and_pods_change() -> None:
    """The store keeps a DaemonSet's counts as nodes and pods change, instead of a pass over every node and
    pod on each of its pods' changes; after each kind of change they equal a recount."""
    state = seed_cluster(6)
    daemonsets = [(ds["metadata"]["namespace"], ds["metadata"]["name"]) for ds in state.list_objects("daemonsets")]
    assert len(daemonsets) == 2

    def check(what: str) -> None:
        for ns, name in daemonsets:
            status = state.get("daemonsets", name, ns)["status"]
            assert {k: status[k] for k in ("desiredNumberScheduled", "currentNumberScheduled", "numberReady")} \
                == _daemonset_counts(state, ns, name), (what, name)

    check("seeded")
    assert _daemonset_counts(state, *daemonsets[0])["desiredNumberScheduled"] == 6
    state.patch("nodes", "gpu-node-2", {"spec": {"taints": [{"key": "gpu-remediator.io/gpu-lost", "value": "79",
                                                             "effect": "NoExecute"}]}})
    check("a NoExecute taint evicted the exporter's pod")
    state.patch("nodes", "gpu-node-1", {"metadata": {"labels": {"nvidia.com/gpu.present": None}}})
    check("a node no longer selected")
    new = {**state.node("gpu-node-0"), "metadata": {"name": "gpu-node-6",
                                                    "labels": state.node("gpu-node-0")["metadata"]["labels"]}}
    state.create("nodes", new)
    check("a node added")
    for _ns, name in daemonsets:  # a node that joins gets each selecting DaemonSet's pod
        assert any(p["metadata"]["name"].startswith(name) for p in state.pods_on("gpu-node-6")), name
    state.delete("nodes", "gpu-node-4")
    check("a node deleted")
    state.set_node_ready("gpu-node-3", False)
    check("a node NotReady")
    ns, name = daemonsets[0]
    state.patch("daemonsets", name, {"spec": {"template": {"spec": {"nodeSelector": {
        "nvidia.com/gpu.present": None, "kubernetes.io/os": "linux"}}}}},
                namespace=ns)
    check("a DaemonSet's nodeSelector changed")
    assert any(p["metadata"]["name"].startswith(name) for p in state.pods_on("gpu-node-1"))  # selected again
    assert state.get("daemonsets", name, ns)["status"]["desiredNumberScheduled"] == len(state.node_names())


def test_noexecute_taint_evicts_what_does_not_tolerate_it() -> None:
    state = seed_cluster(4)
    state.patch("nodes", "gpu-node-2", {"spec": {"taints": [{"key": "gpu-remediator.io/gpu-lost",
                                                             "value": "79", "effect": "NoExecute"}]}})
    left = state.pods_on("gpu-node-2")
    assert [p["metadata"]["namespace"] for p in left] == ["gpu-remediator"]  # only the agent tolerates all
    assert state.job_pods("Job", "training", "train-2")[0]["spec"]["nodeName"] != "gpu-node-2"
    ds = state.get("daemonsets", "nvidia-dcgm-exporter", "gpu-operator")
    assert ds["status"]["currentNumberScheduled"] == 3


def test_unhealthy_gpu_is_never_assigned_and_lowers_allocatable() -> None:
    state = seed_cluster(2, gpus_per_pod=2)
    node = state.set_gpu_health("gpu-node-1", 2, healthy=False)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "7"
    assert state.unhealthy_gpus("gpu-node-1") == {2}
    state.patch("nodes", "gpu-node-0", {"spec": {"unschedulable": True}})
    state.evict("training", "pytorch-0-master-0")
    moved = state.pod("training", "pytorch-0-master-0")
    assert moved["spec"]["nodeName"] == "gpu-node-1"
    assert state.gpu_indices_of("training", "pytorch-0-master-0") == [3, 4]
    assert sorted(state.gpus_in_use("gpu-node-1")) == [0, 1, 3, 4]
    healed = state.set_gpu_health("gpu-node-1", 2, healthy=True)
    assert healed["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_restart_job_recreates_every_rank_once() -> None:
    state = seed_cluster(4, pytorchjob_ranks=2)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in state.job_pods("PyTorchJob", "training",
                                                                                  "pytorch-0")}
    after = state.restart_job("PyTorchJob", "training", "pytorch-0")
    assert [p["metadata"]["name"] for p in after] == ["pytorch-0-master-0", "pytorch-0-worker-0"]
    assert all(p["metadata"]["uid"] != before[p["metadata"]["name"]] for p in after)
    assert all(p["status"]["phase"] == "Running" for p in after)
    assert state.job_restarts("PyTorchJob", "training", "pytorch-0") == 1
    status = state.get("pytorchjobs", "pytorch-0", "training")["status"]
    assert status["replicaStatuses"] == {"Master": {"active": 1}, "Worker": {"active": 1}}
    with pytest.raises(ValueError, match="unknown job kind"):
        state.restart_job("Deployment", "training", "x")


def test_job_deletion_orphans_by_default_and_cascades_when_asked() -> None:
    state = seed_cluster(4)
    pod = _training(state, "gpu-node-2")
    state.delete("jobs", "train-2", "training")
    orphan = state.pod("training", pod["metadata"]["name"])
    assert "ownerReferences" not in orphan["metadata"]
    state.delete("jobs", "train-3", "training", propagation="Background")
    assert [p["metadata"]["namespace"] for p in state.pods_on("gpu-node-3")] == ["gpu-operator", "gpu-remediator"]
    state.delete("pytorchjobs", "pytorch-0", "training")
    assert state.list_pods("training", label_selector="training.kubeflow.org/job-name=pytorch-0") == []


def test_pending_pod_eviction_skips_the_pdb_and_a_blocked_pdb_refuses() -> None:
    state = seed_cluster(2)
    pdb = state.block_pdb("training", "pytorch-0-pdb")
    assert pdb["status"]["disruptionsAllowed"] == 0
    assert pdb["status"]["conditions"][0]["reason"] == "InsufficientPods"
    with pytest.raises(ApiError) as refused:
        state.evict("training", "pytorch-0-master-0")
    assert refused.value.code == 429 and refused.value.reason == "TooManyRequests"
    assert state.block_pdb("training", "pytorch-0-pdb", blocked=False)["status"]["disruptionsAllowed"] == 1
    state.evict("training", "pytorch-0-master-0")


def test_wait_for_sees_changes_made_by_another_thread() -> None:
    state = seed_cluster(2)
    timer = threading.Timer(0.2, lambda: state.patch("nodes", "gpu-node-1", {"spec": {"unschedulable": True}}))
    timer.start()
    try:
        assert state.wait_for(lambda s: s.is_cordoned("gpu-node-1"), timeout=5)
        assert not state.wait_for(lambda s: s.is_cordoned("gpu-node-0"), timeout=0.2)
    finally:
        timer.cancel()


# --- writes: patches, updates, conflicts -----------------------------------------------------------


def test_strategic_merge_patch_merges_conditions_by_type_and_status_needs_the_subresource() -> None:
    state = seed_cluster(1)
    ignored = state.patch("nodes", "gpu-node-0", {"status": {"conditions": [
        {"type": "Ready", "status": "False"}]}}, content_type=SMP)
    assert next(c for c in ignored["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
    applied = state.patch("nodes", "gpu-node-0", {"status": {"conditions": [
        {"type": "GpuHealthy", "status": "False", "reason": "Xid79"}]}}, content_type=SMP, subresource="status")
    types = [c["type"] for c in applied["status"]["conditions"]]
    assert types == ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready", "GpuHealthy"]
    dropped = state.patch("nodes", "gpu-node-0", {"status": {"conditions": [
        {"type": "GpuHealthy", "$patch": "delete"}]}}, content_type=SMP, subresource="status")
    assert "GpuHealthy" not in [c["type"] for c in dropped["status"]["conditions"]]


@pytest.mark.parametrize(("resource", "name", "namespace", "patch", "ctype", "code"), [
    ("nodes", "gpu-node-0", None, [{"op": "test", "path": "/spec/unschedulable", "value": True}], JSON_PATCH, 422),
    ("nodes", "gpu-node-0", None, {"spec": {}}, JSON_PATCH, 400),
    ("nodes", "gpu-node-0", None, {"metadata": {"resourceVersion": "1"}}, SMP, 409),
    ("pytorchjobs", "pytorch-0", "training", {"spec": {}}, SMP, 415),
    ("nodes", "gpu-node-0", None, {"spec": {}}, "application/yaml", 415),
    ("nodes", "gpu-node-9", None, {"spec": {}}, SMP, 404),
], ids=["json-patch-test-fails", "json-patch-not-a-list", "stale-rv", "smp-on-custom-resource",
        "unknown-type", "missing"])
def test_patch_errors_match_the_api_server(resource: str, name: str, namespace: str | None, patch: Any,
                                          ctype: str, code: int) -> None:
    state = seed_cluster(2)
    before = state.resource_version
    with pytest.raises(ApiError) as err:
        state.patch(resource, name, patch, namespace, content_type=ctype)
    assert err.value.code == code
    assert err.value.status()["kind"] == "Status"
    assert state.resource_version == before


def test_update_with_stale_resource_version_conflicts_and_names_are_immutable() -> None:
    state = seed_cluster(1)
    node = state.node("gpu-node-0")
    node["spec"]["unschedulable"] = True
    node["metadata"]["uid"] = "forged"
    updated = state.replace("nodes", "gpu-node-0", node)
    assert updated["spec"]["unschedulable"] is True
    assert updated["metadata"]["uid"] == state.node("gpu-node-0")["metadata"]["uid"] != "forged"
    with pytest.raises(ApiError) as err:
        state.replace("nodes", "gpu-node-0", node)  # node still carries the old resourceVersion
    assert err.value.code == 409 and "has been modified" in err.value.message


def test_create_needs_an_existing_namespace_and_a_free_name() -> None:
    state = seed_cluster(1)
    lease = {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a"}}
    created = state.create("leases", lease, "gpu-remediator")
    assert created["metadata"]["uid"] and created["metadata"]["namespace"] == "gpu-remediator"
    with pytest.raises(ApiError) as exists:
        state.create("leases", lease, "gpu-remediator")
    assert exists.value.reason == "AlreadyExists"
    with pytest.raises(ApiError) as no_ns:
        state.create("leases", lease, "nowhere")
    assert no_ns.value.code == 404
    named = state.create("events", {"metadata": {"generateName": "gpu-node-0."}, "reason": "X",
                                    "involvedObject": {"kind": "Node", "name": "gpu-node-0"}}, "default")
    assert named["metadata"]["name"].startswith("gpu-node-0.") and len(named["metadata"]["name"]) == 16


# --- selectors, lists, watch -----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "labels", "expected"), [
    ("a=b", {"a": "b"}, True),
    ("a==b,c!=d", {"a": "b", "c": "e"}, True),
    ("a!=b", {}, True),
    ("a in (x, y),!z", {"a": "y"}, True),
    ("a notin (x,y)", {"a": "x"}, False),
    ("a", {"b": "1"}, False),
    ("", {"anything": "1"}, True),
], ids=["eq", "eq-and-neq", "neq-absent", "in-and-not-exists", "notin", "exists", "empty"])
def test_label_selector(text: str, labels: dict[str, str], expected: bool) -> None:
    assert LabelSelector.parse(text).matches(labels) is expected


def test_selectors_reject_what_the_api_server_rejects() -> None:
    with pytest.raises(SelectorError):
        LabelSelector.parse("a in x")
    with pytest.raises(SelectorError, match="field label not supported"):
        FieldSelector.parse("pods", "spec.gpus=3")
    assert LabelSelector.from_api(None).matches({"a": "b"}) is False
    assert LabelSelector.from_api({}).matches({"a": "b"}) is True
    assert FieldSelector.parse("nodes", "spec.unschedulable=false").matches({"spec": {}})


def test_list_filters_by_field_and_label_and_pages() -> None:
    state = seed_cluster(6)
    on_node = state.list_pods(field_selector="spec.nodeName=gpu-node-4")
    assert len(on_node) == 3 and {p["spec"]["nodeName"] for p in on_node} == {"gpu-node-4"}
    running = state.list_pods("training", field_selector="status.phase=Running,spec.nodeName!=gpu-node-0")
    assert len(running) == 5
    cordoned = state.list_objects("nodes", field_selector="spec.unschedulable=true")
    assert cordoned == []
    from chaos.sim.cluster import BY_PLURAL

    pages, token = [], None
    while True:
        page = state.api_list(BY_PLURAL["pods"], None, limit=7, continue_token=token)
        pages.append([e.obj["metadata"]["name"] for e in page.entries])
        token = page.continue_token
        if token is None:
            break
    flat = [n for p in pages for n in p]
    assert len(flat) == 18 and len(set(flat)) == 18 and [len(p) for p in pages] == [7, 7, 4]


def test_watch_history_expires() -> None:
    state = ClusterState(history=10)
    state.create("namespaces", {"metadata": {"name": "n"}})
    first = state.resource_version
    for i in range(30):
        state.create("leases", {"metadata": {"name": f"l{i}"}}, "n")
    with pytest.raises(ApiError) as gone:
        state.events_since(first)
    assert gone.value.code == 410 and gone.value.reason == "Expired"
    recent = state.events_since(state.resource_version - 3)
    assert [e.type for e in recent] == ["ADDED"] * 3


# --- chaos hooks -----------------------------------------------------------------------------------


def test_injected_faults_match_method_and_path_and_run_out() -> None:
    state = ClusterState()
    fault = state.inject_error(500, method="patch", path=r"/nodes/", count=2, retry_after=1)
    assert state.take_faults("GET", "/api/v1/nodes/a") == (0.0, None)
    _, err = state.take_faults("PATCH", "/api/v1/nodes/a")
    assert err is not None and err.code == 500 and err.retry_after == 1
    assert err.status()["details"]["retryAfterSeconds"] == 1
    assert state.take_faults("PATCH", "/api/v1/nodes/b")[1] is not None
    assert state.take_faults("PATCH", "/api/v1/nodes/c") == (0.0, None)
    assert fault.hits == 2
    slow = state.add_latency(0.25, path="^/api/v1/pods")
    assert state.take_faults("GET", "/api/v1/pods")[0] == 0.25
    state.remove_fault(slow)
    assert state.take_faults("GET", "/api/v1/pods")[0] == 0.0


# --- the HTTP layer --------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[KubeApiServer]:
    with KubeApiServer(seed_cluster(4)) as srv:
        yield srv


def _get(url: str, accept: str = "application/json") -> tuple[int, Any]:
    req = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.load(err)


def test_discovery_and_openapi(server: KubeApiServer) -> None:
    assert _get(server.url + "/version")[1]["gitVersion"] == "v1.36.0"
    core = _get(server.url + "/api/v1")[1]
    eviction = next(r for r in core["resources"] if r["name"] == "pods/eviction")
    assert (eviction["group"], eviction["version"], eviction["kind"]) == ("policy", "v1", "Eviction")
    groups = {g["name"] for g in _get(server.url + "/apis")[1]["groups"]}
    assert groups == {"apps", "batch", "policy", "coordination.k8s.io", "resource.k8s.io", "kubeflow.org"}
    ptj = _get(server.url + "/apis/kubeflow.org/v1")[1]["resources"]
    assert {"name": "pytorchjobs/status", "singularName": "", "namespaced": True, "kind": "PyTorchJob",
            "verbs": ["get", "patch", "update"]} in ptj
    index = _get(server.url + "/openapi/v3")[1]["paths"]
    assert index["api/v1"]["serverRelativeURL"].startswith("/openapi/v3/api/v1")
    v3 = _get(server.url + "/openapi/v3/apis/kubeflow.org/v1")[1]["paths"]
    patch_op = v3["/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}"]["patch"]
    assert patch_op["x-kubernetes-group-version-kind"]["kind"] == "PyTorchJob"
    assert patch_op["parameters"][0]["name"] == "fieldValidation"
    for path in ("/openapi/v2", "/openapi/v3/apis/example.com/v1", "/apis/example.com/v1", "/api/v1/widgets"):
        code, body = _get(server.url + path)
        assert code == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"


def test_table_for_kubectl(server: KubeApiServer) -> None:
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    code, tbl = _get(server.url + "/api/v1/namespaces/training/pods?limit=500", accept)
    assert code == 200 and tbl["kind"] == "Table"
    assert [c["name"] for c in tbl["columnDefinitions"]][:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert tbl["rows"][0]["cells"][:3] == ["pytorch-0-master-0", "1/1", "Running"]
    assert tbl["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


def test_http_keepalive_and_concurrent_patches(server: KubeApiServer) -> None:
    host, port = server.host, server.port
    errors: list[str] = []

    def worker(start: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        try:
            for i in range(start, 40, 8):
                for node in range(4):
                    body = json.dumps({"metadata": {"annotations": {f"w{start}": str(i)}}})
                    conn.request("PATCH", f"/api/v1/nodes/gpu-node-{node}", body=body,
                                 headers={"Content-Type": "application/merge-patch+json"})
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        errors.append(f"{resp.status}")
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert server.state.count("patch", "nodes") == 160
    annotations = server.state.node("gpu-node-2")["metadata"]["annotations"]
    assert {k: v for k, v in annotations.items() if k.startswith("w")} == {f"w{w}": str(32 + w) for w in range(8)}


def test_stop_drops_keepalive_connections() -> None:
    srv = KubeApiServer(seed_cluster(1)).start()
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=5)
    conn.request("GET", "/version")
    conn.getresponse().read()
    srv.stop()
    with pytest.raises((OSError, http.client.HTTPException)):
        conn.request("GET", "/version")
        conn.getresponse().read()
    conn.close()


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("GET", "/api/v1/nodes", {}, ("list", "nodes", None, None, None)),
    ("GET", "/api/v1/nodes", {"watch": "true"}, ("watch", "nodes", None, None, None)),
    ("PATCH", "/api/v1/nodes/n1", {}, ("patch", "nodes", None, "n1", None)),
    ("PATCH", "/api/v1/nodes/n1/status", {}, ("patch", "nodes/status", None, "n1", "status")),
    ("GET", "/api/v1/pods", {}, ("list", "pods", None, None, None)),
    ("POST", "/api/v1/namespaces/t/pods/p/eviction", {}, ("create", "pods/eviction", "t", "p", "eviction")),
    ("DELETE", "/api/v1/namespaces/t/pods", {}, ("deletecollection", "pods", "t", None, None)),
    ("GET", "/api/v1/namespaces/t", {}, ("get", "namespaces", None, "t", None)),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/t/leases/l", {}, ("update", "leases", "t", "l", None)),
], ids=["list", "watch", "patch", "status", "all-namespaces", "eviction", "deletecollection", "namespace",
        "lease"])
def test_route(method: str, path: str, query: dict[str, str], expected: tuple[Any, ...]) -> None:
    r = route(method, path, query)
    assert (r.verb, r.resource, r.namespace, r.name, r.sub) == expected


@pytest.mark.parametrize(("method", "path", "code"), [
    ("POST", "/api/v1/pods", 405),
    ("GET", "/api/v1/pods/p", 404),
    ("POST", "/api/v1/namespaces/t/pods/p/exec", 404),
    ("PATCH", "/api/v1/nodes", 405),
], ids=["create-without-namespace", "namespaced-without-namespace", "unknown-subresource", "patch-collection"])
def test_route_errors(method: str, path: str, code: int) -> None:
    with pytest.raises(ApiError) as err:
        route(method, path, {})
    assert err.value.code == code


@pytest.mark.parametrize(("seconds", "text"), [
    (5, "5s"), (119, "119s"), (150, "2m30s"), (600, "10m"), (3 * 3600 + 120, "3h2m"), (30 * 3600, "30h"),
    (3 * 86400, "3d"), (400 * 86400, "400d"),
])
def test_human_duration_matches_kubectl(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_injected_clock_drives_timestamps() -> None:
    now = [datetime(2025, 1, 1, tzinfo=UTC)]
    state = seed_cluster(1, clock=lambda: now[0])
    assert state.node("gpu-node-0")["metadata"]["creationTimestamp"] == "2025-01-01T00:00:00Z"
    now[0] += timedelta(hours=1)
    lease = state.create("leases", {"metadata": {"name": "x"}}, "default")
    assert lease["metadata"]["creationTimestamp"] == "2025-01-01T01:00:00Z"


def test_jobs_created_through_the_api_get_pods_scheduled() -> None:
    state = seed_cluster(2)
    template = {"spec": {"containers": [{"name": "t", "image": "x",
                                         "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
    state.create("jobs", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "probe"},
                          "spec": {"parallelism": 2, "template": template}}, "training")
    pods = state.job_pods("Job", "training", "probe")
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)
    assert [state.gpu_indices_of("training", p["metadata"]["name"]) for p in pods] == [[4, 5], [4, 5]]
    assert state.job_restarts("Job", "training", "probe") == 0
    ptj = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "big"},
           "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template},
                                            "Worker": {"replicas": 3, "template": template}}},
           "status": {"ignored": True}}
    created = state.create("pytorchjobs", ptj, "training")
    assert "ignored" not in created.get("status", {})
    ranks = state.job_pods("PyTorchJob", "training", "big")
    assert [p["metadata"]["name"] for p in ranks] == ["big-master-0", "big-worker-0", "big-worker-1", "big-worker-2"]
    assert [p["status"]["phase"] for p in ranks].count("Running") == 2  # two more 2-GPU slots were free
    assert len(state.pending_pods()) == 2
