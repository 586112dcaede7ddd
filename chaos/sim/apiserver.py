"""The simulated API server's verbs: get, list, create, replace, patch, delete, deletecollection and the
pods/eviction subresource, with the validation, defaulting and refusals kube-apiserver applies.

Where it sits: between the HTTP front (``kube_api``, which kubectl and the official client talk to) and
the ``Store``. Each verb takes the store's lock, finishes due graceful deletions (``Controllers.tick``),
checks the request the way the real server does (404, 409 AlreadyExists or Conflict on a stale
``resourceVersion`` or failed precondition, 400/415/422 for bodies that do not fit), commits, and runs the
controllers before it returns, so the caller sees their effect. Lists are filtered by label and field
selectors (``kube_select``) and paginated with ``limit``/``continue``; patches are applied by
``kube_patch``. Returned objects are the stored ones and must not be modified.

Defaulting on create: a pod gets ``schedulerName``/``restartPolicy`` and is Pending, or, created with
``spec.nodeName``, is admitted by that node's kubelet (``kubelet``); Deployments, ReplicaSets and
StatefulSets get their spec validated and defaulted; status is dropped where it is a subresource.
Deletion: a pod goes through graceful deletion; dependents cascade (Background/Foreground) unless
``propagationPolicy`` is Orphan, which a batch/v1 Job defaults to, as the real API does; a node or a
namespace takes its pods with it at once. No finalizers.
"""

from __future__ import annotations

import base64
import bisect
import json
from typing import Any

from chaos.sim.controllers import Controllers
from chaos.sim.disruption import Disruption
from chaos.sim.kube_patch import STRATEGIC_MERGE_PATCH, PatchError, apply_patch
from chaos.sim.kube_select import FieldSelector, LabelSelector, SelectorError
from chaos.sim.kubelet import Kubelets
from chaos.sim.resources import (
    BY_PLURAL,
    CONTROLLED_TYPES,
    GENERATION_TYPES,
    RESOURCES,
    WORKLOAD_TYPES,
    ApiError,
    Key,
    ListResult,
    Obj,
    ResourceType,
    StoredObject,
    is_terminating,
)
from chaos.sim.store import Store


