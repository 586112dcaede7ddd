"""The simulated API server's storage: every object, the one resourceVersion counter, the watch history,
the indexes the controllers read, and the queue of work a change leaves for them.

Where it sits: under everything else in ``chaos.sim``. ``Store.commit`` is the only way an object changes:
it bumps the global resourceVersion, keeps the change in a bounded watch history (410 Gone past it),
updates the pod indexes (by node, label, owner; the pending set; the node order), marks what the
controllers owe (``Dirty``) and calls the registered listeners (the disruption controller's PDB index,
the kubelet's device manager) before it wakes watchers. Listeners index and mark work; they never commit.
The controllers, the scheduler and the API verbs read and write through a ``Store`` under its one lock.
"""

from __future__ import annotations

import bisect
import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from chaos.sim.resources import (
    CONTROLLED_TYPES,
    EAGER_KINDS,
    OWNER_PLURAL,
    REPLACING_KINDS,
    RESOURCES,
    SUFFIX_ALPHABET,
    ApiError,
    Key,
    Obj,
    ResourceType,
    StoredObject,
    WatchEvent,
    controller_ref,
    daemonset_selects,
    is_active,
    is_terminal,
    is_terminating,
    natural_key,
    node_open,
    pod_ready,
)

Listener = Callable[[ResourceType, Obj | None, Obj | None], None]


@dataclass
class Dirty:
    """Work the controllers owe after a change; drained by ``Controllers.reconcile``."""

    owners: set[tuple[str, str, str]] = field(default_factory=set)        # (plural, ns, name) lost pods
    status: set[tuple[str, str, str]] = field(default_factory=set)        # owners whose status may change
    ds_nodes: set[tuple[str, str, str]] = field(default_factory=set)      # (ns, daemonset, node)
    sched_new: list[Key] = field(default_factory=list)                    # newly pending pods
    sched_nodes: set[str] = field(default_factory=set)                    # nodes that gained room
    pdbs: set[Key] = field(default_factory=set)                           # PDBs to recompute
    noexecute: set[str] = field(default_factory=set)                      # nodes with new NoExecute taints
    restarted: set[tuple[str, str, str]] = field(default_factory=set)     # owners recreated this pass

    def empty(self) -> bool:
        return not (self.owners or self.ds_nodes or self.sched_new or self.sched_nodes or self.pdbs
                    or self.noexecute or self.status)


