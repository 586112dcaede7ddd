"""``kubectl get``'s view of the simulated cluster: ``meta.k8s.io/v1`` Tables with kubectl's usual columns.

Where it sits: used by the HTTP front (``kube_api``) when a request's ``Accept`` asks for ``as=Table``, as
``kubectl get`` does: nodes, pods, PDBs, DaemonSets, Deployments, ReplicaSets, StatefulSets, Jobs,
PyTorchJobs, leases, events, ResourceSlices and ResourceClaims get their printer columns; any other type
(DeviceTaintRules, DeviceClasses, ResourceClaimTemplates among them) gets name and age.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from chaos.sim.resources import Obj, ResourceType


def human_duration(seconds: float) -> str:
    """kubectl's ``HumanDuration``: ``45s``, ``5m30s``, ``3h``, ``2d4h``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(obj: Obj, now: datetime) -> str:
    ts = obj["metadata"].get("creationTimestamp")
    if not ts:
        return "<unknown>"
    created = datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
    return human_duration((now - created).total_seconds())


Column = tuple[str, str, int]  # name, type, priority
Cells = Callable[[Obj, datetime], list[Any]]


def _node_cells(o: Obj, now: datetime) -> list[Any]:
    st = o.get("status", {})
    ready = next((c.get("status") for c in st.get("conditions", []) if c.get("type") == "Ready"), None)
    status = {"True": "Ready", "False": "NotReady"}.get(str(ready), "Unknown")
    if o.get("spec", {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    labels = o["metadata"].get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    addr = {a.get("type"): a.get("address") for a in st.get("addresses", [])}
    info = st.get("nodeInfo", {})
    return [o["metadata"]["name"], status, ",".join(roles) or "<none>", _age(o, now), info.get("kubeletVersion", ""),
            addr.get("InternalIP", "<none>"), addr.get("ExternalIP", "<none>"), info.get("osImage", "<unknown>"),
            info.get("kernelVersion", "<unknown>"), info.get("containerRuntimeVersion", "<unknown>")]


def _pod_cells(o: Obj, now: datetime) -> list[Any]:
    st = o.get("status", {})
    cs = st.get("containerStatuses") or []
    total = len(o.get("spec", {}).get("containers", []))
    ready = sum(1 for c in cs if c.get("ready"))
    status = st.get("reason") or st.get("phase") or "Unknown"
    if o["metadata"].get("deletionTimestamp"):
        status = "Terminating"
    return [o["metadata"]["name"], f"{ready}/{total}", status, sum(int(c.get("restartCount", 0)) for c in cs),
            _age(o, now), st.get("podIP") or "<none>", o.get("spec", {}).get("nodeName") or "<none>", "<none>",
            "<none>"]


def _pdb_cells(o: Obj, now: datetime) -> list[Any]:
    spec = o.get("spec", {})
    return [o["metadata"]["name"], str(spec.get("minAvailable", "N/A")), str(spec.get("maxUnavailable", "N/A")),
            int(o.get("status", {}).get("disruptionsAllowed", 0)), _age(o, now)]


def _ds_cells(o: Obj, now: datetime) -> list[Any]:
    st = o.get("status", {})
    tmpl = o.get("spec", {}).get("template", {}).get("spec", {})
    sel = ",".join(f"{k}={v}" for k, v in (tmpl.get("nodeSelector") or {}).items()) or "<none>"
    containers = tmpl.get("containers", [])
    match = o.get("spec", {}).get("selector", {}).get("matchLabels") or {}
    return [o["metadata"]["name"], st.get("desiredNumberScheduled", 0), st.get("currentNumberScheduled", 0),
            st.get("numberReady", 0), st.get("updatedNumberScheduled", 0), st.get("numberAvailable", 0), sel,
            _age(o, now), ",".join(c.get("name", "") for c in containers),
            ",".join(c.get("image", "") for c in containers), ",".join(f"{k}={v}" for k, v in match.items())]


def _containers(o: Obj) -> tuple[str, str]:
    containers = o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    return ",".join(c.get("name", "") for c in containers), ",".join(c.get("image", "") for c in containers)


def _selector_text(o: Obj) -> str:
    selector = o.get("spec", {}).get("selector") or {}
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or []:
        parts.append(f"{e.get('key')} {str(e.get('operator', '')).lower()} ({','.join(e.get('values') or [])})")
    return ",".join(parts) or "<none>"


def _deploy_cells(o: Obj, now: datetime) -> list[Any]:
    st = o.get("status", {})
    names, images = _containers(o)
    return [o["metadata"]["name"], f"{st.get('readyReplicas', 0)}/{o.get('spec', {}).get('replicas', 1)}",
            st.get("updatedReplicas", 0), st.get("availableReplicas", 0), _age(o, now), names, images,
            _selector_text(o)]


def _rs_cells(o: Obj, now: datetime) -> list[Any]:
    st = o.get("status", {})
    names, images = _containers(o)
    return [o["metadata"]["name"], o.get("spec", {}).get("replicas", 1), st.get("replicas", 0),
            st.get("readyReplicas", 0), _age(o, now), names, images, _selector_text(o)]


def _sts_cells(o: Obj, now: datetime) -> list[Any]:
    st = o.get("status", {})
    names, images = _containers(o)
    return [o["metadata"]["name"], f"{st.get('readyReplicas', 0)}/{o.get('spec', {}).get('replicas', 1)}",
            _age(o, now), names, images]


def _job_cells(o: Obj, now: datetime) -> list[Any]:
    st = o.get("status", {})
    conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    status = "Complete" if conds.get("Complete") == "True" else "Failed" if conds.get("Failed") == "True" \
        else "Suspended" if o.get("spec", {}).get("suspend") else "Running"
    completions = o.get("spec", {}).get("completions", 1)
    duration = "0s"
    if st.get("startTime"):
        started = datetime.fromisoformat(str(st["startTime"]).replace("Z", "+00:00"))
        duration = human_duration((now - started).total_seconds())
    return [o["metadata"]["name"], status, f"{st.get('succeeded', 0)}/{completions}", duration, _age(o, now)]


def _ptj_cells(o: Obj, now: datetime) -> list[Any]:
    conds = o.get("status", {}).get("conditions") or []
    return [o["metadata"]["name"], conds[-1].get("type", "") if conds else "", _age(o, now)]


def _lease_cells(o: Obj, now: datetime) -> list[Any]:
    return [o["metadata"]["name"], o.get("spec", {}).get("holderIdentity") or "", _age(o, now)]


def _event_cells(o: Obj, now: datetime) -> list[Any]:
    inv = o.get("involvedObject") or {}
    return [o["metadata"]["name"], o.get("type", ""), o.get("reason", ""),
            f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}", o.get("message", ""), _age(o, now)]


def _slice_cells(o: Obj, now: datetime) -> list[Any]:
    spec = o.get("spec", {})
    return [o["metadata"]["name"], spec.get("nodeName") or "", spec.get("driver", ""),
            (spec.get("pool") or {}).get("name", ""), _age(o, now)]


def _claim_cells(o: Obj, now: datetime) -> list[Any]:
    st = o.get("status", {})
    state = ",".join(s for s, on in (("allocated", st.get("allocation")), ("reserved", st.get("reservedFor")))
                     if on) or "pending"
    return [o["metadata"]["name"], state, _age(o, now)]


def _generic_cells(o: Obj, now: datetime) -> list[Any]:
    return [o["metadata"]["name"], _age(o, now)]


_TABLES: dict[str, tuple[list[Column], Cells]] = {
    "nodes": ([("Name", "string", 0), ("Status", "string", 0), ("Roles", "string", 0), ("Age", "string", 0),
               ("Version", "string", 0), ("Internal-IP", "string", 1), ("External-IP", "string", 1),
               ("OS-Image", "string", 1), ("Kernel-Version", "string", 1), ("Container-Runtime", "string", 1)],
              _node_cells),
    "pods": ([("Name", "string", 0), ("Ready", "string", 0), ("Status", "string", 0), ("Restarts", "integer", 0),
              ("Age", "string", 0), ("IP", "string", 1), ("Node", "string", 1), ("Nominated Node", "string", 1),
              ("Readiness Gates", "string", 1)], _pod_cells),
    "poddisruptionbudgets": ([("Name", "string", 0), ("Min Available", "string", 0),
                              ("Max Unavailable", "string", 0), ("Allowed Disruptions", "integer", 0),
                              ("Age", "string", 0)], _pdb_cells),
    "daemonsets": ([("Name", "string", 0), ("Desired", "integer", 0), ("Current", "integer", 0),
                    ("Ready", "integer", 0), ("Up-to-date", "integer", 0), ("Available", "integer", 0),
                    ("Node Selector", "string", 0), ("Age", "string", 0), ("Containers", "string", 1),
                    ("Images", "string", 1), ("Selector", "string", 1)], _ds_cells),
    "deployments": ([("Name", "string", 0), ("Ready", "string", 0), ("Up-to-date", "integer", 0),
                     ("Available", "integer", 0), ("Age", "string", 0), ("Containers", "string", 1),
                     ("Images", "string", 1), ("Selector", "string", 1)], _deploy_cells),
    "replicasets": ([("Name", "string", 0), ("Desired", "integer", 0), ("Current", "integer", 0),
                     ("Ready", "integer", 0), ("Age", "string", 0), ("Containers", "string", 1),
                     ("Images", "string", 1), ("Selector", "string", 1)], _rs_cells),
    "statefulsets": ([("Name", "string", 0), ("Ready", "string", 0), ("Age", "string", 0),
                      ("Containers", "string", 1), ("Images", "string", 1)], _sts_cells),
    "jobs": ([("Name", "string", 0), ("Status", "string", 0), ("Completions", "string", 0),
              ("Duration", "string", 0), ("Age", "string", 0)], _job_cells),
    "pytorchjobs": ([("Name", "string", 0), ("State", "string", 0), ("Age", "string", 0)], _ptj_cells),
    "leases": ([("Name", "string", 0), ("Holder", "string", 0), ("Age", "string", 0)], _lease_cells),
    "events": ([("Name", "string", 0), ("Type", "string", 0), ("Reason", "string", 0), ("Object", "string", 0),
                ("Message", "string", 0), ("Age", "string", 0)], _event_cells),
    "resourceslices": ([("Name", "string", 0), ("Node", "string", 0), ("Driver", "string", 0),
                        ("Pool", "string", 0), ("Age", "string", 0)], _slice_cells),
    "resourceclaims": ([("Name", "string", 0), ("State", "string", 0), ("Age", "string", 0)], _claim_cells),
}


def table(rt: ResourceType, objs: list[Obj], now: datetime, *, resource_version: str,
          continue_token: str | None = None, include_object: str = "Metadata") -> Obj:
    """A ``meta.k8s.io/v1`` Table of ``objs`` with kubectl's columns for ``rt``."""
    columns, cells = _TABLES.get(rt.plural, ([("Name", "string", 0), ("Age", "string", 0)], _generic_cells))
    defs = [{"name": n, "type": t, "format": "name" if n == "Name" else "", "description": n, "priority": p}
            for n, t, p in columns]
    rows = []
    for o in objs:
        row: Obj = {"cells": cells(o, now)}
        if include_object == "Object":
            row["object"] = o
        elif include_object != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": o["metadata"]}
        rows.append(row)
    meta: Obj = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": defs,
            "rows": rows}


