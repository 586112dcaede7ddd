"""The Kubernetes adapter against the simulated API server (chaos.sim), over real HTTP with the official client.

Seeded cluster (``seed_cluster(nodes=4)``): PyTorchJob ``pytorch-0`` with ``pytorch-0-master-0`` on
gpu-node-0 and ``pytorch-0-worker-0`` on gpu-node-1, single-pod Jobs ``train-2`` and ``train-3`` on nodes 2
and 3, each training pod on GPUs 0-3 of its node, a DaemonSet pod pair (dcgm exporter, agent) on every
node, and a PodDisruptionBudget per job that allows one disruption. Everything lives in pool ``pool-a``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.sim import (
    TRAINING_NAMESPACE,
    ClusterState,
    KubeApiServer,
    seed_cluster,
)
from remediator.adapters.kube import (
    CORDONED_BY_US_ANNOTATION,
    ESCALATED_ANNOTATION,
    RESTART_ID_ANNOTATION,
    RESTART_POD_UIDS_ANNOTATION,
    RESTARTED_AT_ANNOTATION,
    DrainTimeout,
    KubeAdapter,
    KubePermanentError,
    KubeTemporaryError,
    NotFound,
)
from remediator.contracts import JobRef
from remediator.errors import TemporaryError
from remediator.settings import Settings

TAINT_KEY = "gpu-remediator/quarantine"
NS = TRAINING_NAMESPACE

pytestmark = pytest.mark.timeout(60)


class SleepRecorder:
    """A real sleep that remembers what it was asked for, so tests can check the backoff it chose."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, seconds: float) -> None:
        with self._lock:
            self.calls.append(seconds)
        time.sleep(seconds)


@pytest.fixture
def cluster() -> ClusterState:
    return seed_cluster(nodes=4)


