"""Simulated GPU node: GPU state, a growing kmsg file, pod log files, and the effects of agent commands.

Where it sits: chaos tooling under the demo, the drills and the agent tests. ``SimGpuNode`` implements the
three interfaces the node agent uses on a real node (``remediator.agent.host``): ``GpuBackend`` (what NVML
would say), ``HostRunner`` (what ``nvidia-smi drain/--gpu-reset``, ``kill`` and the reboot hook would do)
and ``PodView`` (pods the kubelet runs; PIDs are mapped to pods through ``<root>/proc/<pid>/cgroup`` files
parsed by the agent's real ``ProcPodView``). ``remediator agent --sim-gpus N`` therefore runs the real
agent code on it, reading the kernel log from ``<root>/kmsg`` (records in /dev/kmsg format) and the
container logs from ``<root>/pods`` (the kubelet's ``/var/log/pods`` layout, CRI format).

Layout under ``root``::

    state.json            GPU, pod and boot state (shared by every process that opens the same root)
    boot_id               the boot id the agent reads instead of /proc/sys/kernel/random/boot_id
    kmsg                  kernel ring buffer as a file: "<prio>,<seq>,<usec>,-;<message>" + " KEY=value" lines
    pods/<ns>_<pod>_<uid>/<container>/0.log    CRI container logs; labels.json per pod with job and rank
    proc/<pid>/cgroup     cgroup of each simulated GPU process (kubepods path with the pod UID)
    kubelet/pods/<uid>/   one directory per running pod, like /var/lib/kubelet/pods

The node's kubelet side: attached to a simulated cluster (``ClusterState.attach_gpu_node``), the node
reports its drained (isolated) and lost GPUs as unhealthy devices, as the NVIDIA device plugin would, so
the simulated device manager never assigns them; and it keeps the device allocation the cluster's
kubelet hands out is the cluster's (``ClusterState.pod_resources``), which the simulated kubelet serves over
the PodResources gRPC API on a socket per node (``chaos.sim.podresources_server``, ``SimFleet``): the agent
reads it there with its real client, as on a real node. Nothing of the allocation is kept here.

Several processes may open the same root (an agent started by ``remediator agent --sim-gpus`` and an
injector in a test or drill): every change is a read-modify-write of ``state.json`` under an exclusive
``flock``. ``SimFleet`` runs N simulated nodes and their agents in one process (the demo runs 8).

Injectors: ``inject_xid``, ``fall_off_bus``, ``set_ecc``, ``add_process``, ``orphan``, ``add_pod`` /
``delete_pod``, ``pod_log``, ``nccl_timeout``, ``set_thermal``, ``set_unsupported``, ``set_reset_outcome``
(the next resets of a GPU fail, bring back another UUID, or leave page retirement pending),
``set_reboot_outcome`` (a reboot command that runs but never reboots), ``leak_memory`` (a pod's process whose
memory grows every second; once its job is restarted, the new pod's processes run at the job's baseline again:
``start_restarted``, which the simulated kubelet calls for each pod it runs).

The reset as the driver does it (``GpuControl`` and ``HostRunner.reset_gpu``): refused while any process
holds the GPU (``nvidia-smi`` says "in use"), and while persistence mode is on (on by default, as the GPU
Operator's driver container runs ``nvidia-persistenced``, which holds the device open); persistence mode is
read and set per GPU, and ``identity_at`` says which UUID answers at a PCI address. A reboot gives the node
a new boot id (which the attached simulated cluster's node reports as ``status.nodeInfo.bootID`` once the
node is Ready again), and clears the GPUs' processes and volatile state.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from chaos.sim.podresources_server import SOCKET_NAME as POD_RESOURCES_SOCKET
from chaos.sim.podresources_server import PodResourcesServers
from remediator.adapters.podresources import MAX_UNIX_PATH_BYTES
from remediator.agent.host import (
    EccCounts,
    GpuIdentity,
    GpuProcess,
    GpuSnapshot,
    PidInfo,
    ProcPodView,
    RemappedRows,
    RunResult,
    XidNotice,
)
from remediator.agent.main import Agent, AgentConfig
from remediator.agent.state import atomic_write

GIB = 1 << 30
DEFAULT_MEMORY = 80 * GIB
_PCI_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
_NS = uuidlib.UUID("6f1c4a52-6a43-4b1e-9a57-3d5e0c6a2b11")

# What the driver prints after the Xid number for the codes drills use (public report wording).
XID_TEXT: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1c_a0000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "Ch 00000018",
    45: "Ch 00000018",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
        "subpartition 0.",
    63: "Row Remapper: New row (0x00000000000123a0) marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row (0x00000000000123a0) for ECC error, reset gpu and, if the problem "
        "persists, RMA.",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
         "(0x2080014b 0x5).",
    120: "GSP task exception: Error in GSP task (Reason: 0x1)",
}
_HW_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})


def _pod_uid(namespace: str, name: str) -> str:
    return str(uuidlib.uuid5(_NS, f"pod/{namespace}/{name}"))


def _process_bytes(p: dict[str, Any], now: float) -> int:
    """A process's GPU memory now: what it holds, plus what it leaked since ``leak_memory``."""
    growth = p.get("growth")
    if not growth:
        return int(p["bytes"])
    return int(p["bytes"]) + int(growth["per_s"] * max(0.0, now - float(growth["since"])))


