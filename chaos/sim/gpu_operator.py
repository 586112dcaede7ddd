"""The simulated NVIDIA GPU Operator's operands: DaemonSets that follow the ``nvidia.com/gpu.deploy.*`` node
labels and whose pods hold every GPU of their node open.

Where it sits: chaos/sim, on ``ClusterState``'s public API, after ``seed_cluster``. ``install`` does what the
operator's ClusterPolicy does on each GPU node: it labels the node ``nvidia.com/gpu.deploy.<operand>=true``
and runs one DaemonSet per operand in namespace ``gpu-operator`` whose pod template selects nodes by that
label (``nodeSelector``), as the operator's DaemonSets do; the simulated DaemonSet controller
(``controllers``) then removes an operand's pod from a node whose label is set to ``false`` and brings it
back when the label returns. The containers run with ``NVIDIA_VISIBLE_DEVICES=all`` (the operator gives its
operands every GPU), which the drill harness's kubelet (``chaos.kubelet``) turns into one process per GPU
on the simulated GPU node, with the pod's UID in its cgroup: while the pod runs, ``nvidia-smi --gpu-reset``
finds the GPU in use, as on a real node (NVSentinel issues #1690, #1869).

``unmanaged`` operands are installed the way a standalone Helm release of the same component would be:
selecting ``nvidia.com/gpu.present=true``, so no ``gpu.deploy`` label moves them, and they keep holding the
GPUs (the reset is refused with their pods named).

The default seeded ``nvidia-dcgm-exporter`` DaemonSet (which selects ``nvidia.com/gpu.present``) is replaced.

Operands tolerate ``nvidia.com/gpu:NoSchedule`` (the operator's default ``daemonsets.tolerations``) and the
keys given as ``tolerate``. The drills pass the service's partial-withdrawal taint key
(``gpu_withdrawn_taint_key``), as the README asks a device-plugin cluster to configure: without it a
DaemonSet pod of an operand moved off for a reset cannot come back while that GPU stays withdrawn, on a real
cluster as here.
"""

from __future__ import annotations

from collections.abc import Sequence

from chaos.sim.cluster import GPU_PRESENT_LABEL, GPU_RESOURCE, ClusterState
from chaos.sim.resources import Obj

NAMESPACE = "gpu-operator"
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
# operand -> (DaemonSet name, image): the names the GPU Operator gives its DaemonSets
OPERANDS: dict[str, tuple[str, str]] = {
    "device-plugin": ("nvidia-device-plugin-daemonset", "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"),
    "gpu-feature-discovery": ("gpu-feature-discovery", "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"),
    "dcgm-exporter": ("nvidia-dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04"),
    "dcgm": ("nvidia-dcgm", "nvcr.io/nvidia/cloud-native/dcgm:3.3.9-1-ubuntu22.04"),
}
HOLDS_ALL_GPUS = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}


def holds_all_gpus(pod: Obj) -> bool:
    """Whether the container runtime gives this pod every GPU of its node (``NVIDIA_VISIBLE_DEVICES=all``)."""
    return any(e.get("name") == "NVIDIA_VISIBLE_DEVICES" and e.get("value") == "all"
               for c in (pod.get("spec") or {}).get("containers") or [] for e in c.get("env") or [])


def _daemonset(name: str, image: str, selector: dict[str, str], tolerate: Sequence[str]) -> Obj:
    labels = {"app": name}
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
                   *({"key": key, "operator": "Exists"} for key in tolerate)]
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(labels)},
            "spec": {"selector": {"matchLabels": dict(labels)},
                     "template": {"metadata": {"labels": dict(labels)},
                                  "spec": {"nodeSelector": selector, "priorityClassName": "system-node-critical",
                                           "tolerations": tolerations,
                                           "containers": [{"name": name, "image": image,
                                                           "env": [dict(HOLDS_ALL_GPUS)], "resources": {}}]}}}}


def install(state: ClusterState, operands: Sequence[str] = tuple(OPERANDS), *,
            unmanaged: Sequence[str] = (), tolerate: Sequence[str] = ()) -> None:
    """Label every GPU node for ``operands`` and run their DaemonSets (``unmanaged`` ones ignoring the
    labels); see the module docstring. ``tolerate``: taint keys the operands tolerate besides
    ``nvidia.com/gpu`` (the ClusterPolicy's ``daemonsets.tolerations``)."""
    for op in (*operands, *unmanaged):
        if op not in OPERANDS:
            raise ValueError(f"unknown GPU Operator operand {op!r} (one of {', '.join(OPERANDS)})")
    for ds in state.list_objects("daemonsets", NAMESPACE):
        state.delete("daemonsets", ds["metadata"]["name"], NAMESPACE, propagation="Background")
    managed = [op for op in operands if op not in unmanaged]
    for node in state.node_names():
        state.patch("nodes", node, {"metadata": {"labels": {DEPLOY_PREFIX + op: "true" for op in managed}}})
    for op in managed:
        name, image = OPERANDS[op]
        state.create("daemonsets", _daemonset(name, image, {DEPLOY_PREFIX + op: "true"}, tolerate), NAMESPACE)
    for op in unmanaged:
        name, image = OPERANDS[op]
        state.create("daemonsets", _daemonset(f"{name}-standalone", image, {GPU_PRESENT_LABEL: "true"}, tolerate),
                     NAMESPACE)