@pytest.fixture
def kubeconfig(cluster: ClusterState, tmp_path: Path) -> Iterator[Path]:
    with KubeApiServer(cluster) as srv:
        yield srv.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def make_adapter(kubeconfig: Path, sleeps: SleepRecorder) -> Iterator[Callable[..., KubeAdapter]]:
    made: list[KubeAdapter] = []

    def make(**overrides: Any) -> KubeAdapter:
        kwargs: dict[str, Any] = {
            "retry_budget_s": 10.0,
            "backoff_base_s": 0.05,
            "backoff_max_s": 0.5,
            "poll_interval_s": 0.1,
            "taint_key": TAINT_KEY,
            "drain_grace_period_s": 0,
            "sleep": sleeps,
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


def training_pod(cluster: ClusterState, node: str) -> dict[str, Any]:
    pods = [p for p in cluster.pods_on(node) if p["metadata"]["namespace"] == NS]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def pod_names_on(cluster: ClusterState, node: str) -> set[str]:
    return {p["metadata"]["name"] for p in cluster.pods_on(node)}


def taints_of(cluster: ClusterState, node: str) -> list[tuple[str, str, str]]:
    return [(t["key"], t.get("value", ""), t["effect"]) for t in cluster.taints(node)]


# --- nodes -------------------------------------------------------------------------------------------


def test_get_node_summarises_and_lists_gpu_nodes_by_pool(kube: KubeAdapter) -> None:
    node = kube.get_node("gpu-node-0")
    assert node["name"] == "gpu-node-0"
    assert node["pool"] == "pool-a"
    assert node["gpus"] == 8
    assert node["ready"] is True
    assert node["conditions"]["Ready"] == "True"
    assert node["unschedulable"] is False
    assert node["taints"] == []
    assert node["resource_version"]

    assert [n["name"] for n in kube.list_gpu_nodes()] == [f"gpu-node-{i}" for i in range(4)]
    assert len(kube.list_gpu_nodes("pool-a")) == 4
    assert kube.list_gpu_nodes("pool-b") == []
    assert kube.node_pool("gpu-node-3") == "pool-a"


def test_a_missing_node_is_not_found(kube: KubeAdapter, cluster: ClusterState) -> None:
    with pytest.raises(NotFound) as err:
        kube.get_node("gpu-node-99")
    assert err.value.kind == "Node" and err.value.name == "gpu-node-99"
    with pytest.raises(NotFound):
        kube.taint("gpu-node-99", TAINT_KEY, "xid-79")
    # 404 is an answer, not a failure: asked once, never retried.
    assert cluster.count("get", "nodes") == 2


def test_taint_is_idempotent_and_keeps_other_taints(kube: KubeAdapter, cluster: ClusterState) -> None:
    foreign = {"key": "example.com/maintenance", "value": "kernel", "effect": "NoSchedule"}
    cluster.patch("nodes", "gpu-node-1", {"spec": {"taints": [foreign]}})

    first = kube.taint("gpu-node-1", TAINT_KEY, "xid-79")
    assert first.changed
    assert first.before["taints"] == [foreign]
    assert first.after["taints"] == [foreign, {"key": TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}]
    assert taints_of(cluster, "gpu-node-1") == [
        ("example.com/maintenance", "kernel", "NoSchedule"),
        (TAINT_KEY, "xid-79", "NoSchedule"),
    ]

    patches = cluster.count("patch", "nodes")
    again = kube.taint("gpu-node-1", TAINT_KEY, "xid-79")
    assert not again.changed
    assert again.before == again.after
    assert cluster.count("patch", "nodes") == patches  # checked, not written

    # Same key and effect with another value: present already, left as it is.
    other_value = kube.taint("gpu-node-1", TAINT_KEY, "ecc-dbe")
    assert not other_value.changed
    assert "not ours" in other_value.detail
    # Same key, another effect: a different taint.
    assert kube.taint("gpu-node-1", TAINT_KEY, "xid-79", effect="NoExecute").changed
    assert len(cluster.taints("gpu-node-1")) == 3
    assert any(t.get("timeAdded") for t in cluster.taints("gpu-node-1") if t["effect"] == "NoExecute")

    with pytest.raises(KubePermanentError):
        kube.taint("gpu-node-1", TAINT_KEY, "x", effect="NoWay")


def test_untaint_removes_only_our_taint(kube: KubeAdapter, cluster: ClusterState) -> None:
    foreign = {"key": "example.com/maintenance", "value": "kernel", "effect": "NoSchedule"}
    cluster.patch("nodes", "gpu-node-2", {"spec": {"taints": [foreign]}})
    kube.taint("gpu-node-2", TAINT_KEY, "xid-79")

    wrong_value = kube.untaint("gpu-node-2", TAINT_KEY, "NoSchedule", only_if_value="someone-else")
    assert not wrong_value.changed
    assert (TAINT_KEY, "xid-79", "NoSchedule") in taints_of(cluster, "gpu-node-2")

    removed = kube.untaint("gpu-node-2", TAINT_KEY, "NoSchedule", only_if_value="xid-79")
    assert removed.changed
    assert removed.after["taints"] == [foreign]
    assert taints_of(cluster, "gpu-node-2") == [("example.com/maintenance", "kernel", "NoSchedule")]

    assert not kube.untaint("gpu-node-2", TAINT_KEY, "NoSchedule").changed


def test_cordon_records_the_previous_state_and_uncordon_respects_other_cordons(
    kube: KubeAdapter, cluster: ClusterState
) -> None:
    first = kube.cordon("gpu-node-0")
    assert first.changed
    assert first.before["unschedulable"] is False and first.after["unschedulable"] is True
    assert cluster.is_cordoned("gpu-node-0")
    assert CORDONED_BY_US_ANNOTATION in cluster.node("gpu-node-0")["metadata"]["annotations"]

    second = kube.cordon("gpu-node-0")
    assert not second.changed
    assert second.before["unschedulable"] is True
    assert second.before["cordoned_by_us"] is True

    back = kube.uncordon("gpu-node-0", only_if_ours=True)
    assert back.changed
    assert not cluster.is_cordoned("gpu-node-0")
    assert CORDONED_BY_US_ANNOTATION not in (cluster.node("gpu-node-0")["metadata"].get("annotations") or {})
    assert not kube.uncordon("gpu-node-0").changed

    # Someone else's cordon: cordon() finds it (and says so), uncordon(only_if_ours) leaves it.
    cluster.patch("nodes", "gpu-node-1", {"spec": {"unschedulable": True}})
    theirs = kube.cordon("gpu-node-1")
    assert not theirs.changed
    assert theirs.before == {"taints": [], "unschedulable": True, "cordoned_by_us": False}
    assert not kube.uncordon("gpu-node-1", only_if_ours=True).changed
    assert cluster.is_cordoned("gpu-node-1")


def test_annotate_sets_and_removes_idempotently(kube: KubeAdapter, cluster: ClusterState) -> None:
    change = kube.annotate("gpu-node-3", {"gpu-remediator.io/incident": "inc-1", "gpu-remediator.io/x": "1"})
    assert change.changed
    assert change.before == {"annotations": {"gpu-remediator.io/incident": None, "gpu-remediator.io/x": None}}
    assert change.after == {"annotations": {"gpu-remediator.io/incident": "inc-1", "gpu-remediator.io/x": "1"}}
    assert not kube.annotate("gpu-node-3", {"gpu-remediator.io/incident": "inc-1"}).changed

    removed = kube.annotate("gpu-node-3", {"gpu-remediator.io/x": None})
    assert removed.changed
    annotations = cluster.node("gpu-node-3")["metadata"]["annotations"]
    assert "gpu-remediator.io/x" not in annotations
    assert annotations["gpu-remediator.io/incident"] == "inc-1"
    assert not kube.annotate("gpu-node-3", {"gpu-remediator.io/x": None}).changed


def test_count_out_of_service_counts_cordoned_or_tainted_gpu_nodes(kube: KubeAdapter, cluster: ClusterState) -> None:
    assert kube.count_out_of_service("pool-a") == (0, 4)
    kube.taint("gpu-node-0", TAINT_KEY, "xid-79")
    kube.cordon("gpu-node-1")
    kube.taint("gpu-node-1", TAINT_KEY, "xid-79")  # both: still one node
    kube.taint("gpu-node-2", "example.com/other", "x")  # not our key
    assert kube.count_out_of_service("pool-a") == (2, 4)
    assert kube.count_out_of_service("pool-z") == (0, 0)

    # Removing the last taint leaves a node with none.
    assert kube.untaint("gpu-node-0", TAINT_KEY).changed
    assert cluster.taints("gpu-node-0") == []
    assert kube.count_out_of_service("pool-a") == (1, 4)


def test_lists_follow_continue_tokens(make_adapter: Callable[..., KubeAdapter], cluster: ClusterState) -> None:
    kube = make_adapter(page_size=1)
    assert [n["name"] for n in kube.list_gpu_nodes()] == [f"gpu-node-{i}" for i in range(4)]
    assert cluster.count("list", "nodes") == 4
    assert {p["name"] for p in kube.pods_on_node("gpu-node-0")} == pod_names_on(cluster, "gpu-node-0")


# --- pods and jobs -----------------------------------------------------------------------------------


def test_pods_on_node_and_job_of_pod(kube: KubeAdapter, cluster: ClusterState) -> None:
    pods = {p["name"]: p for p in kube.pods_on_node("gpu-node-0")}
    master = pods["pytorch-0-master-0"]
    assert master["namespace"] == NS
    assert master["owner"] is not None and master["owner"]["kind"] == "PyTorchJob"
    assert "gpu_indices" not in master  # which GPUs a pod holds is the node agent's to say, not a pod field
    assert master["phase"] == "Running"
    assert master["emptydir"] is True
    daemon_pods = [p for p in pods.values() if p["daemonset"]]
    assert len(daemon_pods) == 2

    assert kube.job_of_pod(master) == JobRef(
        "PyTorchJob", "pytorch-0", NS, "kubeflow.org/v1", master["owner"]["uid"]
    )
    assert all(kube.job_of_pod(p) is None for p in daemon_pods)

    job_pod = next(p for p in kube.pods_on_node("gpu-node-2") if p["namespace"] == NS)
    ref = kube.job_of_pod(job_pod)
    assert ref is not None and (ref.kind, ref.name, ref.api_version) == ("Job", "train-2", "batch/v1")

    # Without owner references the labels still name the gang; a raw pod object is accepted too.
    raw = training_pod(cluster, "gpu-node-1")
    raw["metadata"].pop("ownerReferences")
    ref = kube.job_of_pod(raw)
    assert ref is not None and (ref.kind, ref.name) == ("PyTorchJob", "pytorch-0")
    bare = {"metadata": {"name": "scratch", "namespace": NS, "labels": {}}, "spec": {}}
    assert kube.job_of_pod(bare) == JobRef("Pod", "scratch", NS, "v1", None)


def test_daemon_pods_at_an_address_are_the_daemonset_pods_with_that_pod_ip(kube: KubeAdapter,
                                                                           cluster: ClusterState) -> None:
    """What places an alert from a scrape without Kubernetes labels (``owners.OwnerResolver.node_at``): one
    list of pods with the field selector ``status.podIP``."""
    exporter = next(p for p in cluster.pods_on("gpu-node-3") if p["metadata"]["name"].startswith("nvidia-dcgm"))
    ip = exporter["status"]["podIP"]
    assert kube.daemon_pods_at(ip) == [(exporter["metadata"]["namespace"], exporter["metadata"]["name"],
                                        "gpu-node-3")]
    workload = training_pod(cluster, "gpu-node-2")
    assert kube.daemon_pods_at(workload["status"]["podIP"]) == []  # a training pod is no exporter
    assert kube.daemon_pods_at("10.255.255.254") == []


# --- drain -------------------------------------------------------------------------------------------


def test_drain_evicts_training_pods_leaves_daemonsets_and_is_idempotent(
    kube: KubeAdapter, cluster: ClusterState
) -> None:
    victim = training_pod(cluster, "gpu-node-2")
    daemons = {p["metadata"]["name"] for p in cluster.pods_on("gpu-node-2")} - {victim["metadata"]["name"]}
    # A static pod's mirror and a finished pod: neither is evicted.
    cluster.create("pods", {
        "metadata": {"name": "kube-proxy-gpu-node-2", "namespace": "kube-system",
                     "annotations": {"kubernetes.io/config.mirror": "abc"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "gpu-node-2",
                                          "uid": cluster.node("gpu-node-2")["metadata"]["uid"], "controller": True}]},
        "spec": {"nodeName": "gpu-node-2", "containers": [{"name": "kube-proxy", "image": "kube-proxy"}]},
    })
    cluster.create("pods", {
        "metadata": {"name": "done", "namespace": NS},
        "spec": {"nodeName": "gpu-node-2", "containers": [{"name": "c", "image": "busybox"}]},
    })
    cluster.patch("pods", "done", {"status": {"phase": "Succeeded"}}, namespace=NS, subresource="status")
    kept = daemons | {"kube-proxy-gpu-node-2", "done"}
    kube.cordon("gpu-node-2")
    messages: list[str] = []

    change = kube.drain("gpu-node-2", timeout_s=10, progress=messages.append)

    assert change.changed
    assert [(p["name"], p["owner"]) for p in change.after["evicted"]] == [
        (victim["metadata"]["name"], "Job/train-2")
    ]
    reasons = {p["name"]: p["reason"] for p in change.after["skipped"]}
    assert reasons == {
        **{name: "DaemonSet pod" for name in daemons},
        "kube-proxy-gpu-node-2": "mirror pod",
        "done": "finished (Succeeded)",
    }
    assert {p["name"] for p in change.before["pods"]} == kept | {victim["metadata"]["name"]}
    assert pod_names_on(cluster, "gpu-node-2") == kept
    assert cluster.count("create", "pods/eviction") == 1
    assert any("evicted" in m for m in messages)
    # The Job controller replaced the pod and the scheduler put it on another node.
    replacement = cluster.job_pods("Job", NS, "train-2")
    assert len(replacement) == 1
    assert replacement[0]["spec"]["nodeName"] not in (None, "gpu-node-2")

    again = kube.drain("gpu-node-2", timeout_s=10)
    assert not again.changed
    assert again.after["evicted"] == []
    assert cluster.count("create", "pods/eviction") == 1


