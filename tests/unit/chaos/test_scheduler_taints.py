"""The simulated scheduler filters nodes by taints and tolerations exactly as kube-scheduler's
TaintToleration and NodeUnschedulable plugins do (``Toleration.ToleratesTaint`` in k8s.io/api/core/v1)."""

from __future__ import annotations

from typing import Any

import pytest

from chaos.sim import seed_cluster
from chaos.sim.resources import tolerates

T = {"key": "gpu-remediator/gpu-withdrawn", "value": "xid-48", "effect": "NoSchedule"}


@pytest.mark.parametrize(("toleration", "ok"), [
    ({"operator": "Exists"}, True),                                            # empty key + Exists: all taints
    ({"key": "gpu-remediator/gpu-withdrawn", "operator": "Exists"}, True),
    ({"key": "gpu-remediator/gpu-withdrawn", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "gpu-remediator/gpu-withdrawn", "value": "xid-48"}, True),        # no operator means Equal
    ({"key": "gpu-remediator/gpu-withdrawn", "operator": "Equal", "value": "xid-79"}, False),
    ({"key": "other", "operator": "Exists"}, False),
    ({"operator": "Equal", "value": "xid-48"}, True),                          # empty key: any key, value equal
    ({"key": "gpu-remediator/gpu-withdrawn", "operator": "Lt", "value": "xid-48"}, False),  # unknown operator
], ids=["exists-all", "exists-key", "other-effect", "equal-default", "equal-other-value", "other-key",
        "equal-empty-key", "unknown-operator"])
def test_tolerates_is_tolerates_taint(toleration: dict[str, Any], ok: bool) -> None:
    assert tolerates([toleration], T) is ok


def _pod(name: str, tolerations: list[dict[str, Any]], gpus: int = 2) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "training"},
            "spec": {"tolerations": tolerations, "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_prefer_no_schedule_never_filters_a_node_and_no_schedule_does() -> None:
    state = seed_cluster(2, gpus_per_pod=2)  # each node: one pod on 2 GPUs, 6 free
    for n in ("gpu-node-0", "gpu-node-1"):
        state.patch("nodes", n, {"spec": {"taints": [{**T, "effect": "PreferNoSchedule"}]}})
    placed = state.create("pods", _pod("a", []))
    assert placed["spec"].get("nodeName")
    state.patch("nodes", "gpu-node-0", {"spec": {"taints": [T]}})
    state.patch("nodes", "gpu-node-1", {"spec": {"taints": [T]}})
    stuck = state.create("pods", _pod("b", []))
    assert not stuck["spec"].get("nodeName")
    msg = stuck["status"]["conditions"][0]["message"]
    assert msg == "0/2 nodes are available: 2 node(s) had untolerated taint {gpu-remediator/gpu-withdrawn: xid-48}."
    tolerant = state.create("pods", _pod("c", [{"key": T["key"], "operator": "Exists", "effect": "NoSchedule"}]))
    assert tolerant["spec"].get("nodeName")


def test_a_cordoned_node_takes_only_pods_tolerating_the_unschedulable_taint() -> None:
    state = seed_cluster(1, gpus_per_pod=2)
    state.patch("nodes", "gpu-node-0", {"spec": {"unschedulable": True}})
    assert not state.create("pods", _pod("a", []))["spec"].get("nodeName")
    ok = state.create("pods", _pod("b", [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                          "effect": "NoSchedule"}]))
    assert ok["spec"]["nodeName"] == "gpu-node-0"


def test_a_daemonset_pod_comes_back_on_a_withdrawn_node_only_when_it_tolerates_the_taint() -> None:
    state = seed_cluster(1, gpus_per_pod=2)
    state.patch("nodes", "gpu-node-0", {"spec": {"taints": [T]}})

    def daemon(ns: str) -> list[dict[str, Any]]:
        return [p for p in state.pods_on("gpu-node-0") if p["metadata"]["namespace"] == ns]

    (dcgm,) = daemon("gpu-operator")  # tolerates only nvidia.com/gpu:NoSchedule
    (agent,) = daemon("gpu-remediator")  # tolerates everything
    state.delete("pods", dcgm["metadata"]["name"], "gpu-operator")
    state.delete("pods", agent["metadata"]["name"], "gpu-remediator")
    assert daemon("gpu-operator") == []
    (back,) = daemon("gpu-remediator")
    assert back["metadata"]["uid"] != agent["metadata"]["uid"]
