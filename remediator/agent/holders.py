"""Which pods hold which GPU: the kubelet's PodResources reply joined with NVML's GPUs, and each pod's UID.

Where it sits: the node agent's ``PodResourcesView`` on a real node and on a simulated one alike
(``remediator agent --pod-resources SOCKET``; with ``--sim-gpus`` the simulated kubelet's socket). The
command responder asks it for the holders of a GPU (``isolate_gpu`` and ``status`` replies:
``after.holders``), and the service evicts exactly those pods by UID. The reply comes from the PodResources
client (``remediator.adapters.podresources``); GPUs come from the agent's ``GpuBackend`` (NVML).

The join, per container of every pod the kubelet lists:

- **Device plugin** (``devices``, any ``nvidia.com/…`` resource): a device ID is a GPU UUID (``GPU-…``); with
  time-slicing the plugin hands out replicas ``<uuid>::<n>``, which are that GPU; with the plugin's
  ``deviceIDStrategy: index`` the ID is the NVML index (``"3"``, or ``"3:1"`` for a MIG device of GPU 3).
  A MIG UUID (``MIG-…``) names no full GPU NVML lists here: it is reported as unknown.
- **DRA** (``dynamic_resources`` of driver ``gpu.nvidia.com``, NVIDIA's k8s-dra-driver-gpu): the device name is
  ``gpu-<minor>`` for a full GPU and ``gpu-<minor>-mig-<profile>-<start>-<size>`` for a MIG device of it
  (``deviceinfo.go`` ``CanonicalName``; ``<minor>`` is the GPU's device minor number, ``/dev/nvidia<minor>``,
  from NVML's ``nvmlDeviceGetMinorNumber``; where the backend cannot tell it, the NVML index stands in, equal to
  it on nodes where the driver numbers devices in PCI order). Where a kubelet before 1.31 gives no device name,
  the CDI device names stand in: ``k8s.gpu.nvidia.com/device=gpu-<minor>`` and
  ``k8s.gpu.nvidia.com/claim=<claim uid>-gpu-<minor>`` (``cdi.go``). ``gpu-vfio-<n>`` (a GPU passed through to a
  VM) is not a GPU NVML sees: unknown.
- Other resources and drivers (NICs, CPUs, compute domains) are not GPUs and are left out.

The UID: the PodResources API names pods by namespace and name only. The kubelet keeps each pod's container
logs under ``/var/log/pods/<namespace>_<name>_<uid>/`` (names and namespaces never contain ``_``) and each pod's
data under ``/var/lib/kubelet/pods/<uid>/``; the UID is the one of the log directories for that namespace and
name whose UID the kubelet still runs. Where no such directory exists yet (a pod whose sandbox is not created)
or two pods of the same name still run (a replacement during a graceful stop), NVML's process list stands in
(``with_process_uids``): when the kubelet names exactly one pod on a GPU and every compute process NVML lists
on it is in one pod's cgroup, that pod UID is the holder's. Otherwise ``uid`` is None and the service evicts
by name, after reading the pod as it is then.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from remediator.agent.host import GpuHolder, kubelet_pod_uids
from remediator.errors import RemediatorError
from remediator.gpu import GpuIdentity

if TYPE_CHECKING:  # the client module loads grpc (about 18 MB): only an agent that reads the socket loads it
    from remediator.adapters.podresources import PodAllocation

__all__ = [
    "DRA_DRIVER",
    "HolderMap",
    "KubeletHolders",
    "PodUids",
    "device_plugin_gpu",
    "dra_gpu_minor",
    "join",
    "with_process_uids",
]

log = logging.getLogger(__name__)

DRA_DRIVER = "gpu.nvidia.com"
DEVICE_PLUGIN_PREFIX = "nvidia.com/"

_DRA_NAME = re.compile(r"(?:^|[=-])gpu-(\d+)(?:-mig-\d+-\d+-\d+)?$")
_INDEX_ID = re.compile(r"^(\d+)(?::\d+)?$")


class _Lister(Protocol):
    def list(self) -> tuple[PodAllocation, ...]: ...


@dataclass(frozen=True)
class HolderMap:
    """One join: each GPU's holders (by ``GpuIdentity.key``), and the device IDs that matched no GPU."""

    holders: dict[str, tuple[GpuHolder, ...]]
    unknown: tuple[str, ...] = ()
    pods: int = 0

    def of(self, gpu: GpuIdentity) -> tuple[GpuHolder, ...]:
        return self.holders.get(gpu.key, ())