def test_drain_with_a_blocking_pdb_retries_then_times_out(
    make_adapter: Callable[..., KubeAdapter], cluster: ClusterState, sleeps: SleepRecorder
) -> None:
    kube = make_adapter()
    cluster.block_pdb(NS, "train-3-pdb")
    victim = training_pod(cluster, "gpu-node-3")["metadata"]["name"]
    started = time.monotonic()

    with pytest.raises(DrainTimeout) as err:
        kube.drain("gpu-node-3", timeout_s=1.5)

    elapsed = time.monotonic() - started
    assert 1.5 <= elapsed < 5
    assert err.value.node == "gpu-node-3"
    assert [(p["name"], p["reason"]) for p in err.value.pods_left] == [
        (victim, "blocked by PodDisruptionBudget")
    ]
    assert err.value.evicted == []
    assert cluster.count("create", "pods/eviction") >= 3  # retried, with backoff in between
    assert len(sleeps.calls) >= 2
    assert victim in pod_names_on(cluster, "gpu-node-3")


def test_drain_succeeds_when_the_pdb_is_unblocked_during_the_retry(
    kube: KubeAdapter, cluster: ClusterState
) -> None:
    cluster.block_pdb(NS, "train-3-pdb")
    victim = training_pod(cluster, "gpu-node-3")["metadata"]["name"]
    messages: list[str] = []
    unblock = threading.Timer(1.0, lambda: cluster.block_pdb(NS, "train-3-pdb", blocked=False))
    unblock.start()
    try:
        change = kube.drain("gpu-node-3", timeout_s=20, progress=messages.append)
    finally:
        unblock.cancel()
    assert change.changed
    assert [p["name"] for p in change.after["evicted"]] == [victim]
    assert any("PodDisruptionBudget" in m for m in messages)
    assert cluster.count("create", "pods/eviction") >= 2
    assert victim not in pod_names_on(cluster, "gpu-node-3")


