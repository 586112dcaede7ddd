"""The simulated kube-controller-manager: the loop that runs after every change, and the controllers of
batch Jobs, Kubeflow PyTorchJobs and DaemonSets, the NoExecute taint manager and graceful deletion.

Where it sits: on the ``Store``, driven synchronously by every write (``reconcile``), so a test sees the
effect as soon as its request returns. ``reconcile`` drains the work ``Store.commit`` marked (``Dirty``)
in a fixed order until nothing is left (bounded): the taint manager, the owners that lost pods, the
DaemonSet pods per node, the scheduler (``scheduler``), owner status, PodDisruptionBudget status
(``disruption``); then the restart count of every job whose pods it recreated. The apps/v1 workload controllers are in
``workloads``.

- Job controller: a pod owned by a Job or PyTorchJob that is deleted or evicted is replaced (Job pods get
  a fresh ``<job>-<5 chars>`` name, PyTorchJob pods keep ``<job>-<replica type>-<index>``); each pass that
  recreates pods of a job that ran before bumps its ``sim.gpu-remediator.io/restarts`` annotation.
- DaemonSet controller: a deleted DaemonSet pod comes back on its node (if the node still tolerates it); a
  node whose labels stop matching the DaemonSet's ``nodeSelector`` loses its pod, and gets one back when
  they match again (how the GPU Operator's ``nvidia.com/gpu.deploy.<operand>`` labels move operands).
- ``Reboots``: the nodes' boot ids. An attached simulated GPU node's boot id is the node's
  ``status.nodeInfo.bootID``; when it changes (the node rebooted) the node is NotReady for ``down_s`` on
  the store's clock, then Ready with the new boot id. Two simulated reboot controllers act as real ones
  would: a node-repair controller that reboots a node once per new value of its ``annotation``
  (``gpu-remediator.io/reboot-requested`` unless set otherwise), and the kubelet running a pod that can
  reboot its host (``hostPID``, a privileged container whose command ends in ``reboot``, e.g. ``nsenter -t 1
  -m -- systemctl reboot``), which reboots the node once per such pod. A pod without those privileges
  reboots nothing.
- Taint manager: a new NoExecute taint deletes the pods on the node that do not tolerate it.
- Graceful deletion (``Store.graceful``): deleting a bound, running pod marks it terminating
  (``deletionTimestamp``, ``deletionGracePeriodSeconds``) until the clock passes its deadline.
"""

from __future__ import annotations

import copy
import time
import uuid
from datetime import datetime, timedelta

from chaos.sim.disruption import Disruption
from chaos.sim.kubelet import Kubelets
from chaos.sim.resources import (
    BY_PLURAL,
    DEFAULT_GRACE_PERIOD_S,
    DEFAULT_TOLERATIONS,
    JOB_NAME_LABEL,
    KUBEFLOW_JOB_NAME_LABEL,
    KUBEFLOW_REPLICA_INDEX_LABEL,
    KUBEFLOW_REPLICA_TYPE_LABEL,
    RESTARTS_ANNOTATION,
    Obj,
    ResourceType,
    blocking_taints,
    daemonset_selects,
    is_active,
    is_terminal,
    is_terminating,
    natural_key,
    pod_ready,
    stamp,
    template_hash,
    tolerates,
)
from chaos.sim.scheduler import Scheduler
from chaos.sim.store import Store
from chaos.sim.workloads import Workloads