def device_plugin_gpu(device_id: str, gpus: Sequence[GpuIdentity]) -> GpuIdentity | None:
    """The GPU a device plugin's device ID names (UUID, ``<uuid>::<replica>``, or index), or None."""
    base = device_id.split("::", 1)[0].strip()
    if base[:4].upper() == "GPU-":
        return next((g for g in gpus if g.uuid and g.uuid.lower() == base.lower()), None)
    m = _INDEX_ID.match(base)
    if m is not None:
        return next((g for g in gpus if g.index == int(m.group(1))), None)
    return None


def dra_gpu_minor(device_name: str, cdi_devices: Sequence[str] = ()) -> int | None:
    """The minor number of the (parent) GPU a ``gpu.nvidia.com`` DRA device names, or None."""
    for name in (device_name, *cdi_devices):
        m = _DRA_NAME.search(name) if name else None
        if m is not None:
            return int(m.group(1))
    return None


def join(pods: Sequence[PodAllocation], gpus: Sequence[GpuIdentity], *,
         uid: Callable[[str, str], str | None] = lambda ns, name: None,
         minor: Callable[[GpuIdentity], int | None] = lambda g: None,
         dra_driver: str = DRA_DRIVER) -> HolderMap:
    """Each GPU's holders in ``pods`` (see the module docstring); ``uid`` gives a pod's UID by namespace and
    name, ``minor`` a GPU's device minor number (None: its index stands in)."""
    by_minor: dict[int, GpuIdentity] = {}
    for g in gpus:
        m = minor(g)
        by_minor[g.index if m is None else m] = g
    holders: dict[str, list[GpuHolder]] = {}
    unknown: list[str] = []
    for pod in pods:
        pod_uid: str | None = None
        looked = False
        for c in pod.containers:
            found: list[GpuIdentity] = []
            for d in c.devices:
                if not d.resource_name.startswith(DEVICE_PLUGIN_PREFIX):
                    continue
                for device_id in d.device_ids:
                    named = device_plugin_gpu(device_id, gpus)
                    if named is None:
                        unknown.append(f"{d.resource_name}:{device_id}")
                    else:
                        found.append(named)
            for cd in c.dynamic:
                if cd.driver_name != dra_driver and not (not cd.driver_name and any(
                        n.startswith(f"k8s.{dra_driver}/") for n in cd.cdi_devices)):
                    continue
                n = dra_gpu_minor(cd.device_name, cd.cdi_devices)
                dev = by_minor.get(n) if n is not None else None
                if dev is None:
                    unknown.append(f"{dra_driver}:{cd.pool_name}/{cd.device_name or ','.join(cd.cdi_devices)}")
                else:
                    found.append(dev)
            if not found:
                continue
            if not looked:
                pod_uid, looked = uid(pod.namespace, pod.name), True
            holder = GpuHolder(namespace=pod.namespace, name=pod.name, uid=pod_uid, container=c.name)
            for g in dict.fromkeys(found):  # a GPU once per container, however many replicas it got
                holders.setdefault(g.key, []).append(holder)
    return HolderMap({k: tuple(v) for k, v in holders.items()}, tuple(sorted(set(unknown))), len(pods))