def test_drain_honours_retry_after_on_an_eviction_429(
    kube: KubeAdapter, cluster: ClusterState, sleeps: SleepRecorder
) -> None:
    cluster.inject_error(429, method="POST", path=r"/eviction$", count=1, retry_after=1)
    change = kube.drain("gpu-node-2", timeout_s=10)
    assert change.changed
    assert cluster.count("create", "pods/eviction") == 2
    assert any(s >= 1.0 for s in sleeps.calls)


def holders(cluster: ClusterState, node: str, index: int) -> list[dict[str, Any]]:
    """What the node agent names as the holders of GPU ``index``: the simulated kubelet's allocation."""
    return [h.to_dict() for h in cluster.gpu_allocation(node).get(index, [])]


def test_evict_pods_evicts_exactly_the_holders_by_uid(kube: KubeAdapter, cluster: ClusterState) -> None:
    # A second workload on the same node, bound to the GPUs the training pod does not use.
    cluster.create(
        "pods",
        {
            "metadata": {"name": "inference", "namespace": NS},
            "spec": {
                "nodeName": "gpu-node-2",
                "containers": [
                    {"name": "serve", "image": "triton", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
                ],
            },
        },
    )
    assert cluster.gpu_indices_of(NS, "inference") == [4, 5, 6, 7]
    assert "annotations" not in cluster.pod(NS, "inference")["metadata"]
    train = next(
        p["metadata"]["name"] for p in cluster.pods_on("gpu-node-2") if p["metadata"]["name"].startswith("train-2")
    )
    on_gpu5 = holders(cluster, "gpu-node-2", 5)
    assert [(h["name"], h["container"]) for h in on_gpu5] == [("inference", "serve")]

    change = kube.evict_pods("gpu-node-2", on_gpu5, timeout_s=10)

    assert [p["name"] for p in change.after["evicted"]] == ["inference"]
    assert change.after["evicted"][0]["uid"] == on_gpu5[0]["uid"]
    assert train in pod_names_on(cluster, "gpu-node-2")
    assert "inference" not in pod_names_on(cluster, "gpu-node-2")
    assert any(p["name"] == train and p["reason"] == "not selected" for p in change.after["skipped"])

    again = kube.evict_pods("gpu-node-2", on_gpu5, timeout_s=10)
    assert not again.changed and again.after["not_found"] == [
        {"namespace": NS, "name": "inference", "uid": on_gpu5[0]["uid"]}]
    assert holders(cluster, "gpu-node-2", 6) == []
    on_gpu0 = kube.evict_pods("gpu-node-2", holders(cluster, "gpu-node-2", 0), timeout_s=10)
    assert [p["name"] for p in on_gpu0.after["evicted"]] == [train]


def test_evict_pods_leaves_a_replacement_with_another_uid(kube: KubeAdapter, cluster: ClusterState) -> None:
    (holder,) = holders(cluster, "gpu-node-0", 0)
    assert holder["name"] == "pytorch-0-master-0"
    stale = {**holder, "uid": "00000000-0000-4000-8000-000000000000"}  # the pod the agent saw was replaced
    change = kube.evict_pods("gpu-node-0", [stale], timeout_s=10)
    assert not change.changed and change.after["evicted"] == []
    assert change.after["not_found"] == [{"namespace": NS, "name": holder["name"], "uid": stale["uid"]}]
    assert cluster.pod(NS, holder["name"])["metadata"]["uid"] == holder["uid"]


# --- restart_job -------------------------------------------------------------------------------------


def test_restart_job_restarts_every_rank_of_a_pytorchjob_once_per_restart_id(
    kube: KubeAdapter, cluster: ClusterState
) -> None:
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.job_pods("PyTorchJob", NS, "pytorch-0")}
    assert set(before) == {"pytorch-0-master-0", "pytorch-0-worker-0"}
    master = next(p for p in kube.pods_on_node("gpu-node-0") if p["name"] == "pytorch-0-master-0")
    job = kube.job_of_pod(master)
    assert job is not None

    change = kube.restart_job(job, restart_id="inc-7/step-4")

    assert change.changed
    assert {p["name"] for p in change.before["pods"]} == set(before)
    assert {p["uid"] for p in change.after["deleted"]} == set(before.values())
    after = {p["metadata"]["name"]: p for p in cluster.job_pods("PyTorchJob", NS, "pytorch-0")}
    assert set(after) == set(before)  # the controller brought every rank back
    assert all(after[name]["metadata"]["uid"] != uid for name, uid in before.items())
    assert all(p["spec"].get("nodeName") for p in after.values())
    assert cluster.job_restarts("PyTorchJob", NS, "pytorch-0") == 1  # the gang went at once
    annotations = cluster.get("pytorchjobs", "pytorch-0", NS)["metadata"]["annotations"]
    assert annotations[RESTART_ID_ANNOTATION] == "inc-7/step-4"
    assert annotations[RESTARTED_AT_ANNOTATION] == change.after["restarted_at"]

    repeat = kube.restart_job(job, restart_id="inc-7/step-4")
    assert not repeat.changed
    assert {p["metadata"]["uid"] for p in cluster.job_pods("PyTorchJob", NS, "pytorch-0")} == {
        p["metadata"]["uid"] for p in after.values()
    }
    assert cluster.job_restarts("PyTorchJob", NS, "pytorch-0") == 1

    assert kube.restart_job(job, restart_id="inc-8/step-4").changed
    assert cluster.job_restarts("PyTorchJob", NS, "pytorch-0") == 2


