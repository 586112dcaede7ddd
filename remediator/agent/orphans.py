"""Orphaned GPU memory: memory held by a process whose pod no longer exists.

Where it sits: run by the agent after each GPU poll, on the same snapshots as the NVML poller, and by the
``kill_orphans`` command. For every compute process NVML reports, the PID is looked up in our ``/proc``
(``PodView.pid_info``): its cgroup names the pod UID, which is compared with the pods the kubelet runs
(``PodView.running_pod_uids``). A process is an orphan when its pod UID is known and not running.

Not orphans: a PID that is not visible in our /proc (NVML inside a container without ``hostPID`` reports
PIDs of another namespace: gpu-faults.md §5, "Not a leak"), a process outside any pod (a host daemon), and
anything while the running pods cannot be known. An orphan is reported after it is seen in
``confirmations`` consecutive checks (a pod being torn down is not a leak), as one ``memory_leak`` event
per GPU with labels ``orphan_pids`` (comma list), ``used_bytes``, ``pod_uids`` and ``pod_gone="true"``;
when the orphans of a GPU are gone a healthy ``memory_leak`` event clears it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from remediator.agent.events import Clock, make_event
from remediator.agent.host import GpuIdentity, GpuSnapshot, PodView
from remediator.contracts import FaultEvent, GpuRef, Origin, utcnow

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Orphan:
    gpu: GpuIdentity
    pid: int
    used_bytes: int | None
    pod_uid: str


def find_orphans(snapshots: Sequence[GpuSnapshot], pods: PodView) -> list[Orphan]:
    """The orphaned processes on ``snapshots``' GPUs right now (no confirmation window)."""
    running = pods.running_pod_uids()
    if running is None:
        return []
    out: list[Orphan] = []
    for snap in snapshots:
        if snap.lost or not snap.processes:
            continue
        for proc in snap.processes:
            info = pods.pid_info(proc.pid)
            if not info.visible or info.pod_uid is None:
                continue
            if info.pod_uid not in running:
                out.append(Orphan(snap.identity, proc.pid, proc.used_bytes, info.pod_uid))
    return out


class OrphanDetector:
    """Publishes ``memory_leak`` events on changes of the confirmed orphan set of each GPU."""

    def __init__(self, pods: PodView, *, node: str, boot_id: Callable[[], str], clock: Clock = utcnow,
                 confirmations: int = 2) -> None:
        self.pods = pods
        self.node = node
        self.boot_id = boot_id
        self.clock = clock
        self.confirmations = max(1, confirmations)
        self._seen: dict[tuple[str, int], int] = {}  # (gpu key, pid) -> consecutive sightings
        self._reported: dict[str, frozenset[int]] = {}  # gpu key -> pids last reported
        self._pending_report: dict[str, frozenset[int]] = {}

    def check(self, snapshots: Sequence[GpuSnapshot]) -> list[FaultEvent]:
        """Events for orphan sets that changed since the last committed report (call ``commit`` after)."""
        orphans = find_orphans(snapshots, self.pods)
        seen: dict[tuple[str, int], int] = {}
        by_gpu: dict[str, list[Orphan]] = {}
        for o in orphans:
            k = (o.gpu.key, o.pid)
            seen[k] = self._seen.get(k, 0) + 1
            if seen[k] >= self.confirmations:
                by_gpu.setdefault(o.gpu.key, []).append(o)
        self._seen = seen
        events: list[FaultEvent] = []
        self._pending_report = {}
        gpus = {s.identity.key: s.identity for s in snapshots}
        boot = self.boot_id()
        for key in sorted(set(by_gpu) | set(self._reported)):
            found = by_gpu.get(key, [])
            pids = frozenset(o.pid for o in found)
            if pids == self._reported.get(key, frozenset()):
                continue
            self._pending_report[key] = pids
            gid = gpus.get(key)
            gpu = GpuRef(index=gid.index, uuid=gid.uuid, pci_bus_id=gid.pci_bus_id) if gid else None
            if pids:
                held = sum(o.used_bytes or 0 for o in found)
                plist = ",".join(str(p) for p in sorted(pids))
                labels = {"orphan_pids": plist, "used_bytes": str(held), "pod_gone": "true",
                          "pod_uids": ",".join(sorted({o.pod_uid for o in found}))}
                msg = (f"GPU {gid.index if gid else key}: {held} bytes held by pid(s) {plist} whose pod(s) "
                       f"no longer exist")
                owners = {o.pod_uid for o in found}  # the pod(s) gone: an origin when there is one
                origin = Origin(pod_uid=next(iter(owners))) if len(owners) == 1 else None
                event = make_event(event_id=f"agent|{self.node}|{boot}|orphan|{key}|{plist}", node=self.node,
                                   kind="memory_leak", code="orphaned_memory", gpu=gpu, message=msg,
                                   labels=labels, clock=self.clock, origin=origin)
            else:
                old = ",".join(str(p) for p in sorted(self._reported.get(key, frozenset())))
                event = make_event(event_id=f"agent|{self.node}|{boot}|orphan-cleared|{key}|{old}",
                                   node=self.node, kind="memory_leak", code="orphaned_memory", gpu=gpu,
                                   message=f"orphaned processes {old} are gone", labels={"orphan_pids": ""},
                                   clock=self.clock, is_healthy=True)
            if event is not None:
                events.append(event)
        return events

    def commit(self) -> None:
        """The events of the last ``check`` were handed on: remember them as reported."""
        for key, pids in self._pending_report.items():
            if pids:
                self._reported[key] = pids
            else:
                self._reported.pop(key, None)
        self._pending_report = {}

    def current(self, snapshots: Sequence[GpuSnapshot]) -> list[Orphan]:
        """Orphans right now, without confirmation (the ``kill_orphans`` command acts on these)."""
        return find_orphans(snapshots, self.pods)