class Controllers:
    """The controllers over a ``Store`` (lock held by the caller in every method)."""

    def __init__(self, store: Store, scheduler: Scheduler, kubelets: Kubelets, disruption: Disruption) -> None:
        self.s = store
        self.scheduler = scheduler
        self.kubelets = kubelets
        self.disruption = disruption
        self.workloads = Workloads(store, self)
        self.reboots = Reboots(store, kubelets)

    def tick(self) -> None:
        """Finish due graceful deletions, take in the GPU nodes' device health and boot ids, running the
        controllers when any changed anything."""
        rebooted = self.reboots.poll()
        if self.kubelets.poll() or self.s.terminating or rebooted:
            self.reconcile()

    def expire_terminating(self) -> None:
        """Remove the terminating pods whose deletionTimestamp the clock has passed (one pass, so a gang
        deleted together goes together)."""
        if not self.s.terminating:
            return
        now = self.s.clock()
        for key in sorted(k for k, when in self.s.terminating.items() if when <= now):
            self.s.terminating.pop(key, None)
            pod = self.s.obj("pods", *key)
            if pod is not None and is_terminating(pod):
                self.s.remove(BY_PLURAL["pods"], pod)

    def delete_pod(self, pod: Obj, grace_period: int | None = None) -> Obj:
        """Delete a pod the way the API server does: at once, or (``graceful_deletion`` on, a bound pod
        that has not finished, a grace period above 0) by marking it terminating until its grace period
        ends. A pod already terminating only ever has its deadline brought forward."""
        spec = pod.get("spec", {})
        period = grace_period if grace_period is not None else \
            int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_PERIOD_S))
        if not self.s.graceful or period <= 0 or not spec.get("nodeName") or is_terminal(pod):
            return self.s.remove(BY_PLURAL["pods"], pod)
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        when = self.s.clock() + timedelta(seconds=period)
        current = self.s.terminating.get(key)
        if is_terminating(pod) and current is not None and current <= when:
            return pod
        self.s.terminating[key] = when
        return self.s.commit(BY_PLURAL["pods"], {**pod, "metadata": {
            **meta, "deletionTimestamp": stamp(when), "deletionGracePeriodSeconds": period}}, "MODIFIED")

    def reconcile(self) -> None:
        """Run the controllers until nothing is left to do (bounded)."""
        self.expire_terminating()
        self.kubelets.poll()
        for _ in range(20):
            d = self.s.dirty
            if d.empty():
                break
            if d.noexecute:
                nodes, d.noexecute = d.noexecute, set()
                for node in sorted(nodes):
                    self.taint_manager(node)
            if d.owners:
                owners, d.owners = d.owners, set()
                for plural, ns, name in sorted(owners):
                    self.sync_owner(plural, ns, name)
            if d.ds_nodes:
                pairs, d.ds_nodes = d.ds_nodes, set()
                for ns, ds, node in sorted(pairs):
                    self.sync_daemon_pod(ns, ds, node)
            if d.sched_nodes or d.sched_new:
                self.scheduler.schedule()
            if d.status and not (d.owners or d.ds_nodes or d.sched_new or d.sched_nodes):
                owners, d.status = d.status, set()
                for plural, ns, name in sorted(owners):
                    self.sync_owner_status(plural, ns, name)
            if d.pdbs and not (d.owners or d.ds_nodes or d.sched_new or d.sched_nodes or d.status):
                pdbs, d.pdbs = d.pdbs, set()
                for key in sorted(pdbs):
                    self.disruption.sync_pdb(key)
        restarted, self.s.dirty.restarted = self.s.dirty.restarted, set()
        for plural, ns, name in sorted(restarted):
            owner = self.s.obj(plural, ns, name)
            if owner is None:
                continue
            ann = dict(owner["metadata"].get("annotations") or {})
            ann[RESTARTS_ANNOTATION] = str(int(ann.get(RESTARTS_ANNOTATION, "0")) + 1)
            self.s.put(BY_PLURAL[plural], {**owner, "metadata": {**owner["metadata"], "annotations": ann}})
        self.s.dirty.status.clear()

    def taint_manager(self, node_name: str) -> None:
        node = self.s.obj("nodes", "", node_name)
        if node is None:
            return
        noexec = [t for t in node.get("spec", {}).get("taints") or [] if t.get("effect") == "NoExecute"]
        for key in list(self.s.pods_by_node.get(node_name, {})):
            pod = self.s.obj("pods", *key)
            if pod is None or is_terminating(pod):
                continue
            tolerations = pod.get("spec", {}).get("tolerations") or []
            if not all(tolerates(tolerations, t) for t in noexec):
                self.delete_pod(pod)

    def owned_pods(self, owner_uid: str) -> list[Obj]:
        pods = []
        for key in list(self.s.pods_by_owner.get(owner_uid, {})):
            pod = self.s.obj("pods", *key)
            if pod is not None:
                pods.append(pod)
        return pods

    def sync_owner(self, plural: str, ns: str, name: str) -> None:
        owner = self.s.obj(plural, ns, name)
        if owner is None:
            return
        if plural == "deployments":
            self.workloads.sync_deployment(owner)
            self.s.dirty.status.add((plural, ns, name))
            return
        pods = [p for p in self.owned_pods(owner["metadata"]["uid"]) if not is_terminal(p)]
        created = 0
        if plural == "jobs":
            spec = owner.get("spec", {})
            done = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                       for c in owner.get("status", {}).get("conditions") or [])
            if spec.get("suspend") or done:
                return
            active = [p for p in pods if not is_terminating(p)]
            for _ in range(max(0, int(spec.get("parallelism", 1)) - len(active))):
                self.create_job_pod(owner)
                created += 1
        elif plural == "replicasets":
            created = self.workloads.sync_replicaset(owner, [p for p in pods if not is_terminating(p)])
        elif plural == "statefulsets":
            created = self.workloads.sync_statefulset(owner, pods)
        else:
            existing = {p["metadata"]["name"] for p in pods}
            world = self.world_size(owner)
            for rtype, index, rank in self.ranks(owner):
                pod_name = f"{name}-{rtype.lower()}-{index}"
                if pod_name not in existing:
                    self.create_pytorch_pod(owner, rtype, index, rank, world)
                    created += 1
        if created and self.had_pods(owner):
            self.s.dirty.restarted.add((plural, ns, name))
        self.s.dirty.status.add((plural, ns, name))

    def had_pods(self, owner: Obj) -> bool:
        """Whether the owner ran before (its status saw pods start): a recreation is then a restart."""
        status = owner.get("status") or {}
        return bool(status.get("startTime")) or int(status.get("replicas") or 0) > 0
    @staticmethod
    def ranks(ptj: Obj) -> list[tuple[str, int, int]]:
        """``(replica type, index, rank)`` for every replica: Master first (rank 0), then Workers."""
        specs = ptj.get("spec", {}).get("pytorchReplicaSpecs") or {}
        out: list[tuple[str, int, int]] = []
        rank = 0
        for rtype in ["Master", *sorted(t for t in specs if t != "Master")]:
            if rtype not in specs:
                continue
            for i in range(int(specs[rtype].get("replicas", 1))):
                out.append((rtype, i, rank))
                rank += 1
        return out

    def world_size(self, ptj: Obj) -> int:
        return len(self.ranks(ptj))

    def owner_ref(self, owner: Obj, rt: ResourceType) -> Obj:
        return {"apiVersion": rt.api_version, "kind": rt.kind, "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    def pod_from_template(self, template: Obj, *, name: str, namespace: str, labels: dict[str, str],
                           owner: Obj, owner_rt: ResourceType, restart_policy: str,
                           env: list[Obj] | None = None) -> Obj:
        tmeta = template.get("metadata") or {}
        spec = copy.deepcopy(template.get("spec") or {})
        spec.setdefault("restartPolicy", restart_policy)
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("serviceAccountName", "default")
        spec["tolerations"] = list(spec.get("tolerations") or []) + [
            dict(t) for t in DEFAULT_TOLERATIONS if t not in (spec.get("tolerations") or [])]
        if env:
            for c in spec.get("containers", []):
                c["env"] = list(c.get("env") or []) + env
        meta = self.s.new_meta(name, namespace)
        meta["labels"] = {**(tmeta.get("labels") or {}), **labels}
        if tmeta.get("annotations"):
            meta["annotations"] = dict(tmeta["annotations"])
        meta["ownerReferences"] = [self.owner_ref(owner, owner_rt)]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
                "status": {"phase": "Pending", "qosClass": "BestEffort"}}

    def create_job_pod(self, job: Obj, *, node: str | None = None) -> Obj:
        meta = job["metadata"]
        labels = {"batch.kubernetes.io/controller-uid": meta["uid"], "batch.kubernetes.io/job-name": meta["name"],
                  "controller-uid": meta["uid"], JOB_NAME_LABEL: meta["name"]}
        pod = self.pod_from_template(job["spec"]["template"], name=f"{meta['name']}-{self.s.suffix()}",
                                      namespace=meta["namespace"], labels=labels, owner=job,
                                      owner_rt=BY_PLURAL["jobs"], restart_policy="Never")
        return self.add_pod(pod, node)

    def create_pytorch_pod(self, ptj: Obj, rtype: str, index: int, rank: int, world: int, *,
                            node: str | None = None) -> Obj:
        meta = ptj["metadata"]
        spec = ptj["spec"]["pytorchReplicaSpecs"][rtype]
        labels = {KUBEFLOW_JOB_NAME_LABEL: meta["name"],
                  "training.kubeflow.org/operator-name": "pytorchjob-controller",
                  KUBEFLOW_REPLICA_TYPE_LABEL: rtype.lower(), KUBEFLOW_REPLICA_INDEX_LABEL: str(index)}
        if rtype == "Master":
            labels["training.kubeflow.org/job-role"] = "master"
        env = [{"name": "MASTER_PORT", "value": "23456"}, {"name": "MASTER_ADDR", "value": f"{meta['name']}-master-0"},
               {"name": "WORLD_SIZE", "value": str(world)}, {"name": "RANK", "value": str(rank)},
               {"name": "PYTHONUNBUFFERED", "value": "1"}]
        pod = self.pod_from_template(spec["template"], name=f"{meta['name']}-{rtype.lower()}-{index}",
                                      namespace=meta["namespace"], labels=labels, owner=ptj,
                                      owner_rt=BY_PLURAL["pytorchjobs"],
                                      restart_policy=spec.get("restartPolicy", "OnFailure"), env=env)
        return self.add_pod(pod, node)

    def add_pod(self, pod: Obj, node: str | None) -> Obj:
        """Commit a new pod: bound to ``node`` (started by its kubelet) when given, else Pending for the
        scheduler; a template that names its node (``spec.nodeName``) is run by that node's kubelet, which
        admits it (or fails it) as for a pod created bound."""
        if node is not None:
            pod = self.kubelets.start(pod, node)
        elif (pod.get("spec") or {}).get("nodeName") and self.s.obj("nodes", "", pod["spec"]["nodeName"]):
            pod = self.kubelets.admit(pod, pod["spec"]["nodeName"])
        return self.s.commit(BY_PLURAL["pods"], pod, "ADDED")

    def sync_daemon_pod(self, ns: str, ds_name: str, node_name: str) -> None:
        ds = self.s.obj("daemonsets", ns, ds_name)
        node = self.s.obj("nodes", "", node_name)
        if ds is None or node is None:
            return
        uid = ds["metadata"]["uid"]
        template = ds["spec"]["template"]
        wanted = daemonset_selects(ds, node)
        mine = [key for key in self.s.pods_by_node.get(node_name, {}) if key in self.s.pods_by_owner.get(uid, {})]
        if mine:
            if not wanted:  # the node no longer matches the DaemonSet's nodeSelector: its pod goes
                for key in mine:
                    pod = self.s.obj("pods", *key)
                    if pod is not None and not is_terminating(pod):
                        self.delete_pod(pod)
                self.s.dirty.status.add(("daemonsets", ns, ds_name))
            return
        if not wanted:
            return
        tolerations = template.get("spec", {}).get("tolerations") or []
        if not all(tolerates(tolerations, t) for t in blocking_taints(node)):
            return
        pod = self.pod_from_template(template, name=f"{ds_name}-{self.s.suffix()}", namespace=ns,
                                      labels={"controller-revision-hash": "6d4b9c8f7",
                                              "pod-template-generation": "1"},
                                      owner=ds, owner_rt=BY_PLURAL["daemonsets"], restart_policy="Always")
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                    "values": [node_name]}]}]}}}
        pod["spec"]["tolerations"] = pod["spec"]["tolerations"] + [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
        self.add_pod(pod, node_name)
        self.s.dirty.status.add(("daemonsets", ns, ds_name))

    def sync_owner_status(self, plural: str, ns: str, name: str) -> None:
        owner = self.s.obj(plural, ns, name)
        if owner is None:
            return
        if plural == "deployments":
            self.workloads.sync_deployment_status(owner)
            return
        status = dict(owner.get("status") or {})
        generation = owner["metadata"].get("generation", 1)
        # A DaemonSet's counts are the store's (``Store.active_by_owner``, ``Store.ds_desired``): a pass over
        # its pods, one on each node it selects, is what this status must not cost.
        pods = [] if plural == "daemonsets" else [p for p in self.owned_pods(owner["metadata"]["uid"]) if is_active(p)]
        if plural == "daemonsets":
            scheduled, ready = self.s.active_by_owner.get(owner["metadata"]["uid"], (0, 0))
            status.update({"currentNumberScheduled": scheduled, "desiredNumberScheduled": self.s.ds_desired[(ns, name)],
                           "numberMisscheduled": 0, "numberReady": ready, "numberAvailable": ready,
                           "updatedNumberScheduled": scheduled, "observedGeneration": generation})
        elif plural in ("replicasets", "statefulsets"):
            ready = sum(1 for p in pods if pod_ready(p))
            status.update({"replicas": len(pods), "readyReplicas": ready, "availableReplicas": ready,
                           "observedGeneration": generation})
            if plural == "replicasets":
                status["fullyLabeledReplicas"] = len(pods)
            else:
                revision = f"{owner['metadata']['name']}-{template_hash(owner['spec'].get('template') or {})}"
                status.update({"currentReplicas": len(pods), "updatedReplicas": len(pods),
                               "currentRevision": revision, "updateRevision": revision, "collisionCount": 0})
        elif plural == "jobs":
            status["active"] = len(pods)
            status["ready"] = sum(1 for p in pods if pod_ready(p))
            status.setdefault("uncountedTerminatedPods", {})
            if pods and "startTime" not in status:
                status["startTime"] = self.s.ts()
        elif plural == "pytorchjobs":
            counts: dict[str, Obj] = {}
            for rtype, _, _ in self.ranks(owner):
                counts.setdefault(rtype, {"active": 0})
            for p in pods:
                rtype = (p["metadata"].get("labels") or {}).get(KUBEFLOW_REPLICA_TYPE_LABEL, "").capitalize()
                if rtype in counts and pod_ready(p):
                    counts[rtype]["active"] += 1
            status["replicaStatuses"] = counts
            if pods and "startTime" not in status:
                status["startTime"] = self.s.ts()
            running = bool(pods) and all(pod_ready(p) for p in pods) and len(pods) == len(self.ranks(owner))
            status["conditions"] = self.ptj_conditions(status.get("conditions") or [], running)
        if status != owner.get("status"):
            self.s.put(BY_PLURAL[plural], {**owner, "status": status})

    def ptj_conditions(self, conds: list[Obj], running: bool) -> list[Obj]:
        now = self.s.ts()
        out = [c for c in conds if c.get("type") not in ("Running", "Restarting")]
        if not any(c.get("type") == "Created" for c in out):
            out.insert(0, {"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                           "message": "PyTorchJob is created.", "lastUpdateTime": now, "lastTransitionTime": now})
        prev = {c.get("type"): c for c in conds}
        kind = "Running" if running else "Restarting"
        keep = prev.get(kind)
        if keep is not None and keep.get("status") == "True":
            out.append(keep)
        else:
            reason = "PyTorchJobRunning" if running else "PyTorchJobRestarting"
            out.append({"type": kind, "status": "True", "reason": reason,
                        "message": f"PyTorchJob is {kind.lower()}.", "lastUpdateTime": now,
                        "lastTransitionTime": now})
        return out


REBOOT_ANNOTATION = "gpu-remediator.io/reboot-requested"


def reboots_host(pod: Obj) -> bool:
    """Whether a running pod can and does reboot its node: host PID namespace, a privileged container, and
    a command whose last word is ``reboot`` (``systemctl reboot``, ``nsenter ... reboot``)."""
    spec = pod.get("spec") or {}
    if not spec.get("hostPID"):
        return False
    for c in spec.get("containers") or []:
        privileged = bool((c.get("securityContext") or {}).get("privileged"))
        argv = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
        if privileged and argv and argv[-1].rsplit("/", 1)[-1] == "reboot":
            return True
    return False


FULL_POLL_S = 0.2  # how often Reboots.poll looks at the boot id of every attached GPU node


class Reboots:
    """Boot ids of the nodes, and the simulated reboots (see the module docstring). Lock held by the caller."""

    def __init__(self, store: Store, kubelets: Kubelets, *, down_s: float = 1.0) -> None:
        self.s = store
        self.kubelets = kubelets
        self.down_s = down_s
        self.annotation = REBOOT_ANNOTATION
        self._down: dict[str, tuple[str, datetime]] = {}      # node -> (new boot id, Ready again at)
        self._manual: dict[str, str] = {}                     # node without a GPU node -> its new boot id
        self._handled: dict[str, str] = {}                    # node -> annotation value last acted on
        self._reboot_pods: set[str] = set()                   # uids of pods that rebooted their node
        self._dirty: set[str] = set()                         # nodes whose node or pods changed since the scan
        self._full = True                                     # the first scan looks at every node
        self._rebooted: set[str] = set()                      # nodes rebooted here since the last poll
        self._polled_all_at = -1.0                            # time.monotonic() of the last full boot-id poll
        self.count: dict[str, int] = {}
        store.listeners.append(self._on_change)

    def _on_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        """A store listener: mark the node a changed node or pod belongs to for the next scan."""
        obj = new if new is not None else old
        if obj is None:
            return
        if rt.plural == "nodes":
            self._dirty.add(str(obj["metadata"]["name"]))
        elif rt.plural == "pods" and new is not None:
            node = (new.get("spec") or {}).get("nodeName")
            if node:
                self._dirty.add(str(node))

    def adopt(self, node_name: str) -> None:
        """At attach: the node reports its GPU node's boot id (no reboot implied)."""
        view = self.kubelets._views.get(node_name)
        boot = getattr(view, "boot_id", None)
        node = self.s.obj("nodes", "", node_name)
        if node is None or not boot:
            return
        status = node.get("status") or {}
        self.s.commit(BY_PLURAL["nodes"], {**node, "status": {**status, "nodeInfo": {
            **(status.get("nodeInfo") or {}), "bootID": boot}}}, "MODIFIED")

    def reboot(self, node_name: str) -> None:
        """Reboot ``node_name``: its attached GPU node when it has one, else the node alone (new boot id)."""
        view = self.kubelets._views.get(node_name)
        self._rebooted.add(node_name)
        if view is not None and hasattr(view, "reboot"):
            view.reboot()
        else:
            self._manual[node_name] = str(uuid.UUID(int=self.s.rng.getrandbits(128), version=4))

    def _boot_of(self, node_name: str) -> str | None:
        if node_name in self._manual:
            return self._manual[node_name]
        view = self.kubelets._views.get(node_name)
        boot = getattr(view, "boot_id", None)
        return str(boot) if boot else None

    def _requested(self) -> None:
        """The node-repair controller and the kubelets' reboot pods. Annotations and pods change only by a
        commit, so a scan looks at the nodes whose node or pods changed since the last one (``_on_change``),
        not at every node and pod on every API request."""
        if self._full:
            names, self._full = list(self.s.node_order), False
        else:
            names = sorted(self._dirty, key=natural_key)  # the order of node_order
        self._dirty.clear()
        for name in names:
            node = self.s.obj("nodes", "", name)
            if node is None:
                continue
            value = (node["metadata"].get("annotations") or {}).get(self.annotation) or ""
            if value and value != self._handled.get(name):
                self._handled[name] = value
                self.reboot(name)
            elif not value:
                self._handled.pop(name, None)
            for key in list(self.s.pods_by_node.get(name, {})):
                pod = self.s.obj("pods", *key)
                if pod is None or pod["metadata"]["uid"] in self._reboot_pods or is_terminal(pod):
                    continue
                if (pod.get("status") or {}).get("phase") == "Running" and reboots_host(pod):
                    self._reboot_pods.add(pod["metadata"]["uid"])
                    self.reboot(name)

    def poll(self) -> bool:
        """Act on reboot requests, then move each node whose boot id changed through NotReady to Ready with
        the new boot id. True when a node changed."""
        self._requested()
        now = self.s.clock()
        changed = False
        # The nodes going through a reboot, and every FULL_POLL_S the attached GPU nodes too: one may be
        # rebooted from outside, by its agent (a real kubelet reports a new boot id with its next status,
        # seconds later). A node without a GPU node changes its boot id only here (``reboot``), so it is
        # never looked at otherwise: an API request to a cluster of 100,000 nodes once cost a look at each
        # of them five times a second, which held every other request for a tenth of a second or more.
        due = set(self._down) | self._rebooted
        if time.monotonic() - self._polled_all_at >= FULL_POLL_S:
            self._polled_all_at = time.monotonic()
            due |= self.kubelets.attached_nodes()
        self._rebooted.clear()
        for name in sorted(due, key=natural_key):  # the order of node_order
            node = self.s.obj("nodes", "", name)
            boot = self._boot_of(name)
            if node is None or not boot:
                continue
            status = node.get("status") or {}
            reported = (status.get("nodeInfo") or {}).get("bootID")
            down = self._down.get(name)
            if down is None and boot != reported:
                self._down[name] = (boot, now + timedelta(seconds=self.down_s))
                self._set(node, ready=False, boot=None)
                self.count[name] = self.count.get(name, 0) + 1
                changed = True
            elif down is not None and now >= down[1]:
                del self._down[name]
                self._manual.pop(name, None)
                self._set(node, ready=True, boot=boot)
                changed = True
        return changed

    def _set(self, node: Obj, *, ready: bool, boot: str | None) -> None:
        status = dict(node.get("status") or {})
        ts = self.s.ts()
        conds = [dict(c) for c in status.get("conditions") or []]
        for c in conds:
            if c.get("type") == "Ready":
                c.update({"status": "True" if ready else "False",
                          "reason": "KubeletReady" if ready else "KubeletNotReady",
                          "message": "kubelet is posting ready status" if ready else "node is rebooting",
                          "lastTransitionTime": ts, "lastHeartbeatTime": ts})
        status["conditions"] = conds
        if boot is not None:
            status["nodeInfo"] = {**(status.get("nodeInfo") or {}), "bootID": boot}
        self.s.commit(BY_PLURAL["nodes"], {**node, "status": status}, "MODIFIED")