def test_restart_job_of_a_batch_job(kube: KubeAdapter, cluster: ClusterState) -> None:
    old = cluster.job_pods("Job", NS, "train-3")[0]["metadata"]["uid"]
    change = kube.restart_job(JobRef("Job", "train-3", NS, "batch/v1"), restart_id="r1")
    assert change.changed
    assert [p["uid"] for p in change.after["deleted"]] == [old]
    new = cluster.job_pods("Job", NS, "train-3")
    assert len(new) == 1 and new[0]["metadata"]["uid"] != old
    assert [p["uid"] for p in kube.job_pods(JobRef("Job", "train-3", NS, "batch/v1"))] == [new[0]["metadata"]["uid"]]


def test_restart_job_finishes_a_restart_interrupted_after_its_annotation(
    kube: KubeAdapter, cluster: ClusterState
) -> None:
    pods = cluster.job_pods("PyTorchJob", NS, "pytorch-0")
    master, worker = (p["metadata"]["uid"] for p in pods)
    # As if a replica wrote the plan and died after deleting only the master.
    cluster.patch(
        "pytorchjobs",
        "pytorch-0",
        {"metadata": {"annotations": {RESTART_ID_ANNOTATION: "r9", RESTART_POD_UIDS_ANNOTATION: f"{master},{worker}",
                                      RESTARTED_AT_ANNOTATION: "2025-01-01T00:00:00Z"}}},
        namespace=NS,
    )
    cluster.delete("pods", "pytorch-0-master-0", namespace=NS)
    new_master = cluster.pod(NS, "pytorch-0-master-0")["metadata"]["uid"]

    change = kube.restart_job(JobRef("PyTorchJob", "pytorch-0", NS, "kubeflow.org/v1"), restart_id="r9")

    assert change.changed
    assert [p["uid"] for p in change.after["deleted"]] == [worker]
    assert cluster.pod(NS, "pytorch-0-master-0")["metadata"]["uid"] == new_master  # the new one is spared
    assert cluster.pod(NS, "pytorch-0-worker-0")["metadata"]["uid"] != worker
    assert not kube.restart_job(JobRef("PyTorchJob", "pytorch-0", NS, "kubeflow.org/v1"), restart_id="r9").changed