def _workload(pod: dict[str, Any]) -> str:
    """What a restart brings back: the pod's job, else the pod itself by namespace and name."""
    return str(pod.get("job") or f"pod:{pod['namespace']}/{pod['name']}")


class SimGpuNode:
    """One simulated GPU node under ``root``; see the module docstring for the files it keeps there."""

    def __init__(self, root: Path | str, *, name: str = "sim-node", gpus: int = 8,
                 memory_total: int = DEFAULT_MEMORY, clock: Callable[[], float] = time.time,
                 reboot_hook: bool = True) -> None:
        self.root = Path(root)
        self.name = name
        self.clock = clock
        self.state_path = self.root / "state.json"
        self.lock_path = self.root / ".lock"
        self.boot_id_path = self.root / "boot_id"
        self.kmsg_path = self.root / "kmsg"
        self.pod_logs_dir = self.root / "pods"
        self.proc_root = self.root / "proc"
        self.kubelet_pods_dir = self.root / "kubelet" / "pods"
        for d in (self.pod_logs_dir, self.proc_root, self.kubelet_pods_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._state: dict[str, Any] = {}
        self._stamp: tuple[int, int] | None = None
        self._cache_lock = threading.Lock()  # the agent's threads and the simulated cluster read the cache
        self._xid_delivered = 0
        self._xid_wake = threading.Event()
        self._procs = ProcPodView(self.proc_root, running_pods=self.running_pod_uids)
        with self._mutate() as st:
            if not st:
                st.update(self._fresh_state(gpus, memory_total, reboot_hook))
                self._new_boot(st)
        self._xid_delivered = len(self._current().get("xid_events", []))

    @classmethod
    def attach(cls, root: Path | str, *, clock: Callable[[], float] = time.time) -> SimGpuNode:
        """Open an existing simulated node (e.g. the one a ``remediator agent --sim-gpus`` process runs)."""
        state = json.loads((Path(root) / "state.json").read_text())
        return cls(root, name=state["node"], gpus=len(state["gpus"]), clock=clock)

    # --- state file ----------------------------------------------------------------------------------

    def _fresh_state(self, gpus: int, memory_total: int, reboot_hook: bool) -> dict[str, Any]:
        return {
            "node": self.name,
            "boot_id": "",
            "boot_time": 0.0,
            "kmsg_seq": 0,
            "reboots": 0,
            "reboot_hook": reboot_hook,
            "reboot_outcome": None,
            "bug_reports": 0,
            "health_command": None,
            "xid_events": [],
            "pods": {},
            "gpus": [self._fresh_gpu(i, memory_total) for i in range(gpus)],
        }

    def _fresh_gpu(self, i: int, memory_total: int) -> dict[str, Any]:
        bus = _PCI_BUSES[i] if i < len(_PCI_BUSES) else f"{0x30 + i:02x}"
        return {
            "index": i,
            "uuid": f"GPU-{uuidlib.uuid5(_NS, f'gpu/{self.name}/{i}')}",
            "pci": f"0000:{bus}:00.0",
            "memory_total": memory_total,
            "lost": False,
            "isolated": False,
            "reset_count": 0,
            "ecc": {"sbe_volatile": 0, "dbe_volatile": 0, "sbe_aggregate": 0, "dbe_aggregate": 0},
            "retired_sbe": 0,
            "retired_dbe": 0,
            "retired_pending": False,
            "remap": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
            "temperature": 38,
            "throttle": 0,
            "processes": {},
            "identity_printed": False,
            "unsupported": [],
            "persistence": True,
            "reset_outcome": None,
        }

    def _load_if_changed(self) -> None:
        with self._cache_lock:
            try:
                st = os.stat(self.state_path)
            except FileNotFoundError:
                self._state, self._stamp = {}, None
                return
            stamp = (st.st_mtime_ns, st.st_ino)
            if stamp != self._stamp:
                self._state, self._stamp = json.loads(self.state_path.read_bytes()), stamp

    def _current(self) -> dict[str, Any]:
        self._load_if_changed()
        with self._cache_lock:
            return self._state

    @contextlib.contextmanager
    def _mutate(self) -> Iterator[dict[str, Any]]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with self._cache_lock:
                    self._stamp = None
                state = json.loads(json.dumps(self._current()))  # a private copy to change
                yield state
                atomic_write(self.state_path, json.dumps(state, indent=1, sort_keys=True).encode())
                with self._cache_lock:
                    self._state, self._stamp = state, None
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _new_boot(self, st: dict[str, Any]) -> None:
        st["boot_id"] = str(uuidlib.uuid4())
        st["boot_time"] = self.clock()
        st["kmsg_seq"] = 0
        atomic_write(self.boot_id_path, (st["boot_id"] + "\n").encode())
        with open(self.kmsg_path, "ab") as f:  # a new ring buffer, in place (readers see a truncation)
            f.truncate(0)
        for g in st["gpus"]:
            g["identity_printed"] = False

    def _gpu(self, st: dict[str, Any], i: int) -> dict[str, Any]:
        try:
            gpu: dict[str, Any] = st["gpus"][i]
        except IndexError:
            raise ValueError(f"{self.name} has no GPU {i}") from None
        return gpu

    # --- inspection ----------------------------------------------------------------------------------

    @property
    def boot_id(self) -> str:
        return str(self._current()["boot_id"])

    def gpu_state(self, i: int) -> dict[str, Any]:
        """A copy of GPU ``i``'s state (``isolated``, ``reset_count``, ``processes``, ``ecc``, ...)."""
        copy: dict[str, Any] = json.loads(json.dumps(self._gpu(self._current(), i)))
        return copy

    def identity(self, i: int) -> GpuIdentity:
        g = self._gpu(self._current(), i)
        return GpuIdentity(index=i, uuid=g["uuid"], pci_bus_id=g["pci"])

    @property
    def reboots(self) -> int:
        return int(self._current()["reboots"])

    def pod_uid(self, pod: str) -> str:
        """UID of a pod given by name or UID."""
        pods = self._current()["pods"]
        if pod in pods:
            return pod
        for uid, p in pods.items():
            if p["name"] == pod:
                return str(uid)
        raise ValueError(f"no pod {pod!r} on {self.name}")

    # --- kmsg ----------------------------------------------------------------------------------------

    def _kmsg(self, st: dict[str, Any], text: str, *, prio: int = 3, pci: str | None = None) -> int:
        seq = int(st["kmsg_seq"])
        st["kmsg_seq"] = seq + 1
        usec = max(0, int((self.clock() - float(st["boot_time"])) * 1_000_000))
        record = f"{prio},{seq},{usec},-;{text}\n"
        if pci:
            record += f" SUBSYSTEM=pci\n DEVICE=+pci:{pci}\n"
        fd = os.open(self.kmsg_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, record.encode())  # one write per record: readers never see half a record
        finally:
            os.close(fd)
        return seq

    def kmsg(self, text: str, *, prio: int = 6) -> int:
        """Append one raw kernel message; returns its sequence number."""
        with self._mutate() as st:
            return self._kmsg(st, text, prio=prio)

    def xid_line(self, i: int, code: int, text: str | None = None, pid: int | None = None) -> str:
        g = self._gpu(self._current(), i)
        short = g["pci"][:-2]  # the driver prints DDDD:BB:DD
        who = f"pid={pid}, name=python3" if pid is not None else "pid='<unknown>', name=<unknown>"
        return f"NVRM: Xid (PCI:{short}): {code}, {who}, {text or XID_TEXT.get(code, 'Unknown error')}"

    def inject_xid(self, i: int, code: int, text: str | None = None, *, nvml_event: bool = True) -> int:
        """Write an Xid for GPU ``i`` to the kmsg file (after the driver's identity line, the first time in
        a boot) and queue it as an NVML Xid event. Returns the Xid record's kmsg sequence number."""
        with self._mutate() as st:
            g = self._gpu(st, i)
            if not g["identity_printed"]:
                self._kmsg(st, f"NVRM: GPU at PCI:{g['pci'][:-2]}: {g['uuid']}", prio=4)
                self._kmsg(st, f"NVRM: GPU Board Serial Number: 16543210{i:05d}", prio=4)
                g["identity_printed"] = True
            procs = g["processes"]
            pid = None if code in _HW_XIDS or not procs else int(next(iter(procs)))
            seq = self._kmsg(st, self.xid_line(i, code, text, pid), pci=g["pci"])
            if nvml_event:
                st["xid_events"].append([i, code])
        self._xid_wake.set()
        return seq

    def fall_off_bus(self, i: int) -> None:
        """GPU ``i`` is lost: Xid 79 and the "fallen off the bus" line in kmsg, NVML answers GPU_IS_LOST."""
        self.inject_xid(i, 79)
        with self._mutate() as st:
            g = self._gpu(st, i)
            g["lost"] = True
            self._kmsg(st, f"NVRM: GPU {g['pci']}: GPU has fallen off the bus.", pci=g["pci"])

    # --- GPU state injectors -------------------------------------------------------------------------

    def set_ecc(self, i: int, *, dbe: int | None = None, sbe: int | None = None,
                remap_pending: bool | None = None, remap_failure: bool | None = None,
                retired_pending: bool | None = None, retired_dbe: int | None = None,
                remap_correctable: int | None = None, remap_uncorrectable: int | None = None) -> None:
        """Set ECC state of GPU ``i``: ``dbe``/``sbe`` are the volatile totals (the aggregate totals rise
        by the same amount); the others set the row-remap and page-retirement state as given."""
        with self._mutate() as st:
            g = self._gpu(st, i)
            ecc = g["ecc"]
            for value, vol, agg in ((dbe, "dbe_volatile", "dbe_aggregate"), (sbe, "sbe_volatile", "sbe_aggregate")):
                if value is not None:
                    ecc[agg] += max(0, value - ecc[vol])
                    ecc[vol] = value
            remap = g["remap"]
            if remap_pending is not None:
                remap["pending"] = remap_pending
            if remap_failure is not None:
                remap["failure"] = remap_failure
            if remap_correctable is not None:
                remap["correctable"] = remap_correctable
            if remap_uncorrectable is not None:
                remap["uncorrectable"] = remap_uncorrectable
            if retired_pending is not None:
                g["retired_pending"] = retired_pending
            if retired_dbe is not None:
                g["retired_dbe"] = retired_dbe

    def set_thermal(self, i: int, *, temperature: int | None = None, throttle: int | None = None) -> None:
        with self._mutate() as st:
            g = self._gpu(st, i)
            if temperature is not None:
                g["temperature"] = temperature
            if throttle is not None:
                g["throttle"] = throttle

    def set_unsupported(self, i: int, fields: Sequence[str]) -> None:
        """Make GPU ``i`` answer NOT_SUPPORTED for ``fields`` (``ecc``, ``remapped_rows``, ``retired_pages``,
        ``processes``, ``throttle_reasons``, ``temperature``)."""
        with self._mutate() as st:
            self._gpu(st, i)["unsupported"] = sorted(set(fields))

    def set_health_command(self, ok: bool | None, detail: str = "") -> None:
        """The result the configured health command (``dcgmi diag``) gives; None: none configured."""
        with self._mutate() as st:
            st["health_command"] = None if ok is None else {"ok": ok, "detail": detail}

    # --- pods and processes --------------------------------------------------------------------------

    def add_pod(self, name: str, *, namespace: str = "default", uid: str | None = None, job: str | None = None,
                rank: int | None = None, containers: Sequence[str] = ("trainer",)) -> str:
        """A running pod: kubelet directory, log directories (``0.log`` per container); returns its UID."""
        uid = uid or _pod_uid(namespace, name)
        with self._mutate() as st:
            st["pods"][uid] = {"namespace": namespace, "name": name, "job": job, "rank": rank,
                               "containers": list(containers)}
        (self.kubelet_pods_dir / uid).mkdir(parents=True, exist_ok=True)
        pod_dir = self.pod_logs_dir / f"{namespace}_{name}_{uid}"
        for c in containers:
            (pod_dir / c).mkdir(parents=True, exist_ok=True)
            (pod_dir / c / "0.log").touch()
        if job is not None or rank is not None:
            atomic_write(pod_dir / "labels.json", json.dumps({"job": job, "rank": rank}).encode())
        return uid

    def delete_pod(self, pod: str) -> str:
        """The pod is gone (kubelet directory and logs removed); its GPU processes, if any, stay behind."""
        uid = self.pod_uid(pod)
        with self._mutate() as st:
            p = st["pods"].pop(uid)
        shutil.rmtree(self.kubelet_pods_dir / uid, ignore_errors=True)
        shutil.rmtree(self.pod_logs_dir / f"{p['namespace']}_{p['name']}_{uid}", ignore_errors=True)
        return uid

    def add_process(self, i: int, pid: int, used_bytes: int, pod_uid: str | None = None, *,
                    visible: bool = True, unkillable: bool = False) -> None:
        """A compute process on GPU ``i`` holding ``used_bytes``. ``visible=False``: NVML reports a PID of
        another PID namespace (no /proc entry for it here). ``unkillable``: survives SIGKILL (D state)."""
        with self._mutate() as st:
            g = self._gpu(st, i)
            g["processes"][str(pid)] = {"bytes": used_bytes, "pod_uid": pod_uid, "visible": visible,
                                        "unkillable": unkillable}
        if visible:
            self._write_cgroup(pid, pod_uid)

    def _write_cgroup(self, pid: int, pod_uid: str | None) -> None:
        d = self.proc_root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        if pod_uid:
            slug = pod_uid.replace("-", "_")
            cgroup = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slug}.slice/"
                      f"cri-containerd-{uuidlib.uuid5(_NS, f'ctr/{pid}').hex}.scope\n")
        else:
            cgroup = "0::/system.slice/nvidia-persistenced.service\n"
        atomic_write(d / "cgroup", cgroup.encode())

    def orphan(self, i: int, pid: int, used_bytes: int, *, unkillable: bool = False) -> str:
        """A process holding ``used_bytes`` on GPU ``i`` whose pod no longer exists; returns that pod's UID."""
        gone = str(uuidlib.uuid5(_NS, f"gone/{self.name}/{pid}"))
        self.add_process(i, pid, used_bytes, gone, unkillable=unkillable)
        return gone

    def remove_process(self, pid: int) -> None:
        with self._mutate() as st:
            for g in st["gpus"]:
                g["processes"].pop(str(pid), None)
        shutil.rmtree(self.proc_root / str(pid), ignore_errors=True)

    # --- memory growth: a leaking job, and its restart ------------------------------------------------

    def leak_memory(self, i: int, pod: str, *, bytes_per_s: int) -> int:
        """``pod``'s process on GPU ``i`` starts leaking: from now on NVML reports it ``bytes_per_s`` larger
        each second. Its use now is the job's baseline: when the job is restarted, the new pod's processes
        (``start_restarted``) run at that use again, and stay there. Returns the leaking PID."""
        with self._mutate() as st:
            uid = self._pod_uid_in(st, pod)
            g = self._gpu(st, i)
            found = [(pid, p) for pid, p in g["processes"].items() if p.get("pod_uid") == uid]
            if not found:
                raise ValueError(f"pod {pod} runs no process on GPU {i} of {self.name}")
            pid, proc = found[0]
            proc["growth"] = {"per_s": int(bytes_per_s), "since": self.clock()}
            st.setdefault("restart_memory", {})[_workload(st["pods"][uid])] = int(proc["bytes"])
        return int(pid)

    def start_restarted(self, pod_uid: str, gpus: Sequence[int]) -> list[int]:
        """The kubelet runs pod ``pod_uid`` on ``gpus``: when it is a new pod of a job whose process leaked on
        this node (``leak_memory``), its process starts on each of those GPUs at the job's baseline use.
        A pod that already runs a process, or of another job, is left alone. Returns the PIDs started."""
        st0 = self._current()
        p0 = st0["pods"].get(pod_uid)
        if (not gpus or p0 is None or p0.get("restarted")
                or _workload(p0) not in st0.get("restart_memory", {})):
            return []  # the common case, read-only: no lock, no write
        started: list[int] = []
        with self._mutate() as st:
            p = st["pods"].get(pod_uid)
            if p is None or p.get("restarted") or any(
                    q.get("pod_uid") == pod_uid for g in st["gpus"] for q in g["processes"].values()):
                return []
            base = int(st["restart_memory"][_workload(p)])
            for i in gpus:
                pid = 40_000 + uuidlib.uuid5(_NS, f"proc/{pod_uid}/{i}").int % 20_000
                self._gpu(st, i)["processes"][str(pid)] = {"bytes": base, "pod_uid": pod_uid, "visible": True,
                                                           "unkillable": False}
                started.append(pid)
            p["restarted"] = True
        for pid in started:
            self._write_cgroup(pid, pod_uid)
        return started

    def hold_framebuffer(self, i: int, held_bytes: int, *, reserved_bytes: int | None = None) -> None:
        """GPU ``i``'s framebuffer holds ``held_bytes`` that no process NVML lists owns (a context leaked
        in the driver, a process outside the node's view; 0 frees it); ``reserved_bytes`` is what the driver
        sets aside (NVML's ``reserved``), counted in the used memory as NVML v1 counts it."""
        with self._mutate() as st:
            g = self._gpu(st, i)
            g["held_bytes"] = int(held_bytes)
            if reserved_bytes is not None:
                g["reserved_bytes"] = int(reserved_bytes)

    def leak_baselines(self) -> dict[str, int]:
        """Each leaked workload's baseline use (job, else ``pod:<ns>/<name>``), as ``leak_memory`` found it."""
        return {str(k): int(v) for k, v in self._current().get("restart_memory", {}).items()}

    def _pod_uid_in(self, st: dict[str, Any], pod: str) -> str:
        if pod in st["pods"]:
            return pod
        for uid, p in st["pods"].items():
            if p["name"] == pod:
                return str(uid)
        raise ValueError(f"no pod {pod!r} on {self.name}")

    # --- container logs ------------------------------------------------------------------------------

    def _log_path(self, pod: str, container: str | None) -> Path:
        uid = self.pod_uid(pod)
        p = self._current()["pods"][uid]
        c = container or p["containers"][0]
        return self.pod_logs_dir / f"{p['namespace']}_{p['name']}_{uid}" / c / "0.log"

    def pod_log(self, pod: str, text: str, *, container: str | None = None, stream: str = "stderr",
                partial_at: Sequence[int] = ()) -> None:
        """Append ``text`` (one or more lines) to a pod's container log in CRI format; ``partial_at`` splits
        the first line into ``P`` parts at those character offsets, as containerd does for long lines."""
        path = self._log_path(pod, container)
        ts = datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
        out: list[str] = []
        for n, line in enumerate(text.splitlines() or [""]):
            cuts = [0, *sorted(partial_at), len(line)] if n == 0 and partial_at else [0, len(line)]
            for k in range(len(cuts) - 1):
                tag = "F" if k == len(cuts) - 2 else "P"
                out.append(f"{ts} {stream} {tag} {line[cuts[k]:cuts[k + 1]]}\n")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, "".join(out).encode())
        finally:
            os.close(fd)

    def nccl_timeout(self, pod: str, rank: int, seq: int, *, op_type: str = "ALLREDUCE",
                     timeout_ms: int = 600_000, ran_for_ms: int | None = None, container: str | None = None,
                     numel: int = 1_048_576) -> None:
        """The PyTorch ProcessGroupNCCL watchdog timeout line of ``rank`` in ``pod``'s log."""
        now = datetime.fromtimestamp(self.clock(), UTC)
        stamp = f"E{now:%m%d} {now:%H:%M:%S}.{now.microsecond:06d}"
        line = (f"[rank{rank}]:[{stamp} 2161 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
                f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op_type}, NumelIn={numel}, "
                f"NumelOut={numel}, Timeout(ms)={timeout_ms}) ran for {ran_for_ms or timeout_ms + 15} "
                f"milliseconds before timing out.")
        self.pod_log(pod, line, container=container)

    # --- GpuBackend ----------------------------------------------------------------------------------

    def gpu_count(self) -> int:
        return len(self._current()["gpus"])

    def snapshot(self, index: int) -> GpuSnapshot:
        g = self._gpu(self._current(), index)
        ident = GpuIdentity(index=index, uuid=g["uuid"], pci_bus_id=g["pci"])
        if g["lost"]:
            return GpuSnapshot(identity=ident, lost=True)
        un = set(g.get("unsupported", []))
        # a leak stops where the framebuffer ends (the job would hit CUDA out of memory there)
        procs = tuple(GpuProcess(pid=int(pid), used_bytes=min(_process_bytes(p, self.clock()), int(g["memory_total"])))
                      for pid, p in g["processes"].items())
        reserved = int(g.get("reserved_bytes", 0))
        used = sum(p.used_bytes or 0 for p in procs) + int(g.get("held_bytes", 0)) + reserved
        e = g["ecc"]
        snap = GpuSnapshot(
            identity=ident,
            ecc=EccCounts(e["sbe_volatile"], e["dbe_volatile"], e["sbe_aggregate"], e["dbe_aggregate"]),
            retired_pages_pending=bool(g["retired_pending"]),
            retired_pages_sbe=int(g["retired_sbe"]),
            retired_pages_dbe=int(g["retired_dbe"]),
            remapped_rows=RemappedRows(**g["remap"]),
            memory_used=used,
            memory_total=int(g["memory_total"]),
            memory_reserved=reserved,
            processes=procs,
            throttle_reasons=int(g["throttle"]),
            temperature_c=int(g["temperature"]),
        )
        if not un:
            return snap
        return replace(
            snap,
            ecc=EccCounts() if "ecc" in un else snap.ecc,
            remapped_rows=None if "remapped_rows" in un else snap.remapped_rows,
            retired_pages_pending=None if "retired_pages" in un else snap.retired_pages_pending,
            retired_pages_sbe=None if "retired_pages" in un else snap.retired_pages_sbe,
            retired_pages_dbe=None if "retired_pages" in un else snap.retired_pages_dbe,
            processes=None if "processes" in un else snap.processes,
            throttle_reasons=None if "throttle_reasons" in un else snap.throttle_reasons,
            temperature_c=None if "temperature" in un else snap.temperature_c,
            unsupported=frozenset(un),
        )

    def wait_xid(self, timeout_s: float) -> XidNotice | None:
        deadline = time.monotonic() + timeout_s
        while True:
            events = self._current().get("xid_events", [])
            if self._xid_delivered < len(events):
                i, code = events[self._xid_delivered]
                self._xid_delivered += 1
                return XidNotice(index=int(i), code=int(code))
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._xid_wake.wait(min(left, 0.25))
            self._xid_wake.clear()

    def close(self) -> None:
        self._xid_wake.set()

    # --- HostRunner ----------------------------------------------------------------------------------

    async def isolate_gpu(self, gpu: GpuIdentity) -> RunResult:
        with self._mutate() as st:
            g = self._gpu(st, gpu.index)
            if g["lost"]:
                return RunResult(False, f"nvidia-smi drain -p {g['pci']} -m 1: GPU is lost")
            g["isolated"] = True
        return RunResult(True, f"nvidia-smi drain -p {g['pci']} -m 1: GPU {gpu.index} drained (simulated)")

    async def release_gpu(self, gpu: GpuIdentity) -> RunResult:
        with self._mutate() as st:
            g = self._gpu(st, gpu.index)
            g["isolated"] = False
        return RunResult(True, f"nvidia-smi drain -p {g['pci']} -m 0: GPU {gpu.index} undrained (simulated)")

    async def reset_gpu(self, gpu: GpuIdentity) -> RunResult:
        target = gpu.uuid or gpu.pci_bus_id
        shown = f"nvidia-smi --gpu-reset -i {target}"
        with self._mutate() as st:
            found = [g for g in st["gpus"] if target in (g["uuid"], g["pci"])]
            if target is None or not found:
                return RunResult(False, f"{shown}: exit 6: No devices were found")
            g = found[0]
            if g["lost"]:
                return RunResult(False, f"{shown}: exit 15: GPU is lost")
            if g["processes"]:
                return RunResult(False, f"{shown}: exit 255: GPU {g['pci']} is currently in use by another "
                                        f"process (pid {', '.join(g['processes'])})")
            if g.get("persistence", True):
                return RunResult(False, f"{shown}: exit 255: GPU {g['pci']} is in use by another client "
                                        "(nvidia-persistenced holds it while persistence mode is on)")
            outcome = g.get("reset_outcome")
            if outcome == "fail":
                return RunResult(False, f"{shown}: exit 255: Unable to reset GPU {g['pci']}: Unknown Error "
                                        "(simulated: the GPU did not come back from the reset)")
            g["reset_count"] += 1
            g["ecc"]["sbe_volatile"] = g["ecc"]["dbe_volatile"] = 0
            if g["remap"]["pending"]:
                g["remap"]["pending"] = False
            g["retired_pending"] = outcome == "retired_pending"
            g["throttle"] = 0
            if outcome == "new_uuid":
                seed = f"gpu/{self.name}/{g['index']}/{g['reset_count']}"
                g["uuid"] = f"GPU-{uuidlib.uuid5(_NS, seed)}"
        return RunResult(True, f"{shown}: GPU {g['pci']} was successfully reset (simulated, reset "
                               f"#{g['reset_count']})")

    # --- GpuControl ----------------------------------------------------------------------------------

    def persistence_mode(self, index: int) -> bool | None:
        g = self._gpu(self._current(), index)
        return None if g["lost"] else bool(g.get("persistence", True))

    def set_persistence_mode(self, index: int, enabled: bool) -> str | None:
        with self._mutate() as st:
            g = self._gpu(st, index)
            if g["lost"]:
                return f"nvmlDeviceSetPersistenceMode(GPU {index}): NVML_ERROR_GPU_IS_LOST"
            g["persistence"] = enabled
        return None

    def identity_at(self, pci_bus_id: str) -> GpuIdentity | None:
        for g in self._current()["gpus"]:
            if g["pci"] == pci_bus_id:
                return None if g["lost"] else GpuIdentity(index=int(g["index"]), uuid=g["uuid"], pci_bus_id=g["pci"])
        return None

    def set_reset_outcome(self, i: int, outcome: str | None) -> None:
        """What the next resets of GPU ``i`` do: ``fail`` (nvidia-smi reports an error, nothing changes),
        ``new_uuid`` (another UUID answers at the PCI address afterwards), ``retired_pending`` (page
        retirement still pending afterwards), None (a good reset)."""
        if outcome not in (None, "fail", "new_uuid", "retired_pending"):
            raise ValueError(f"unknown reset outcome {outcome!r}")
        with self._mutate() as st:
            self._gpu(st, i)["reset_outcome"] = outcome

    def set_reboot_outcome(self, outcome: str | None) -> None:
        """``ignored``: the reboot command runs and says so, but the node never reboots (same boot id)."""
        if outcome not in (None, "ignored"):
            raise ValueError(f"unknown reboot outcome {outcome!r}")
        with self._mutate() as st:
            st["reboot_outcome"] = outcome

    @property
    def bug_reports(self) -> int:
        return int(self._current().get("bug_reports", 0))

    async def kill_process(self, pid: int) -> RunResult:
        survived = False
        found = False
        with self._mutate() as st:
            for g in st["gpus"]:
                p = g["processes"].get(str(pid))
                if p is None:
                    continue
                found = True
                if p.get("unkillable"):
                    survived = True
                else:
                    del g["processes"][str(pid)]
        if not found:
            return RunResult(True, f"pid {pid} already gone")
        if survived:
            return RunResult(True, f"sent SIGKILL to pid {pid} (simulated; it is in D state and stays)")
        shutil.rmtree(self.proc_root / str(pid), ignore_errors=True)
        return RunResult(True, f"sent SIGKILL to pid {pid} (simulated)")

    async def reboot_node(self) -> RunResult | None:
        if not self._current().get("reboot_hook"):
            return None
        return self.reboot()

    def reboot(self) -> RunResult:
        """The node reboots (new boot id, GPUs' volatile state and processes gone), unless its reboot outcome
        is ``ignored``: then the command "ran" and nothing happened."""
        if self._current().get("reboot_outcome") == "ignored":
            return RunResult(True, f"{self.name}: reboot command ran (simulated; the node does not reboot)")
        with self._mutate() as st:
            st["reboots"] += 1
            self._new_boot(st)
            for g in st["gpus"]:
                g["lost"] = False
                g["isolated"] = False
                g["processes"] = {}
                g["ecc"]["sbe_volatile"] = g["ecc"]["dbe_volatile"] = 0
                g["remap"]["pending"] = False
                g["retired_pending"] = False
                g["throttle"] = 0
        shutil.rmtree(self.proc_root, ignore_errors=True)
        self.proc_root.mkdir(parents=True, exist_ok=True)
        return RunResult(True, f"{self.name} rebooted (simulated, reboot #{st['reboots']})")

    async def bug_report(self) -> RunResult | None:
        with self._mutate() as st:
            st["bug_reports"] = int(st.get("bug_reports", 0)) + 1
            n = st["bug_reports"]
        return RunResult(True, f"nvidia-bug-report.sh (simulated): wrote nvidia-bug-report.log.gz (report #{n})")

    async def health_command(self) -> RunResult | None:
        hc = self._current().get("health_command")
        if not hc:
            return None
        return RunResult(bool(hc["ok"]), f"dcgmi diag -r 1 (simulated): {hc.get('detail') or 'Pass'}")

    # --- the kubelet's device plugin ------------------------------------------------------------------

    def unhealthy_devices(self) -> set[int]:
        """GPU indices the device plugin reports unhealthy: drained by ``isolate_gpu`` or lost."""
        return {int(g["index"]) for g in self._current().get("gpus", []) if g.get("isolated") or g.get("lost")}

    def device_ids(self) -> list[str]:
        """The device plugin's device IDs, in index order: the GPU UUIDs."""
        return [str(g["uuid"]) for g in self._current().get("gpus", [])]

    # --- PodView -------------------------------------------------------------------------------------

    def running_pod_uids(self) -> frozenset[str] | None:
        return frozenset(self._current()["pods"])

    def pid_info(self, pid: int) -> PidInfo:
        return self._procs.pid_info(pid)


