"""Dynamic Resource Allocation in the simulated cluster: NVIDIA's DRA driver's ResourceSlices, the
resourceclaim controller, the scheduler's claim allocation honouring device taints, and the device-taint
eviction controller.

Where it sits: beside the scheduler (``scheduler``), which asks it whether a pod's claims fit a node and has
it allocate them when it binds; the kubelet (``kubelet``) reads the allocation back to hand out GPU indices
and to report it in the PodResources ``dynamic_resources`` shape. The types are served at
``resource.k8s.io`` (``resources.RESOURCES``: ResourceSlice, ResourceClaim, ResourceClaimTemplate and
DeviceClass at v1, DeviceTaintRule at v1beta2), so kubectl and the service's adapter see what they would
see on a cluster running the driver.

What it does, as Kubernetes does it:

- ``publish(node)``: the driver's kubelet plugin publishes one ResourceSlice per node, driver
  ``gpu.nvidia.com``, pool = the node's name, devices ``gpu-<minor>`` with the attributes the driver sets
  (``type``, ``uuid``, ``productName``, ``brand``, ``architecture``, ``driverVersion``, ``pcieBusID`` …,
  plus ``index``/``minor`` as earlier driver releases set them) and ``memory`` capacity. UUIDs are those of
  the simulated GPU node once one is attached (``ClusterState.attach_gpu_node``). A slice is owned by its
  Node and goes with it (``ApiServer.delete_now``).
- The resourceclaim controller: a pod naming a ``resourceClaimTemplateName`` gets a ResourceClaim
  ``<pod>-<claim>-<5 chars>`` owned by the pod (annotation ``resource.kubernetes.io/pod-claim-name``) and
  listed in ``pod.status.resourceClaimStatuses``; it goes with the pod (garbage collection), and a claim no
  pod reserves any more is deallocated.
- Allocation (the scheduler's DynamicResources plugin): an ``ExactCount`` request of a DeviceClass takes
  the lowest-named free devices of the class's driver on the node; a device is free when no claim has it
  allocated and it carries no taint with effect ``NoSchedule`` or ``NoExecute`` that the request does not
  tolerate. A device's taints are its own (``spec.devices[].taints``) and those of every DeviceTaintRule
  whose ``deviceSelector`` (driver, pool, device; all set ones must match) selects it. The result goes to
  ``claim.status.allocation`` (``devices.results[]`` with request, driver, pool, device; ``nodeSelector``
  pinning the node) and ``status.reservedFor``.
- The device-taint eviction controller: a ``NoExecute`` taint on an allocated device deletes the pods
  reserving the claim unless the request tolerates it (``tolerationSeconds`` is not modelled: they go at
  once, gracefully when graceful deletion is on). ``None`` effects are ignored by both.

Deliberate simplifications: a DeviceClass's CEL selector is not evaluated; the class selects the devices of
the driver its expression names (``device.driver == '<driver>'``). Only ``exactly`` requests with
``ExactCount`` (or ``All``) are served; ``firstAvailable``, admin access, partitionable devices and
DeviceTaintRule ``status`` conditions are not modelled; a pod created with ``spec.nodeName`` (past the
scheduler) whose claims are not allocated starts without devices, where a real kubelet would hold it back.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from chaos.sim.resources import BY_PLURAL, Obj, ResourceType, natural_key, tolerates
from chaos.sim.store import Store

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
CDI_VENDOR = "k8s.gpu.nvidia.com"
EFFECTS_THAT_BLOCK = ("NoSchedule", "NoExecute")
# The simulated GPU node's UUIDs (``chaos.sim.gpu_node``) derive from this namespace too, so a slice
# published before its GPU node is attached already names the UUIDs the node will report.
_GPU_NS = uuidlib.UUID("6f1c4a52-6a43-4b1e-9a57-3d5e0c6a2b11")
_PCI_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
_DRIVER_IN_CEL = re.compile(r"device\.driver\s*==\s*['\"]([^'\"]+)['\"]")


@dataclass(frozen=True)
class Device:
    """One published device: where it is, its name, the GPU index it stands for, and its slice entry."""

    driver: str
    pool: str
    name: str
    index: int
    node: str
    obj: Obj

    @property
    def key(self) -> tuple[str, str, str]:
        return self.driver, self.pool, self.name


@dataclass(frozen=True)
class Request:
    """One device request of a claim: its name, class, count and device tolerations."""

    name: str
    device_class: str
    count: int
    all_devices: bool
    tolerations: tuple[Obj, ...]


def _attr(v: str | int) -> Obj:
    return {"int": v} if isinstance(v, int) else {"string": v}


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuidlib.uuid5(_GPU_NS, f'gpu/{node}/{index}')}"


def claim_requests(spec: Obj) -> list[Request]:
    """The requests of a ResourceClaim spec (or a template's ``spec.spec``) in resource.k8s.io/v1 form."""
    out: list[Request] = []
    for r in ((spec.get("devices") or {}).get("requests") or []):
        exact = r.get("exactly") or {}
        mode = exact.get("allocationMode") or "ExactCount"
        out.append(Request(str(r.get("name", "")), str(exact.get("deviceClassName", "")),
                           int(exact.get("count", 1)) if mode == "ExactCount" else 0, mode == "All",
                           tuple(exact.get("tolerations") or ())))
    return out


class Dra:
    """The DRA objects' behaviour over a ``Store`` (lock held by the caller in every method)."""

    def __init__(self, store: Store) -> None:
        self.s = store
        self.delete_pod: Callable[[Obj], Obj] | None = None    # Controllers.delete_pod, set by ClusterState
        store.listeners.append(self.on_change)

    # --- the driver: ResourceSlices -----------------------------------------------------------------

    def install(self) -> None:
        """What installing the driver's chart leaves: its DeviceClass."""
        if self.s.obj("deviceclasses", "", DEVICE_CLASS) is None:
            self.s.commit(BY_PLURAL["deviceclasses"], {
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": self.s.new_meta(DEVICE_CLASS, generation=1),
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                                              f"device.attributes['{DRIVER}'].type == 'gpu'"}}]}},
                "ADDED")

    def slice_name(self, node: str) -> str:
        return f"{node}-{DRIVER}-{uuidlib.uuid5(_GPU_NS, f'slice/{node}').hex[:5]}"

    def publish(self, node: str, gpus: int, uuids: list[str] | None = None,
                pcis: list[str] | None = None) -> Obj:
        """Create or update ``node``'s ResourceSlice with ``gpus`` devices (``uuids``/``pcis`` in index
        order when the GPU node is known); the pool's generation moves with every change."""
        devices = []
        for i in range(gpus):
            uuid = uuids[i] if uuids and i < len(uuids) else gpu_uuid(node, i)
            pci = pcis[i] if pcis and i < len(pcis) else \
                f"0000:{_PCI_BUSES[i] if i < len(_PCI_BUSES) else f'{0x30 + i:02x}'}:00.0"
            devices.append({"name": f"gpu-{i}", "attributes": {
                "type": _attr("gpu"), "uuid": _attr(uuid), "index": _attr(i), "minor": _attr(i),
                "productName": _attr("NVIDIA H100 80GB HBM3"), "brand": _attr("Nvidia"),
                "architecture": _attr("Hopper"), "cudaComputeCapability": {"version": "9.0.0"},
                "driverVersion": {"version": "550.127.5"}, "cudaDriverVersion": {"version": "12.4.0"},
                "pcieBusID": _attr(pci), "addressingMode": _attr("None")},
                "capacity": {"memory": {"value": "80Gi"}}})
        name = self.slice_name(node)
        current = self.s.obj("resourceslices", "", name)
        gen = 1 if current is None else int(current["spec"]["pool"]["generation"]) + 1
        spec = {"driver": DRIVER, "nodeName": node,
                "pool": {"name": node, "generation": gen, "resourceSliceCount": 1}, "devices": devices}
        if current is not None and current["spec"]["devices"] == devices:
            return current
        if current is None:
            return self.s.commit(BY_PLURAL["resourceslices"], {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": self.s.new_meta(name, generation=1,
                                            ownerReferences=[self._node_owner(node)]), "spec": spec}, "ADDED")
        return self.s.commit(BY_PLURAL["resourceslices"], {**current, "spec": spec}, "MODIFIED")

    def _node_owner(self, node: str) -> Obj:
        obj = self.s.obj("nodes", "", node)
        return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": obj["metadata"]["uid"] if obj else "",
                "controller": True}

    @property
    def enabled(self) -> bool:
        """Whether any node publishes devices (the driver runs)."""
        return bool(self.s.objects["resourceslices"])

    def devices(self, node: str | None = None) -> list[Device]:
        """Published devices (of one node), by driver, pool and name in natural order."""
        out: list[Device] = []
        for entry in self.s.objects["resourceslices"].values():
            spec = entry.obj.get("spec") or {}
            where = str(spec.get("nodeName") or "")
            if node is not None and where != node:
                continue
            pool = str((spec.get("pool") or {}).get("name", ""))
            for d in spec.get("devices") or []:
                attrs = d.get("attributes") or {}
                index = (attrs.get("index") or attrs.get("minor") or {}).get("int")
                if index is None:
                    m = re.fullmatch(r"gpu-(\d+)", str(d.get("name", "")))
                    index = int(m.group(1)) if m else -1
                out.append(Device(str(spec.get("driver", "")), pool, str(d.get("name", "")), int(index), where, d))
        return sorted(out, key=lambda d: (d.driver, d.pool, natural_key(d.name)))

    # --- device taints ------------------------------------------------------------------------------

    def taints(self, device: Device) -> list[Obj]:
        """The device's taints: its own and those of every DeviceTaintRule selecting it."""
        out = [dict(t) for t in device.obj.get("taints") or []]
        for entry in self.s.objects["devicetaintrules"].values():
            spec = entry.obj.get("spec") or {}
            sel = spec.get("deviceSelector")
            if sel is None or not isinstance(spec.get("taint"), dict):
                continue
            if any(sel.get(k) not in (None, "", v) for k, v in (("driver", device.driver), ("pool", device.pool),
                                                                 ("device", device.name))):
                continue
            out.append(dict(spec["taint"]))
        return out

    @staticmethod
    def untolerated(taints: Iterable[Obj], tolerations: Iterable[Obj], effects: tuple[str, ...]) -> list[Obj]:
        tol = list(tolerations)
        return [t for t in taints if t.get("effect") in effects and not tolerates(tol, t)]

    # --- claims -------------------------------------------------------------------------------------

    def class_driver(self, name: str) -> str | None:
        cls = self.s.obj("deviceclasses", "", name)
        if cls is None:
            return None
        for sel in (cls.get("spec") or {}).get("selectors") or []:
            m = _DRIVER_IN_CEL.search(str((sel.get("cel") or {}).get("expression", "")))
            if m:
                return m.group(1)
        return None

    def allocated(self) -> dict[tuple[str, str, str], str]:
        """(driver, pool, device) -> ``namespace/name`` of the claim it is allocated to."""
        out: dict[tuple[str, str, str], str] = {}
        for (ns, name), entry in self.s.objects["resourceclaims"].items():
            for r in _results(entry.obj):
                out[(str(r.get("driver")), str(r.get("pool")), str(r.get("device")))] = f"{ns}/{name}"
        return out

    def pod_claims(self, pod: Obj) -> list[tuple[str, Obj | None, list[Request]]]:
        """Each of the pod's ``spec.resourceClaims``: its name in the pod, the ResourceClaim (None while the
        controller has not made it yet) and the requests (from the claim, else from its template)."""
        ns = pod["metadata"]["namespace"]
        statuses = {s.get("name"): s.get("resourceClaimName")
                    for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        out: list[tuple[str, Obj | None, list[Request]]] = []
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            pname = str(ref.get("name", ""))
            claim_name = ref.get("resourceClaimName") or statuses.get(pname)
            claim = self.s.obj("resourceclaims", ns, str(claim_name)) if claim_name else None
            if claim is not None:
                out.append((pname, claim, claim_requests(claim.get("spec") or {})))
                continue
            tmpl_name = ref.get("resourceClaimTemplateName")
            tmpl = self.s.obj("resourceclaimtemplates", ns, str(tmpl_name)) if tmpl_name else None
            reqs = claim_requests(((tmpl or {}).get("spec") or {}).get("spec") or {})
            out.append((pname, None, reqs))
        return out

    def ensure_claims(self, pod: Obj) -> Obj:
        """The resourceclaim controller: create the claims the pod's templates call for, owned by the pod,
        and record them in ``status.resourceClaimStatuses``; returns the pod as stored."""
        ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        have = {s.get("name") for s in statuses}
        changed = False
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            pname = str(ref.get("name", ""))
            tmpl_name = ref.get("resourceClaimTemplateName")
            if not tmpl_name or pname in have:
                continue
            tmpl = self.s.obj("resourceclaimtemplates", ns, str(tmpl_name))
            if tmpl is None:
                continue  # as the controller does: the pod waits for its template
            claim_name = f"{pod_name}-{pname}-{self.s.suffix()}"
            tspec = tmpl.get("spec") or {}
            meta = self.s.new_meta(claim_name, ns, labels=dict((tspec.get("metadata") or {}).get("labels") or {})
                                   or None,
                                   annotations={POD_CLAIM_NAME_ANNOTATION: pname},
                                   ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                                     "uid": pod["metadata"]["uid"], "controller": True,
                                                     "blockOwnerDeletion": True}])
            self.s.commit(BY_PLURAL["resourceclaims"], {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                                        "metadata": meta, "spec": tspec.get("spec") or {},
                                                        "status": {}}, "ADDED")
            statuses.append({"name": pname, "resourceClaimName": claim_name})
            changed = True
        if not changed:
            return pod
        return self.s.commit(BY_PLURAL["pods"], {**pod, "status": {**(pod.get("status") or {}),
                                                                    "resourceClaimStatuses": statuses}},
                             "MODIFIED")

    def pick(self, pod: Obj, node: str) -> dict[str, list[tuple[Request, list[Device]]]] | None:
        """The devices the pod's unallocated claims would get on ``node`` (pod claim name -> per request its
        devices), or None when they do not fit there (or a claim is allocated on another node)."""
        taken = set(self.allocated())
        free = [d for d in self.devices(node) if d.key not in taken]
        out: dict[str, list[tuple[Request, list[Device]]]] = {}
        for pname, claim, reqs in self.pod_claims(pod):
            if claim is not None and _results(claim):
                if _allocated_node(claim) not in (None, node):
                    return None
                continue
            if not reqs:
                return None  # its template is missing: the pod cannot be scheduled yet
            picked: list[tuple[Request, list[Device]]] = []
            for req in reqs:
                driver = self.class_driver(req.device_class)
                if driver is None:
                    return None
                fit = [d for d in free if d.driver == driver
                       and not self.untolerated(self.taints(d), req.tolerations, EFFECTS_THAT_BLOCK)]
                n = len(fit) if req.all_devices else req.count
                if len(fit) < n or n == 0:
                    return None
                chosen = fit[:n]
                picked.append((req, chosen))
                free = [d for d in free if d not in chosen]
            out[pname] = picked
        return out

    def allocate(self, pod: Obj, node: str) -> bool:
        """Allocate the pod's claims on ``node`` and reserve them for it (before it is bound)."""
        picks = self.pick(pod, node)
        if picks is None:
            return False
        ref = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        for pname, claim, _ in self.pod_claims(pod):
            if claim is None:
                return False
            status = dict(claim.get("status") or {})
            if pname in picks:
                status["allocation"] = {
                    "devices": {"results": [{"request": req.name, "driver": d.driver, "pool": d.pool, "device": d.name}
                                            for req, devs in picks[pname] for d in devs]},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                    "allocationTimestamp": self.s.ts()}
            reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") != ref["uid"]]
            status["reservedFor"] = [*reserved, ref]
            self.s.commit(BY_PLURAL["resourceclaims"], {**claim, "status": status}, "MODIFIED")
        return True

    def container_devices(self, pod: Obj) -> list[tuple[str, list[int], list[Obj]]]:
        """For each container of the pod that uses claims: its name, the GPU indices of the allocated
        devices, and its PodResources ``dynamic_resources`` entries."""
        by_name = {pname: claim for pname, claim, _ in self.pod_claims(pod)}
        index_of = {d.key: d.index for d in self.devices()}
        out: list[tuple[str, list[int], list[Obj]]] = []
        for c in (pod.get("spec") or {}).get("containers") or []:
            uses = [str(u.get("name", "")) for u in (c.get("resources") or {}).get("claims") or []]
            indices: list[int] = []
            dynamic: list[Obj] = []
            for pname in uses:
                claim = by_name.get(pname)
                if claim is None:
                    continue
                resources = []
                for r in _results(claim):
                    key = (str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                    if key in index_of:
                        indices.append(index_of[key])
                    resources.append({"driver_name": key[0], "pool_name": key[1], "device_name": key[2],
                                      "cdi_devices": [{"name": f"{CDI_VENDOR}/device={key[2]}"}]})
                dynamic.append({"claim_name": claim["metadata"]["name"],
                                "claim_namespace": claim["metadata"]["namespace"], "claim_resources": resources})
            if dynamic:
                out.append((str(c.get("name", "")), sorted(indices), dynamic))
        return out

    # --- controllers: garbage collection, deallocation, NoExecute eviction ----------------------------

    def on_change(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        """Store listener: a changed device taint rule or slice, or a pod gone, is work for ``sync`` (run by
        the scheduler's pass, which it schedules)."""
        if rt.plural in ("devicetaintrules", "resourceslices"):
            self.s.dirty.sched_nodes.update(d.node for d in self.devices() if d.node)
        elif rt.plural == "pods" and new is None and old is not None and old.get("spec", {}).get("resourceClaims"):
            node = old.get("spec", {}).get("nodeName")
            if node:
                self.s.dirty.sched_nodes.add(node)

    def sync(self) -> None:
        """Delete claims whose pod is gone, drop reservations of gone pods (deallocating claims no pod
        reserves), and delete the pods whose allocated devices carry an untolerated ``NoExecute`` taint."""
        if not self.s.objects["resourceclaims"]:
            return
        pods_by_uid = {e.obj["metadata"]["uid"]: e.obj for e in self.s.objects["pods"].values()}
        for entry in list(self.s.objects["resourceclaims"].values()):
            claim = entry.obj
            owner = next((r for r in claim["metadata"].get("ownerReferences") or []
                          if r.get("kind") == "Pod" and r.get("controller")), None)
            if owner is not None and owner.get("uid") not in pods_by_uid:
                self.s.remove(BY_PLURAL["resourceclaims"], claim)
                continue
            status = claim.get("status") or {}
            reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") in pods_by_uid]
            if reserved != list(status.get("reservedFor") or []):
                new_status = {**status, "reservedFor": reserved}
                if not reserved:
                    new_status.pop("allocation", None)
                    new_status.pop("reservedFor", None)
                self.s.commit(BY_PLURAL["resourceclaims"], {**claim, "status": new_status}, "MODIFIED")
        if self.delete_pod is None:
            return
        devices = {d.key: d for d in self.devices()}
        for entry in list(self.s.objects["resourceclaims"].values()):
            claim = entry.obj
            reqs = {r.name: r for r in claim_requests(claim.get("spec") or {})}
            evict = False
            for r in _results(claim):
                d = devices.get((str(r.get("driver")), str(r.get("pool")), str(r.get("device"))))
                req = reqs.get(str(r.get("request")))
                if d is not None and self.untolerated(self.taints(d), req.tolerations if req else (), ("NoExecute",)):
                    evict = True
            if not evict:
                continue
            for ref in (claim.get("status") or {}).get("reservedFor") or []:
                pod = pods_by_uid.get(ref.get("uid"))
                if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                    self.delete_pod(pod)


def _results(claim: Obj) -> list[Obj]:
    return list((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or [])


def _allocated_node(claim: Obj) -> str | None:
    sel = (((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {})
    for term in sel.get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return None
