"""The simulated kube-scheduler: binds each pending pod to a node it fits, or says why it cannot.

Where it sits: run by the controllers' loop (``Controllers.reconcile``) whenever a pod becomes pending or a
node gains room. The filters are kube-scheduler's, in its order:

- NodeUnschedulable: a cordoned node (``spec.unschedulable``) takes only pods tolerating
  ``node.kubernetes.io/unschedulable:NoSchedule``; a node that is not Ready counts as carrying
  ``node.kubernetes.io/not-ready:NoSchedule``, the taint the node lifecycle controller puts on it;
- NodeAffinity: the pod's ``nodeSelector`` matches the node's labels;
- TaintToleration: every node taint with effect ``NoSchedule`` or ``NoExecute`` is tolerated
  (``resources.tolerates``: ``Toleration.ToleratesTaint``); ``PreferNoSchedule`` only scores, so it never
  filters a node out;
- NodeResourcesFit: the node's device manager (``kubelet``) has enough free healthy GPUs for its
  ``nvidia.com/gpu`` request;
- DynamicResources: the pod's ResourceClaims can be allocated on the node (``dra``: free devices whose
  device taints the claim tolerates), or are already allocated there.

New pods scan the nodes round-robin from a rotating start, as kube-scheduler does; a node that gained room
is offered to the pods still pending. A pod that fits nowhere stays Pending with
``PodScheduled=False/Unschedulable`` and a message in kube-scheduler's words (``0/N nodes are available: …``).
Binding allocates the pod's claims, then hands the pod to the node's kubelet, which starts it and assigns
its GPUs. Each pass first runs the DRA controllers (``Dra.sync``: claim garbage collection and the
device-taint eviction controller).
"""

from __future__ import annotations

from collections import Counter

from chaos.sim.dra import Dra
from chaos.sim.kubelet import Kubelets
from chaos.sim.resources import (
    BY_PLURAL,
    GPU_RESOURCE,
    Obj,
    gpu_request,
    natural_key,
    node_ready,
    tolerates,
)
from chaos.sim.store import Store

UNSCHEDULABLE_TAINT: Obj = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
NOT_READY_TAINT: Obj = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


def _taint_text(t: Obj) -> str:
    value = f": {t['value']}" if t.get("value") else ""
    return f"{{{t.get('key')}{value}}}"


class Scheduler:
    """Placement of pending pods (lock held by the caller)."""

    def __init__(self, store: Store, kubelets: Kubelets, dra: Dra | None = None) -> None:
        self.s = store
        self.kubelets = kubelets
        self.dra = dra if dra is not None else Dra(store)
        self._cursor = 0

    def why_not(self, pod: Obj, node: Obj) -> str | None:
        """None when ``pod`` may be bound to ``node`` now, else kube-scheduler's reason for the node."""
        spec = pod.get("spec", {})
        tolerations = spec.get("tolerations") or []
        if node.get("spec", {}).get("unschedulable") and not tolerates(tolerations, UNSCHEDULABLE_TAINT):
            return "node(s) were unschedulable"
        if not node_ready(node) and not tolerates(tolerations, NOT_READY_TAINT):
            return f"node(s) had untolerated taint {_taint_text(NOT_READY_TAINT)}"
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        for t in node.get("spec", {}).get("taints") or []:
            if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t):
                return f"node(s) had untolerated taint {_taint_text(t)}"
        name = node["metadata"]["name"]
        if self.kubelets.free_gpus(name, gpu_request(pod)) is None:
            return f"Insufficient {GPU_RESOURCE}"
        if spec.get("resourceClaims") and self.dra.pick(pod, name) is None:
            return "cannot allocate all claims"
        return None

    def fits(self, pod: Obj, node: Obj) -> bool:
        """Whether ``pod`` may be bound to ``node`` now (see the module docstring)."""
        return self.why_not(pod, node) is None

    def _bind(self, pod: Obj, node_name: str) -> bool:
        if pod.get("spec", {}).get("resourceClaims") and not self.dra.allocate(pod, node_name):
            return False
        current = self.s.obj("pods", pod["metadata"]["namespace"], pod["metadata"]["name"]) or pod
        self.s.commit(BY_PLURAL["pods"], self.kubelets.start(current, node_name), "MODIFIED")
        return True

    def bind_to(self, pod: Obj, node_name: str) -> bool:
        """Bind a pending pod to ``node_name`` if it fits there (its claims made and allocated first): what
        the seeder does to lay pods out where it wants them."""
        if pod.get("spec", {}).get("resourceClaims"):
            pod = self.dra.ensure_claims(pod)
        node = self.s.obj("nodes", "", node_name)
        if node is None or not self.fits(pod, node):
            return False
        return self._bind(pod, node_name)

    def _prepare(self, key: tuple[str, str]) -> Obj | None:
        pod = self.s.obj("pods", *key)
        if pod is not None and pod.get("spec", {}).get("resourceClaims"):
            pod = self.dra.ensure_claims(pod)
        return pod

    def schedule(self) -> None:
        """Run the DRA controllers, offer nodes that gained room to the pending pods, then place the newly
        pending ones."""
        self.dra.sync()
        d = self.s.dirty
        nodes, d.sched_nodes = d.sched_nodes, set()
        for node_name in sorted(nodes, key=natural_key):
            if self.s.obj("nodes", "", node_name) is None:
                continue
            for key in list(self.s.pending):
                pod = self._prepare(key)
                node = self.s.obj("nodes", "", node_name)
                if pod is None or node is None:
                    continue
                if self.fits(pod, node):
                    self._bind(pod, node_name)
        new, d.sched_new = d.sched_new, []
        order = self.s.node_order
        for key in new:
            if key not in self.s.pending:
                continue
            pod = self._prepare(key)
            if pod is None:
                continue
            placed = False
            reasons: Counter[str] = Counter()
            n = len(order)
            for i in range(n):
                idx = (self._cursor + i) % n
                node = self.s.obj("nodes", "", order[idx])
                if node is None:
                    continue
                why = self.why_not(pod, node)
                if why is None and self._bind(pod, order[idx]):
                    self._cursor = (idx + 1) % n
                    placed = True
                    break
                reasons[why or "cannot allocate all claims"] += 1
            if not placed:
                self.mark_unschedulable(pod, reasons)

    def mark_unschedulable(self, pod: Obj, reasons: Counter[str] | None = None) -> None:
        """Record once why the pod stays Pending (``PodScheduled=False/Unschedulable``), in
        kube-scheduler's words: ``0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had
        untolerated taint {…}.``"""
        current = self.s.obj("pods", pod["metadata"]["namespace"], pod["metadata"]["name"]) or pod
        conds = current.get("status", {}).get("conditions") or []
        if any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conds):
            return
        parts = ", ".join(f"{n} {why}" for why, n in sorted((reasons or Counter()).items()))
        msg = f"0/{len(self.s.node_order)} nodes are available" + (f": {parts}." if parts else ".")
        status = {**current.get("status", {}), "phase": "Pending",
                  "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                  "message": msg, "lastTransitionTime": self.s.ts()}]}
        self.s.commit(BY_PLURAL["pods"], {**current, "status": status}, "MODIFIED")