def sim_agent_config(node: SimGpuNode, *, nats_url: str, state_dir: Path | str | None = None,
                     **overrides: Any) -> AgentConfig:
    """An ``AgentConfig`` that points the agent at ``node``'s kmsg file, pod logs and boot id."""
    values: dict[str, Any] = {
        "node": node.name,
        "state_dir": state_dir or node.root / "agent",
        "nats_url": nats_url,
        "kmsg_path": str(node.kmsg_path),
        "pod_logs_dir": node.pod_logs_dir,
        "kubelet_pods_dir": node.kubelet_pods_dir,
        "boot_id_path": str(node.boot_id_path),
    }
    values.update(overrides)
    return AgentConfig(**values)


def sim_agent(node: SimGpuNode, *, nats_url: str, state_dir: Path | str | None = None,
              **overrides: Any) -> Agent:
    """The real ``Agent`` running on simulated ``node`` (GPU backend, host runner and pod view)."""
    return Agent(sim_agent_config(node, nats_url=nats_url, state_dir=state_dir, **overrides),
                 gpus=node, host=node, pods=node)


def _identity(node: str, agent_creds: dict[str, str] | None) -> dict[str, Any]:
    """The agent's own ``.creds`` (its NATS identity and the key it signs replies with), when given."""
    path = (agent_creds or {}).get(node)
    return {"creds_file": path, "signing_seed_file": path} if path else {}