def with_process_uids(found: HolderMap, process_uids: Mapping[str, set[str]]) -> HolderMap:
    """``found`` with the UID of a holder the directories could not name taken from NVML's processes: for a GPU
    (by key) that the kubelet gave to exactly one pod, whose compute processes are all in one pod's cgroup
    (``process_uids``: GPU key -> the pod UIDs of its processes), and only where that UID names no other pod."""
    named = {h.uid: (h.namespace, h.name) for hs in found.holders.values() for h in hs if h.uid}
    fill: dict[tuple[str, str], str] = {}
    for key, holders in found.holders.items():
        pods = {(h.namespace, h.name) for h in holders}
        uids = process_uids.get(key, set())
        if len(pods) == 1 and len(uids) == 1 and all(h.uid is None for h in holders):
            (uid,) = uids
            (pod,) = pods
            if named.get(uid, pod) == pod and fill.get(pod, uid) == uid:
                fill[pod] = uid
    if not fill:
        return found
    filled = {k: tuple(replace(h, uid=fill.get((h.namespace, h.name), h.uid)) if h.uid is None else h for h in hs)
              for k, hs in found.holders.items()}
    return HolderMap(filled, found.unknown, found.pods)


class PodUids:
    """Pod UIDs by namespace and name, from the kubelet's directories (see the module docstring)."""

    def __init__(self, pod_logs_dir: Path | str = "/var/log/pods",
                 kubelet_pods_dir: Path | str | None = "/var/lib/kubelet/pods") -> None:
        self.pod_logs_dir = Path(pod_logs_dir)
        self.kubelet_pods_dir = Path(kubelet_pods_dir) if kubelet_pods_dir is not None else None

    def table(self) -> Callable[[str, str], str | None]:
        """A lookup over one scan of the directories (one scan per join)."""
        seen: dict[tuple[str, str], list[str]] = {}
        try:
            with os.scandir(self.pod_logs_dir) as entries:
                for e in entries:
                    parts = e.name.split("_")
                    if len(parts) == 3 and all(parts) and e.is_dir():
                        seen.setdefault((parts[0], parts[1]), []).append(parts[2])
        except OSError:
            return lambda ns, name: None
        live = kubelet_pod_uids(self.kubelet_pods_dir) if self.kubelet_pods_dir is not None else None

        def lookup(namespace: str, name: str) -> str | None:
            uids = seen.get((namespace, name), [])
            if live is not None:
                uids = [u for u in uids if u in live]
            return uids[0] if len(uids) == 1 else None

        return lookup


@dataclass
class KubeletHolders:
    """``PodResourcesView`` over the kubelet's PodResources socket: one ``List`` per question, joined with
    ``gpus()`` (the backend's identities). ``last_error`` is the last failure in one line (None after an
    answer); ``unknown`` the device IDs of the last answer that matched no GPU."""

    client: _Lister
    gpus: Callable[[], Sequence[GpuIdentity]]
    uids: PodUids = field(default_factory=PodUids)
    minor: Callable[[GpuIdentity], int | None] = lambda g: None
    dra_driver: str = DRA_DRIVER
    last_error: str | None = None
    unknown: tuple[str, ...] = ()

    def holder_map(self, gpus: Sequence[GpuIdentity] | None = None) -> HolderMap | None:
        """The holders of every GPU from one ``List``; None (and ``last_error``) when the socket did not answer."""
        try:
            pods = self.client.list()
        except RemediatorError as e:
            if self.last_error != str(e):
                log.warning("which pods hold the GPUs is unknown: %s", e)
            self.last_error = str(e)
            return None
        found = join(pods, list(gpus) if gpus is not None else list(self.gpus()), uid=self.uids.table(),
                     minor=self.minor, dra_driver=self.dra_driver)
        if found.unknown and found.unknown != self.unknown:
            log.warning("pod-resources devices that match no GPU of this node: %s", ", ".join(found.unknown[:8]))
        self.last_error, self.unknown = None, found.unknown
        return found

    def gpu_holders(self, gpu: GpuIdentity) -> tuple[GpuHolder, ...] | None:
        found = self.holder_map()
        return None if found is None else found.of(gpu)
