"""Issue 10's done-when for GPU withdrawal, in both allocation modes: on ``remediator sim --nodes 2
--gpu-pods-per-node 4``'s cluster, with the service and the simulated nodes' real agents running, an Xid 48
alert for one GPU of gpu-node-0 evicts exactly one of that node's four training pods; the other three keep
running with unchanged UIDs; with DRA a DeviceTaintRule for that device exists and gpu-node-0 stays
schedulable; with the device plugin gpu-node-0 carries our NoSchedule taint and is not cordoned; no pod
anywhere carries a ``gpu-remediator.io/gpu-indices`` annotation.

Where it sits: integration ring. The cluster, GPU nodes, agents and service are the drill harness's
(``chaos.world.environment``: ``seed_cluster`` as ``remediator sim`` calls it, the ``Service`` as ``remediator
serve`` runs it, ``remediator agent``'s ``Agent`` on each simulated GPU node, authenticated NATS); the alert
comes through the Alertmanager webhook. The hold-down is long, so the GPU is still out when the test looks.
``test_sim_cli_serves_that_cluster`` runs the CLI itself and reads it with kubectl.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.faults import Fault
from chaos.injectors import WebhookXid
from chaos.sim import TRAINING_NAMESPACE
from chaos.world import environment

NODE = "gpu-node-0"
GPU = 1


def _training(world_cluster: object, node: str) -> dict[str, str]:
    pods = world_cluster.pods_on(node)  # type: ignore[attr-defined]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods
            if p["metadata"]["namespace"] == TRAINING_NAMESPACE and not p["metadata"].get("deletionTimestamp")}


@pytest.mark.drill
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["dra", "device-plugin"])
async def test_xid48_evicts_exactly_its_pod_and_withdraws_what_the_mode_allows(mode: str) -> None:
    progress: list[str] = []
    async with environment(progress.append, nodes=2, gpus=8, gpu_allocation=mode, gpu_pods_per_node=4,
                           settings={"verify_hold_down_s": 60.0}, label=f"withdrawal-{mode}") as world:
        cluster = world.cluster
        before = _training(cluster, NODE)
        assert len(before) == 4
        victim = cluster.gpus_in_use(NODE)[GPU].split("/")[1]
        fault = Fault("xid48", NODE, GPU, WebhookXid(xid=48), "gpu-memory-fatal")
        await WebhookXid(xid=48)(world, fault)

        def withdrawn() -> bool:
            if mode == "dra":
                return bool(cluster.device_taints(NODE, GPU))
            return any(t["key"] == world.settings.gpu_withdrawn_taint_key for t in cluster.taints(NODE))

        await asyncio.to_thread(cluster.wait_for, lambda c: victim not in _training(c, NODE) and withdrawn(), 60.0)
        after = _training(cluster, NODE)
        assert victim not in after, progress
        assert {n: u for n, u in after.items()} == {n: u for n, u in before.items() if n != victim}

        node = cluster.node(NODE)
        assert not node["spec"].get("unschedulable")
        if mode == "dra":
            (rule,) = cluster.list_objects("devicetaintrules")
            assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": NODE, "device": f"gpu-{GPU}"}
            assert rule["spec"]["taint"]["effect"] == "NoSchedule"
            assert not node["spec"].get("taints")  # the node stays schedulable
        else:
            assert [(t["key"], t["effect"]) for t in node["spec"]["taints"]] == [
                (world.settings.gpu_withdrawn_taint_key, "NoSchedule")]
            assert not cluster.list_objects("devicetaintrules")
        for pod in cluster.list_pods():
            assert "gpu-remediator.io/gpu-indices" not in (pod["metadata"].get("annotations") or {})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["dra", "device-plugin"])
def test_sim_cli_serves_that_cluster(mode: str, tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed: this test needs a real kubectl (v1.32)")
    proc = subprocess.Popen([sys.executable, "-m", "remediator.cli", "sim", "--nodes", "2", "--gpu-pods-per-node", "4",
                             "--gpu-allocation", mode, "--kubeconfig-out", str(tmp_path / "kc"), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        doc = json.loads(proc.stdout.readline())
        assert doc["gpu_allocation"] == mode
        env = {**os.environ, "HOME": str(tmp_path)}

        def get(*args: str) -> str:
            out = subprocess.run([kubectl, "--kubeconfig", doc["kubeconfig"], "--cache-dir", str(tmp_path / "kc-cache"),
                                  *args], capture_output=True, text=True, timeout=60, env=env, check=True)
            return out.stdout

        pods = json.loads(get("get", "pods", "-n", TRAINING_NAMESPACE, "-o", "json"))["items"]
        per_node = {n: sum(1 for p in pods if p["spec"].get("nodeName") == n) for n in ("gpu-node-0", "gpu-node-1")}
        assert per_node == {"gpu-node-0": 4, "gpu-node-1": 4}
        slices = get("get", "resourceslices", "-o", "name").split()
        assert len(slices) == (2 if mode == "dra" else 0)
        if mode == "dra":
            assert all(p["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName":
                                                         p["metadata"]["labels"]["job-name"] + "-gpus"}] for p in pods)
        else:
            assert all(p["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"} for p in pods)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