class SimFleet:
    """N simulated GPU nodes and their agents in one process (the demo and drills use 8).

    ::

        async with SimFleet(tmp, [f"gpu-node-{i}" for i in range(8)], nats_url=url, gpus=8) as fleet:
            fleet.nodes["gpu-node-3"].inject_xid(2, 79)
            fleet.agents["gpu-node-3"].stats()

    ``agent_options`` are ``AgentConfig`` fields for every agent (e.g. ``nvml_interval_s=1.0``);
    ``agent_creds`` each node's agent ``.creds`` file (node → path).

    Each agent reads its node's kubelet PodResources socket, ``<root>/<node>/pod-resources.sock`` (in a short
    private directory instead where that path is over the 107-byte limit of a unix socket address), which
    ``serve_pod_resources`` serves from a simulated cluster (``chaos.kubelet.mirror_pods`` does it). Until
    then the socket does not exist, and the agents say they cannot tell who holds a GPU.
    """

    def __init__(self, root: Path | str, nodes: Sequence[str] | int, *, nats_url: str, gpus: int = 8,
                 agent_options: dict[str, Any] | None = None, clock: Callable[[], float] = time.time,
                 agent_creds: dict[str, str] | None = None) -> None:
        names = [f"gpu-node-{i}" for i in range(nodes)] if isinstance(nodes, int) else list(nodes)
        self.root = Path(root)
        self.nodes: dict[str, SimGpuNode] = {
            n: SimGpuNode(self.root / n, name=n, gpus=gpus, clock=clock) for n in names}
        self._short: tempfile.TemporaryDirectory[str] | None = None
        self.sockets: dict[str, Path] = {n: self._socket_path(n) for n in names}
        self.agents: dict[str, Agent] = {
            n: sim_agent(node, nats_url=nats_url, **{"pod_resources_socket": self.sockets[n], **(agent_options or {})},
                         **_identity(n, agent_creds))
            for n, node in self.nodes.items()}
        self.kubelets: PodResourcesServers | None = None

    def _socket_path(self, node: str) -> Path:
        path = (self.root / node / POD_RESOURCES_SOCKET).absolute()
        if len(os.fsencode(str(path))) <= MAX_UNIX_PATH_BYTES:
            return path
        if self._short is None:
            self._short = tempfile.TemporaryDirectory(prefix="remediator-kubelet-")
        return Path(self._short.name) / f"{node}.sock"

    def serve_pod_resources(self, cluster: Any) -> PodResourcesServers:
        """Serve every node's PodResources socket from ``cluster`` (a ``chaos.sim.ClusterState``); stopped
        with the fleet."""
        if self.kubelets is None:
            self.kubelets = PodResourcesServers(cluster, self.nodes)
            for n, path in self.sockets.items():
                self.kubelets.serve(n, path)
        return self.kubelets

    async def start(self) -> None:
        for agent in self.agents.values():
            await agent.start()

    async def stop(self) -> None:
        for agent in self.agents.values():
            await agent.stop()
        if self.kubelets is not None:
            self.kubelets.stop()
            self.kubelets = None

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
