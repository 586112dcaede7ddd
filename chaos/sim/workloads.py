"""The simulated apps/v1 workload controllers: Deployments, ReplicaSets and StatefulSets.

Where it sits: called by the controller loop (``controllers.Controllers``) for the owners a change
marked, on the same ``Store``; their pods go through the scheduler like any other (GPU requests honoured).

- A Deployment owns one ReplicaSet ``<deployment>-<pod-template-hash>`` (``ownerReferences`` with
  ``controller: true``); a template change creates a new one and scales the old ones to 0 at once (a
  Recreate rollout). Its status sums its ReplicaSets' and carries the Available/Progressing conditions.
- A ReplicaSet keeps ``replicas`` pods ``<rs>-<5 chars>``, replacing a terminating pod at once, as the
  real controller does; past ``replicas`` it deletes the surplus (unscheduled first, then the newest).
- A StatefulSet keeps pods ``<sts>-0`` … ``<sts>-(N-1)`` with stable names: a lost pod comes back under
  the same name once the old one is gone; all ordinals are created at once (``podManagementPolicy:
  Parallel`` behaviour). No PersistentVolumeClaims, no ``/scale`` subresource.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import TYPE_CHECKING

from chaos.sim.resources import (
    BY_PLURAL,
    CONTROLLER_REVISION_HASH_LABEL,
    GPU_RESOURCE,
    POD_INDEX_LABEL,
    POD_TEMPLATE_HASH_LABEL,
    STATEFULSET_POD_NAME_LABEL,
    Obj,
    controller_ref,
    is_terminating,
    natural_key,
    template_hash,
)
from chaos.sim.store import Store

if TYPE_CHECKING:
    from chaos.sim.controllers import Controllers


def workload_manifest(kind: str, namespace: str, name: str, replicas: int, gpus: int,
                      labels: dict[str, str] | None, node_selector: dict[str, str] | None, image: str) -> Obj:
    """An apps/v1 Deployment or StatefulSet of ``replicas`` one-container pods requesting ``gpus`` GPUs each;
    ``labels`` (default ``app: <name>``) are the selector and the pod labels."""
    match = dict(labels or {"app": name})
    container: Obj = {"name": name, "image": image, "resources": {}}
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}, "requests": {GPU_RESOURCE: str(gpus)}}
    pod_spec: Obj = {"containers": [container]}
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": namespace,
                                                                "labels": dict(match)},
            "spec": {"replicas": replicas, "selector": {"matchLabels": dict(match)},
                     "template": {"metadata": {"labels": dict(match)}, "spec": pod_spec}}}


class Workloads:
    """Deployment, ReplicaSet and StatefulSet controllers (lock held by the caller)."""

    def __init__(self, store: Store, controllers: Controllers) -> None:
        self.s = store
        self.c = controllers

    # --- apps/v1 workload controllers (lock held) -----------------------------------------------

    def owned_replicasets(self, owner_uid: str) -> list[Obj]:
        out = []
        for key in self.s.sorted_keys("replicasets"):
            rs = self.s.obj("replicasets", *key)
            ref = None if rs is None else controller_ref(rs)
            if rs is not None and ref is not None and ref.get("uid") == owner_uid:
                out.append(rs)
        return out

    def sync_deployment(self, dep: Obj) -> None:
        """One ReplicaSet per pod template: create the current one (or set its replicas), scale the others
        to 0."""
        meta, spec = dep["metadata"], dep.get("spec", {})
        replicas = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        pod_hash = template_hash(template)
        owned = self.owned_replicasets(meta["uid"])
        current = next((rs for rs in owned
                        if (rs["metadata"].get("labels") or {}).get(POD_TEMPLATE_HASH_LABEL) == pod_hash), None)
        for rs in owned:
            if rs is not current and int(rs.get("spec", {}).get("replicas", 0)) != 0:
                self.set_replicas(rs, 0)
        if current is not None:
            if int(current.get("spec", {}).get("replicas", 1)) != replicas:
                self.set_replicas(current, replicas)
            return
        revision = str(1 + max((int((rs["metadata"].get("annotations") or {}).get(
            "deployment.kubernetes.io/revision", "0")) for rs in owned), default=0))
        selector = copy.deepcopy(spec.get("selector") or {})
        selector["matchLabels"] = {**(selector.get("matchLabels") or {}), POD_TEMPLATE_HASH_LABEL: pod_hash}
        tmeta = copy.deepcopy(template.get("metadata") or {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), POD_TEMPLATE_HASH_LABEL: pod_hash}
        rs_meta = self.s.new_meta(
            f"{meta['name']}-{pod_hash}", meta["namespace"], labels=dict(tmeta["labels"]), generation=1,
            annotations={"deployment.kubernetes.io/revision": revision,
                         "deployment.kubernetes.io/desired-replicas": str(replicas),
                         "deployment.kubernetes.io/max-replicas": str(replicas)},
            ownerReferences=[self.c.owner_ref(dep, BY_PLURAL["deployments"])])
        if self.s.obj("replicasets", meta["namespace"], rs_meta["name"]) is not None:
            return  # a ReplicaSet of that name that is not ours: leave it, as the real controller would not adopt
        rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": rs_meta,
              "spec": {"replicas": replicas, "minReadySeconds": int(spec.get("minReadySeconds", 0)),
                       "selector": selector, "template": {**copy.deepcopy(template), "metadata": tmeta}}}
        self.s.commit(BY_PLURAL["replicasets"], rs, "ADDED")
        ann = {**(meta.get("annotations") or {}), "deployment.kubernetes.io/revision": revision}
        self.s.put(BY_PLURAL["deployments"], {**dep, "metadata": {**meta, "annotations": ann}})

    def set_replicas(self, rs: Obj, replicas: int) -> None:
        ann = {**(rs["metadata"].get("annotations") or {})}
        if "deployment.kubernetes.io/desired-replicas" in ann:
            ann["deployment.kubernetes.io/desired-replicas"] = str(replicas)
        meta = {**rs["metadata"], "annotations": ann, "generation": int(rs["metadata"].get("generation", 1)) + 1}
        self.s.put(BY_PLURAL["replicasets"], {**rs, "metadata": meta, "spec": {**rs["spec"], "replicas": replicas}})

    def sync_replicaset(self, rs: Obj, active: list[Obj]) -> int:
        """Create pods up to ``replicas`` (returns how many); past it, delete the surplus (unscheduled first,
        then the newest)."""
        want = int(rs.get("spec", {}).get("replicas", 1))
        for _ in range(want - len(active)):
            meta = rs["metadata"]
            pod = self.c.pod_from_template(rs["spec"].get("template") or {}, name=f"{meta['name']}-{self.s.suffix()}",
                                          namespace=meta["namespace"], labels={}, owner=rs,
                                          owner_rt=BY_PLURAL["replicasets"], restart_policy="Always")
            self.c.add_pod(pod, None)
        newest_first = sorted(active, key=lambda p: (p["metadata"].get("creationTimestamp", ""),
                                                     natural_key(p["metadata"]["name"])), reverse=True)
        surplus = sorted(newest_first, key=lambda p: bool(p.get("spec", {}).get("nodeName")))
        for pod in surplus[:max(0, len(active) - want)]:
            self.c.delete_pod(pod)
        return max(0, want - len(active))

    def sync_statefulset(self, sts: Obj, pods: list[Obj]) -> int:
        """Keep ``<sts>-0`` … ``<sts>-(replicas-1)``: create each missing ordinal (once the old pod of that
        name is gone), delete ordinals at or past ``replicas``. Returns how many pods it created."""
        meta, spec = sts["metadata"], sts.get("spec", {})
        want = int(spec.get("replicas", 1))
        created = 0
        for i in range(want):
            if self.s.obj("pods", meta["namespace"], f"{meta['name']}-{i}") is None:
                self.create_stateful_pod(sts, i)
                created += 1
        prefix = f"{meta['name']}-"
        for pod in pods:
            ordinal = pod["metadata"]["name"][len(prefix):]
            if not is_terminating(pod) and ordinal.isdigit() and int(ordinal) >= want:
                self.c.delete_pod(pod)
        return created

    def create_stateful_pod(self, sts: Obj, ordinal: int) -> Obj:
        meta, spec = sts["metadata"], sts.get("spec", {})
        name = f"{meta['name']}-{ordinal}"
        labels = {CONTROLLER_REVISION_HASH_LABEL: f"{meta['name']}-{template_hash(spec.get('template') or {})}",
                  STATEFULSET_POD_NAME_LABEL: name, POD_INDEX_LABEL: str(ordinal)}
        pod = self.c.pod_from_template(spec.get("template") or {}, name=name, namespace=meta["namespace"],
                                      labels=labels, owner=sts, owner_rt=BY_PLURAL["statefulsets"],
                                      restart_policy="Always")
        pod["spec"]["hostname"] = name
        if spec.get("serviceName"):
            pod["spec"]["subdomain"] = spec["serviceName"]
        return self.c.add_pod(pod, None)

    def sync_deployment_status(self, dep: Obj) -> None:
        spec = dep.get("spec", {})
        desired = int(spec.get("replicas", 1))
        pod_hash = template_hash(spec.get("template") or {})
        owned = self.owned_replicasets(dep["metadata"]["uid"])
        counts: Counter[str] = Counter()
        for rs in owned:
            st = rs.get("status") or {}
            for k in ("replicas", "readyReplicas", "availableReplicas"):
                counts[k] += int(st.get(k) or 0)
            if (rs["metadata"].get("labels") or {}).get(POD_TEMPLATE_HASH_LABEL) == pod_hash:
                counts["updatedReplicas"] += int(st.get("replicas") or 0)
        available = counts["availableReplicas"]
        old: dict[str, Obj] = {str(c.get("type")): c for c in (dep.get("status") or {}).get("conditions") or []}
        now = self.s.ts()

        def condition(ctype: str, ok: bool, reason: str, message: str) -> Obj:
            prev = old.get(ctype)
            status = "True" if ok else "False"
            if prev is not None and prev.get("status") == status and prev.get("reason") == reason:
                return prev
            return {"type": ctype, "status": status, "reason": reason, "message": message, "lastUpdateTime": now,
                    "lastTransitionTime": now}

        current = next((rs for rs in owned
                        if (rs["metadata"].get("labels") or {}).get(POD_TEMPLATE_HASH_LABEL) == pod_hash), None)
        rs_name = current["metadata"]["name"] if current is not None else dep["metadata"]["name"]
        done = counts["updatedReplicas"] == desired and available >= desired and counts["replicas"] == desired
        status: Obj = {
            "observedGeneration": dep["metadata"].get("generation", 1),
            "replicas": counts["replicas"], "updatedReplicas": counts["updatedReplicas"],
            "readyReplicas": counts["readyReplicas"], "availableReplicas": available,
            "unavailableReplicas": max(0, desired - available),
            "conditions": [
                condition("Available", available >= desired,
                          "MinimumReplicasAvailable" if available >= desired else "MinimumReplicasUnavailable",
                          "Deployment has minimum availability." if available >= desired
                          else "Deployment does not have minimum availability."),
                condition("Progressing", True, "NewReplicaSetAvailable" if done else "ReplicaSetUpdated",
                          f'ReplicaSet "{rs_name}" has successfully progressed.' if done
                          else f'ReplicaSet "{rs_name}" is progressing.'),
            ],
        }
        if status != dep.get("status"):
            self.s.put(BY_PLURAL["deployments"], {**dep, "status": status})