class Store:
    """Objects by resource and key under one ``RLock``; see the module docstring.

    ``clock`` and ``seed`` make a run reproducible: UIDs, name suffixes and container ids come from one
    seeded generator, timestamps from the injected clock.
    """

    def __init__(self, *, clock: Callable[[], datetime] | None = None, seed: int = 0, history: int = 50_000,
                 graceful_deletion: bool = False) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)    # watchers: the resourceVersion moved
        self.wakeup = threading.Condition(self.lock)     # wait_for: anything it may look at changed
        self.graceful = graceful_deletion
        self.terminating: dict[Key, datetime] = {}         # terminating pods -> when they go
        self.clock = clock or (lambda: datetime.now(UTC))
        self.rng = random.Random(seed)
        self.rv = 1000
        self.objects: dict[str, dict[Key, StoredObject]] = {rt.plural: {} for rt in RESOURCES}
        self.sorted: dict[str, list[Key] | None] = {rt.plural: None for rt in RESOURCES}
        self.pods_by_node: dict[str, dict[Key, None]] = {}
        self.pods_by_label: dict[tuple[str, str], set[Key]] = {}
        self.pods_by_owner: dict[str, dict[Key, None]] = {}
        self.active_by_owner: dict[str, list[int]] = {}  # owner uid -> [its active pods, of them Ready]
        self.ds_desired: dict[Key, int] = {}             # DaemonSet -> how many nodes its nodeSelector selects
        self.pending: dict[Key, None] = {}
        self.node_order: list[str] = []
        self.dirty = Dirty()
        self.listeners: list[Listener] = []
        self._ip_counter = 0
        self.history: list[WatchEvent] = []
        self.history_rvs: list[int] = []
        self._history_cap = history
        self.history_floor = self.rv

    # --- clock, identity ------------------------------------------------------------------------

    def ts(self) -> str:
        return self.clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def suffix(self, n: int = 5) -> str:
        return "".join(self.rng.choice(SUFFIX_ALPHABET) for _ in range(n))

    def next_ip(self) -> str:
        self._ip_counter += 1
        n = self._ip_counter
        return f"10.{64 + ((n >> 16) & 63)}.{(n >> 8) & 255}.{n & 255}"

    # --- storage primitives (lock held) ---------------------------------------------------------

    def entry(self, plural: str, namespace: str, name: str) -> StoredObject | None:
        return self.objects[plural].get((namespace, name))

    def obj(self, plural: str, namespace: str, name: str) -> Obj | None:
        e = self.objects[plural].get((namespace, name))
        return None if e is None else e.obj

    def sorted_keys(self, plural: str) -> list[Key]:
        keys = self.sorted[plural]
        if keys is None:
            keys = sorted(self.objects[plural])
            self.sorted[plural] = keys
        return keys

    def commit(self, rt: ResourceType, obj: Obj, etype: str) -> Obj:
        """Store (or remove, for DELETED) ``obj`` under a new resourceVersion and tell the controllers."""
        self.rv += 1
        meta = dict(obj["metadata"])
        meta["resourceVersion"] = str(self.rv)
        obj = {**obj, "metadata": meta}
        key: Key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
        store = self.objects[rt.plural]
        prev_entry = store.get(key)
        prev = prev_entry.obj if prev_entry is not None else None
        if etype == "DELETED":
            store.pop(key, None)
            self.sorted[rt.plural] = None
        else:
            store[key] = StoredObject(obj)
            if prev is None:
                self.sorted[rt.plural] = None
        self.record(WatchEvent(self.rv, etype, rt.plural, key[0], obj, prev))
        self._after_change(rt, prev, None if etype == "DELETED" else obj)
        self.changed.notify_all()
        self.wakeup.notify_all()
        return obj

    def record(self, ev: WatchEvent) -> None:
        self.history.append(ev)
        self.history_rvs.append(ev.rv)
        if len(self.history) > 2 * self._history_cap:
            cut = len(self.history) - self._history_cap
            self.history_floor = self.history_rvs[cut - 1]
            del self.history[:cut]
            del self.history_rvs[:cut]

    def put(self, rt: ResourceType, obj: Obj) -> Obj:
        meta = obj["metadata"]
        key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
        return self.commit(rt, obj, "MODIFIED" if key in self.objects[rt.plural] else "ADDED")

    def remove(self, rt: ResourceType, obj: Obj) -> Obj:
        meta = {**obj["metadata"], "deletionTimestamp": self.ts(), "deletionGracePeriodSeconds": 0}
        return self.commit(rt, {**obj, "metadata": meta}, "DELETED")

    def new_meta(self, name: str, namespace: str | None = None, **extra: Any) -> Obj:
        meta: Obj = {"name": name, "uid": self.uid(), "creationTimestamp": self.ts()}
        if namespace is not None:
            meta["namespace"] = namespace
        meta.update({k: v for k, v in extra.items() if v is not None})
        return meta

    # --- change hooks: index and mark work (lock held, never commit) ----------------------------

    def _after_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        if rt.plural == "pods":
            self._pod_changed(old, new)
        elif rt.plural == "nodes":
            self._node_changed(old, new)
        elif rt.plural in CONTROLLED_TYPES:
            if new is not None and (old is None or old.get("spec") != new.get("spec")):
                self.dirty.owners.add((rt.plural, new["metadata"]["namespace"], new["metadata"]["name"]))
            if rt.plural == "replicasets":
                self._replicaset_changed(old, new)
        elif rt.plural == "daemonsets":
            self._daemonset_changed(old, new)
        for listener in self.listeners:
            listener(rt, old, new)

    def _daemonset_changed(self, old: Obj | None, new: Obj | None) -> None:
        """A new DaemonSet, or one whose nodeSelector changed, looks at every node; from then on its desired
        count is kept as nodes change (``_node_changed``) and its pods' counts as they change
        (``active_by_owner``), so its status costs no pass over the nodes and pods: at 100,000 nodes that pass
        held every request for 0.35 s a DaemonSet whenever one of its pods changed."""
        ds = new if new is not None else old
        assert ds is not None
        key = (ds["metadata"]["namespace"], ds["metadata"]["name"])
        if new is None:
            self.ds_desired.pop(key, None)
            return
        if old is None or (old["spec"]["template"].get("spec", {}).get("nodeSelector")
                           != new["spec"]["template"].get("spec", {}).get("nodeSelector")):
            nodes = self.objects["nodes"]
            self.ds_desired[key] = sum(1 for name in self.node_order
                                       if daemonset_selects(new, nodes[("", name)].obj))
            self.dirty.status.add(("daemonsets", *key))
            for node in self.node_order:  # each node may gain or lose its pod
                self.dirty.ds_nodes.add((key[0], key[1], node))

    def _replicaset_changed(self, old: Obj | None, new: Obj | None) -> None:
        """A Deployment recreates a lost ReplicaSet and sums its ReplicaSets' status."""
        rs = new if new is not None else old
        assert rs is not None
        ref = controller_ref(rs)
        if not ref or ref.get("kind") != "Deployment":
            return
        key = ("deployments", rs["metadata"]["namespace"], str(ref["name"]))
        if new is None:
            self.dirty.owners.add(key)
        elif old is None or old.get("status") != new.get("status"):
            self.dirty.status.add(key)

    def _pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        if old is not None:
            self._unindex_pod(old)
        if new is not None:
            self._index_pod(new)
        else:
            assert old is not None
            self.terminating.pop((old["metadata"]["namespace"], old["metadata"]["name"]), None)
        for pod in (old, new):
            if pod is not None:
                ref = controller_ref(pod)
                if ref and ref.get("kind") in OWNER_PLURAL:
                    self.dirty.status.add((OWNER_PLURAL[ref["kind"]], pod["metadata"]["namespace"],
                                            ref["name"]))
        if new is None and old is not None:
            node = old.get("spec", {}).get("nodeName")
            if node:
                self.dirty.sched_nodes.add(node)
            ref = controller_ref(old)
            if ref and ref.get("kind") in REPLACING_KINDS:
                self.dirty.owners.add((OWNER_PLURAL[ref["kind"]], old["metadata"]["namespace"], ref["name"]))
            elif ref and ref.get("kind") == "DaemonSet" and node:
                self.dirty.ds_nodes.add((old["metadata"]["namespace"], ref["name"], node))
        elif new is not None and old is not None and is_terminating(new) and not is_terminating(old):
            ref = controller_ref(new)
            if ref and ref.get("kind") in EAGER_KINDS:
                self.dirty.owners.add((OWNER_PLURAL[ref["kind"]], new["metadata"]["namespace"], ref["name"]))
        if new is not None and not new.get("spec", {}).get("nodeName") and not is_terminal(new):
            key = (new["metadata"]["namespace"], new["metadata"]["name"])
            if key not in self.pending:
                self.pending[key] = None
                self.dirty.sched_new.append(key)

    def _index_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        node = pod.get("spec", {}).get("nodeName")
        if node:
            self.pods_by_node.setdefault(node, {})[key] = None
        for kv in (meta.get("labels") or {}).items():
            self.pods_by_label.setdefault(kv, set()).add(key)
        ref = controller_ref(pod)
        if ref is not None:
            self.pods_by_owner.setdefault(ref["uid"], {})[key] = None
            if is_active(pod):
                counts = self.active_by_owner.setdefault(ref["uid"], [0, 0])
                counts[0] += 1
                counts[1] += pod_ready(pod)

    def _unindex_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        node = pod.get("spec", {}).get("nodeName")
        if node and node in self.pods_by_node:
            self.pods_by_node[node].pop(key, None)
        for kv in (meta.get("labels") or {}).items():
            s = self.pods_by_label.get(kv)
            if s is not None:
                s.discard(key)
                if not s:
                    del self.pods_by_label[kv]
        ref = controller_ref(pod)
        if ref is not None and ref["uid"] in self.pods_by_owner:
            self.pods_by_owner[ref["uid"]].pop(key, None)
        if ref is not None and is_active(pod) and ref["uid"] in self.active_by_owner:
            counts = self.active_by_owner[ref["uid"]]
            counts[0] -= 1
            counts[1] -= pod_ready(pod)
            if counts == [0, 0]:
                del self.active_by_owner[ref["uid"]]
        self.pending.pop(key, None)

    def _node_changed(self, old: Obj | None, new: Obj | None) -> None:
        if old is None and new is not None:
            bisect.insort(self.node_order, new["metadata"]["name"], key=natural_key)
        elif new is None and old is not None and old["metadata"]["name"] in self.node_order:
            self.node_order.remove(old["metadata"]["name"])
        if old is None or new is None or old["metadata"].get("labels") != new["metadata"].get("labels"):
            for key, count in self.ds_desired.items():
                daemonset = self.objects["daemonsets"][key].obj
                delta = daemonset_selects(daemonset, new) - daemonset_selects(daemonset, old)
                if delta:
                    self.ds_desired[key] = count + delta
                    self.dirty.status.add(("daemonsets", *key))
        if new is None:
            return
        name = new["metadata"]["name"]
        changed = old is None or any(old.get(k) != new.get(k) for k in ("spec", "status")) or \
            old["metadata"].get("labels") != new["metadata"].get("labels")
        if changed and node_open(new):
            self.dirty.sched_nodes.add(name)
        if old is None or (old["metadata"].get("labels") != new["metadata"].get("labels")
                           or (old.get("spec") or {}).get("taints") != (new.get("spec") or {}).get("taints")):
            for ns, ds in self.objects["daemonsets"]:  # its nodeSelector or tolerations may (no longer) fit
                self.dirty.ds_nodes.add((ns, ds, name))
        old_noexec = {(t.get("key"), t.get("value"), t.get("effect"))
                      for t in (old or {}).get("spec", {}).get("taints") or [] if t.get("effect") == "NoExecute"}
        if any(t.get("effect") == "NoExecute" and (t.get("key"), t.get("value"), t.get("effect")) not in old_noexec
               for t in new.get("spec", {}).get("taints") or []):
            self.dirty.noexecute.add(name)

    # --- watch ----------------------------------------------------------------------------------

    def events_since(self, rv: int) -> list[WatchEvent]:
        """Every change after ``rv``; ``ApiError`` 410 when ``rv`` is older than the kept history."""
        with self.lock:
            if rv < self.history_floor:
                raise ApiError(410, f"too old resource version: {rv} ({self.history_floor})")
            i = bisect.bisect_right(self.history_rvs, rv)
            return self.history[i:]

    def wait_changed(self, rv: int, timeout: float) -> None:
        """Block until the resourceVersion passes ``rv`` or ``timeout`` seconds elapse."""
        with self.changed:
            if self.rv <= rv:
                self.changed.wait(timeout)

    def wake_watchers(self) -> None:
        """Wake every watcher and ``wait_for`` caller (the server does this when it stops)."""
        with self.lock:
            self.changed.notify_all()
            self.wakeup.notify_all()

