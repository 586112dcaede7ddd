"""The simulated kube-scheduler: binds each pending pod to a node it fits, or says why it cannot.

Where it sits: run by the controllers' loop (``Controllers.reconcile``) whenever a pod becomes pending or a
node gains room. A pod fits a node that is Ready and not cordoned, whose NoSchedule/NoExecute taints it
tolerates, whose labels satisfy its ``nodeSelector`` and whose device manager (``kubelet``) has enough
free healthy GPUs for its ``nvidia.com/gpu`` request. New pods scan the nodes round-robin from a rotating
start, as kube-scheduler does; a node that gained room is offered to the pods still pending. A pod that
fits nowhere stays Pending with ``PodScheduled=False/Unschedulable``. Binding hands the pod to the node's
kubelet, which starts it and assigns its GPUs.
"""

from __future__ import annotations

from chaos.sim.kubelet import Kubelets
from chaos.sim.resources import (
    BY_PLURAL,
    GPU_RESOURCE,
    Obj,
    blocking_taints,
    gpu_request,
    natural_key,
    node_open,
    tolerates,
)
from chaos.sim.store import Store


class Scheduler:
    """Placement of pending pods (lock held by the caller)."""

    def __init__(self, store: Store, kubelets: Kubelets) -> None:
        self.s = store
        self.kubelets = kubelets
        self._cursor = 0

    def fits(self, pod: Obj, node: Obj) -> bool:
        """Whether ``pod`` may be bound to ``node`` now (see the module docstring)."""
        if not node_open(node):
            return False
        spec = pod.get("spec", {})
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return False
        tolerations = spec.get("tolerations") or []
        if not all(tolerates(tolerations, t) for t in blocking_taints(node)):
            return False
        return self.kubelets.free_gpus(node["metadata"]["name"], gpu_request(pod)) is not None

    def _bind(self, pod: Obj, node_name: str) -> None:
        self.s.commit(BY_PLURAL["pods"], self.kubelets.start(pod, node_name), "MODIFIED")

    def schedule(self) -> None:
        """Offer nodes that gained room to the pending pods, then place the newly pending ones."""
        d = self.s.dirty
        nodes, d.sched_nodes = d.sched_nodes, set()
        for node_name in sorted(nodes, key=natural_key):
            node = self.s.obj("nodes", "", node_name)
            if node is None or not node_open(node):
                continue
            for key in list(self.s.pending):
                pod = self.s.obj("pods", *key)
                node = self.s.obj("nodes", "", node_name)
                if pod is None or node is None:
                    continue
                if self.fits(pod, node):
                    self._bind(pod, node_name)
        new, d.sched_new = d.sched_new, []
        order = self.s.node_order
        for key in new:
            pod = self.s.obj("pods", *key)
            if pod is None or key not in self.s.pending:
                continue
            placed = False
            n = len(order)
            for i in range(n):
                idx = (self._cursor + i) % n
                node = self.s.obj("nodes", "", order[idx])
                if node is None:
                    continue
                if self.fits(pod, node):
                    self._cursor = (idx + 1) % n
                    self._bind(pod, order[idx])
                    placed = True
                    break
            if not placed:
                self.mark_unschedulable(pod)

    def mark_unschedulable(self, pod: Obj) -> None:
        """Record once why the pod stays Pending (``PodScheduled=False/Unschedulable``)."""
        conds = pod.get("status", {}).get("conditions") or []
        if any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conds):
            return
        msg = (f"0/{len(self.s.node_order)} nodes are available: {gpu_request(pod)} {GPU_RESOURCE} requested; "
               "no schedulable, untainted node has that many free GPUs.")
        status = {**pod.get("status", {}), "phase": "Pending",
                  "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                  "message": msg, "lastTransitionTime": self.s.ts()}]}
        self.s.commit(BY_PLURAL["pods"], {**pod, "status": status}, "MODIFIED")