def test_restart_job_refuses_what_it_cannot_restart(kube: KubeAdapter) -> None:
    with pytest.raises(KubePermanentError):
        kube.restart_job(JobRef("Pod", "scratch", NS, "v1"), restart_id="r1")
    with pytest.raises(NotFound):
        kube.restart_job(JobRef("PyTorchJob", "no-such-job", NS, "kubeflow.org/v1"), restart_id="r1")


# --- events and escalation ---------------------------------------------------------------------------


def test_create_event_and_escalate(kube: KubeAdapter, cluster: ClusterState) -> None:
    change = kube.create_event("gpu-node-1", "GpuQuarantined", "GPU 3: Xid 79, fallen off the bus")
    assert change.changed
    events = cluster.events("default")
    assert len(events) == 1
    event = events[0]
    assert event["involvedObject"]["kind"] == "Node"
    assert event["involvedObject"]["name"] == "gpu-node-1"
    assert event["involvedObject"]["uid"] == cluster.node("gpu-node-1")["metadata"]["uid"]
    assert (event["reason"], event["type"]) == ("GpuQuarantined", "Warning")
    assert event["source"]["component"] == "gpu-remediator"

    first = kube.escalate("gpu-node-1", "drain timed out", "inc-42")
    assert first.changed
    mark = cluster.node("gpu-node-1")["metadata"]["annotations"][ESCALATED_ANNOTATION]
    assert '"incident": "inc-42"' in mark
    second = kube.escalate("gpu-node-1", "drain timed out", "inc-42")
    assert not second.changed
    assert len(cluster.events("default")) == 2
    assert kube.escalate("gpu-node-1", "reset failed", "inc-43").changed
    assert len(cluster.events("default")) == 3

    with pytest.raises(NotFound):
        kube.create_event("gpu-node-99", "X", "y")