class ApiServer:
    """The verbs over a ``Store``; each takes the lock itself."""

    def __init__(self, store: Store, controllers: Controllers, kubelets: Kubelets, disruption: Disruption) -> None:
        self.s = store
        self.c = controllers
        self.kubelets = kubelets
        self.disruption = disruption

    def get(self, rt: ResourceType, namespace: str, name: str) -> StoredObject:
        """The stored object or ``ApiError`` 404."""
        with self.s.lock:
            self.c.tick()
            entry = self.s.entry(rt.plural, namespace if rt.namespaced else "", name)
            if entry is None:
                raise ApiError.not_found(rt, name)
            return entry

    def list_objects(self, rt: ResourceType, namespace: str | None, *, label_selector: str | None = None,
                 field_selector: str | None = None, limit: int = 0,
                 continue_token: str | None = None) -> ListResult:
        """List (one namespace or all), filtered by selectors, paginated by ``limit``/``continue``."""
        try:
            ls = LabelSelector.parse(label_selector)
            fs = FieldSelector.parse(rt.plural, field_selector)
        except SelectorError as exc:
            raise ApiError(400, str(exc)) from exc
        with self.s.lock:
            self.c.tick()
            start: Key | None = None
            if continue_token:
                try:
                    token = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                    start = (str(token["start"][0]), str(token["start"][1]))
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    raise ApiError(400, "continue key is not valid") from exc
            keys = self.candidate_keys(rt, namespace, ls, fs)
            if start is not None:
                keys = keys[bisect.bisect_right(keys, start):]
            entries: list[StoredObject] = []
            next_token = None
            remaining = None
            store = self.s.objects[rt.plural]
            for i, key in enumerate(keys):
                if namespace is not None and rt.namespaced and key[0] != namespace:
                    continue
                entry = store.get(key)
                if entry is None:
                    continue
                obj = entry.obj
                if ls.requirements and not ls.matches(obj["metadata"].get("labels")):
                    continue
                if fs.terms and not fs.matches(obj):
                    continue
                if limit and len(entries) == limit:
                    last = entries[-1].obj["metadata"]
                    next_token = base64.urlsafe_b64encode(json.dumps(
                        {"rv": self.s.rv, "start": [last.get("namespace", "") if rt.namespaced else "",
                                                   last["name"]]}).encode()).decode()
                    remaining = len(keys) - i
                    break
                entries.append(entry)
            return ListResult(entries, str(self.s.rv), next_token, remaining)

    def candidate_keys(self, rt: ResourceType, namespace: str | None, ls: LabelSelector,
                        fs: FieldSelector) -> list[Key]:
        if rt.plural == "pods":
            node = fs.equals("spec.nodeName")
            if node:
                return sorted(self.s.pods_by_node.get(node, {}))
            terms = ls.equality_terms()
            if terms:
                return sorted(self.s.pods_by_label.get(terms[0], set()))
        name = fs.equals("metadata.name")
        if name is not None:
            ns = (namespace or "") if rt.namespaced else ""
            if namespace is not None or not rt.namespaced:
                return [(ns, name)] if (ns, name) in self.s.objects[rt.plural] else []
        return self.s.sorted_keys(rt.plural)

    def create(self, rt: ResourceType, namespace: str | None, body: Any, *, dry_run: bool = False) -> Obj:
        """Create ``body``; 409 AlreadyExists, 400/422 for a body that does not fit the request."""
        obj = self.validate_body(rt, namespace, body)
        with self.s.lock:
            self.c.tick()
            meta = dict(obj.get("metadata") or {})
            ns = meta.get("namespace", "") if rt.namespaced else ""
            if rt.namespaced and self.s.obj("namespaces", "", ns) is None:
                raise ApiError.not_found(BY_PLURAL["namespaces"], ns)
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise ApiError(422, f"{rt.kind}.{rt.group or 'core'} is invalid: metadata.name: "
                                        "Required value: name or generateName is required")
                meta["name"] = f"{meta['generateName']}{self.s.suffix()}"
            if self.s.obj(rt.plural, ns, meta["name"]) is not None:
                raise ApiError.already_exists(rt, meta["name"])
            meta.update({"uid": self.s.uid(), "creationTimestamp": self.s.ts()})
            for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
                meta.pop(k, None)
            if rt.plural in GENERATION_TYPES:
                meta["generation"] = 1
            obj = {**obj, "apiVersion": rt.api_version, "kind": rt.kind, "metadata": meta}
            obj = self.defaults_on_create(rt, obj)
            if dry_run:
                return obj
            created = self.s.commit(rt, obj, "ADDED")
            self.c.reconcile()
            return self.s.obj(rt.plural, ns, meta["name"]) or created

    def defaults_on_create(self, rt: ResourceType, obj: Obj) -> Obj:
        if rt.plural == "pods":
            spec = dict(obj.get("spec") or {})
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("restartPolicy", "Always")
            node = spec.get("nodeName")
            obj = {**obj, "spec": spec, "status": {"phase": "Pending", "qosClass": "BestEffort"}}
            if node:
                obj = self.kubelets.admit(obj, node)
        elif rt.plural == "namespaces":
            obj = {**obj, "spec": obj.get("spec") or {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
        elif rt.plural in WORKLOAD_TYPES:
            obj = {k: v for k, v in obj.items() if k != "status"}
            obj["spec"] = self.workload_spec(rt, obj["metadata"]["name"], obj.get("spec"))
        elif "status" in rt.subresources and rt.plural != "nodes":
            obj = {k: v for k, v in obj.items() if k != "status"}
        if rt.plural == "devicetaintrules":
            obj = {**obj, "spec": self.device_taint_rule_spec(obj["metadata"]["name"], obj.get("spec"))}
        return obj

    def device_taint_rule_spec(self, name: str, spec: Any) -> Obj:
        """A DeviceTaintRule spec validated as resource.k8s.io validates it (422) and ``taint.timeAdded``
        defaulted to now."""
        def invalid(field_path: str, why: str) -> ApiError:
            return ApiError(422, f'DeviceTaintRule.resource.k8s.io "{name}" is invalid: {field_path}: {why}',
                            details={"name": name, "group": "resource.k8s.io", "kind": "DeviceTaintRule",
                                     "causes": [{"reason": "FieldValueInvalid", "message": why,
                                                 "field": field_path}]})

        if not isinstance(spec, dict) or not isinstance(spec.get("taint"), dict):
            raise invalid("spec.taint", "Required value")
        taint = dict(spec["taint"])
        if not taint.get("key"):
            raise invalid("spec.taint.key", "Required value")
        if taint.get("effect") not in ("None", "NoSchedule", "NoExecute"):
            raise invalid("spec.taint.effect", f'Unsupported value: "{taint.get("effect")}": supported values: '
                                               '"NoExecute", "NoSchedule", "None"')
        selector = spec.get("deviceSelector")
        if selector is not None and (not isinstance(selector, dict)
                                     or set(selector) - {"driver", "pool", "device"}):
            raise invalid("spec.deviceSelector", "Invalid value: only driver, pool and device may be set")
        taint.setdefault("timeAdded", self.s.ts())
        return {**spec, "taint": taint}

    @staticmethod
    def workload_spec(rt: ResourceType, name: str, spec: Any) -> Obj:
        """A Deployment/ReplicaSet/StatefulSet spec validated (422 as the API server words it) and defaulted."""
        def invalid(field_path: str, why: str) -> ApiError:
            return ApiError(422, f'{rt.kind}.{rt.group} "{name}" is invalid: {field_path}: {why}',
                            details={"name": name, "group": rt.group, "kind": rt.kind,
                                     "causes": [{"reason": "FieldValueInvalid", "message": why,
                                                 "field": field_path}]})

        if not isinstance(spec, dict):
            raise invalid("spec", "Required value")
        selector = spec.get("selector")
        if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
            raise invalid("spec.selector", "Required value")
        template = spec.get("template")
        if not isinstance(template, dict) or not isinstance(template.get("spec"), dict) or \
                not template["spec"].get("containers"):
            raise invalid("spec.template.spec.containers", "Required value")
        tlabels = (template.get("metadata") or {}).get("labels") or {}
        try:
            matches = LabelSelector.from_api(selector).matches(tlabels)
        except SelectorError as exc:
            raise invalid("spec.selector", str(exc)) from exc
        if not matches:
            raise invalid("spec.template.metadata.labels", f"Invalid value: {json.dumps(tlabels)}: `selector` "
                                                           "does not match template `labels`")
        replicas = spec.get("replicas", 1)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid("spec.replicas", f"Invalid value: {replicas!r}: must be greater than or equal to 0")
        out = {**spec, "replicas": replicas}
        out.setdefault("revisionHistoryLimit", 10)
        if rt.plural == "deployments":
            out.setdefault("strategy", {"type": "RollingUpdate",
                                        "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
            out.setdefault("progressDeadlineSeconds", 600)
        elif rt.plural == "statefulsets":
            out.setdefault("podManagementPolicy", "OrderedReady")
            out.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
            out.setdefault("persistentVolumeClaimRetentionPolicy", {"whenDeleted": "Retain", "whenScaled": "Retain"})
        if rt.plural == "replicasets":
            out.pop("revisionHistoryLimit")
        return out

    def validate_body(self, rt: ResourceType, namespace: str | None, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if body.get("kind") not in (None, rt.kind) or body.get("apiVersion") not in (None, rt.api_version):
            raise ApiError(400, f"the API version in the data ({body.get('apiVersion')}) does not match the "
                                f"expected API version ({rt.api_version}) or kind {body.get('kind')} is not "
                                f"{rt.kind}")
        meta = body.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise ApiError(400, "metadata must be an object")
        meta = dict(meta or {})
        if rt.namespaced:
            if namespace is None:
                raise ApiError(405, f"{rt.plural} are namespaced: use /namespaces/<ns>/{rt.plural}")
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(400, "the namespace of the provided object does not match the namespace sent "
                                    "on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return {**body, "metadata": meta}

    def replace(self, rt: ResourceType, namespace: str | None, name: str, body: Any, *,
                    subresource: str | None = None, dry_run: bool = False) -> Obj:
        """PUT: 409 Conflict when ``metadata.resourceVersion`` is set and stale."""
        obj = self.validate_body(rt, namespace, body)
        ns = (namespace or "") if rt.namespaced else ""
        with self.s.lock:
            self.c.tick()
            current = self.s.obj(rt.plural, ns, name)
            if current is None:
                raise ApiError.not_found(rt, name)
            if obj["metadata"].get("name") not in (None, name):
                raise ApiError(400, "the name of the object does not match the name on the URL")
            rv = obj["metadata"].get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise ApiError.conflict(rt, name, "the object has been modified; please apply your changes to "
                                                  "the latest version and try again")
            return self.write(rt, current, {**obj, "apiVersion": rt.api_version, "kind": rt.kind},
                               subresource, dry_run)

    def patch(self, rt: ResourceType, namespace: str | None, name: str, body: bytes | Any,
                  content_type: str, *, subresource: str | None = None, dry_run: bool = False) -> Obj:
        """PATCH with merge, strategic-merge (built-in types only) or JSON patch."""
        media = content_type.split(";")[0].strip().lower()
        if media == STRATEGIC_MERGE_PATCH and rt.group == "kubeflow.org":
            raise ApiError(415, "the body of the request was in an unknown format - accepted media types "
                                "include: application/json-patch+json, application/merge-patch+json, "
                                "application/apply-patch+yaml")
        ns = (namespace or "") if rt.namespaced else ""
        with self.s.lock:
            self.c.tick()
            current = self.s.obj(rt.plural, ns, name)
            if current is None:
                raise ApiError.not_found(rt, name)
            try:
                patched = apply_patch(current, body, media)
            except PatchError as exc:
                raise ApiError(exc.code, str(exc)) from exc
            meta = patched.get("metadata")
            if not isinstance(meta, dict):
                raise ApiError(422, "metadata must be an object")
            rv = meta.get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise ApiError.conflict(rt, name, "the object has been modified; please apply your changes to "
                                                  "the latest version and try again")
            return self.write(rt, current, patched, subresource, dry_run)

    def write(self, rt: ResourceType, current: Obj, new: Obj, subresource: str | None, dry_run: bool) -> Obj:
        """Commit an update of ``current`` to ``new``, keeping what a client cannot change."""
        keep = ("name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp",
                "deletionGracePeriodSeconds")
        cmeta = current["metadata"]
        if subresource == "status":
            new = {**current, "status": new.get("status")}
        else:
            meta = {k: v for k, v in (new.get("metadata") or {}).items() if k not in keep}
            meta.update({k: cmeta[k] for k in keep if k in cmeta})
            new = {**new, "apiVersion": rt.api_version, "kind": rt.kind, "metadata": meta}
            if "status" in rt.subresources:
                new = {**new, "status": current.get("status")} if "status" in current else \
                    {k: v for k, v in new.items() if k != "status"}
            if rt.plural == "devicetaintrules":
                spec = dict(new.get("spec") or {})
                old_taint = (current.get("spec") or {}).get("taint") or {}
                taint = dict(spec.get("taint") or {}) if isinstance(spec.get("taint"), dict) else spec.get("taint")
                if isinstance(taint, dict) and taint.get("effect") != old_taint.get("effect") and \
                        taint.get("timeAdded") in (None, old_taint.get("timeAdded")):
                    taint["timeAdded"] = self.s.ts()  # the effect changed: the eviction clock starts again
                new = {**new, "spec": self.device_taint_rule_spec(cmeta["name"], {**spec, "taint": taint})}
            if rt.plural in GENERATION_TYPES and new.get("spec") != current.get("spec"):
                meta["generation"] = int(cmeta.get("generation", 1)) + 1
        if new.get("status") is None:
            new = {k: v for k, v in new.items() if k != "status"}
        if dry_run:
            return new
        committed = self.s.commit(rt, new, "MODIFIED")
        self.c.reconcile()
        key = (cmeta.get("namespace", "") if rt.namespaced else "", cmeta["name"])
        latest = self.s.objects[rt.plural].get(key)
        return committed if latest is None else latest.obj

    def delete(self, rt: ResourceType, namespace: str | None, name: str, *, propagation: str | None = None,
                   precondition_uid: str | None = None, precondition_rv: str | None = None,
                   grace_period: int | None = None, dry_run: bool = False) -> Obj:
        """Delete (a pod gracefully when ``graceful_deletion`` is on); dependents cascade unless
        ``propagation`` is Orphan (batch/v1 Job default). Returns the object as deleted, or as now
        terminating."""
        ns = (namespace or "") if rt.namespaced else ""
        with self.s.lock:
            self.c.tick()
            current = self.s.obj(rt.plural, ns, name)
            if current is None:
                raise ApiError.not_found(rt, name)
            self.check_preconditions(rt, current, precondition_uid, precondition_rv)
            if dry_run:
                return current
            deleted = self.delete_now(rt, current, propagation, grace_period)
            self.c.reconcile()
            return deleted

    @staticmethod
    def check_preconditions(rt: ResourceType, current: Obj, uid: str | None, rv: str | None) -> None:
        name = current["metadata"]["name"]
        if uid and uid != current["metadata"]["uid"]:
            raise ApiError.conflict(rt, name, f"Precondition failed: UID in precondition: {uid}, "
                                              f"UID in object meta: {current['metadata']['uid']}")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise ApiError.conflict(rt, name, "Precondition failed: ResourceVersion in precondition: "
                                              f"{rv}, ResourceVersion in object meta: "
                                              f"{current['metadata']['resourceVersion']}")

    def delete_now(self, rt: ResourceType, obj: Obj, propagation: str | None,
                    grace_period: int | None = None) -> Obj:
        if rt.plural == "pods":
            return self.c.delete_pod(obj, grace_period)
        if propagation is None:
            propagation = "Orphan" if rt.plural == "jobs" else "Background"
        deleted = self.s.remove(rt, obj)
        uid = obj["metadata"]["uid"]
        if rt.plural in CONTROLLED_TYPES or rt.plural == "daemonsets":
            dependents = [(BY_PLURAL["pods"], p) for p in self.c.owned_pods(uid)]
            if rt.plural == "deployments":
                dependents = [(BY_PLURAL["replicasets"], rs) for rs in self.c.workloads.owned_replicasets(uid)]
            for dep_rt, dep in dependents:
                if propagation == "Orphan":
                    refs = [r for r in dep["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
                    meta = {k: v for k, v in dep["metadata"].items() if k != "ownerReferences"}
                    if refs:
                        meta["ownerReferences"] = refs
                    self.s.put(dep_rt, {**dep, "metadata": meta})
                elif dep_rt.plural == "pods":
                    if not is_terminating(dep):
                        self.c.delete_pod(dep)
                else:
                    self.delete_now(dep_rt, dep, propagation)
        elif rt.plural == "nodes":
            for key in list(self.s.pods_by_node.get(obj["metadata"]["name"], {})):
                bound = self.s.obj("pods", *key)
                if bound is not None:
                    self.s.remove(BY_PLURAL["pods"], bound)
            # the garbage collector: the node's ResourceSlices are owned by it (DRA)
            for key in self.s.sorted_keys("resourceslices"):
                rs = self.s.obj("resourceslices", *key)
                if rs is not None and any(r.get("uid") == uid for r in rs["metadata"].get("ownerReferences") or []):
                    self.s.remove(BY_PLURAL["resourceslices"], rs)
        elif rt.plural == "namespaces":
            for other in RESOURCES:
                if other.namespaced:
                    for key in [k for k in self.s.sorted_keys(other.plural) if k[0] == obj["metadata"]["name"]]:
                        child = self.s.obj(other.plural, *key)
                        if child is not None:
                            self.s.remove(other, child)
        return deleted

    def delete_collection(self, rt: ResourceType, namespace: str | None, *, label_selector: str | None = None,
                              field_selector: str | None = None, propagation: str | None = None,
                              grace_period: int | None = None, dry_run: bool = False) -> list[Obj]:
        """Delete every match in one controller pass (so a gang restart counts once)."""
        with self.s.lock:
            found = self.list_objects(rt, namespace, label_selector=label_selector, field_selector=field_selector)
            objs = [e.obj for e in found.entries]
            if dry_run:
                return objs
            deleted = [self.delete_now(rt, o, propagation, grace_period) for o in objs
                       if self.s.obj(rt.plural, o["metadata"].get("namespace", "") if rt.namespaced else "",
                                    o["metadata"]["name"]) is not None]
            self.c.reconcile()
            return deleted

    def evict(self, namespace: str, name: str, body: Any = None, *, dry_run: bool = False) -> None:
        """The pods/eviction subresource: 409 when ``deleteOptions.preconditions`` (uid, resourceVersion)
        do not match the pod, 429 when a PodDisruptionBudget has no disruption left; then the pod is deleted
        (gracefully when ``graceful_deletion`` is on, with ``deleteOptions.gracePeriodSeconds`` if given).
        A pod already terminating is deleted again without a PodDisruptionBudget check."""
        pods = BY_PLURAL["pods"]
        options: Obj = {}
        if body is not None:
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be an Eviction object")
            bname = (body.get("metadata") or {}).get("name")
            if bname not in (None, name):
                raise ApiError(400, "name in URL does not match name in Eviction object")
            raw_options = body.get("deleteOptions")
            if raw_options is not None and not isinstance(raw_options, dict):
                raise ApiError(400, "deleteOptions must be an object")
            options = raw_options or {}
        pre = options.get("preconditions") or {}
        grace = options.get("gracePeriodSeconds")
        if not isinstance(pre, dict) or (grace is not None and not isinstance(grace, int)):
            raise ApiError(400, "deleteOptions.preconditions must be an object and gracePeriodSeconds an integer")
        with self.s.lock:
            self.c.tick()
            pod = self.s.obj("pods", namespace, name)
            if pod is None:
                raise ApiError.not_found(pods, name)
            self.check_preconditions(pods, pod, pre.get("uid"), pre.get("resourceVersion"))
            phase = pod.get("status", {}).get("phase")
            if phase == "Running" and not is_terminating(pod):
                self.disruption.check_eviction(pod)
            if dry_run:
                return
            self.c.delete_pod(pod, grace)
            self.c.reconcile()
