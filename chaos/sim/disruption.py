"""The disruption controller and the eviction check: PodDisruptionBudget status, and whether the
pods/eviction subresource may take a pod.

Where it sits: beside the other controllers, on the ``Store``. It keeps its own index of PDBs by their
first selector term (a store listener), marks the PDBs a pod change touches, recomputes their status
(``disruptionsAllowed``, ``currentHealthy``, ``desiredHealthy``, ``expectedPods``, the
``DisruptionAllowed`` condition) when the controllers run, and answers the API verbs' eviction question
as kube-apiserver does: 429 with a ``DisruptionBudget`` cause when no disruption is left, 500 when more
than one PDB selects the pod. ``block`` pins ``disruptionsAllowed`` at 0 for a drill.
"""

from __future__ import annotations

from typing import Any

from chaos.sim.kube_select import LabelSelector, SelectorError
from chaos.sim.resources import BY_PLURAL, ApiError, Key, Obj, ResourceType, is_active, pod_ready
from chaos.sim.store import Store


class Disruption:
    """PodDisruptionBudgets over a ``Store`` (lock held by the caller in every method)."""

    def __init__(self, store: Store) -> None:
        self.s = store
        self._pdbs_by_label: dict[tuple[str, str], set[Key]] = {}
        self._pdbs_unindexed: set[Key] = set()
        self.blocked: set[Key] = set()
        store.listeners.append(self.on_change)

    def on_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        """Store listener: index PDBs; mark the PDBs whose pods changed."""
        if rt.plural == "poddisruptionbudgets":
            self._pdb_changed(old, new)
        elif rt.plural == "pods":
            for pod in (old, new):
                if pod is not None:
                    self.mark_pdbs_for(pod)

    def _pdb_changed(self, old: Obj | None, new: Obj | None) -> None:
        for pdb, add in ((old, False), (new, True)):
            if pdb is None:
                continue
            key = (pdb["metadata"]["namespace"], pdb["metadata"]["name"])
            try:
                terms = LabelSelector.from_api(pdb.get("spec", {}).get("selector")).equality_terms()
            except SelectorError:
                terms = []
            if add:
                if terms:
                    self._pdbs_by_label.setdefault(terms[0], set()).add(key)
                else:
                    self._pdbs_unindexed.add(key)
            else:
                if terms and terms[0] in self._pdbs_by_label:
                    self._pdbs_by_label[terms[0]].discard(key)
                self._pdbs_unindexed.discard(key)
        if new is not None and (old is None or old.get("spec") != new.get("spec")):
            self.s.dirty.pdbs.add((new["metadata"]["namespace"], new["metadata"]["name"]))

    def pdbs_for(self, pod: Obj) -> list[Obj]:
        """The PodDisruptionBudgets whose selector matches ``pod``."""
        ns = pod["metadata"]["namespace"]
        labels = pod["metadata"].get("labels") or {}
        candidates: set[Key] = set(self._pdbs_unindexed)
        for kv in labels.items():
            candidates |= self._pdbs_by_label.get(kv, set())
        found = []
        for key in sorted(candidates):
            if key[0] != ns:
                continue
            pdb = self.s.obj("poddisruptionbudgets", *key)
            if pdb is not None and LabelSelector.from_api(pdb.get("spec", {}).get("selector")).matches(labels):
                found.append(pdb)
        return found

    def mark_pdbs_for(self, pod: Obj) -> None:
        for pdb in self.pdbs_for(pod):
            self.s.dirty.pdbs.add((pdb["metadata"]["namespace"], pdb["metadata"]["name"]))

    # --- controllers (lock held) ----------------------------------------------------------------

    def pods_matching(self, ns: str, selector: LabelSelector) -> list[Obj]:
        terms = selector.equality_terms()
        keys = sorted(self.s.pods_by_label.get(terms[0], set())) if terms else self.s.sorted_keys("pods")
        out = []
        for key in keys:
            if key[0] != ns:
                continue
            pod = self.s.obj("pods", *key)
            if pod is not None and selector.matches(pod["metadata"].get("labels")):
                out.append(pod)
        return out

    def pdb_numbers(self, pdb: Obj) -> tuple[int, int, int, int]:
        """``(expected, current healthy, desired healthy, disruptions allowed)`` for a PDB right now."""
        key = (pdb["metadata"]["namespace"], pdb["metadata"]["name"])
        spec = pdb.get("spec", {})
        pods = [p for p in self.pods_matching(key[0], LabelSelector.from_api(spec.get("selector")))
                if is_active(p)]
        expected = len(pods)
        healthy = sum(1 for p in pods if pod_ready(p))

        def amount(v: Any) -> int:
            if isinstance(v, str) and v.endswith("%"):
                return -(-expected * int(v[:-1]) // 100)
            return int(v)

        if spec.get("minAvailable") is not None:
            desired = amount(spec["minAvailable"])
        elif spec.get("maxUnavailable") is not None:
            desired = max(0, expected - amount(spec["maxUnavailable"]))
        else:
            desired = expected
        allowed = 0 if key in self.blocked else max(0, healthy - desired)
        return expected, healthy, desired, allowed

    def sync_pdb(self, key: Key) -> None:
        pdb = self.s.obj("poddisruptionbudgets", *key)
        if pdb is None:
            return
        expected, healthy, desired, allowed = self.pdb_numbers(pdb)
        old = pdb.get("status") or {}
        old_cond = next((c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
        cond_status = "True" if allowed > 0 else "False"
        cond = old_cond if old_cond and old_cond.get("status") == cond_status else {
            "type": "DisruptionAllowed", "status": cond_status,
            "reason": "SufficientPods" if allowed > 0 else "InsufficientPods", "message": "",
            "lastTransitionTime": self.s.ts(), "observedGeneration": pdb["metadata"].get("generation", 1)}
        status = {"observedGeneration": pdb["metadata"].get("generation", 1), "disruptionsAllowed": allowed,
                  "currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
                  "conditions": [cond]}
        if status != old:
            self.s.put(BY_PLURAL["poddisruptionbudgets"], {**pdb, "status": status})

    # --- the API server's interface: stored (read-only) objects ----------------------------------

    def check_eviction(self, pod: Obj) -> None:
        """Raise the ``ApiError`` kube-apiserver answers an eviction of ``pod`` with, if a budget refuses it."""
        pdbs = self.pdbs_for(pod)
        if len(pdbs) > 1:
            raise ApiError(500, "This pod has more than one PodDisruptionBudget, which the eviction "
                                "subresource does not support.")
        if pdbs:
            pdb = pdbs[0]
            _, healthy, desired, allowed = self.pdb_numbers(pdb)
            if allowed <= 0:
                raise ApiError(429, "Cannot evict pod as it would violate the pod's disruption budget.",
                               details={"causes": [{
                                   "reason": "DisruptionBudget",
                                   "message": f"The disruption budget {pdb['metadata']['name']} needs "
                                              f"{desired} healthy pods and has {healthy} currently"}]})

    def block(self, key: Key, blocked: bool) -> None:
        """Make a PDB refuse every eviction (``disruptionsAllowed: 0``) or allow again; recomputes it."""
        if self.s.obj("poddisruptionbudgets", *key) is None:
            raise ApiError.not_found(BY_PLURAL["poddisruptionbudgets"], key[1])
        if blocked:
            self.blocked.add(key)
        else:
            self.blocked.discard(key)
        self.sync_pdb(key)