# --- client discipline -------------------------------------------------------------------------------


def test_transient_503s_are_retried_with_backoff(
    kube: KubeAdapter, cluster: ClusterState, sleeps: SleepRecorder
) -> None:
    cluster.inject_error(503, method="GET", path="/api/v1/nodes/gpu-node-0$", count=3)
    assert kube.get_node("gpu-node-0")["name"] == "gpu-node-0"
    assert cluster.count("get", "nodes") == 4
    assert len(sleeps.calls) == 3
    assert all(0 < s <= 0.5 for s in sleeps.calls)


def test_429_retry_after_is_honoured(kube: KubeAdapter, cluster: ClusterState, sleeps: SleepRecorder) -> None:
    cluster.inject_error(429, path="/api/v1/nodes/gpu-node-0$", count=1, retry_after=1)
    change = kube.taint("gpu-node-0", TAINT_KEY, "xid-79")
    assert change.changed
    assert len(sleeps.calls) == 1
    assert 1.0 <= sleeps.calls[0] <= 1.2


def test_a_persistent_500_exhausts_the_budget(
    make_adapter: Callable[..., KubeAdapter], cluster: ClusterState
) -> None:
    kube = make_adapter(retry_budget_s=1.0)
    cluster.inject_error(500, path="/api/v1/nodes/gpu-node-0$", count=None)
    started = time.monotonic()
    with pytest.raises(KubeTemporaryError) as err:
        kube.cordon("gpu-node-0")
    assert err.value.status == 500
    assert "gave up" in str(err.value)
    assert time.monotonic() - started < 3.0
    assert cluster.count("get", "nodes") >= 3
    assert not cluster.is_cordoned("gpu-node-0")


def test_a_retry_after_beyond_the_budget_is_handed_to_the_caller(
    make_adapter: Callable[..., KubeAdapter], cluster: ClusterState, sleeps: SleepRecorder
) -> None:
    kube = make_adapter(retry_budget_s=2.0)
    cluster.inject_error(429, path="/api/v1/nodes$", count=1, retry_after=30)
    with pytest.raises(KubeTemporaryError) as err:
        kube.list_gpu_nodes()
    assert err.value.status == 429
    assert err.value.retry_after == 30
    assert sleeps.calls == []  # no point waiting 30 s inside a 2 s budget


def test_the_retry_after_handed_to_the_caller_is_the_errors_delay(
    make_adapter: Callable[..., KubeAdapter], cluster: ClusterState
) -> None:
    kube = make_adapter(retry_budget_s=2.0)
    cluster.inject_error(429, path="/api/v1/nodes/gpu-node-0$", count=1, retry_after=30)
    with pytest.raises(TemporaryError) as err:  # the shared vocabulary: bus.settle naks for 30 s
        kube.cordon("gpu-node-0")
    assert isinstance(err.value, KubeTemporaryError) and err.value.delay == 30


def test_client_errors_are_permanent_and_not_retried(kube: KubeAdapter, cluster: ClusterState) -> None:
    cluster.inject_error(403, path="/api/v1/nodes/gpu-node-0$", count=1)
    with pytest.raises(KubePermanentError) as err:
        kube.get_node("gpu-node-0")
    assert err.value.status == 403
    assert not isinstance(err.value, NotFound)
    assert cluster.count("get", "nodes") == 1


def test_timeouts_and_connection_errors_are_temporary(
    make_adapter: Callable[..., KubeAdapter], cluster: ClusterState, sleeps: SleepRecorder, tmp_path: Path
) -> None:
    kube = make_adapter(request_timeout_s=(1.0, 0.3))
    cluster.add_latency(1.0, method="GET", path="/api/v1/nodes/gpu-node-0$", count=1)
    assert kube.get_node("gpu-node-0")["name"] == "gpu-node-0"  # the slow answer timed out; the retry did not
    assert cluster.count("get", "nodes") == 2

    with KubeApiServer(cluster) as other:
        config = other.write_kubeconfig(tmp_path / "gone")
    dead = KubeAdapter(str(config), retry_budget_s=0.5, backoff_base_s=0.05, sleep=sleeps)
    try:
        with pytest.raises(KubeTemporaryError) as err:
            dead.get_node("gpu-node-0")
        assert err.value.status is None
    finally:
        dead.close()


def test_a_concurrent_writer_causes_a_conflict_that_is_reread_not_overwritten(
    kube: KubeAdapter, cluster: ClusterState
) -> None:
    # Our PATCH is held back long enough for another writer to change the node after we read it.
    cluster.add_latency(1.0, method="PATCH", path="/api/v1/nodes/gpu-node-0$", count=1)
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(kube.taint("gpu-node-0", TAINT_KEY, "xid-79")))
    worker.start()
    # The server counts a request before holding it back: once it has our PATCH, the other writer goes.
    deadline = time.monotonic() + 5
    while cluster.count("patch", "nodes") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cluster.count("patch", "nodes") == 1
    cluster.patch("nodes", "gpu-node-0", {"spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}})
    worker.join(timeout=10)

    (change,) = result
    assert change.changed
    assert cluster.count("patch", "nodes") == 2  # the first lost on resourceVersion, the second won
    assert cluster.count("get", "nodes") == 2  # re-read before re-deciding
    assert change.before["taints"] == [{"key": "other", "value": "", "effect": "NoSchedule"}]
    assert taints_of(cluster, "gpu-node-0") == [("other", "", "NoSchedule"), (TAINT_KEY, "xid-79", "NoSchedule")]


def test_conflicts_that_never_end_are_temporary(
    make_adapter: Callable[..., KubeAdapter], cluster: ClusterState
) -> None:
    kube = make_adapter(conflict_attempts=3)
    cluster.inject_error(409, method="PATCH", path="/api/v1/nodes/gpu-node-0$", count=None)
    with pytest.raises(KubeTemporaryError) as err:
        kube.cordon("gpu-node-0")
    assert err.value.status == 409
    assert cluster.count("patch", "nodes") == 3
    assert cluster.count("get", "nodes") == 3


def test_threads_sharing_one_adapter_lose_no_update(kube: KubeAdapter, cluster: ClusterState) -> None:
    keys = [f"example.com/t{i}" for i in range(4)]
    barrier = threading.Barrier(len(keys))
    errors: list[BaseException] = []

    def add(key: str) -> None:
        barrier.wait()
        try:
            kube.taint("gpu-node-1", key, "v")
        except BaseException as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=add, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert errors == []
    assert sorted(t[0] for t in taints_of(cluster, "gpu-node-1")) == keys


class FakeClock:
    """Monotonic seconds that move only when the adapter sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_every_call_goes_through_the_rate_limit(
    make_adapter: Callable[..., KubeAdapter], cluster: ClusterState
) -> None:
    clock = FakeClock()
    kube = make_adapter(qps=10, burst=2, clock=clock, sleep=clock.sleep)
    for _ in range(4):
        kube.get_node("gpu-node-0")
    kube.list_gpu_nodes()
    kube.cordon("gpu-node-0")  # a read and a write: two more tokens
    # Two requests free from the burst, then one every 1/10 s.
    assert clock.slept == pytest.approx([0.1] * 5)
    assert cluster.count("get", "nodes") == 5 and cluster.count("patch", "nodes") == 1


def test_from_settings(kubeconfig: Path) -> None:
    settings = Settings(kubeconfig=str(kubeconfig), kube_qps=7, kube_burst=3, taint_key="example.com/q")
    with KubeAdapter.from_settings(settings) as kube:
        assert kube.taint_key == "example.com/q"
        assert kube.get_node("gpu-node-0")["pool"] == "pool-a"
